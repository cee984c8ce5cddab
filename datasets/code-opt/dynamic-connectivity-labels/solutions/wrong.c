#include <stdio.h>
#include <stdlib.h>

/* Disjoint-set union, but union links the vertex a itself (not its root) under b's root,
   which can cut a away from the rest of its old component. */
static int *parent;

static int find(int x) {
    while (parent[x] != x) x = parent[x];
    return x;
}

int main(void) {
    int n, m;
    if (scanf("%d %d", &n, &m) != 2) return 0;
    parent = malloc(sizeof(int) * (n + 1));
    for (int v = 1; v <= n; v++) parent[v] = v;
    char *ans = malloc((size_t)m + 1);
    int na = 0, comps = n;
    for (int k = 0; k < m; k++) {
        char op[2];
        int a, b;
        scanf("%1s %d %d", op, &a, &b);
        if (op[0] == 'U') {
            if (find(a) != find(b)) {
                parent[a] = find(b);
                comps--;
            }
        } else {
            ans[na++] = find(a) == find(b) ? '1' : '0';
        }
    }
    ans[na] = '\0';
    printf("%s\n%d\n", ans, comps);
    free(parent); free(ans);
    return 0;
}
