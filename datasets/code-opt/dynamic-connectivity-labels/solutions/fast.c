#include <stdio.h>
#include <stdlib.h>

/* Disjoint-set union with union by size and path halving. */
static int *parent, *sz;

static int find(int x) {
    while (parent[x] != x) {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    return x;
}

int main(void) {
    int n, m;
    if (scanf("%d %d", &n, &m) != 2) return 0;
    parent = malloc(sizeof(int) * (n + 1));
    sz = malloc(sizeof(int) * (n + 1));
    for (int v = 1; v <= n; v++) { parent[v] = v; sz[v] = 1; }
    char *ans = malloc((size_t)m + 1);
    int na = 0, comps = n;
    for (int k = 0; k < m; k++) {
        char op[2];
        int a, b;
        scanf("%1s %d %d", op, &a, &b);
        int ra = find(a), rb = find(b);
        if (op[0] == 'U') {
            if (ra != rb) {
                if (sz[ra] < sz[rb]) { int t = ra; ra = rb; rb = t; }
                parent[rb] = ra;
                sz[ra] += sz[rb];
                comps--;
            }
        } else {
            ans[na++] = ra == rb ? '1' : '0';
        }
    }
    ans[na] = '\0';
    printf("%s\n%d\n", ans, comps);
    free(parent); free(sz); free(ans);
    return 0;
}
