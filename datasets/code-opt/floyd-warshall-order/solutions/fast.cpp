#include <cstdio>
#include <cstdlib>
#include <vector>

// Contiguous row-major matrix, k-i-j order: d[i][k] is hoisted and the inner loop
// streams row k and row i sequentially.
static char* buf;
static size_t pos, len;
static void load() {
    size_t cap = 1 << 22;
    buf = (char*)std::malloc(cap);
    for (;;) {
        if (len == cap) { cap *= 2; buf = (char*)std::realloc(buf, cap); }
        size_t r = std::fread(buf + len, 1, cap - len, stdin);
        if (!r) break;
        len += r;
    }
}
static long long num() {
    while (pos < len && buf[pos] != '-' && (buf[pos] < '0' || buf[pos] > '9')) pos++;
    bool neg = false;
    if (pos < len && buf[pos] == '-') { neg = true; pos++; }
    long long v = 0;
    while (pos < len && buf[pos] >= '0' && buf[pos] <= '9') v = v * 10 + (buf[pos++] - '0');
    return neg ? -v : v;
}

int main() {
    load();
    int n = (int)num();
    // Path lengths are < 500 * 10^6 < 2^30, so 32-bit ints suffice with INF = 2^30
    // (INF + INF still fits). Rows are padded to a multiple of 8 for a vectorizable
    // fixed-size inner block.
    const int INF = 1 << 30;
    int m = (n + 7) & ~7;
    std::vector<int> d((size_t)n * m, INF);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            long long w = num();
            d[(size_t)i * m + j] = (i == j) ? 0 : (w < 0 ? INF : (int)w);
        }
    for (int k = 0; k < n; k++) {
        const int* rk = &d[(size_t)k * m];
        for (int i = 0; i < n; i++) {
            int* ri = &d[(size_t)i * m];
            int dik = ri[k];
            if (dik >= INF) continue;
            for (int j = 0; j < m; j += 8) {
                int a[8], c[8];               // local copies: no aliasing, so it vectorizes
                for (int t = 0; t < 8; t++) a[t] = ri[j + t];
                for (int t = 0; t < 8; t++) c[t] = dik + rk[j + t];
                for (int t = 0; t < 8; t++) a[t] = c[t] < a[t] ? c[t] : a[t];
                for (int t = 0; t < 8; t++) ri[j + t] = a[t];
            }
        }
    }
    long long reach = 0, sum = 0;
    unsigned long long h = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            long long v = d[(size_t)i * m + j];
            if (v >= INF) v = -1;
            if (i != j && v >= 0) { reach++; sum += v; }
            h = h * 1000003ULL + (unsigned long long)v;
        }
    std::printf("%lld %lld %llu\n", reach, sum, h);
    return 0;
}
