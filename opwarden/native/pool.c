/* MaxPool over NHWC float32 (2-D; any kernel, strides, dilations and pads): each output pixel
 * folds its in-image taps along C, unit stride in x and y, which the compiler vectorizes;
 * padding cells are skipped rather than read (a pad holds the identity, -inf). Output rows
 * (n, r) are shared over OpenMP threads. The NumPy path folds the same taps (kernels/cpu/pool.py)
 * and NaN propagates as np.maximum propagates it: a NaN tap makes the result NaN. Built for the
 * x86-64-v3/v4 levels too (target_clones).
 */
#include "native.h"

#include <math.h>

/* Channels per register block: the running maxima of 32 channels stay in registers across all
 * taps (folding into y in memory re-read and re-wrote it once per tap: half the speed). */
#define MP_CB 32

OW_INLINE float mp_max(float m, float v) { return (v > m) | (v != v) ? v : m; }

/* Channels [k0, k0 + len) of output pixel (n, r, j); len a constant MP_CB or the remainder. */
OW_INLINE void mp_pixel(const float *x, float *yp, int64_t k0, int64_t len, int64_t n,
                        int64_t r, int64_t j, int64_t h, int64_t w, int64_t c, int64_t kh,
                        int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                        int64_t pl) {
    float acc[MP_CB];
    for (int64_t k = 0; k < len; k++) acc[k] = -INFINITY;
    for (int64_t a = 0; a < kh; a++) {
        const int64_t ih = r * sh - pt + a * dh;
        if (ih < 0 || ih >= h) continue;
        for (int64_t b = 0; b < kw; b++) {
            const int64_t iw = j * sw - pl + b * dw;
            if (iw < 0 || iw >= w) continue;
            const float *xp = x + ((n * h + ih) * w + iw) * c + k0;
            for (int64_t k = 0; k < len; k++) acc[k] = mp_max(acc[k], xp[k]);
        }
    }
    for (int64_t k = 0; k < len; k++) yp[k0 + k] = acc[k];
}

OW_CLONES
static void maxpool_rows(const float *x, float *y, int64_t r0, int64_t r1, int64_t h, int64_t w,
                         int64_t c, int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh,
                         int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl) {
    for (int64_t q = r0; q < r1; q++) {
        const int64_t n = q / oh, r = q % oh;
        for (int64_t j = 0; j < ow; j++) {
            float *yp = y + ((n * oh + r) * ow + j) * c;
            int64_t k0 = 0;
            for (; k0 + MP_CB <= c; k0 += MP_CB)
                mp_pixel(x, yp, k0, MP_CB, n, r, j, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl);
            if (k0 < c)
                mp_pixel(x, yp, k0, c - k0, n, r, j, h, w, c, kh, kw, sh, sw, dh, dw, pt, pl);
        }
    }
}

void maxpool_nhwc_f32(const float *x, float *y, int64_t n, int64_t h, int64_t w, int64_t c,
                      int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                      int64_t dh, int64_t dw, int64_t pt, int64_t pl, int n_threads) {
    OW_ROW_BLOCKS(n * oh, ow * c, n_threads, n * oh * ow * c * kh * kw,
                  maxpool_rows(x, y, r0, r1, h, w, c, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl));
}
