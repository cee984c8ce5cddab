#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int n, q;
    if (scanf("%d %d", &n, &q) != 2) return 0;
    long long *p = malloc(sizeof(long long) * (n + 1));
    p[0] = 0;
    for (int i = 1; i <= n; i++) {
        long long x;
        scanf("%lld", &x);
        p[i] = p[i - 1] + x;
    }
    for (int k = 0; k < q; k++) {
        int l, r;
        scanf("%d %d", &l, &r);
        printf("%lld\n", p[r] - p[l - 1]);
    }
    free(p);
    return 0;
}
