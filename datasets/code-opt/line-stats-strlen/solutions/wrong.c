#include <stdio.h>
#include <string.h>

/* strlen hoisted out of the loop, but words are counted as "spaces + 1". */
static char line[200005];

int main(void) {
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        size_t n = strlen(line);
        int vowels = 0, spaces = 0;
        for (size_t i = 0; i < n; i++) {
            char c = line[i];
            if (strchr("aeiouAEIOU", c)) vowels++;
            if (c == ' ') spaces++;
        }
        printf("%d %d\n", vowels, n ? spaces + 1 : 0);
    }
    return 0;
}
