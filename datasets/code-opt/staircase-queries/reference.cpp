#include <cstdio>
#include <vector>

static const long long MOD = 1000000007LL;

int main() {
    int m, q;
    if (std::scanf("%d %d", &m, &q) != 2) return 0;
    std::vector<int> s(m);
    for (auto& x : s) std::scanf("%d", &x);
    for (int k = 0; k < q; k++) {
        int h;
        std::scanf("%d", &h);
        std::vector<long long> dp(h + 1, 0);    // the whole table is rebuilt for every query
        dp[0] = 1;
        for (int i = 1; i <= h; i++)
            for (int j = 0; j < m; j++)
                if (i >= s[j]) dp[i] = (dp[i] + dp[i - s[j]]) % MOD;
        std::printf("%lld\n", dp[h]);
    }
    return 0;
}
