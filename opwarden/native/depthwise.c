/* Depthwise 2-D convolution over NHWC float32, with the fused epilogue (bias, residual,
 * activation) applied to each output pixel while it is still in L1.
 *
 * x [N, H, W, C], taps [kh, kw, C] (W's (C, 1, kh, kw) transposed once on the Python side),
 * y [N, OH, OW, C]. Padding is implicit: taps reading outside the image are skipped, so no
 * padded copy is made. A call computes a range of output rows (n, oh), on OpenMP threads or
 * one (the Python side shares ranges out over its own threads); the inner loop runs
 * along C, unit stride in x, taps and y, which the compiler vectorizes. On x86-64 Linux the
 * row function is also built for the x86-64-v3 (AVX2 + FMA) and v4 (AVX-512) levels and picked
 * at load time (target_clones), the baseline build staying portable.
 */
#include "native.h"

#include <math.h>
#include <string.h>

/* (By ISA level, not CPU name: "arch=haswell" resolves by the vendor's model and leaves AMD
 * CPUs with AVX2 on the baseline.) */
/* Multiply-adds contract to FMA where the target has one (ISO C modes keep them apart). */
#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

/* Inlined into each clone of dw_row, so that they are compiled for its instruction set. */
#if defined(__GNUC__)
#define DW_INLINE static inline __attribute__((always_inline))
#else
#define DW_INLINE static inline
#endif

/* Channels per register block and output pixels per block in the interior path: 4 pixels
 * x 16 channels of accumulators stay in registers across all the taps, and each tap's weight
 * vector is loaded once for the 4 pixels. */
#define CB 16
#define PB 4

/* yp[k] = act(yp[k]) for k in [0, len): ow_act_row (native.h), the switch outside the loops so
 * that each piecewise activation is a loop the compiler vectorizes (a per-element switch kept
 * HardSwish scalar: a third of the Relu blocks' speed on MobileNetV3's layers). */
DW_INLINE void dw_act_run(float *yp, int64_t len, const dw_args_t *a) {
    ow_act_row(yp, len, a->act, a->p0, a->p1);
}

/* Output pixel (n, r, j), channels [c0, c1), every tap checked against the image bounds. The
 * residual and bias are read before any tap is added, so Y may be written in place over Z
 * (FusedConv's alias): yp and zp may then be the same pointer. */
DW_INLINE void dw_pixel(const dw_args_t *a, int64_t n, int64_t r, int64_t j, int64_t c0,
                     int64_t c1) {
    const int64_t c = a->c, o = ((n * a->oh + r) * a->ow + j) * c;
    float *yp = a->y + o;
    const float *zp = a->z ? a->z + o : 0;
    for (int64_t k = c0; k < c1; k++)
        yp[k] = (zp ? zp[k] : 0.0f) + (a->bias ? a->bias[k] : 0.0f);
    for (int64_t ta = 0; ta < a->kh; ta++) {
        int64_t ih = r * a->sh - a->pt + ta * a->dh;
        if (ih < 0 || ih >= a->h) continue;
        for (int64_t tb = 0; tb < a->kw; tb++) {
            int64_t iw = j * a->sw - a->pl + tb * a->dw;
            if (iw < 0 || iw >= a->w) continue;
            const float *xp = a->x + ((n * a->h + ih) * a->w + iw) * c;
            const float *wp = a->taps + (ta * a->kw + tb) * c;
            for (int64_t k = c0; k < c1; k++) yp[k] += xp[k] * wp[k];
        }
    }
    dw_act_run(yp + c0, c1 - c0, a);
}

/* m ? x : y lane by lane (m from a vector comparison: all ones or all zeros per lane). */
DW_INLINE v8f sel8(v8i m, v8f x, v8f y) { return (v8f)((m & (v8i)x) | (~m & (v8i)y)); }

/* Whether dw_vact applies `act` in registers: the piecewise activations. (A 16-float run of
 * dw_act_run stayed scalar, with a branch per element that random signs mispredict: a block
 * with HardSwish took 5x one without.) */
DW_INLINE int dw_vact_ok(int act) {
    return act == A_NONE || act == A_RELU || act == A_CLIP || act == A_LEAKY ||
           act == A_HARDSWISH;
}

/* ow_act_row's piecewise cases on 8 lanes, for the codes dw_vact_ok accepts; the same operations in the same order
 * as ow_act_row, and a NaN lane fails every comparison, so it passes through as there. */
DW_INLINE v8f dw_vact(v8f v, const dw_args_t *a) {
    const v8f zero = {0}, one = zero + 1.0f;
    switch (a->act) {
    case A_RELU:
        return sel8(v < zero, zero, v);
    case A_CLIP: {
        const v8f lo = zero + a->p0, hi = zero + a->p1;
        return sel8(v < lo, lo, sel8(v > hi, hi, v));
    }
    case A_LEAKY:
        return sel8(v < zero, v * a->p0, v);
    case A_HARDSWISH: {
        v8f t = v * (1.0f / 6.0f) + 0.5f;
        t = sel8(t < zero, zero, sel8(t > one, one, t));
        return v * t;
    }
    default:
        return v;
    }
}

/* PB output pixels j0 .. j0+PB-1 of row (n, r) whose taps all lie inside the image along W,
 * channels [cb, cb + CB): PB x CB accumulators in registers, each tap's weights loaded once
 * for the PB pixels. */
DW_INLINE void dw_block(const dw_args_t *a, int64_t n, int64_t r, int64_t j0, int64_t cb) {
    const int64_t c = a->c;
    v8f acc[PB][2];
    const int64_t o0 = ((n * a->oh + r) * a->ow + j0) * c + cb;
    const v8f zero = {0};
    v8f b0 = a->bias ? ld8(a->bias + cb) : zero, b1 = a->bias ? ld8(a->bias + cb + 8) : zero;
    for (int p = 0; p < PB; p++) {
        acc[p][0] = b0;
        acc[p][1] = b1;
        if (a->z) {
            acc[p][0] += ld8(a->z + o0 + p * c);
            acc[p][1] += ld8(a->z + o0 + p * c + 8);
        }
    }
    const int64_t xstep = a->sw * c;
    for (int64_t ta = 0; ta < a->kh; ta++) {
        int64_t ih = r * a->sh - a->pt + ta * a->dh;
        if (ih < 0 || ih >= a->h) continue;
        const float *xrow = a->x + ((n * a->h + ih) * a->w + j0 * a->sw - a->pl) * c + cb;
        const float *wrow = a->taps + ta * a->kw * c + cb;
        for (int64_t tb = 0; tb < a->kw; tb++) {
            const float *xp = xrow + tb * a->dw * c;
            v8f w0 = ld8(wrow + tb * c), w1 = ld8(wrow + tb * c + 8);
            for (int p = 0; p < PB; p++) {
                acc[p][0] += ld8(xp + p * xstep) * w0;
                acc[p][1] += ld8(xp + p * xstep + 8) * w1;
            }
        }
    }
    const int in_regs = dw_vact_ok(a->act);
    for (int p = 0; p < PB; p++) {
        float *yp = a->y + o0 + p * c;
        if (in_regs) {
            acc[p][0] = dw_vact(acc[p][0], a);
            acc[p][1] = dw_vact(acc[p][1], a);
        }
        st8(yp, acc[p][0]);
        st8(yp + 8, acc[p][1]);
        if (!in_regs) dw_act_run(yp, CB, a);
    }
}

/* Stride SW (1 or 2) and dilation 1 along W, kw = KW (constants at each call): PB1 pixels
 * j0.. of row (n, r), channels [cb, cb + 8), all taps inside along W. Each input column is
 * loaded once per kernel row and used for every pixel whose window covers it, the row's KW
 * weight vectors stay in registers: SW (PB1 - 1) + KW + KW loads per PB1 * KW multiply-adds,
 * where dw_block loads each tap's input again for each pixel (~1 load per multiply-add). Per
 * pixel the taps are still added in dw_block's order, so the sums are the same bits. */
#define PB1 8

DW_INLINE void dw_block_s1(const dw_args_t *a, int64_t n, int64_t r, int64_t j0, int64_t cb,
                           const int KW, const int SW) {
    const int64_t c = a->c;
    const int64_t o0 = ((n * a->oh + r) * a->ow + j0) * c + cb;
    const v8f zero = {0};
    v8f acc[PB1];
    v8f b = a->bias ? ld8(a->bias + cb) : zero;
#pragma GCC unroll 8
    for (int p = 0; p < PB1; p++) acc[p] = a->z ? b + ld8(a->z + o0 + p * c) : b;
    for (int64_t ta = 0; ta < a->kh; ta++) {
        int64_t ih = r * a->sh - a->pt + ta * a->dh;
        if (ih < 0 || ih >= a->h) continue;
        const float *xrow = a->x + ((n * a->h + ih) * a->w + j0 * SW - a->pl) * c + cb;
        const float *wrow = a->taps + ta * KW * c + cb;
        v8f wv[7];
#pragma GCC unroll 7
        for (int tb = 0; tb < KW; tb++) wv[tb] = ld8(wrow + tb * c);
#pragma GCC unroll 21
        for (int q = 0; q < SW * (PB1 - 1) + KW; q++) {
            v8f xv = ld8(xrow + q * c);
#pragma GCC unroll 8
            for (int p = 0; p < PB1; p++) {
                int tb = q - SW * p;
                if (tb >= 0 && tb < KW) acc[p] += xv * wv[tb];
            }
        }
    }
    const int in_regs = dw_vact_ok(a->act);
#pragma GCC unroll 8
    for (int p = 0; p < PB1; p++) {
        float *yp = a->y + o0 + p * c;
        st8(yp, in_regs ? dw_vact(acc[p], a) : acc[p]);
        if (!in_regs) dw_act_run(yp, 8, a);
    }
}

/* The pixels [j, jhi) of a row on dw_block_s1 where it applies (returns the first pixel not
 * done): channel tails past the last 8 on dw_pixel. */
DW_INLINE int64_t dw_row_s1(const dw_args_t *a, int64_t n, int64_t r, int64_t j, int64_t jhi,
                            const int KW, const int SW) {
    const int64_t c = a->c, c8 = c - c % 8;
    for (; j + PB1 <= jhi; j += PB1) {
        for (int64_t cb = 0; cb < c8; cb += 8) dw_block_s1(a, n, r, j, cb, KW, SW);
        if (c8 < c)
            for (int p = 0; p < PB1; p++) dw_pixel(a, n, r, j + p, c8, c);
    }
    return j;
}

DW_INLINE void dw_row_body(const dw_args_t *a, int64_t n, int64_t r) {
    const int64_t c = a->c, cfull = c - c % CB;
    int64_t jlo, jhi; /* pixels with every tap inside along W */
    ow_inside_cols(a->w, a->pl, a->sw, a->dw, a->kw, a->ow, &jlo, &jhi);
    int64_t j = 0;
    for (; j < jlo; j++) dw_pixel(a, n, r, j, 0, c);
    if (a->sw == 1 && a->dw == 1 && c >= 8) {
        if (a->kw == 3)
            j = dw_row_s1(a, n, r, j, jhi, 3, 1);
        else if (a->kw == 5)
            j = dw_row_s1(a, n, r, j, jhi, 5, 1);
        else if (a->kw == 7)
            j = dw_row_s1(a, n, r, j, jhi, 7, 1);
    } else if (a->sw == 2 && a->dw == 1 && c >= 8 && c % CB) {
        /* (stride 2 reuses fewer loads: dw_block is as fast where the channels fill its
         * 16-wide blocks; here they do not, and its tail would run pixel by pixel) */
        if (a->kw == 3)
            j = dw_row_s1(a, n, r, j, jhi, 3, 2);
        else if (a->kw == 5)
            j = dw_row_s1(a, n, r, j, jhi, 5, 2);
    }
    for (; j + PB <= jhi; j += PB) {
        for (int64_t cb = 0; cb < cfull; cb += CB) dw_block(a, n, r, j, cb);
        if (cfull < c)
            for (int p = 0; p < PB; p++) dw_pixel(a, n, r, j + p, cfull, c);
    }
    for (; j < a->ow; j++) dw_pixel(a, n, r, j, 0, c);
}

/* Output row (n, r). Swish is applied to the finished row while it is in L1/L2, one long
 * loop at the clone's full vector width (per 16-channel block, or in 8-lane registers, the
 * exponential and division ran at half the standalone SiLU's speed or less). */
OW_CLONES
static void dw_row(const dw_args_t *a, int64_t n, int64_t r) {
    dw_args_t b;
    const dw_args_t *use = a;
    if (a->act == A_SWISH) { /* (one inlined body for both) */
        b = *a;
        b.act = A_NONE;
        use = &b;
    }
    dw_row_body(use, n, r);
    if (use == a) return;
    float *yr = a->y + (n * a->oh + r) * a->ow * a->c;
    const int64_t len = a->ow * a->c;
    const float na = -a->p0;
    for (int64_t k = 0; k < len; k++) yr[k] = ow_over_one_plus_exp(yr[k], na * yr[k]);
}

void depthwise_nhwc_f32(const dw_args_t *a, int64_t q0, int64_t q1, int n_threads) {
    /* Output rows q0 .. q1-1 of the n*oh rows (the caller may share rows out itself). */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && (q1 - q0) * a->ow * a->c * a->kh * a->kw >= 65536)
#endif
    for (int64_t q = q0; q < q1; q++) dw_row(a, q / a->oh, q % a->oh);
    (void)n_threads;
}
