#include <stdio.h>
#include <stdlib.h>

/* Row-major streaming like the fast version, but the per-column running hashes are
   kept in 32-bit words "to halve the working set" -- so they wrap modulo 2^32. */
int main(void) {
    int n, m;
    unsigned long long seed;
    if (scanf("%d %d %llu", &n, &m, &seed) != 3) return 0;
    unsigned *h = calloc((size_t)m, sizeof(unsigned));
    unsigned long long x = seed;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            x = (x * 6364136223846793005ULL + 1442695040888963407ULL);
            h[j] = h[j] * 1000003U + (unsigned)(x >> 33);
        }
    unsigned long long total = 0;
    for (int j = 0; j < m; j++) {
        printf("%u\n", h[j]);
        total ^= h[j];
    }
    printf("%llu\n", total);
    free(h);
    return 0;
}
