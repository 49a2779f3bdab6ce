/* A convolution's epilogue in one pass over its row-major float32 output [rows, cols]:
 * y = act(y + bias[col] + z), in place (the NumPy path makes one pass per term and two to
 * four per activation). The sums are formed in the NumPy path's order ((y + bias) + z, a term
 * left out when absent, so -0.0 stays -0.0), and the activations are written as the NumPy
 * kernels compute them (HardSwish divides by 6 as they do), so results match them bit for
 * bit; NaN fails every comparison and passes through. Swish (x sigmoid(alpha x), SiLU at
 * alpha 1) is v / (1 + e^(-alpha v)) on native.h's branch-free exponential, as the compiled
 * SiLU computes it (within 2e-7 relative of the reference), and Sigmoid as 1 / (1 + e^-v) on
 * the same exponential (within 4e-7 relative; NaN passes through). Rows are shared over OpenMP
 * threads for large outputs. Built for the x86-64-v3/v4 levels too (target_clones, as depthwise.c).
 */
#include "native.h"

/* Multiply-adds contract to FMA where the target has one (Swish's polynomial; the other
 * activations and the sums have no multiply feeding an add, so their results are unchanged). */
#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

#if defined(__GNUC__)
#define EP_INLINE static inline __attribute__((always_inline))
#else
#define EP_INLINE static inline
#endif

/* opwarden.native.EPILOGUE_ACTS */
enum { E_NONE, E_RELU, E_CLIP, E_LEAKY, E_HARDSWISH, E_SWISH, E_SIGMOID };

/* One row; hb/hz are constants at each call, so every combination compiles to its own loop
 * the compiler vectorizes. */
EP_INLINE void ep_row(float *yr, const float *b, const float *zr, int64_t cols, int hb, int hz,
                      int act, float p0, float p1) {
    switch (act) {
    case E_RELU:
        for (int64_t j = 0; j < cols; j++) {
            float v = yr[j];
            if (hb) v += b[j];
            if (hz) v += zr[j];
            yr[j] = v < 0.0f ? 0.0f : v;
        }
        return;
    case E_CLIP:
        for (int64_t j = 0; j < cols; j++) {
            float v = yr[j];
            if (hb) v += b[j];
            if (hz) v += zr[j];
            yr[j] = v < p0 ? p0 : (v > p1 ? p1 : v);
        }
        return;
    case E_LEAKY:
        for (int64_t j = 0; j < cols; j++) {
            float v = yr[j];
            if (hb) v += b[j];
            if (hz) v += zr[j];
            yr[j] = v < 0.0f ? v * p0 : v;
        }
        return;
    case E_HARDSWISH:
        for (int64_t j = 0; j < cols; j++) {
            float v = yr[j];
            if (hb) v += b[j];
            if (hz) v += zr[j];
            float t = v / 6.0f + 0.5f;
            t = t > 1.0f ? 1.0f : t;
            t = t < 0.0f ? 0.0f : t;
            yr[j] = v * t;
        }
        return;
    case E_SWISH:
        for (int64_t j = 0; j < cols; j++) {
            float v = yr[j];
            if (hb) v += b[j];
            if (hz) v += zr[j];
            yr[j] = ow_over_one_plus_exp(v, -p0 * v);
        }
        return;
    case E_SIGMOID:
        for (int64_t j = 0; j < cols; j++) {
            float v = yr[j];
            if (hb) v += b[j];
            if (hz) v += zr[j];
            float s = 1.0f / (1.0f + ow_exp(-v));
            yr[j] = v != v ? v : s; /* (ow_exp takes a NaN to 89: NaN passes here instead) */
        }
        return;
    default:
        for (int64_t j = 0; j < cols; j++) {
            float v = yr[j];
            if (hb) v += b[j];
            if (hz) v += zr[j];
            yr[j] = v;
        }
    }
}

OW_CLONES
static void ep_rows(float *y, const float *b, const float *z, int64_t r0, int64_t r1,
                    int64_t cols, int act, float p0, float p1) {
    for (int64_t r = r0; r < r1; r++) {
        float *yr = y + r * cols;
        const float *zr = z ? z + r * cols : 0;
        if (b && zr)
            ep_row(yr, b, zr, cols, 1, 1, act, p0, p1);
        else if (b)
            ep_row(yr, b, zr, cols, 1, 0, act, p0, p1);
        else if (zr)
            ep_row(yr, b, zr, cols, 0, 1, act, p0, p1);
        else
            ep_row(yr, b, zr, cols, 0, 0, act, p0, p1);
    }
}

void conv_epilogue_f32(float *y, const float *bias, const float *z, int64_t rows, int64_t cols,
                       int act, float p0, float p1, int n_threads) {
    OW_ROW_BLOCKS(rows, cols, n_threads, rows * cols,
                  ep_rows(y, bias, z, r0, r1, cols, act, p0, p1));
}
