#include <stdio.h>
#include <stdlib.h>

/* Prefix sums, but accumulated in 32-bit ints: overflows for large values. */
int main(void) {
    int n, q;
    if (scanf("%d %d", &n, &q) != 2) return 0;
    int *p = malloc(sizeof(int) * (n + 1));
    p[0] = 0;
    for (int i = 1; i <= n; i++) {
        int x;
        scanf("%d", &x);
        p[i] = p[i - 1] + x;
    }
    for (int k = 0; k < q; k++) {
        int l, r;
        scanf("%d %d", &l, &r);
        printf("%d\n", p[r] - p[l - 1]);
    }
    free(p);
    return 0;
}
