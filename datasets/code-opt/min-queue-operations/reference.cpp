#include <algorithm>
#include <cstdio>
#include <vector>

int main() {
    int m;
    if (std::scanf("%d", &m) != 1) return 0;
    std::vector<long long> items;               // unsorted; minimum found by a scan
    for (int k = 0; k < m; k++) {
        char op[2];
        std::scanf("%1s", op);
        if (op[0] == '+') {
            long long x;
            std::scanf("%lld", &x);
            items.push_back(x);
        } else if (items.empty()) {
            std::printf("EMPTY\n");
        } else {
            auto it = std::min_element(items.begin(), items.end());
            std::printf("%lld\n", *it);
            items.erase(it);                    // shifts the tail down: O(size)
        }
    }
    return 0;
}
