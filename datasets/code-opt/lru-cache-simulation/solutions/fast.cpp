#include <cstdio>
#include <list>
#include <string>
#include <unordered_map>

// Classic O(1) LRU: list for recency order + hash map from page to its list node.
int main() {
    int C, n;
    if (std::scanf("%d %d", &C, &n) != 2) return 0;
    std::list<int> cache;
    std::unordered_map<int, std::list<int>::iterator> where;
    where.reserve((size_t)C * 2 + 16);
    std::string out(n, '?');
    long long misses = 0;
    for (int i = 0; i < n; i++) {
        int p;
        std::scanf("%d", &p);
        auto f = where.find(p);
        if (f != where.end()) {
            cache.splice(cache.begin(), cache, f->second);
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
