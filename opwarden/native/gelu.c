/* Gelu over float32, one pass, optionally adding a bias row first: y = f(x + bias[i % cols]),
 * y may be x. The forms (GELU_ERF, GELU_TANH) and a plain erf (GELU_PLAIN_ERF):
 *
 * - erf form, x/2 (1 + erf(x / sqrt 2)), as the NumPy kernel (kernels/cpu/util.py
 *   _gelu_chunk) writes it, with its erf: u P(u^2) / Q(u^2) on |u| <= 3.9, the same
 *   float32 coefficients (a fit of erf(u)/u, relative error 1.8e-9 before float32 rounding),
 *   the quotient clamped to [-1, 1] and exactly +-1 at the clamp (so erf(+-inf) = +-1 and
 *   Gelu(-inf) = -inf * 0 = NaN, as in the reference). Evaluated here with FMAs, so it may
 *   differ from the NumPy pass by an ulp or two of erf; Horner and the division vectorize
 *   (no libm call in the loop).
 * - tanh form, x/2 (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3), computed as the equal
 *   x / (1 + e^(-2z)) (1 + tanh z = 2 / (1 + e^-2z)): one exponential and one division, and
 *   no cancellation in 1 + tanh(z) for negative x, so the tails keep their relative
 *   accuracy (the reference's 1 + tanh loses it there, by up to |x| 2^-25 absolutely).
 *   e^t is native.h's ow_over_one_plus_exp (relative error below 2e-7), t clamped to [-88, 89]: e^89
 *   overflows to inf, so -inf gives -inf / inf = NaN as the reference's -inf * 0 does.
 *
 * A NaN input reaches the output. Built for the
 * x86-64-v3/v4 levels too (target_clones, as silu.c).
 */
#include "native.h"

#include <string.h>

#if defined(__GNUC__)
#define GELU_INLINE static inline __attribute__((always_inline))
#else
#define GELU_INLINE static inline
#endif

/* y may be x (same index read before written): tell GCC so, or its runtime alias check
 * would send the in-place call, the common one, to the scalar loop. */
#if defined(__GNUC__) && !defined(__clang__)
#define GELU_IVDEP _Pragma("GCC ivdep")
#elif defined(__clang__)
#define GELU_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#else
#define GELU_IVDEP
#endif

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

#define ERF_CLAMP 3.9f

GELU_INLINE float erf_rational(float u) {
    float a = u > ERF_CLAMP ? ERF_CLAMP : u;
    a = a < -ERF_CLAMP ? -ERF_CLAMP : a;
    float t = a * a;
    float p = -1.2675257288208286e-08f;
    p = p * t + 4.5861556827730965e-06f;
    p = p * t + 0.0003758871171157807f;
    p = p * t + 0.0038349484093487263f;
    p = p * t + 0.05422070249915123f;
    p = p * t + 0.18510589003562927f;
    p = p * t + 1.1283793449401855f;
    float q = 6.218258931767195e-05f;
    q = q * t + 0.0012996160658076406f;
    q = q * t + 0.015419595874845982f;
    q = q * t + 0.11384444683790207f;
    q = q * t + 0.49737921357154846f;
    q = q * t + 1.0f;
    float r = (a * p) / q;
    r = r > 1.0f ? 1.0f : r;
    r = r < -1.0f ? -1.0f : r;
    r = a >= ERF_CLAMP ? 1.0f : r;
    r = a <= -ERF_CLAMP ? -1.0f : r;
    return r;
}

GELU_INLINE float gelu_erf1(float v) {
    float e = erf_rational(v * 0.70710678118654752f);
    return v * (0.5f * e + 0.5f);
}

GELU_INLINE float gelu_tanh1(float v) {
    /* t = -2z = -2 sqrt(2/pi) v (1 + 0.044715 v^2) */
    float t = (-1.5957691216057308f * v) * (0.044715f * (v * v) + 1.0f);
    return ow_over_one_plus_exp(v, t);
}

/* One contiguous run: y[i] = f(x[i] + b[i]) (b NULL: f(x[i]); adding 0 would turn -0 into
 * +0). Separate loops per form and per bias keep each one branch-free for the vectorizer. */
OW_CLONES
void gelu_run_f32(const float *x, float *y, const float *b, int64_t n, int mode) {
    if (mode == GELU_ERF && b) {
        GELU_IVDEP
        for (int64_t i = 0; i < n; i++) y[i] = gelu_erf1(x[i] + b[i]);
    } else if (mode == GELU_ERF) {
        GELU_IVDEP
        for (int64_t i = 0; i < n; i++) y[i] = gelu_erf1(x[i]);
    } else if (mode == GELU_TANH && b) {
        GELU_IVDEP
        for (int64_t i = 0; i < n; i++) y[i] = gelu_tanh1(x[i] + b[i]);
    } else if (mode == GELU_TANH) {
        GELU_IVDEP
        for (int64_t i = 0; i < n; i++) y[i] = gelu_tanh1(x[i]);
    } else {
        GELU_IVDEP
        for (int64_t i = 0; i < n; i++) y[i] = erf_rational(x[i]);
    }
}

void gelu_f32(const float *x, float *y, const float *bias, int64_t cols, int64_t lo, int64_t hi,
              int mode) {
    if (!bias) {
        gelu_run_f32(x + lo, y + lo, NULL, hi - lo, mode);
        return;
    }
    /* a span may start and end inside a row: one run per (part of a) row */
    for (int64_t i = lo; i < hi;) {
        int64_t j = i % cols, len = cols - j < hi - i ? cols - j : hi - i;
        gelu_run_f32(x + i, y + i, bias + j, len, mode);
        i += len;
    }
}

/* gelu_f32 over blocks of [lo, hi) on up to n_threads OpenMP threads (large spans only, as
 * silu.c). Elementwise, so the result does not depend on the split. */
void gelu_f32_threads(const float *x, float *y, const float *bias, int64_t cols, int64_t lo,
                      int64_t hi, int mode, int n_threads) {
    const int64_t block = 1 << 14, n = hi - lo, n_blocks = (n + block - 1) / block;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && n >= (1 << 16))
#endif
    for (int64_t b = 0; b < n_blocks; b++) {
        int64_t a = lo + b * block, e = a + block < hi ? a + block : hi;
        gelu_f32(x, y, bias, cols, a, e, mode);
    }
    (void)n_threads;
}
