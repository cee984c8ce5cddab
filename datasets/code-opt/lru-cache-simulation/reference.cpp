#include <algorithm>
#include <cstdio>
#include <list>
#include <string>

int main() {
    int C, n;
    if (std::scanf("%d %d", &C, &n) != 2) return 0;
    std::list<int> cache;                       // front = most recently used
    std::string out;
    long long misses = 0;
    for (int i = 0; i < n; i++) {
        int p;
        std::scanf("%d", &p);
        auto it = std::find(cache.begin(), cache.end(), p);   // linear search
        if (it != cache.end()) {
            cache.splice(cache.begin(), cache, it);
            out += 'H';
        } else {
            cache.push_front(p);
            if ((int)cache.size() > C) cache.pop_back();
            out += 'M';
            misses++;
        }
    }
    std::printf("%s\n%lld\n", out.c_str(), misses);
    return 0;
}
