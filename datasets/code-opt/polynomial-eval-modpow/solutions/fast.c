#include <stdio.h>
#include <stdlib.h>

#define MOD 1000000007ULL

/* Horner's rule: one multiply and one reduction per coefficient. */
int main(void) {
    int d, q;
    if (scanf("%d %d", &d, &q) != 2) return 0;
    unsigned long long *c = malloc(sizeof(unsigned long long) * (d + 1));
    for (int i = 0; i <= d; i++) scanf("%llu", &c[i]);
    for (int j = 0; j < q; j++) {
        unsigned long long x, s = 0;
        scanf("%llu", &x);
        for (int i = d; i >= 0; i--) s = (s * x + c[i]) % MOD;
        printf("%llu\n", s);
    }
    free(c);
    return 0;
}
