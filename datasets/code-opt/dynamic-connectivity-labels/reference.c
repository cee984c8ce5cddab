#include <stdio.h>
#include <stdlib.h>

int main(void) {
    int n, m;
    if (scanf("%d %d", &n, &m) != 2) return 0;
    int *label = malloc(sizeof(int) * (n + 1));   /* label[v] = id of v's component */
    for (int v = 1; v <= n; v++) label[v] = v;
    char *ans = malloc((size_t)m + 1);
    int na = 0, comps = n;
    for (int k = 0; k < m; k++) {
        char op[2];
        int a, b;
        scanf("%1s %d %d", op, &a, &b);
        if (op[0] == 'U') {
            int la = label[a], lb = label[b];
            if (la != lb) {                        /* relabel the whole array: O(n) */
                for (int v = 1; v <= n; v++)
                    if (label[v] == lb) label[v] = la;
                comps--;
            }
        } else {
            ans[na++] = label[a] == label[b] ? '1' : '0';
        }
    }
    ans[na] = '\0';
    printf("%s\n%d\n", ans, comps);
    free(label);
    free(ans);
    return 0;
}
