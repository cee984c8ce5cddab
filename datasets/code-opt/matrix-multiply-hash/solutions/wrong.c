#include <stdio.h>
#include <stdlib.h>

/* "Transpose B for cache-friendliness" -- but indexes the transposed copy as if it
   were B, so it really computes A * B^T. */
int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 0;
    unsigned *A = malloc(sizeof(unsigned) * n * n);
    unsigned *B = malloc(sizeof(unsigned) * n * n);
    unsigned *BT = malloc(sizeof(unsigned) * n * n);
    for (int i = 0; i < n * n; i++) scanf("%u", &A[i]);
    for (int i = 0; i < n * n; i++) scanf("%u", &B[i]);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) BT[j * n + i] = B[i * n + j];
    unsigned long long h = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            unsigned s = 0;
            for (int k = 0; k < n; k++) s += A[i * n + k] * BT[k * n + j];
            h = h * 1000003ULL + s;
        }
    printf("%llu\n", h);
    free(A); free(B); free(BT);
    return 0;
}
