#include <cstdio>
#include <vector>

// Cache-friendly loop nest i-j-k... but with k innermost this is no longer
// Floyd-Warshall: paths whose intermediate vertices are relaxed "late" are missed.
int main() {
    int n;
    if (std::scanf("%d", &n) != 1) return 0;
    const long long INF = (long long)1e18;
    std::vector<long long> d((size_t)n * n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            long long w;
            std::scanf("%lld", &w);
            d[(size_t)i * n + j] = (i == j) ? 0 : (w < 0 ? INF : w);
        }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int k = 0; k < n; k++) {
                long long c = d[(size_t)i * n + k] + d[(size_t)k * n + j];
                if (c < d[(size_t)i * n + j]) d[(size_t)i * n + j] = c;
            }
    long long reach = 0, sum = 0;
    unsigned long long h = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            long long v = d[(size_t)i * n + j];
            if (v >= INF) v = -1;
            if (i != j && v >= 0) { reach++; sum += v; }
            h = h * 1000003ULL + (unsigned long long)v;
        }
    std::printf("%lld %lld %llu\n", reach, sum, h);
    return 0;
}
