#include <iostream>
#include <string>
#include <vector>

struct Particle {
    std::string name;
    std::string color;
    long long x, y;
    long long vx, vy;
    long long mass;
    long long charge;
};

static const long long L = 1 << 20;

int main() {
    std::ios::sync_with_stdio(false);
    std::cin.tie(nullptr);
    int n, T;
    long long W;
    if (!(std::cin >> n >> T >> W)) return 0;
    std::vector<Particle> ps(n);
    for (auto& p : ps)
        std::cin >> p.name >> p.color >> p.x >> p.y >> p.vx >> p.vy >> p.mass >> p.charge;
    for (int t = 0; t < T; t++) {
        for (auto& p : ps) {                       // move everything
            p.x = ((p.x + p.vx) % L + L) % L;
            p.y = ((p.y + p.vy) % L + L) % L;
        }
        long long s = 0;
        for (const auto& p : ps)                   // then measure the strip
            if (p.x < W) s += p.mass;
        std::cout << s << '\n';
    }
    return 0;
}
