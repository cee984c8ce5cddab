#include <algorithm>
#include <cstdio>
#include <vector>

// Memoised table like the fast solution, but each query scans the half-open range
// [a, b), missing b itself (and answering 0 when a == b).
int main() {
    int q;
    if (std::scanf("%d", &q) != 1) return 0;
    std::vector<int> A(q), B(q);
    int N = 1;
    for (int k = 0; k < q; k++) { std::scanf("%d %d", &A[k], &B[k]); N = std::max(N, B[k]); }
    std::vector<int> st(N + 1, 0);
    for (int n = 2; n <= N; n++) {
        long long x = n;
        int c = 0;
        while (x >= n) {
            x = (x & 1) ? 3 * x + 1 : x >> 1;
            c++;
        }
        st[n] = c + st[x];
    }
    for (int k = 0; k < q; k++) {
        int best = 0;
        for (int n = A[k]; n < B[k]; n++) best = std::max(best, st[n]);
        std::printf("%d\n", best);
    }
    return 0;
}
