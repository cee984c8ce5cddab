#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int n, m;
    unsigned long long seed;
    if (scanf("%d %d %llu", &n, &m, &seed) != 3) return 0;
    /* generate the matrix in row-major order */
    unsigned *a = malloc(sizeof(unsigned) * (size_t)n * m);
    unsigned long long x = seed;
    for (size_t k = 0; k < (size_t)n * m; k++) {
        x = (x * 6364136223846793005ULL + 1442695040888963407ULL);
        a[k] = (unsigned)(x >> 33);
    }
    /* hash each column top to bottom: the inner loop jumps m elements at a time */
    unsigned long long total = 0;
    for (int j = 0; j < m; j++) {
        unsigned long long h = 0;
        for (int i = 0; i < n; i++) h = h * 1000003ULL + a[(size_t)i * m + j];
        printf("%llu\n", h);
        total ^= h;
    }
    printf("%llu\n", total);
    free(a);
    return 0;
}
