/* QuantizeLinear / DequantizeLinear of float32 <-> 8 bits with per-tensor parameters, one
 * pass each, with the NumPy variants' (kernels/cpu/quant_linear.py) float steps:
 *   quantize:   saturate(rint(x / scale) + zp), NaN to the type's minimum;
 *   dequantize: float(x - zp) * scale.
 * The division is IEEE float32 division (vectorized the same), rint rounds half to even;
 * clamping after adding the zero point equals the reference's clamping before rounding (its
 * bounds are integers, and |x / scale| past 2**23 saturates either way). No FMA contraction.
 * The loops are written for the compiler to vectorize; on x86-64 Linux they are also built
 * for the x86-64-v3 / v4 levels and picked at load time. */
#include "native.h"

#include <math.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

OW_CLONES void quantize_f32_8bit(const float *x, void *y, int64_t n, float scale, int32_t zp,
                                int out_signed) {
    float lo = out_signed ? -128.0f : 0.0f, hi = out_signed ? 127.0f : 255.0f, z = (float)zp;
    if (out_signed) {
        int8_t *o = (int8_t *)y;
        for (int64_t i = 0; i < n; i++) {
            float f = rintf(x[i] / scale) + z;
            f = f >= lo ? f : lo; /* NaN fails the test: the minimum */
            f = f <= hi ? f : hi;
            o[i] = (int8_t)(int32_t)f;
        }
    } else {
        uint8_t *o = (uint8_t *)y;
        for (int64_t i = 0; i < n; i++) {
            float f = rintf(x[i] / scale) + z;
            f = f >= lo ? f : lo;
            f = f <= hi ? f : hi;
            o[i] = (uint8_t)(int32_t)f;
        }
    }
}

OW_CLONES void dequantize_8bit_f32(const void *x, float *y, int64_t n, float scale, int32_t zp,
                                  int in_signed) {
    if (in_signed) {
        const int8_t *s = (const int8_t *)x;
        for (int64_t i = 0; i < n; i++) y[i] = (float)((int32_t)s[i] - zp) * scale;
    } else {
        const uint8_t *s = (const uint8_t *)x;
        for (int64_t i = 0; i < n; i++) y[i] = (float)((int32_t)s[i] - zp) * scale;
    }
}

/* com.microsoft QLinearAdd of two same-shape 8-bit tensors as the reference computes it:
 * r = fma32(x, rx, fma32(y, ry, fixed)), each fma32 a float64 multiply-add of float32
 * operands rounded once to float32, then rint and saturation (NaN to the minimum). x is the
 * operand the caller names first (ORT's broadcaster order). */
OW_CLONES static void qlinear_add_f64(const void *x, const void *y, void *out, int64_t n,
                                     float rx, float ry, float fixed, int is_signed) {
    float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
    for (int64_t i = 0; i < n; i++) {
        double xv = is_signed ? (double)((const int8_t *)x)[i] : (double)((const uint8_t *)x)[i];
        double yv = is_signed ? (double)((const int8_t *)y)[i] : (double)((const uint8_t *)y)[i];
        float inner = (float)(yv * (double)ry + (double)fixed);
        float f = rintf((float)(xv * (double)rx + (double)inner));
        f = f >= lo ? f : lo;
        f = f <= hi ? f : hi;
        if (is_signed)
            ((int8_t *)out)[i] = (int8_t)(int32_t)f;
        else
            ((uint8_t *)out)[i] = (uint8_t)(int32_t)f;
    }
}

/* The same with float32 FMAs (16 lanes where the float64 loop has 8, and half the operations).
 * Only called where qadd_fma_exact holds, so the results are the float64 loop's bit for bit. */
#define QADD_FMA_LOOP(T)                                                         \
    for (int64_t i = 0; i < n; i++) {                                            \
        float inner = __builtin_fmaf((float)((const T *)y)[i], ry, fixed);       \
        float f = rintf(__builtin_fmaf((float)((const T *)x)[i], rx, inner));    \
        f = f >= lo ? f : lo;                                                    \
        f = f <= hi ? f : hi;                                                    \
        ((T *)out)[i] = (T)(int32_t)f;                                           \
    }

OW_CLONES static void qlinear_add_fma(const void *x, const void *y, void *out, int64_t n,
                                     float rx, float ry, float fixed, int is_signed) {
    float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
    if (is_signed) {
        QADD_FMA_LOOP(int8_t)
    } else {
        QADD_FMA_LOOP(uint8_t)
    }
}

/* The bit positions a finite nonzero float32 v spans: its leading bit 2**top and its unit in
 * the last place 2**lsb (subnormals included). */
static void f32_bits(float v, int *top, int *lsb) {
    int e;
    (void)frexpf(v, &e); /* |v| = m 2**e, 0.5 <= m < 1 */
    *top = e - 1;
    *lsb = e - 24 > -149 ? e - 24 : -149;
}

/* Is a * i + b exact in float64 for every integer |i| < 256, float32 a and b? Then rounding it
 * to float32 (the float64 emulation) is one rounding of the exact value, which is what a float32
 * FMA computes. i a is a multiple of a's last place and below 2**(top(a) + 9); the sum a multiple
 * of the smaller last place and below twice the larger bound: it fits 53 bits when the leading
 * bit and the smallest last place are at most 52 apart. */
static int fma_exact(float a, float b) {
    int ta = 0, la = 0, tb = 0, lb = 0;
    if (!isfinite(a) || !isfinite(b)) return 0;
    if (a == 0.0f || b == 0.0f) return 1; /* a product of two floats or one float: exact */
    f32_bits(a, &ta, &la);
    f32_bits(b, &tb, &lb);
    ta += 8;
    int top = (ta > tb ? ta : tb) + 1, lsb = la < lb ? la : lb;
    return top - lsb <= 52;
}

/* May qlinear_add_fma stand for qlinear_add_f64 with these terms? The inner sum y ry + fixed
 * must be exact, and the outer x rx + inner for every inner value the 256 y values give. */
static int qadd_fma_exact(float rx, float ry, float fixed, int is_signed) {
    if (!fma_exact(ry, fixed)) return 0;
    int first = is_signed ? -128 : 0;
    for (int v = first; v < first + 256; v++) /* (the inner sum is exact: one rounding) */
        if (!fma_exact(rx, (float)((double)v * (double)ry + (double)fixed))) return 0;
    return 1;
}

static int has_fast_fma(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma");
#elif defined(__aarch64__) || defined(FP_FAST_FMAF)
    return 1;
#else
    return 0; /* fmaf would be a library call an element */
#endif
}

void qlinear_add_8bit(const void *x, const void *y, void *out, int64_t n, float rx, float ry,
                      float fixed, int is_signed) {
    static int fast = -1;
    if (fast < 0) fast = has_fast_fma();
    if (fast && qadd_fma_exact(rx, ry, fixed, is_signed))
        qlinear_add_fma(x, y, out, n, rx, ry, fixed, is_signed);
    else
        qlinear_add_f64(x, y, out, n, rx, ry, fixed, is_signed);
}

/* The integer GEMM's requantization in one pass (the NumPy path makes five over a float32
 * copy): for a row-major [rows, cols] exact accumulator (float32 or float64 integers),
 *   v = bias ? float32(float64(acc) + bias[ch]) : float32(acc)   (exact sum, one rounding)
 *   out = saturate(rint(v * mult[ch]) + zf), NaN to the type's minimum,
 * with ch = row % period, or the column where per_col; a one-value mult passes period 1.
 * The product is one float32 multiply (no FMA: fp-contract is off above), the clamp is to the
 * type's bounds less the zero point before rounding (the same, the bounds being integers), as
 * quant_linear._finish computes it, so the results are its bit for bit. */
#define RQ_BODY(A, T)                                                                  \
    for (int64_t j = 0; j < cols; j++) {                                               \
        int64_t c = per_col ? j : 0;                                                   \
        float v = bias ? (float)((double)((const A *)ar)[j] + (double)bias[ch + c])    \
                       : (float)((const A *)ar)[j];                                    \
        float f = v * mult[ch + c];                                                    \
        f = f >= lo_b ? f : lo_b;                                                      \
        f = f <= hi_b ? f : hi_b;                                                      \
        ((T *)orow)[j] = (T)(int32_t)(rintf(f) + zf);                                  \
    }

OW_CLONES static void requantize_rows(const void *acc, int acc_f64, const int32_t *bias,
                                      const float *mult, int64_t r0, int64_t r1, int64_t cols,
                                      int64_t period, int per_col, float zf, int out_signed,
                                      void *out) {
    float lo_b = (out_signed ? -128.0f : 0.0f) - zf, hi_b = (out_signed ? 127.0f : 255.0f) - zf;
    for (int64_t r = r0; r < r1; r++) {
        int64_t ch = per_col ? 0 : r % period;
        const char *ar = (const char *)acc + r * cols * (acc_f64 ? 8 : 4);
        char *orow = (char *)out + r * cols;
        if (acc_f64 && out_signed) {
            RQ_BODY(double, int8_t)
        } else if (acc_f64) {
            RQ_BODY(double, uint8_t)
        } else if (out_signed) {
            RQ_BODY(float, int8_t)
        } else {
            RQ_BODY(float, uint8_t)
        }
    }
}

void requantize_8bit(const void *acc, int acc_f64, const int32_t *bias, const float *mult,
                     int64_t rows, int64_t cols, int64_t period, int per_col, float zf,
                     int out_signed, void *out, int n_threads) {
    OW_ROW_BLOCKS(rows, cols, n_threads, rows * cols,
                  requantize_rows(acc, acc_f64, bias, mult, r0, r1, cols, period, per_col, zf,
                                  out_signed, out));
}

/* The float32 im2col columns of one 8-bit image [c, h, w] for the exact float-BLAS
 * QLinearConv (kernels/cpu/quant.py), centered on the zero point and padded in one pass:
 *   cols[(ci kh + i) kw + j][oy ow + ox] = x[ci][iy][ix] - zp, 0 outside the image
 * (iy = oy sh - pt + i dh, ix = ox sw - pl + j dw), the padding being the zero point itself.
 * Each value is an integer below 2**9, exact in float32. Rows are shared over threads. */
#define IM2COL_ROW(T)                                                                  \
    for (int64_t oy = 0; oy < oh; oy++) {                                              \
        float *o = dst + oy * ow;                                                      \
        int64_t iy = oy * sh - pt + i * dh;                                            \
        if (iy < 0 || iy >= h) {                                                       \
            for (int64_t ox = 0; ox < ow; ox++) o[ox] = 0.0f;                          \
            continue;                                                                  \
        }                                                                              \
        const T *src = (const T *)x + (ci * h + iy) * w;                               \
        for (int64_t ox = 0; ox < lo; ox++) o[ox] = 0.0f;                              \
        if (sw == 1) {                                                                 \
            const T *s0 = src + (lo - pl + j * dw);                                    \
            for (int64_t ox = lo; ox < hi; ox++) o[ox] = (float)s0[ox - lo] - zp;      \
        } else {                                                                       \
            for (int64_t ox = lo; ox < hi; ox++)                                       \
                o[ox] = (float)src[ox * sw - pl + j * dw] - zp;                        \
        }                                                                              \
        for (int64_t ox = hi; ox < ow; ox++) o[ox] = 0.0f;                             \
    }

OW_CLONES static void qim2col_row(const void *x, int is_signed, int64_t ci, int64_t i,
                                  int64_t j, int64_t h, int64_t w, int64_t sh, int64_t sw,
                                  int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh,
                                  int64_t ow, float zp, float *dst) {
    /* the output columns whose tap lands inside the row, lo <= ox < hi: one tap of left pad
     * pl - j dw */
    int64_t lo, hi;
    ow_inside_cols(w, pl - j * dw, sw, dw, 1, ow, &lo, &hi);
    if (is_signed) {
        IM2COL_ROW(int8_t)
    } else {
        IM2COL_ROW(uint8_t)
    }
}

void qconv_im2col_f32(const void *x, int is_signed, int64_t c, int64_t h, int64_t w,
                      int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                      int64_t pt, int64_t pl, int64_t oh, int64_t ow, float zp, float *cols,
                      int n_threads) {
    const int64_t rows = c * kh * kw;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && rows > 1 && rows * oh * ow >= (1 << 16))
#endif
    for (int64_t r = 0; r < rows; r++) {
        int64_t ci = r / (kh * kw), i = (r / kw) % kh, j = r % kw;
        qim2col_row(x, is_signed, ci, i, j, h, w, sh, sw, dh, dw, pt, pl, oh, ow, zp,
                    cols + r * oh * ow);
    }
    (void)n_threads;
}
