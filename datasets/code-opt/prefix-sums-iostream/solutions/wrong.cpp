#include <iostream>

// Fast iostreams (no sync, '\n' instead of endl), but the running sum is an int.
int main() {
    std::ios::sync_with_stdio(false);
    std::cin.tie(nullptr);
    int n;
    if (!(std::cin >> n)) return 0;
    int s = 0;
    for (int i = 0; i < n; i++) {
        int x;
        std::cin >> x;
        s += x;
        std::cout << s << '\n';
    }
    return 0;
}
