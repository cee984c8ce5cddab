#include <cstdio>
#include <set>

// Balanced tree via std::set: O(log size), but a set drops duplicate values.
int main() {
    int m;
    if (std::scanf("%d", &m) != 1) return 0;
    std::set<long long> s;
    for (int k = 0; k < m; k++) {
        char op[2];
        std::scanf("%1s", op);
        if (op[0] == '+') {
            long long x;
            std::scanf("%lld", &x);
            s.insert(x);
        } else if (s.empty()) {
            std::printf("EMPTY\n");
        } else {
            std::printf("%lld\n", *s.begin());
            s.erase(s.begin());
        }
    }
    return 0;
}
