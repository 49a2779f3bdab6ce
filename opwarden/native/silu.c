/* Swish / SiLU over float32: y = x * sigmoid(alpha * x), one pass, y may be x.
 *
 * e^t comes from a polynomial the compiler vectorizes (no libm call in the loop): t = k ln2 + r
 * with k = round(t / ln2) (the 1.5 * 2^23 rounding trick, exact in float32 arithmetic), ln2
 * split in a high part exact in float32 and a low part, e^r by a degree-6 Taylor polynomial on
 * |r| <= ln2 / 2 (relative error below 2e-7), 2^k put in the exponent bits. t is clamped to
 * [-88, 89]: below, e^t is taken as 0 (sigmoid is 1 within float32); at 89, k = 128 makes 2^k
 * +inf, so e^t overflows to inf beyond 88.72 as expf does, sigmoid is then exactly 0 and
 * -inf * sigmoid(-inf) is NaN as in the reference. A NaN x reaches the output through the final
 * x / (1 + e^t). The loop has no branches, so it vectorizes without AVX512's masks. Built for the x86-64-v3/v4 levels too
 * (target_clones, as depthwise.c).
 */
#include "native.h"

#include <string.h>

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 11
#define SILU_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SILU_CLONES
#endif

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

SILU_CLONES
void swish_f32(const float *x, float *y, int64_t n, float alpha) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693145751953125f,
                ln2_lo = 1.428606765330187e-06f, magic = 12582912.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float t = -alpha * v;
        /* (a < b ? a : b) is minps exactly, so the loop needs no masks on AVX2; a NaN t
         * becomes 89 here, and the output is still NaN since v is. */
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
        /* k is an integer in [-127, 128] (t is never NaN here). */
        int32_t ki = (int32_t)k;
        int32_t bits = (ki + 127) << 23;
        float scale;
        memcpy(&scale, &bits, sizeof scale);
        y[i] = v / (1.0f + p * scale);
    }
}

/* swish_f32 over blocks of the n floats on up to n_threads OpenMP threads (large tensors
 * only: a region's wake-up costs more than a small one takes). Elementwise, so the result
 * does not depend on the split. */
void swish_f32_threads(const float *x, float *y, int64_t n, float alpha, int n_threads) {
    const int64_t block = 1 << 14, n_blocks = (n + block - 1) / block;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && n >= (1 << 16))
#endif
    for (int64_t b = 0; b < n_blocks; b++) {
        int64_t lo = b * block, len = n - lo < block ? n - lo : block;
        swish_f32(x + lo, y + lo, len, alpha);
    }
    (void)n_threads;
}
