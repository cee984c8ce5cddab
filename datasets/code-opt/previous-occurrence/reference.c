#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 0;
    /* values seen so far and the last index of each, searched linearly */
    int *vals = malloc(sizeof(int) * n);
    int *last = malloc(sizeof(int) * n);
    int d = 0;
    long long s = 0;
    unsigned long long h = 0;
    for (int i = 1; i <= n; i++) {
        int x;
        scanf("%d", &x);
        int p = 0, k;
        for (k = 0; k < d; k++)
            if (vals[k] == x) break;
        if (k < d) { p = last[k]; last[k] = i; }
        else { vals[d] = x; last[d] = i; d++; }
        s += p;
        h = h * 1000003ULL + (unsigned long long)p;
    }
    printf("%d %lld %llu\n", d, s, h);
    free(vals);
    free(last);
    return 0;
}
