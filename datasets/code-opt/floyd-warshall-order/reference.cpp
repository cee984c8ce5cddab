#include <cstdio>
#include <vector>

int main() {
    int n;
    if (std::scanf("%d", &n) != 1) return 0;
    const long long INF = (long long)1e18;
    std::vector<std::vector<long long>> d(n, std::vector<long long>(n));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            long long w;
            std::scanf("%lld", &w);
            d[i][j] = (i == j) ? 0 : (w < 0 ? INF : w);
        }
    // Floyd-Warshall; the two inner loops walk the matrix column by column.
    for (int k = 0; k < n; k++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < n; i++)
                if (d[i][k] + d[k][j] < d[i][j]) d[i][j] = d[i][k] + d[k][j];
    long long reach = 0, sum = 0;
    unsigned long long h = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            long long v = d[i][j] >= INF ? -1 : d[i][j];
            if (i != j && v >= 0) { reach++; sum += v; }
            h = h * 1000003ULL + (unsigned long long)v;
        }
    std::printf("%lld %lld %llu\n", reach, sum, h);
    return 0;
}
