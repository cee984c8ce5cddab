#include <cstdio>

static int steps(long long n) {
    int c = 0;
    while (n != 1) {
        n = (n % 2) ? 3 * n + 1 : n / 2;
        c++;
    }
    return c;
}

int main() {
    int q;
    if (std::scanf("%d", &q) != 1) return 0;
    for (int k = 0; k < q; k++) {
        int a, b;
        std::scanf("%d %d", &a, &b);
        int best = 0;
        for (int n = a; n <= b; n++) {          // every trajectory walked from scratch
            int s = steps(n);
            if (s > best) best = s;
        }
        std::printf("%d\n", best);
    }
    return 0;
}
