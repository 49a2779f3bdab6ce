/* Grouped 2-D convolution over NHWC float32 with few channels per group (group > 1, not
 * depthwise), with the fused epilogue (bias, residual, activation).
 *
 * x [N, H, W, C], y [N, OH, OW, M], group g reads channels [g cg, (g+1) cg) of x and writes
 * [g mg, (g+1) mg) of y. Padding is implicit: taps reading outside the image are skipped. The
 * weights arrive repacked once on the Python side (conv_grouped.py), in one of two layouts:
 *  - wide (mg a multiple of 8): Wp[g][tap][ci][mg]. For a fixed (pixel, tap, ci) one x value
 *    is broadcast against a contiguous run of weights: a block of P pixels x 8, 16 or 24
 *    channels of sums stays in registers, each weight vector loaded once for the P pixels;
 *  - pair (mg 4, cg a multiple of 4, an even group count): Wp[g/2][tap][ci][g%2][4], one
 *    8-float vector holding the 4 outputs of two neighbouring groups. The 8 inputs
 *    x[g cg + ci0 .. + 4) and x[(g+1) cg + ci0 .. + 4) are loaded as one vector; an in-lane
 *    shuffle turns it into (x[g cg + ci] x 4, x[(g+1) cg + ci] x 4) for each ci of the four,
 *    so every lane does useful work where a 4-wide broadcast would leave half the vector idle.
 * Other shapes run a plain per-pixel loop (gc_pixel). Every output element is the same sum in
 * the same order on every path: bias + z first, then taps row by row, ci ascending.
 * A call computes a range of output rows (n, oh); the row function is built for x86-64-v3
 * and v4 too (OW_CLONES), the baseline staying portable.
 */
#include "native.h"

#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

typedef float v4f __attribute__((vector_size(16)));

/* (lo[0..3], hi[0..3]) as one vector: two groups' four inputs. (Two 16-byte memcpy into one
 * vector went through the stack: a store-forwarding stall per load, 1/3 the speed.) */
OW_INLINE v8f ld4x2(const float *lo, const float *hi) {
    v4f a, b;
    memcpy(&a, lo, 16);
    memcpy(&b, hi, 16);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7);
}

/* Lanes (v[k] x 4, v[4 + k] x 4): an in-lane shuffle (vpermilps on AVX). */
#if defined(__clang__)
#define SPLAT2(v, k) __builtin_shufflevector(v, v, k, k, k, k, k + 4, k + 4, k + 4, k + 4)
#else
#define SPLAT2(v, k) __builtin_shuffle(v, (v8i){k, k, k, k, k + 4, k + 4, k + 4, k + 4})
#endif

/* Pair layout: P pixels j0.. of row (n, r), groups 2 gp and 2 gp + 1. CHK (P 1 only): taps
 * outside the image along W are skipped (border pixels). */
OW_INLINE void gc_pair(const gc_args_t *a, int64_t n, int64_t r, int64_t j0, int64_t gp,
                       const int P, const int CHK) {
    const int64_t c = a->c, cg = a->cg, m = a->m;
    const int64_t o0 = ((n * a->oh + r) * a->ow + j0) * m + 8 * gp;
    const v8f zero = {0};
    const v8f b = a->bias ? ld8(a->bias + 8 * gp) : zero;
    v8f acc[8];
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) acc[p] = a->z ? b + ld8(a->z + o0 + p * m) : b;
    const int64_t xstep = a->sw * c, taps = a->kh * a->kw;
    const float *wg = a->wp + gp * taps * cg * 8;
    for (int64_t ta = 0; ta < a->kh; ta++) {
        int64_t ih = r * a->sh - a->pt + ta * a->dh;
        if (ih < 0 || ih >= a->h) continue;
        for (int64_t tb = 0; tb < a->kw; tb++) {
            int64_t iw = j0 * a->sw - a->pl + tb * a->dw;
            if (CHK && (iw < 0 || iw >= a->wd)) continue;
            const float *xp = a->x + ((n * a->h + ih) * a->wd + iw) * c + 2 * gp * cg;
            const float *wt = wg + (ta * a->kw + tb) * cg * 8;
            for (int64_t cb = 0; cb < cg; cb += 4) {
                const v8f w0 = ld8(wt + cb * 8), w1 = ld8(wt + cb * 8 + 8),
                          w2 = ld8(wt + cb * 8 + 16), w3 = ld8(wt + cb * 8 + 24);
#pragma GCC unroll 8
                for (int p = 0; p < P; p++) {
                    const float *xq = xp + p * xstep + cb;
                    v8f xv = cg == 4 ? ld8(xq) : ld4x2(xq, xq + cg);
                    acc[p] += SPLAT2(xv, 0) * w0;
                    acc[p] += SPLAT2(xv, 1) * w1;
                    acc[p] += SPLAT2(xv, 2) * w2;
                    acc[p] += SPLAT2(xv, 3) * w3;
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < P; p++) st8(a->y + o0 + p * m, acc[p]);
}

/* Wide layout: P pixels j0.. of row (n, r), group g, output channels [mb, mb + 8 V) of the
 * group. CHK as in gc_pair. */
OW_INLINE void gc_wide(const gc_args_t *a, int64_t n, int64_t r, int64_t j0, int64_t g,
                       int64_t mb, const int P, const int V, const int CHK) {
    const int64_t c = a->c, cg = a->cg, m = a->m, mg = a->mg;
    const int64_t o0 = ((n * a->oh + r) * a->ow + j0) * m + g * mg + mb;
    const v8f zero = {0};
    v8f acc[8][3], b[3];
#pragma GCC unroll 3
    for (int v = 0; v < V; v++) b[v] = a->bias ? ld8(a->bias + g * mg + mb + 8 * v) : zero;
#pragma GCC unroll 8
    for (int p = 0; p < P; p++)
#pragma GCC unroll 3
        for (int v = 0; v < V; v++)
            acc[p][v] = a->z ? b[v] + ld8(a->z + o0 + p * m + 8 * v) : b[v];
    const int64_t xstep = a->sw * c, taps = a->kh * a->kw;
    const float *wg = a->wp + g * taps * cg * mg + mb;
    for (int64_t ta = 0; ta < a->kh; ta++) {
        int64_t ih = r * a->sh - a->pt + ta * a->dh;
        if (ih < 0 || ih >= a->h) continue;
        for (int64_t tb = 0; tb < a->kw; tb++) {
            int64_t iw = j0 * a->sw - a->pl + tb * a->dw;
            if (CHK && (iw < 0 || iw >= a->wd)) continue;
            const float *xp = a->x + ((n * a->h + ih) * a->wd + iw) * c + g * cg;
            const float *wt = wg + (ta * a->kw + tb) * cg * mg;
            for (int64_t ci = 0; ci < cg; ci++) {
                v8f wv[3];
#pragma GCC unroll 3
                for (int v = 0; v < V; v++) wv[v] = ld8(wt + ci * mg + 8 * v);
#pragma GCC unroll 8
                for (int p = 0; p < P; p++) {
                    const v8f xs = zero + xp[p * xstep + ci];
#pragma GCC unroll 3
                    for (int v = 0; v < V; v++) acc[p][v] += xs * wv[v];
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < P; p++)
#pragma GCC unroll 3
        for (int v = 0; v < V; v++) st8(a->y + o0 + p * m + 8 * v, acc[p][v]);
}

/* Any shape (wide layout): output pixel (n, r, j), every group, every tap checked. The sums
 * build in y itself (z read first, at the same element, so y may be z). */
OW_INLINE void gc_pixel(const gc_args_t *a, int64_t n, int64_t r, int64_t j) {
    const int64_t c = a->c, cg = a->cg, m = a->m, mg = a->mg, taps = a->kh * a->kw;
    const int64_t o = ((n * a->oh + r) * a->ow + j) * m;
    float *yp = a->y + o;
    const float *zp = a->z ? a->z + o : 0;
    for (int64_t k = 0; k < m; k++) yp[k] = (a->bias ? a->bias[k] : 0.0f) + (zp ? zp[k] : 0.0f);
    for (int64_t g = 0; g < a->group; g++) {
        float *yg = yp + g * mg;
        for (int64_t ta = 0; ta < a->kh; ta++) {
            int64_t ih = r * a->sh - a->pt + ta * a->dh;
            if (ih < 0 || ih >= a->h) continue;
            for (int64_t tb = 0; tb < a->kw; tb++) {
                int64_t iw = j * a->sw - a->pl + tb * a->dw;
                if (iw < 0 || iw >= a->wd) continue;
                const float *xp = a->x + ((n * a->h + ih) * a->wd + iw) * c + g * cg;
                const float *wt = a->wp + (g * taps + ta * a->kw + tb) * cg * mg;
                for (int64_t ci = 0; ci < cg; ci++) {
                    const float xv = xp[ci];
                    for (int64_t k = 0; k < mg; k++) yg[k] += xv * wt[ci * mg + k];
                }
            }
        }
    }
}

/* A row's pixels on the register blocks: border pixels (taps outside the image along W) one
 * by one with the bounds checked, the inside ones in blocks of PB, then of 4, 2, 1 (a 7-wide
 * map has 5 inside pixels: no block of 6, and single pixels run at a fraction of a block's
 * speed, their few sums a chain of dependent multiply-adds). */
#define GC_SPAN(BLOCK, PB)                                                     \
    do {                                                                       \
        int64_t j = 0;                                                         \
        for (; j < jlo; j++) BLOCK(j, 1, 1);                                   \
        for (; j + (PB) <= jhi; j += (PB)) BLOCK(j, PB, 0);                    \
        if ((PB) > 4 && j + 4 <= jhi) { BLOCK(j, 4, 0); j += 4; }              \
        if ((PB) > 2 && j + 2 <= jhi) { BLOCK(j, 2, 0); j += 2; }              \
        for (; j < jhi; j++) BLOCK(j, 1, 0);                                   \
        for (; j < a->ow; j++) BLOCK(j, 1, 1);                                 \
    } while (0)

/* Pixels per register block: pair 8 (8 sums + 4 weights); wide with 16 channels 6 (12 sums
 * + 2 weights), with 24 channels 4 (12 + 3), with 8 channels 8. */
OW_CLONES
static void gc_row(const gc_args_t *a, int64_t n, int64_t r) {
    int64_t jlo, jhi;
    ow_inside_cols(a->wd, a->pl, a->sw, a->dw, a->kw, a->ow, &jlo, &jhi);
    if (a->pair) {
        for (int64_t gp = 0; gp < a->group / 2; gp++) {
#define B_PAIR(j, P, CHK) gc_pair(a, n, r, j, gp, P, CHK)
            GC_SPAN(B_PAIR, 8);
        }
    } else if (a->mg % 16 == 0) {
        for (int64_t g = 0; g < a->group; g++)
            for (int64_t mb = 0; mb < a->mg; mb += 16) {
#define B_W16(j, P, CHK) gc_wide(a, n, r, j, g, mb, P, 2, CHK)
                GC_SPAN(B_W16, 6);
            }
    } else if (a->mg % 24 == 0) {
        for (int64_t g = 0; g < a->group; g++)
            for (int64_t mb = 0; mb < a->mg; mb += 24) {
#define B_W24(j, P, CHK) gc_wide(a, n, r, j, g, mb, P, 3, CHK)
                GC_SPAN(B_W24, 4);
            }
    } else if (a->mg % 8 == 0) {
        for (int64_t g = 0; g < a->group; g++)
            for (int64_t mb = 0; mb < a->mg; mb += 8) {
#define B_W8(j, P, CHK) gc_wide(a, n, r, j, g, mb, P, 1, CHK)
                GC_SPAN(B_W8, 8);
            }
    } else {
        for (int64_t j = 0; j < a->ow; j++) gc_pixel(a, n, r, j);
    }
    ow_act_row(a->y + (n * a->oh + r) * a->ow * a->m, a->ow * a->m, a->act, a->p0, a->p1);
}

int grouped_nhwc_pair_ok(int64_t group, int64_t cg, int64_t mg) {
    return mg == 4 && cg % 4 == 0 && group % 2 == 0;
}

void grouped_nhwc_f32(const gc_args_t *a, int64_t q0, int64_t q1, int n_threads) {
    /* Output rows q0 .. q1-1 of the n*oh rows (the caller may share rows out itself). */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && (q1 - q0) * a->ow * a->m * a->cg * a->kh * a->kw >= 65536)
#endif
    for (int64_t q = q0; q < q1; q++) gc_row(a, q / a->oh, q % a->oh);
    (void)n_threads;
}
