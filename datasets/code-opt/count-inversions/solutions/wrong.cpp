#include <cstdio>
#include <vector>

// Merge sort counting, but takes from the right half on ties: counts equal pairs too.
static long long sort_count(std::vector<int>& a, std::vector<int>& tmp, int lo, int hi) {
    if (hi - lo < 2) return 0;
    int mid = (lo + hi) / 2;
    long long c = sort_count(a, tmp, lo, mid) + sort_count(a, tmp, mid, hi);
    int i = lo, j = mid, k = lo;
    while (i < mid && j < hi) {
        if (a[j] <= a[i]) { c += mid - i; tmp[k++] = a[j++]; }
        else tmp[k++] = a[i++];
    }
    while (i < mid) tmp[k++] = a[i++];
    while (j < hi) tmp[k++] = a[j++];
    for (int t = lo; t < hi; t++) a[t] = tmp[t];
    return c;
}

int main() {
    int n;
    if (std::scanf("%d", &n) != 1) return 0;
    std::vector<int> a(n), tmp(n);
    for (int i = 0; i < n; i++) std::scanf("%d", &a[i]);
    std::printf("%lld\n", sort_count(a, tmp, 0, n));
    return 0;
}
