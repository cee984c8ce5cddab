#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bulk input parsing. */
static char *buf;
static size_t pos, len;
static void load_input(void) {
    size_t cap = 1 << 20;
    buf = malloc(cap);
    len = 0;
    for (;;) {
        if (len == cap) { cap *= 2; buf = realloc(buf, cap); }
        size_t r = fread(buf + len, 1, cap - len, stdin);
        if (r == 0) break;
        len += r;
    }
}
static unsigned read_uint(void) {
    while (pos < len && (buf[pos] < '0' || buf[pos] > '9')) pos++;
    unsigned x = 0;
    while (pos < len && buf[pos] >= '0' && buf[pos] <= '9') x = x * 10 + (unsigned)(buf[pos++] - '0');
    return x;
}

int main(void) {
    load_input();
    int n = (int)read_uint();
    int m = (n + 7) & ~7;                     /* pad rows to a multiple of 8 */
    unsigned *A = calloc((size_t)n * n, sizeof(unsigned));
    unsigned *B = calloc((size_t)n * m, sizeof(unsigned));
    unsigned *C = calloc((size_t)n * m, sizeof(unsigned));
    for (int i = 0; i < n * n; i++) A[i] = read_uint();
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) B[(size_t)i * m + j] = read_uint();
    /* i-k-j order: inner loop streams rows of B and C contiguously; the fixed-size
       8-wide block lets the compiler vectorize it at -O2. */
    for (int i = 0; i < n; i++) {
        unsigned *c = C + (size_t)i * m;
        for (int k = 0; k < n; k++) {
            unsigned a = A[(size_t)i * n + k];
            const unsigned *b = B + (size_t)k * m;
            for (int j = 0; j < m; j += 8)
                for (int t = 0; t < 8; t++) c[j + t] += a * b[j + t];
        }
    }
    unsigned long long h = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) h = h * 1000003ULL + C[(size_t)i * m + j];
    printf("%llu\n", h);
    free(A); free(B); free(C); free(buf);
    return 0;
}
