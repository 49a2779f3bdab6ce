/* Swish / SiLU over float32: y = x * sigmoid(alpha * x) = x / (1 + e^(-alpha x)), one pass,
 * y may be x; e^t is native.h's ow_over_one_plus_exp (no libm call, vectorized). Built for the
 * x86-64-v3/v4 levels too (target_clones, as depthwise.c).
 */
#include "native.h"

#include <string.h>

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

OW_CLONES
void swish_f32(const float *x, float *y, int64_t n, float alpha) {
    for (int64_t i = 0; i < n; i++) y[i] = ow_over_one_plus_exp(x[i], -alpha * x[i]);
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
