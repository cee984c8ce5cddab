#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 0;
    unsigned *A = malloc(sizeof(unsigned) * n * n);
    unsigned *B = malloc(sizeof(unsigned) * n * n);
    unsigned *C = malloc(sizeof(unsigned) * n * n);
    for (int i = 0; i < n * n; i++) scanf("%u", &A[i]);
    for (int i = 0; i < n * n; i++) scanf("%u", &B[i]);
    /* textbook i-j-k order: the inner loop walks B down a column (stride n) */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            unsigned s = 0;
            for (int k = 0; k < n; k++) s += A[i * n + k] * B[k * n + j];
            C[i * n + j] = s;
        }
    unsigned long long h = 0;
    for (int i = 0; i < n * n; i++) h = h * 1000003ULL + C[i];
    printf("%llu\n", h);
    free(A); free(B); free(C);
    return 0;
}
