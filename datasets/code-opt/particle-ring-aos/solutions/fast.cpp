#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>

// Structure of arrays with only the fields the answer depends on (x, vx, mass), in
// 32-bit words; y never influences the output, so it is not simulated.
static char* buf;
static size_t pos, len;
static void load() {
    size_t cap = 1 << 24;
    buf = (char*)std::malloc(cap);
    for (;;) {
        if (len == cap) { cap *= 2; buf = (char*)std::realloc(buf, cap); }
        size_t r = std::fread(buf + len, 1, cap - len, stdin);
        if (!r) break;
        len += r;
    }
}
static void skip_word() {
    while (pos < len && (buf[pos] == ' ' || buf[pos] == '\n' || buf[pos] == '\r')) pos++;
    while (pos < len && buf[pos] > ' ') pos++;
}
static long long num() {
    while (pos < len && buf[pos] != '-' && (buf[pos] < '0' || buf[pos] > '9')) pos++;
    bool neg = false;
    if (buf[pos] == '-') { neg = true; pos++; }
    long long v = 0;
    while (pos < len && buf[pos] >= '0' && buf[pos] <= '9') v = v * 10 + (buf[pos++] - '0');
    return neg ? -v : v;
}

int main() {
    load();
    int n = (int)num(), T = (int)num();
    long long W = num();
    const uint32_t mask = (1u << 20) - 1;
    std::vector<uint32_t> x(n), vx(n), mass(n);
    for (int i = 0; i < n; i++) {
        skip_word(); skip_word();
        x[i] = (uint32_t)num();
        num();                                        // y
        vx[i] = (uint32_t)(num() & mask);             // velocity mod L
        num();                                        // vy
        mass[i] = (uint32_t)num();
        num();                                        // charge
    }
    // pad to a multiple of 8 with zero-mass particles so the inner block has a fixed
    // trip count (branch-free, vectorizable at -O2)
    int m = (n + 7) & ~7;
    x.resize(m, 0); vx.resize(m, 0); mass.resize(m, 0);
    const uint32_t w = (uint32_t)(W > (long long)mask + 1 ? mask + 1 : W);
    char out[32];
    for (int t = 0; t < T; t++) {
        uint64_t s = 0;
        for (int i = 0; i < m; i += 8) {
            uint32_t part[8];
            for (int k = 0; k < 8; k++) {
                uint32_t nx = (x[i + k] + vx[i + k]) & mask;
                x[i + k] = nx;
                part[k] = mass[i + k] & (0u - (uint32_t)(nx < w));
            }
            uint64_t ps = 0;
            for (int k = 0; k < 8; k++) ps += part[k];
            s += ps;
        }
        int l = std::snprintf(out, sizeof out, "%llu\n", (unsigned long long)s);
        std::fwrite(out, 1, l, stdout);
    }
    return 0;
}
