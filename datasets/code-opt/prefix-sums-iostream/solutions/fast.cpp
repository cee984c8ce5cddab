#include <cstdio>
#include <cstdlib>
#include <vector>

// Whole input read with one fread loop, output formatted into one buffer, one fwrite.
int main() {
    size_t cap = 1 << 22, len = 0;
    char* buf = (char*)std::malloc(cap + 1);
    for (;;) {
        if (len == cap) { cap *= 2; buf = (char*)std::realloc(buf, cap + 1); }
        size_t r = std::fread(buf + len, 1, cap - len, stdin);
        if (!r) break;
        len += r;
    }
    buf[len] = 0;
    const char* p = buf;
    const char* end = buf + len;
    auto next = [&](long long& v) -> bool {
        while (p < end && *p != '-' && (unsigned)(*p - '0') > 9) p++;
        if (p >= end) return false;
        bool neg = false;
        if (*p == '-') { neg = true; p++; }
        long long x = 0;
        while ((unsigned)(*p - '0') <= 9) x = x * 10 + (*p++ - '0');
        v = neg ? -x : x;
        return true;
    };
    long long n;
    if (!next(n)) return 0;
    std::vector<char> out((size_t)n * 21 + 16);
    char* o = out.data();
    long long s = 0;
    for (long long i = 0; i < n; i++) {
        long long x;
        next(x);
        s += x;
        unsigned long long u = s < 0 ? 0ULL - (unsigned long long)s : (unsigned long long)s;
        char tmp[24];
        int t = 0;
        do { tmp[t++] = (char)('0' + u % 10); u /= 10; } while (u);
        if (s < 0) *o++ = '-';
        while (t) *o++ = tmp[--t];
        *o++ = '\n';
    }
    std::fwrite(out.data(), 1, (size_t)(o - out.data()), stdout);
    std::free(buf);
    return 0;
}
