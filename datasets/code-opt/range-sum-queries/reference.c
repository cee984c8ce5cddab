#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int n, q;
    if (scanf("%d %d", &n, &q) != 2) return 0;
    long long *a = malloc(sizeof(long long) * (n + 1));
    for (int i = 1; i <= n; i++) scanf("%lld", &a[i]);
    for (int k = 0; k < q; k++) {
        int l, r;
        scanf("%d %d", &l, &r);
        long long s = 0;
        for (int i = l; i <= r; i++) s += a[i];   /* O(r - l + 1) per query */
        printf("%lld\n", s);
    }
    free(a);
    return 0;
}
