#include <stdio.h>
#include <stdlib.h>

/* Fully buffered: slurp the input, format everything into one buffer, write once. */
int main(void) {
    size_t cap = 1 << 22, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) { cap *= 2; buf = realloc(buf, cap + 1); }
        size_t r = fread(buf + len, 1, cap - len, stdin);
        if (r == 0) break;
        len += r;
    }
    buf[len] = '\0';
    char *p = buf, *end = buf + len;
    #define SKIP() while (p < end && (unsigned)(*p - '0') > 9) p++
    SKIP();
    long n = 0;
    while ((unsigned)(*p - '0') <= 9) n = n * 10 + (*p++ - '0');
    char *out = malloc((size_t)n * 48 + 64);
    char *o = out;
    static const char hx[] = "0123456789abcdef";
    for (long i = 1; i <= n; i++) {
        SKIP();
        unsigned long long v = 0;
        while ((unsigned)(*p - '0') <= 9) v = v * 10 + (unsigned)(*p++ - '0');
        *o++ = 'C'; *o++ = 'a'; *o++ = 's'; *o++ = 'e'; *o++ = ' '; *o++ = '#';
        char tmp[24];
        int t = 0;
        long k = i;
        do { tmp[t++] = (char)('0' + k % 10); k /= 10; } while (k);
        while (t) *o++ = tmp[--t];
        *o++ = ':'; *o++ = ' ';
        unsigned long long u = v;
        do { tmp[t++] = hx[u & 15]; u >>= 4; } while (u);
        while (t) *o++ = tmp[--t];
        *o++ = ' ';
        int bits = 0;
        for (u = v; u; u &= u - 1) bits++;
        if (bits >= 10) *o++ = (char)('0' + bits / 10);
        *o++ = (char)('0' + bits % 10);
        *o++ = '\n';
    }
    fwrite(out, 1, (size_t)(o - out), stdout);
    free(buf);
    free(out);
    return 0;
}
