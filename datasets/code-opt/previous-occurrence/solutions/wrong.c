#include <stdio.h>
#include <stdlib.h>

/* Hash table, but it stores only the FIRST index of each value, so p(i) is the first
   occurrence instead of the most recent one. */
int main(void) {
    int n;
    if (scanf("%d", &n) != 1) return 0;
    size_t cap = 1;
    while (cap < (size_t)n * 2) cap <<= 1;
    int *key = malloc(sizeof(int) * cap);
    int *first = calloc(cap, sizeof(int));
    int d = 0;
    long long s = 0;
    unsigned long long h = 0;
    for (int i = 1; i <= n; i++) {
        int x;
        scanf("%d", &x);
        size_t slot = (size_t)(((unsigned long long)(unsigned)x * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
        while (first[slot] && key[slot] != x) slot = (slot + 1) & (cap - 1);
        int p = first[slot];
        if (!p) { key[slot] = x; first[slot] = i; d++; }
        s += p;
        h = h * 1000003ULL + (unsigned long long)p;
    }
    printf("%d %lld %llu\n", d, s, h);
    free(key);
    free(first);
    return 0;
}
