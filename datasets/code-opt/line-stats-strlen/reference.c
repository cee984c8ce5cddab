#include <ctype.h>
#include <stdio.h>
#include <string.h>

static char line[200005];

int main(void) {
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        int vowels = 0, words = 0;
        for (size_t i = 0; i < strlen(line); i++) {   /* strlen re-evaluated every iteration */
            line[i] = (char)tolower((unsigned char)line[i]);
            if (strchr("aeiou", line[i])) vowels++;
            if (line[i] != ' ' && (i == 0 || line[i - 1] == ' ')) words++;
        }
        printf("%d %d\n", vowels, words);
    }
    return 0;
}
