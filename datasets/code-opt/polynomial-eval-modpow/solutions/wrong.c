#include <stdio.h>
#include <stdlib.h>

/* Horner's rule, but the intermediate product is taken in 32-bit arithmetic. */
int main(void) {
    int d, q;
    if (scanf("%d %d", &d, &q) != 2) return 0;
    unsigned *c = malloc(sizeof(unsigned) * (d + 1));
    for (int i = 0; i <= d; i++) scanf("%u", &c[i]);
    for (int j = 0; j < q; j++) {
        unsigned x, s = 0;
        scanf("%u", &x);
        for (int i = d; i >= 0; i--) s = (s * x + c[i]) % 1000000007u;
        printf("%u\n", s);
    }
    free(c);
    return 0;
}
