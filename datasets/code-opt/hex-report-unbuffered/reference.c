#include <stdio.h>

int main(void) {
    /* unbuffered stdout "so that every line appears immediately" */
    setvbuf(stdout, NULL, _IONBF, 0);
    int n;
    if (scanf("%d", &n) != 1) return 0;
    for (int i = 1; i <= n; i++) {
        unsigned long long v;
        scanf("%llu", &v);
        int bits = 0;
        for (unsigned long long t = v; t; t >>= 1) bits += (int)(t & 1);
        printf("Case #%d: %llx %d\n", i, v, bits);
    }
    return 0;
}
