#include <stdio.h>

/* Buffered output, but the bit count loop uses a 32-bit variable: high bits are lost. */
int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 0;
    for (int i = 1; i <= n; i++) {
        unsigned long long v;
        scanf("%llu", &v);
        int bits = 0;
        for (unsigned t = (unsigned)v; t; t >>= 1) bits += (int)(t & 1);
        printf("Case #%d: %llx %d\n", i, v, bits);
    }
    return 0;
}
