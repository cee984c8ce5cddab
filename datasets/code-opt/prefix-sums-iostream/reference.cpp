#include <iostream>

int main() {
    int n;
    if (!(std::cin >> n)) return 0;
    long long s = 0;
    for (int i = 0; i < n; i++) {
        long long x;
        std::cin >> x;                        // iostreams still synchronised with stdio
        s += x;
        std::cout << s << std::endl;          // endl flushes the stream on every line
    }
    return 0;
}
