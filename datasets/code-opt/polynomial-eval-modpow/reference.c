#include <stdio.h>
#include <stdlib.h>

#define MOD 1000000007ULL

static unsigned long long power(unsigned long long b, unsigned long long e) {
    unsigned long long r = 1;
    b %= MOD;
    while (e) {
        if (e & 1) r = r * b % MOD;
        b = b * b % MOD;
        e >>= 1;
    }
    return r;
}

int main(void) {
    int d, q;
    if (scanf("%d %d", &d, &q) != 2) return 0;
    unsigned long long *c = malloc(sizeof(unsigned long long) * (d + 1));
    for (int i = 0; i <= d; i++) scanf("%llu", &c[i]);
    for (int j = 0; j < q; j++) {
        unsigned long long x, s = 0;
        scanf("%llu", &x);
        for (int i = 0; i <= d; i++)              /* x^i recomputed from scratch per term */
            s = (s + c[i] * power(x, (unsigned long long)i)) % MOD;
        printf("%llu\n", s);
    }
    free(c);
    return 0;
}
