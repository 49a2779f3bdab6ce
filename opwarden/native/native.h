/* Shared declarations of opwarden's compiled kernels (module.c binds them to Python). */
#ifndef OPWARDEN_NATIVE_H
#define OPWARDEN_NATIVE_H

#include <stdint.h>
#include <math.h>
#include <string.h>

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

/* One grouped NHWC convolution with few channels per group (grouped.c): x [n, h, wd, c],
 * y [n, oh, ow, m], c = group cg, m = group mg; wp the weights in the pair layout (`pair`,
 * where grouped_nhwc_pair_ok) or the wide one (grouped.c says which is which). */
typedef struct {
    const float *x, *wp, *bias, *z; /* bias, z: NULL when absent; z may equal y */
    float *y;
    int64_t n, h, wd, c, oh, ow, m, group, cg, mg, kh, kw, sh, sw, dh, dw, pt, pl;
    int pair, act;
    float p0, p1;
} gc_args_t;

int grouped_nhwc_pair_ok(int64_t group, int64_t cg, int64_t mg);
void grouped_nhwc_f32(const gc_args_t *a, int64_t q0, int64_t q1, int n_threads);

/* y = x * sigmoid(alpha x) over n floats (silu.c); y may be x. */
void swish_f32(const float *x, float *y, int64_t n, float alpha);
void swish_f32_threads(const float *x, float *y, int64_t n, float alpha, int n_threads);

/* Gelu or erf over float32 elements [lo, hi) (gelu.c): y[i] = f(x[i] + bias[i % cols]), bias
 * NULL for none (cols is then unused); y may be x, bias may not overlap y. */
enum { GELU_ERF, GELU_TANH, GELU_PLAIN_ERF };
void gelu_f32(const float *x, float *y, const float *bias, int64_t cols, int64_t lo, int64_t hi,
              int mode);
void gelu_f32_threads(const float *x, float *y, const float *bias, int64_t cols, int64_t lo,
                      int64_t hi, int mode, int n_threads);

/* LayerNormalization of rows r0..r1-1 of a row-major float32 [rows, cols] x into y
 * (layernorm.c): mean[r] and inv[r] = 1 / sqrt(var + eps) per row, then
 * y = (x - mean) * inv * scale + bias; scale, bias [cols] or NULL; y may be x. */
void layernorm_f32(const float *x, float *y, const float *scale, const float *bias,
                   int64_t rows, int64_t cols, float eps, float *mean, float *inv, int64_t r0,
                   int64_t r1, int n_threads);

/* float32 <-> float16 (cast.c), bit for bit NumPy's astype: elements [lo, hi) of x (float32 if
 * to_half, else float16 bits) into y, the other type; isa -1 the best path the CPU has, else at
 * most 0 scalar, 1 F16C, 2 AVX512F (cast_f16_isa: the best one). */
void cast_f16_f32(const void *x, void *y, int64_t lo, int64_t hi, int to_half, int isa,
                  int n_threads);
int cast_f16_isa(void);

/* y = act(y + bias + z) over a row-major [rows, cols] float32 output (conv_epilogue.c); bias
 * [cols] and z [rows, cols] may be NULL, z may not overlap y other than being y. */
void conv_epilogue_f32(float *y, const float *bias, const float *z, int64_t rows, int64_t cols,
                       int act, float p0, float p1, int n_threads);

/* 8-bit integer GEMM with an exact int32 accumulator and its epilogue (qgemm.c). Rows are
 * uint8 against int8 panels, or with `swap` int8 rows against uint8 panels. */
#define QG_NR 64 /* columns per packed panel */
#define QG_MB 48 /* rows per job: a block of rows reused across its column panels */
enum { QG_OUT_I32, QG_OUT_F32, QG_OUT_Q8 };
enum { QG_ONE, QG_PER_COL, QG_PER_ROW }; /* how scale / bias are indexed */
typedef struct {
    const void *a;       /* [m, k] rows, stride lda; k a multiple of 4 (zero-padded) */
    const void *bp;      /* packed panels (qgemm.c) */
    int64_t lda, m, n, k, ldo;
    /* acc = sum row * col + colc[n] + rowc[m] + u[m] v[n]; NULL terms are absent */
    const int32_t *colc, *rowc, *u, *v;
    int swap, mode, scale_idx, bias_idx, out_signed;
    int portable;          /* 1: the portable loop, 2: at most AVX2 (tests), 0: the best */
    const float *scale;    /* QG_OUT_F32 / QG_OUT_Q8 */
    const float *fbias;    /* QG_OUT_F32, or NULL */
    const int32_t *ibias;  /* QG_OUT_Q8: added to the accumulator, or NULL */
    /* AVX2 only: the int8 operand's sums over k (per column, or per row with swap), given
     * with the caller's word that the operand holds no -128; NULL: qgemm_8bit finds both */
    const int32_t *sums;
    int32_t zy;
    void *out;             /* int32, float32 or 8-bit [m, ldo] */
} qg_args_t;

/* Returns the instruction set the call ran on (qgemm_isa's codes). */
int qgemm_8bit(const qg_args_t *p, int n_threads);
int qgemm_isa(void); /* 1: AVX512-VNNI, 2: AVX2 (qgemm_avx2.c), 0: the portable loop */
/* qgemm_avx2.c, and the scalar epilogue of qgemm.c it finishes rows with. */
int qg_cpu_avx2(void);
int qg_avx2_sums(const qg_args_t *p, int32_t *corr);
void qg_job_avx2(const qg_args_t *p, int64_t mb, int64_t panel, int bias_safe,
                 const int32_t *corr);
void qg_store_row(const qg_args_t *p, int64_t m, int64_t n0, int cols, const int32_t *t);
/* uint8 image [c, hp, wp] (padded) -> im2col columns of the oh x ow output pixels in the panel
 * layout (rows k = (ci, i, j)), and each pixel's column sum if colsum is not NULL. */
void qg_pack_im2col_u8(const uint8_t *x, int64_t c, int64_t hp, int64_t wp, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh,
                       int64_t ow, uint8_t *packed, int32_t *colsum, int n_threads);

/* float32 GEMM against a B packed once into 32-column panels (sgemm.c, AVX-512F). */
int sgemm_packed_isa(void);
void sgemm_packed(const float *a, int64_t lda, const int64_t *offs, int ntaps, int64_t m,
                  int64_t k, const float *bp, int64_t n, const float *bias, float *c,
                  int64_t ldc, int accumulate, int n_threads);

/* Per-tensor QuantizeLinear / DequantizeLinear between float32 and 8 bits (quantize.c). */
void quantize_f32_8bit(const float *x, void *y, int64_t n, float scale, int32_t zp,
                       int out_signed);
void dequantize_8bit_f32(const void *x, float *y, int64_t n, float scale, int32_t zp,
                         int in_signed);
/* The integer GEMM's requantization of an exact [rows, cols] accumulator (quantize.c):
 * out = saturate(rint(float32(acc + bias[ch]) * mult[ch]) + zf), ch = row % period or, with
 * per_col, the column; bias may be NULL. */
void requantize_8bit(const void *acc, int acc_f64, const int32_t *bias, const float *mult,
                     int64_t rows, int64_t cols, int64_t period, int per_col, float zf,
                     int out_signed, void *out, int n_threads);
/* One 8-bit image [c, h, w]'s float32 im2col columns [c kh kw, oh ow], less the zero point,
 * zero in the padding (quantize.c). */
void qconv_im2col_f32(const void *x, int is_signed, int64_t c, int64_t h, int64_t w,
                      int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                      int64_t pt, int64_t pl, int64_t oh, int64_t ow, float zp, float *cols,
                      int n_threads);
/* Softmax rows of an n x m block of attention scores (softmax.c). */
void softmax_rows_f32(float *s, int64_t n, int64_t m, int64_t t, float c, const float *b0,
                      int64_t b0_hs, int64_t b0_rs, const float *b1, int64_t b1_hs,
                      int64_t b1_rs, float *inv);

void qlinear_add_8bit(const void *x, const void *y, void *out, int64_t n, float rx, float ry,
                      float fixed, int is_signed);

/* pool.c: MaxPool of an NHWC float32 x [n, h, w, c] into y [n, oh, ow, c]; pads top/left pt/pl
 * (the output size fixes the rest). */
void maxpool_nhwc_f32(const float *x, float *y, int64_t n, int64_t h, int64_t w, int64_t c,
                      int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t dh, int64_t dw, int64_t pt, int64_t pl, int n_threads);

/* shuffle.c: ChannelShuffle of `rows` rows of c contiguous float32 channels, group g (g | c):
 * y[r, j*g + i] = x[r, i*(c/g) + j]; x and y must not overlap. */
void channel_shuffle_f32(const float *x, float *y, int64_t rows, int64_t c, int64_t g,
                         int n_threads);

/* blas_pool.c: OpenBLAS's threading callback set (on) or cleared through its setter; 0 when not
 * set (no setter, or no OpenMP to lend). Counts of job sets run on an OpenMP team / plain
 * threads. */
int blas_pool_set(void *setter, int on);
void blas_pool_counts(int64_t *team, int64_t *threads);
/* Test hook: fn(thread number) called from each thread of an OpenMP team of n. */
void blas_pool_call_in_team(void (*fn)(int), int n);

/* e^t in float32 without libm, branch-free so every target clone vectorizes it, and v / (1 + e^t)
 * (the SiLU and tanh-Gelu core; e^t alone for the attention softmax), inlined into each
 * caller: t = k ln2 + r with k = round(t / ln2)
 * (the 1.5 * 2^23 rounding trick), ln2 split in a part exact in float32 and a low part, e^r by
 * a degree-6 Taylor polynomial on |r| <= ln2 / 2 (relative error below 2e-7), 2^k put in the
 * exponent bits. t is clamped to [-88, 89] as minps/maxps do (a NaN t becomes 89): below, e^t
 * is taken as 0; at 89, k = 128 makes 2^k +inf, so e^t overflows to inf beyond 88.72 as expf
 * does. A NaN v reaches the result through the division. */
#if defined(__GNUC__)
#define OW_INLINE static inline __attribute__((always_inline))
#else
#define OW_INLINE static inline
#endif

/* A vectorized loop's function built for the x86-64-v4 and -v3 levels too, picked at load
 * time (GCC 11+ on x86-64 Linux; elsewhere the one portable build): no -march flag is passed,
 * so a wheel built here runs on any CPU of the architecture. */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 11
#define OW_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OW_CLONES
#endif
OW_INLINE float ow_exp(float t) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693145751953125f,
                ln2_lo = 1.428606765330187e-06f, magic = 12582912.0f;
    t = t < 89.0f ? t : 89.0f;
    t = t > -88.0f ? t : -88.0f;
    float k = (t * log2e + magic) - magic;
    float r = t - k * ln2_hi;
    r = r - k * ln2_lo;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23; /* k is an integer in [-127, 128] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

OW_INLINE float ow_over_one_plus_exp(float v, float t) { return v / (1.0f + ow_exp(t)); }

/* Rows per block when a [rows, cols] pass is shared over threads: about 16k values a block. */
OW_INLINE int64_t ow_block_rows(int64_t rows, int64_t cols) {
    int64_t step = cols > 0 ? (16384 + cols - 1) / cols : rows;
    return step < 1 ? 1 : step;
}

/* Runs the statement(s) after `work` once per row block [r0, r1) of a [rows, cols] pass (r0 and
 * r1 in scope), the blocks shared over n_threads OpenMP threads when there is more than one
 * block and `work` (the pass's operation count) is at least 2^16: below that a fork costs more
 * than it saves. */
#ifdef _OPENMP
#define OW_OMP_ROW_BLOCKS \
    _Pragma("omp parallel for schedule(static) num_threads(ow_nt) if (ow_par)")
#else
#define OW_OMP_ROW_BLOCKS
#endif
#define OW_ROW_BLOCKS(rows, cols, n_threads, work, ...)                                      \
    do {                                                                                     \
        const int64_t ow_rows = (rows), ow_step = ow_block_rows(ow_rows, (cols)),            \
                      ow_nb = (ow_rows + ow_step - 1) / ow_step;                             \
        const int ow_nt = (n_threads), ow_par = ow_nt > 1 && ow_nb > 1 && (work) >= (1 << 16); \
        (void)ow_nt;                                                                         \
        (void)ow_par;                                                                        \
        OW_OMP_ROW_BLOCKS                                                                    \
        for (int64_t ow_q = 0; ow_q < ow_nb; ow_q++) {                                       \
            const int64_t r0 = ow_q * ow_step,                                               \
                          r1 = r0 + ow_step < ow_rows ? r0 + ow_step : ow_rows;                 \
            __VA_ARGS__;                                                                     \
        }                                                                                    \
    } while (0)

/* The output columns j of a row whose taps all lie inside the image along W (width wd, left
 * pad pl, stride sw, dilation dw, kw taps, ow columns): j*sw - pl >= 0 and
 * j*sw - pl + (kw-1)*dw < wd, as [*lo, *hi) (depthwise.c, grouped.c,
 * quantize.c). */
OW_INLINE void ow_inside_cols(int64_t wd, int64_t pl, int64_t sw, int64_t dw, int64_t kw,
                              int64_t ow, int64_t *lo, int64_t *hi) {
    int64_t jlo = (pl + sw - 1) / sw;
    int64_t span = wd + pl - (kw - 1) * dw; /* j*sw < span */
    int64_t jhi = span > 0 ? (span + sw - 1) / sw : 0;
    if (jlo < 0) jlo = 0;
    if (jhi > ow) jhi = ow;
    if (jlo > jhi) jlo = jhi;
    *lo = jlo;
    *hi = jhi;
}

/* 8 floats (GCC/Clang vector extension: one AVX register in the x86-64-v3/v4 clones, two SSE
 * registers in the baseline); unaligned loads and stores through memcpy (depthwise.c,
 * grouped.c). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

OW_INLINE v8f ld8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

OW_INLINE void st8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

/* The activation codes of opwarden.native.DW_ACTS (depthwise.c, grouped.c). NaN propagates
 * through every one (the comparisons are written so a NaN takes the pass-through branch), as
 * in the references. */
enum { A_NONE, A_RELU, A_CLIP, A_LEAKY, A_SIGMOID, A_HARDSWISH, A_TANH, A_GELU, A_GELU_TANH,
       A_SWISH };

/* The activation (opwarden.native.DW_ACTS codes) over a finished row of len floats (the switch outside the loops, so that
 * each piecewise one is a loop the compiler vectorizes). NaN takes the pass-through branch of
 * every comparison, as in the references. */
OW_INLINE void ow_act_row(float *yr, int64_t len, int act, float p0, float p1) {
    switch (act) {
    case A_NONE:
        return;
    case A_RELU:
        for (int64_t k = 0; k < len; k++) yr[k] = yr[k] < 0.0f ? 0.0f : yr[k];
        return;
    case A_CLIP:
        for (int64_t k = 0; k < len; k++) {
            float v = yr[k];
            yr[k] = v < p0 ? p0 : (v > p1 ? p1 : v);
        }
        return;
    case A_LEAKY:
        for (int64_t k = 0; k < len; k++) yr[k] = yr[k] < 0.0f ? yr[k] * p0 : yr[k];
        return;
    case A_HARDSWISH:
        for (int64_t k = 0; k < len; k++) {
            float v = yr[k], t = v * (1.0f / 6.0f) + 0.5f;
            t = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
            yr[k] = v * t;
        }
        return;
    case A_SWISH: {
        const float na = -p0;
        for (int64_t k = 0; k < len; k++) yr[k] = ow_over_one_plus_exp(yr[k], na * yr[k]);
        return;
    }
    case A_SIGMOID:
        for (int64_t k = 0; k < len; k++) yr[k] = 1.0f / (1.0f + expf(-yr[k]));
        return;
    case A_TANH:
        for (int64_t k = 0; k < len; k++) yr[k] = tanhf(yr[k]);
        return;
    case A_GELU:
        for (int64_t k = 0; k < len; k++)
            yr[k] = 0.5f * yr[k] * (1.0f + erff(yr[k] * 0.70710678118654752f));
        return;
    case A_GELU_TANH:
        for (int64_t k = 0; k < len; k++) {
            float v = yr[k], u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
            yr[k] = 0.5f * v * (1.0f + tanhf(u));
        }
        return;
    default:
        return;
    }
}

#endif
