#include <stdio.h>

int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 0;
    long long sum = 0, mn = 0, mx = 0;
    for (int i = 0; i < n; i++) {
        long long x;
        scanf("%lld", &x);                     /* one formatted-input call per number */
        sum += x;
        if (i == 0 || x < mn) mn = x;
        if (i == 0 || x > mx) mx = x;
    }
    printf("%lld %lld %lld\n", sum, mn, mx);
    return 0;
}
