#include <stdio.h>
#include <stdlib.h>

/* One pass over the whole input read in bulk; vowel test by table lookup. */
int main(void) {
    size_t cap = 1 << 22, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len == cap) { cap *= 2; buf = realloc(buf, cap); }
        size_t r = fread(buf + len, 1, cap - len, stdin);
        if (r == 0) break;
        len += r;
    }
    unsigned char isv[256] = {0};
    const char *v = "aeiouAEIOU";
    for (int i = 0; v[i]; i++) isv[(unsigned char)v[i]] = 1;
    char *out = malloc(len * 4 + 64);
    size_t o = 0;
    int vowels = 0, words = 0, prev_space = 1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c == '\n') {
            o += (size_t)sprintf(out + o, "%d %d\n", vowels, words);
            vowels = words = 0;
            prev_space = 1;
            continue;
        }
        vowels += isv[c];
        if (c != ' ') { words += prev_space; prev_space = 0; }
        else prev_space = 1;
    }
    fwrite(out, 1, o, stdout);
    free(buf);
    free(out);
    return 0;
}
