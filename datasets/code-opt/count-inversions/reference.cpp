#include <cstdio>
#include <vector>

int main() {
    int n;
    if (std::scanf("%d", &n) != 1) return 0;
    std::vector<int> a(n);
    for (int i = 0; i < n; i++) std::scanf("%d", &a[i]);
    long long inv = 0;
    for (int i = 0; i < n; i++)          // O(n^2): compare every pair
        for (int j = i + 1; j < n; j++)
            if (a[i] > a[j]) inv++;
    std::printf("%lld\n", inv);
    return 0;
}
