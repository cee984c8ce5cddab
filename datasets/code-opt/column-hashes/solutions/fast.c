#include <stdio.h>
#include <stdlib.h>

/* Same hashes, but the matrix is consumed row by row while keeping one running hash
   per column: every access is sequential, and the matrix is never stored. */
int main(void) {
    int n, m;
    unsigned long long seed;
    if (scanf("%d %d %llu", &n, &m, &seed) != 3) return 0;
    unsigned long long *h = calloc((size_t)m, sizeof(unsigned long long));
    unsigned long long x = seed;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            x = (x * 6364136223846793005ULL + 1442695040888963407ULL);
            h[j] = h[j] * 1000003ULL + (unsigned)(x >> 33);
        }
    unsigned long long total = 0;
    char line[32];
    static char out[1 << 16];
    size_t o = 0;
    for (int j = 0; j < m; j++) {
        int l = snprintf(line, sizeof line, "%llu\n", h[j]);
        if (o + (size_t)l > sizeof out) { fwrite(out, 1, o, stdout); o = 0; }
        for (int t = 0; t < l; t++) out[o++] = line[t];
        total ^= h[j];
    }
    fwrite(out, 1, o, stdout);
    printf("%llu\n", total);
    free(h);
    return 0;
}
