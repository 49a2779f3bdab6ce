/* The softmax rows of a block of attention scores (kernels/cpu/attention.py), in two passes
 * instead of NumPy's eight: s = c * s + b0 + b1 with the row maximum, then e^(s - max) in place
 * with the row sum, and inv = 1 / sum (the caller scales the (rows, Hv) product by it).
 *
 * Rows are (head, row) pairs of an n x m block; a bias is read at bias + head * hs + row * rs
 * (strides in floats, 0 where it broadcasts), its columns contiguous. A row holding a NaN
 * score, or without a finite maximum (all -inf), comes out NaN through e^NaN, as the
 * reference's exp(-inf - -inf) (whether the maximum skips a NaN does not matter: the NaN
 * makes the row's sum NaN). e^t is native.h's ow_exp; the maximum and the sum
 * are OpenMP simd reductions (vector lanes, then combined).
 */
#include "native.h"

#include <math.h>

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

/* s = c * s + b0 + b1 over one row (b0, b1 NULL when absent); returns the row maximum. */
static inline float scale_max(float *restrict s, int64_t t, float c, const float *restrict b0,
                              const float *restrict b1) {
    if (b0 != NULL && b1 != NULL) {
        for (int64_t j = 0; j < t; j++) s[j] = s[j] * c + b0[j] + b1[j];
    } else if (b0 != NULL) {
        for (int64_t j = 0; j < t; j++) s[j] = s[j] * c + b0[j];
    } else {
        for (int64_t j = 0; j < t; j++) s[j] *= c;
    }
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < t; j++) m = s[j] > m ? s[j] : m;
    return m;
}

/* s = e^(s - m) in place; returns the row sum. */
static inline float exp_sum(float *restrict s, int64_t t, float m) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < t; j++) {
        float d = s[j] - m;
        float e = ow_exp(d);
        e = d == d ? e : d; /* NaN stays NaN (ow_exp clamps it to a finite t) */
        s[j] = e;
        sum += e;
    }
    return sum;
}

OW_CLONES
void softmax_rows_f32(float *s, int64_t n, int64_t m, int64_t t, float c, const float *b0,
                      int64_t b0_hs, int64_t b0_rs, const float *b1, int64_t b1_hs,
                      int64_t b1_rs, float *inv) {
    for (int64_t h = 0; h < n; h++)
        for (int64_t r = 0; r < m; r++) {
            float *row = s + (h * m + r) * t;
            const float *p0 = b0 != NULL ? b0 + h * b0_hs + r * b0_rs : NULL;
            const float *p1 = b1 != NULL ? b1 + h * b1_hs + r * b1_rs : NULL;
            float mx = scale_max(row, t, c, p0, p1);
            inv[h * m + r] = 1.0f / exp_sum(row, t, mx);
        }
}
