#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 0;
    int *a = malloc(sizeof(int) * n);
    int *best = malloc(sizeof(int) * n);   /* best[i] = LIS length ending at i */
    for (int i = 0; i < n; i++) scanf("%d", &a[i]);
    int ans = 0;
    for (int i = 0; i < n; i++) {          /* O(n^2) DP */
        best[i] = 1;
        for (int j = 0; j < i; j++)
            if (a[j] < a[i] && best[j] + 1 > best[i]) best[i] = best[j] + 1;
        if (best[i] > ans) ans = best[i];
    }
    printf("%d\n", ans);
    free(a);
    free(best);
    return 0;
}
