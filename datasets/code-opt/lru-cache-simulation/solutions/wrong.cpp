#include <cstdio>
#include <list>
#include <string>
#include <unordered_map>

// O(1) with a hash map, but hits do not refresh recency: this is FIFO, not LRU.
int main() {
    int C, n;
    if (std::scanf("%d %d", &C, &n) != 2) return 0;
    std::list<int> cache;
    std::unordered_map<int, std::list<int>::iterator> where;
    std::string out(n, '?');
    long long misses = 0;
    for (int i = 0; i < n; i++) {
        int p;
        std::scanf("%d", &p);
        if (where.count(p)) {
            out[i] = 'H';
        } else {
            cache.push_front(p);
            where[p] = cache.begin();
            if ((int)cache.size() > C) {
                where.erase(cache.back());
                cache.pop_back();
            }
            out[i] = 'M';
            misses++;
        }
    }
    std::printf("%s\n%lld\n", out.c_str(), misses);
    return 0;
}
