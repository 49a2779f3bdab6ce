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

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__) && \
    __GNUC__ >= 11
#define Q_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define Q_CLONES
#endif

Q_CLONES void quantize_f32_8bit(const float *x, void *y, int64_t n, float scale, int32_t zp,
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

Q_CLONES void dequantize_8bit_f32(const void *x, float *y, int64_t n, float scale, int32_t zp,
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
Q_CLONES void qlinear_add_8bit(const void *x, const void *y, void *out, int64_t n, float rx,
                               float ry, float fixed, int is_signed) {
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
