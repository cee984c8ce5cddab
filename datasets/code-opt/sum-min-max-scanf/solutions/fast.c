#include <stdio.h>
#include <stdlib.h>

/* Slurp the whole input with fread and parse it with a pointer walk. */
int main(void) {
    size_t cap = 1 << 22, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) { cap *= 2; buf = realloc(buf, cap + 1); }
        size_t r = fread(buf + len, 1, cap - len, stdin);
        if (r == 0) break;
        len += r;
    }
    buf[len] = '\0';                           /* sentinel: not a digit */
    const char *p = buf, *end = buf + len;
    int first = 1;
    long long n = -1, cnt = 0, sum = 0, mn = 0, mx = 0;
    while (p < end) {
        while (p < end && *p != '-' && (unsigned)(*p - '0') > 9) p++;
        if (p >= end) break;
        int neg = 0;
        if (*p == '-') { neg = 1; p++; }
        long long v = 0;
        while ((unsigned)(*p - '0') <= 9) v = v * 10 + (*p++ - '0');
        if (neg) v = -v;
        if (n < 0) { n = v; continue; }
        if (cnt == n) break;
        sum += v;
        if (first || v < mn) mn = v;
        if (first || v > mx) mx = v;
        first = 0;
        cnt++;
    }
    printf("%lld %lld %lld\n", sum, mn, mx);
    free(buf);
    return 0;
}
