/* Shared declarations of opwarden's compiled kernels (module.c binds them to Python). */
#ifndef OPWARDEN_NATIVE_H
#define OPWARDEN_NATIVE_H

#include <stdint.h>

/* One interior node; the layout matches NODE_DTYPE in opwarden/native/__init__.py. For a
 * BRANCH_MEMBER node `thr` holds two int32: the [begin, end) range of its set in `members`. */
typedef struct {
    double thr;
    int32_t feat;
    int32_t child_false;
    int32_t child_true;
    uint8_t mode;
    uint8_t miss;
    uint16_t pad;
} tree_node_t;

typedef struct {
    const tree_node_t *nodes;
    const double *members;
    const int32_t *roots;     /* per tree: node index, or -(leaf + 1) for a single-leaf tree */
    const int32_t *leaf_off;  /* n_leaves + 1: each leaf's [begin, end) in leaf_tgt/leaf_w */
    const int32_t *leaf_tgt;
    const double *leaf_w;
    int64_t n_trees, n_feat, n_targets;
    int agg;         /* 0 AVERAGE and 1 SUM (both summed here), 2 MIN, 3 MAX */
    int mode_class;  /* 1 all BRANCH_LEQ, 2 all BRANCH_LT, 0 mixed */
} forest_t;

void forest_eval(const forest_t *f, const void *X, int is_double, int64_t n_rows, double *S,
                 uint8_t *H, int n_threads);

void bias_act_f32(float *y, const float *bias, int64_t rows, int64_t cols, int act,
                  int n_threads);

/* One depthwise NHWC convolution (depthwise.c): shapes, geometry and the fused epilogue. */
typedef struct {
    const float *x, *taps, *bias, *z; /* bias, z: NULL when absent; z may equal y */
    float *y;
    int64_t n, h, w, c, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl;
    int act;
    float p0, p1;
} dw_args_t;

void depthwise_nhwc_f32(const dw_args_t *a, int64_t q0, int64_t q1, int n_threads);

/* y = x * sigmoid(alpha x) over n floats (silu.c); y may be x. */
void swish_f32(const float *x, float *y, int64_t n, float alpha);

#endif
