#include <stdio.h>
#include <stdlib.h>

/* Patience sorting with an upper bound: computes the longest NON-decreasing subsequence. */
int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 0;
    int *tail = malloc(sizeof(int) * n);
    int len = 0;
    for (int i = 0; i < n; i++) {
        int x;
        scanf("%d", &x);
        int lo = 0, hi = len;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (tail[mid] <= x) lo = mid + 1; else hi = mid;
        }
        tail[lo] = x;
        if (lo == len) len++;
    }
    printf("%d\n", len);
    free(tail);
    return 0;
}
