/* Tree-ensemble traversal: every row through every tree, leaf values aggregated per target.
 *
 * The forest comes flattened (opwarden/native/__init__.py describes the layout): one 24-byte
 * node record per interior node, children encoded as node index (>= 0) or leaf -(index + 1).
 * Rows are split into blocks handed to OpenMP threads; inside a block the trees are the outer
 * loop, so a tree's upper levels stay in cache while the block's rows descend it. Each row's
 * leaves are aggregated in tree order, the order the NumPy reference sums in.
 */
#include "native.h"

#include <math.h>
#include <string.h>

#define TREE_BLOCK 64

enum { M_LEQ, M_LT, M_GTE, M_GT, M_EQ, M_NEQ, M_MEMBER };

static inline int member_of(const tree_node_t *nd, const double *members, double x) {
    int32_t b, e;
    memcpy(&b, &nd->thr, 4);
    memcpy(&e, (const char *)&nd->thr + 4, 4);
    for (int32_t i = b; i < e; i++)
        if (members[i] == x) return 1;
    return 0;
}

/* The branch taken at one node: NaN follows missing_value_tracks_true in every mode. */
static inline int go_true(const tree_node_t *nd, const double *members, double x) {
    if (isnan(x)) return nd->miss;
    switch (nd->mode) {
    case M_LEQ: return x <= nd->thr;
    case M_LT: return x < nd->thr;
    case M_GTE: return x >= nd->thr;
    case M_GT: return x > nd->thr;
    case M_EQ: return x == nd->thr;
    case M_NEQ: return x != nd->thr;
    default: return member_of(nd, members, x);
    }
}

static inline void add_leaf(const forest_t *f, int32_t leaf, double *s, uint8_t *h) {
    for (int32_t k = f->leaf_off[leaf]; k < f->leaf_off[leaf + 1]; k++) {
        int32_t t = f->leaf_tgt[k];
        double w = f->leaf_w[k];
        if (f->agg <= 1 || !h[t]) {
            s[t] = (f->agg <= 1 && h[t]) ? s[t] + w : w;
        } else if (!isnan(s[t]) && (isnan(w) || (f->agg == 2 ? w < s[t] : w > s[t]))) {
            s[t] = w;  /* MIN / MAX, NaN propagating as np.minimum / np.maximum do */
        }
        h[t] = 1;
    }
}

/* One specialised walk per (input type, mode class): all-LEQ and all-LT forests (sklearn,
 * LightGBM, XGBoost) skip the mode switch; a NaN compares false, so it only needs `miss`.
 * A walk is a chain of dependent loads (node, then feature, then the next node), so LANES
 * rows descend the same tree together: their chains are independent and overlap in memory. */
#define LANES 8
#define DEFINE_WALK(NAME, T, COND)                                                          \
    static void NAME(const forest_t *f, const T *X, int64_t r0, int64_t r1, double *S,      \
                     uint8_t *H) {                                                          \
        const tree_node_t *nodes = f->nodes;                                                \
        const double *members = f->members;                                                 \
        (void)members;                                                                      \
        for (int64_t t = 0; t < f->n_trees; t++) {                                          \
            const int32_t root = f->roots[t];                                               \
            for (int64_t r = r0; r < r1; r += LANES) {                                      \
                const int m = r1 - r < LANES ? (int)(r1 - r) : LANES;                       \
                int32_t id[LANES];                                                          \
                const T *xs[LANES];                                                         \
                for (int l = 0; l < m; l++) {                                               \
                    id[l] = root;                                                           \
                    xs[l] = X + (r + l) * f->n_feat;                                        \
                }                                                                           \
                int active = root >= 0;                                                     \
                while (active) {                                                            \
                    active = 0;                                                             \
                    for (int l = 0; l < m; l++) {                                           \
                        const int32_t i = id[l];                                            \
                        if (i < 0) continue;                                                \
                        const tree_node_t *nd = nodes + i;                                  \
                        const double v = (double)xs[l][nd->feat];                           \
                        id[l] = (COND) ? nd->child_true : nd->child_false;                  \
                        active |= id[l] >= 0;                                               \
                    }                                                                       \
                }                                                                           \
                for (int l = 0; l < m; l++)                                                 \
                    add_leaf(f, -id[l] - 1, S + (r + l) * f->n_targets,                     \
                             H + (r + l) * f->n_targets);                                   \
            }                                                                               \
        }                                                                                   \
    }

DEFINE_WALK(walk_f32_leq, float, (v <= nd->thr) | (nd->miss & (v != v)))
DEFINE_WALK(walk_f64_leq, double, (v <= nd->thr) | (nd->miss & (v != v)))
DEFINE_WALK(walk_f32_lt, float, (v < nd->thr) | (nd->miss & (v != v)))
DEFINE_WALK(walk_f64_lt, double, (v < nd->thr) | (nd->miss & (v != v)))
DEFINE_WALK(walk_f32_any, float, go_true(nd, members, v))
DEFINE_WALK(walk_f64_any, double, go_true(nd, members, v))

void forest_eval(const forest_t *f, const void *X, int is_double, int64_t n_rows, double *S,
                 uint8_t *H, int n_threads) {
    typedef void (*walk_fn)(const forest_t *, const void *, int64_t, int64_t, double *,
                            uint8_t *);
    walk_fn fn;
    if (f->mode_class == 1)
        fn = is_double ? (walk_fn)walk_f64_leq : (walk_fn)walk_f32_leq;
    else if (f->mode_class == 2)
        fn = is_double ? (walk_fn)walk_f64_lt : (walk_fn)walk_f32_lt;
    else
        fn = is_double ? (walk_fn)walk_f64_any : (walk_fn)walk_f32_any;
    memset(S, 0, sizeof(double) * (size_t)(n_rows * f->n_targets));
    memset(H, 0, (size_t)(n_rows * f->n_targets));
    const int64_t n_blocks = (n_rows + TREE_BLOCK - 1) / TREE_BLOCK;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads) if (n_threads > 1 && n_blocks > 1)
#endif
    for (int64_t b = 0; b < n_blocks; b++) {
        const int64_t r0 = b * TREE_BLOCK;
        const int64_t r1 = r0 + TREE_BLOCK < n_rows ? r0 + TREE_BLOCK : n_rows;
        fn(f, X, r0, r1, S, H);
    }
    (void)n_threads;
}
