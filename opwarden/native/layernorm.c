/* LayerNormalization over the rows of a row-major float32 [rows, cols] array: per row the
 * mean, the two-pass variance (of the float32 deviations x - mean, as the NumPy kernel and
 * the reference), inv = 1 / sqrt(var + eps), and y = (x - mean) * inv * scale + bias, in
 * three passes over a row that stays in L1/L2.
 *
 * The sums accumulate in double, in eight lanes summed in a fixed order at the end, so the
 * result is the same on every SIMD level (and the OpenMP split is by rows: the same on any
 * thread count); the NumPy kernel's float32 BLAS and einsum sums are the less accurate of the
 * two, so the two agree to the NumPy rounding. Built for the x86-64-v3/v4 levels too
 * (target_clones, as silu.c).
 */
#include "native.h"

#include <math.h>

#if defined(__GNUC__) && !defined(__clang__)
#define LN_IVDEP _Pragma("GCC ivdep")
#elif defined(__clang__)
#define LN_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define LN_IVDEP
#endif

#define LN_LANES 8

/* One row: its mean and 1/std into *mean_out, *inv_out, y the normalized row (y may be x). */
OW_CLONES
void layernorm_row_f32(const float *x, float *y, const float *scale, const float *bias,
                       int64_t cols, float eps, float *mean_out, float *inv_out) {
    double acc[LN_LANES] = {0};
    int64_t j = 0;
    for (; j + LN_LANES <= cols; j += LN_LANES)
        for (int k = 0; k < LN_LANES; k++) acc[k] += (double)x[j + k];
    double s = 0.0;
    for (int k = 0; k < LN_LANES; k++) s += acc[k];
    for (; j < cols; j++) s += (double)x[j];
    const float m = (float)(s / (double)cols);

    for (int k = 0; k < LN_LANES; k++) acc[k] = 0.0;
    j = 0;
    for (; j + LN_LANES <= cols; j += LN_LANES)
        for (int k = 0; k < LN_LANES; k++) {
            double d = (double)(x[j + k] - m);
            acc[k] += d * d;
        }
    s = 0.0;
    for (int k = 0; k < LN_LANES; k++) s += acc[k];
    for (; j < cols; j++) {
        double d = (double)(x[j] - m);
        s += d * d;
    }
    float v = (float)(s / (double)cols) + eps;
    const float inv = 1.0f / sqrtf(v);
    *mean_out = m;
    *inv_out = inv;

    /* separate rounding steps, as the NumPy kernel: ((x - m) * inv) * scale + bias */
    if (scale && bias) {
        LN_IVDEP
        for (j = 0; j < cols; j++) {
            float t = (x[j] - m) * inv;
            t = t * scale[j];
            y[j] = t + bias[j];
        }
    } else if (scale) {
        LN_IVDEP
        for (j = 0; j < cols; j++) {
            float t = (x[j] - m) * inv;
            y[j] = t * scale[j];
        }
    } else if (bias) {
        LN_IVDEP
        for (j = 0; j < cols; j++) {
            float t = (x[j] - m) * inv;
            y[j] = t + bias[j];
        }
    } else {
        LN_IVDEP
        for (j = 0; j < cols; j++) y[j] = (x[j] - m) * inv;
    }
}

void layernorm_f32(const float *x, float *y, const float *scale, const float *bias,
                   int64_t rows, int64_t cols, float eps, float *mean, float *inv, int64_t r0,
                   int64_t r1, int n_threads) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && (r1 - r0) > 1 && (r1 - r0) * cols >= (1 << 16))
#endif
    for (int64_t r = r0; r < r1; r++)
        layernorm_row_f32(x + r * cols, y + r * cols, scale, bias, cols, eps, mean + r,
                          inv + r);
    (void)rows;
    (void)n_threads;
}
