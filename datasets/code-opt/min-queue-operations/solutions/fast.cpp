#include <cstdio>
#include <functional>
#include <queue>
#include <vector>

// Binary min-heap: O(log size) per operation.
int main() {
    int m;
    if (std::scanf("%d", &m) != 1) return 0;
    std::priority_queue<long long, std::vector<long long>, std::greater<long long>> pq;
    for (int k = 0; k < m; k++) {
        char op[2];
        std::scanf("%1s", op);
        if (op[0] == '+') {
            long long x;
            std::scanf("%lld", &x);
            pq.push(x);
        } else if (pq.empty()) {
            std::printf("EMPTY\n");
        } else {
            std::printf("%lld\n", pq.top());
            pq.pop();
        }
    }
    return 0;
}
