#include <algorithm>
#include <cstdio>
#include <vector>

// One table up to the largest queried height, shared by all queries.
static const unsigned MOD = 1000000007u;

int main() {
    int m, q;
    if (std::scanf("%d %d", &m, &q) != 2) return 0;
    std::vector<int> s(m);
    for (auto& x : s) std::scanf("%d", &x);
    std::vector<int> h(q);
    int H = 0;
    for (auto& x : h) { std::scanf("%d", &x); H = std::max(H, x); }
    std::vector<unsigned> dp(H + 1, 0);
    dp[0] = 1;
    for (int i = 1; i <= H; i++) {
        unsigned long long acc = 0;
        for (int j = 0; j < m; j++)
            if (i >= s[j]) acc += dp[i - s[j]];
        dp[i] = (unsigned)(acc % MOD);
    }
    for (int x : h) std::printf("%u\n", dp[x]);
    return 0;
}
