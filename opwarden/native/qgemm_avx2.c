/* The exact 8-bit GEMM of qgemm.c on AVX2 (no VNNI), on the same packed panels.
 *
 * vpmaddubsw sums two u8 x s8 products in saturating int16, which is inexact for 8-bit data
 * (255 * 127 * 2 > 32767). Here the uint8 operand is first centred to int8 (v - 128), and
 * each product is formed as |x| * (y sign(x)) with x the centred value: |x| <= 128, and
 * |y sign(x)| <= 127 provided the int8 operand never holds -128 (vpsignb cannot negate it).
 * A pair then sums to at most 2 * 128 * 127 = 32512, so no int16 step saturates; vpmaddwd
 * by ones widens the pairs into int32 lanes of four products, the layout vpdpbusd fills.
 * The centring is undone exactly by adding 128 * (the int8 operand's sums over k), in the
 * same wrapping int32 arithmetic as the rest of the accumulator.
 *
 * qg_avx2_sums computes those sums once a call and refuses an int8 operand holding -128
 * (then qgemm_8bit runs the portable loop; the Python variants check first and keep such
 * operands on float BLAS). The epilogue is qg_store's arithmetic in 8-lane vectors.
 */
#include "native.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 9 || defined(__clang__))
#define QA_HAVE 1
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#define QA_MR 4   /* rows per register tile: 4 rows x 16 columns, 8 accumulators */
#define QA_KC 64  /* groups of 4 k per block of the inner dimension: 16 KiB of a panel */

int qg_cpu_avx2(void) {
#ifdef QA_HAVE
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2");
    }
    return known;
#else
    return 0;
#endif
}

/* corr[i] = 128 * sum over k of the int8 operand's line i (columns of the panels, or rows
 * with swap), wrapping; 0 if that operand holds -128 anywhere. */
int qg_avx2_sums(const qg_args_t *p, int32_t *corr) {
    int64_t groups = p->k / 4;
    if (p->swap) {
        for (int64_t r = 0; r < p->m; r++) {
            const int8_t *row = (const int8_t *)p->a + r * p->lda;
            int32_t s = 0, bad = 0;
            for (int64_t q = 0; q < p->k; q++) {
                s += row[q];
                bad |= row[q] == -128;
            }
            if (bad) return 0;
            corr[r] = (int32_t)((uint32_t)s * 128u);
        }
        return 1;
    }
    int64_t panels = (p->n + QG_NR - 1) / QG_NR;
    for (int64_t pn = 0; pn < panels; pn++) {
        const int8_t *b = (const int8_t *)p->bp + pn * groups * QG_NR * 4;
        int32_t s[QG_NR];
        int bad = 0;
        memset(s, 0, sizeof(s));
        for (int64_t g = 0; g < groups; g++) {
            const int8_t *e = b + g * QG_NR * 4;
            for (int j = 0; j < QG_NR * 4; j++) {
                s[j / 4] += e[j];
                bad |= e[j] == -128;
            }
        }
        if (bad) return 0;
        for (int j = 0; j < QG_NR; j++) corr[pn * QG_NR + j] = (int32_t)((uint32_t)s[j] * 128u);
    }
    return 1;
}

#ifdef QA_HAVE
#define QA_T __attribute__((target("avx2,fma")))

/* acc += |x| * (y sign(x)) summed over four k's, as int32 lanes. */
#define QA_DOT(acc, ax, sy) \
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones))

/* The 4 x 16 tile's set-up (rows past mr repeat row 0; the sums start from acc, row r at
 * acc + r QG_NR) and its write-back. */
#define QA_BEGIN                                                                              \
    const __m256i ones = _mm256_set1_epi16(1), bias = _mm256_set1_epi8((char)0x80);           \
    const uint8_t *r0 = a, *r1 = a + (mr > 1 ? 1 : 0) * lda, *r2 = a + (mr > 2 ? 2 : 0) * lda; \
    const uint8_t *r3 = a + (mr > 3 ? 3 : 0) * lda;                                           \
    __m256i *t = (__m256i *)acc;                                                              \
    __m256i c00 = _mm256_loadu_si256(t), c01 = _mm256_loadu_si256(t + 1);                     \
    __m256i c10 = _mm256_loadu_si256(t + 8), c11 = _mm256_loadu_si256(t + 9);                 \
    __m256i c20 = _mm256_loadu_si256(t + 16), c21 = _mm256_loadu_si256(t + 17);               \
    __m256i c30 = _mm256_loadu_si256(t + 24), c31 = _mm256_loadu_si256(t + 25);
#define QA_END                                                                                \
    _mm256_storeu_si256(t, c00); _mm256_storeu_si256(t + 1, c01);                             \
    _mm256_storeu_si256(t + 8, c10); _mm256_storeu_si256(t + 9, c11);                         \
    _mm256_storeu_si256(t + 16, c20); _mm256_storeu_si256(t + 17, c21);                       \
    _mm256_storeu_si256(t + 24, c30); _mm256_storeu_si256(t + 25, c31);

/* Rows uint8 (centred here), panels int8: tile[r][0..15] of one 16-column chunk. */
QA_T __attribute__((noinline)) static void qa_tile_us(const uint8_t *a, int64_t lda,
                                                     const uint8_t *bp, int64_t g0, int64_t g1,
                                                     int mr, int32_t *acc) {
    QA_BEGIN
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *bg = bp + g * QG_NR * 4;
        __m256i b0 = _mm256_loadu_si256((const __m256i *)bg);
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(bg + 32));
        int32_t v;
#define QA_ROW(R)                                                                             \
    {                                                                                         \
        memcpy(&v, r##R + 4 * g, 4);                                                          \
        __m256i x = _mm256_xor_si256(_mm256_set1_epi32(v), bias), ax = _mm256_abs_epi8(x);    \
        QA_DOT(c##R##0, ax, _mm256_sign_epi8(b0, x));                                         \
        QA_DOT(c##R##1, ax, _mm256_sign_epi8(b1, x));                                         \
    }
        QA_ROW(0) QA_ROW(1) QA_ROW(2) QA_ROW(3)
#undef QA_ROW
    }
    QA_END
}

/* Rows int8, panels uint8 (centred here): tile[r][0..15] of one 16-column chunk. */
QA_T __attribute__((noinline)) static void qa_tile_su(const uint8_t *a, int64_t lda,
                                                     const uint8_t *bp, int64_t g0, int64_t g1,
                                                     int mr, int32_t *acc) {
    QA_BEGIN
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *bg = bp + g * QG_NR * 4;
        __m256i x0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)bg), bias);
        __m256i x1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(bg + 32)), bias);
        __m256i a0 = _mm256_abs_epi8(x0), a1 = _mm256_abs_epi8(x1);
        int32_t v;
#define QA_ROW(R)                                                                             \
    {                                                                                         \
        memcpy(&v, r##R + 4 * g, 4);                                                          \
        __m256i w = _mm256_set1_epi32(v);                                                     \
        QA_DOT(c##R##0, a0, _mm256_sign_epi8(w, x0));                                         \
        QA_DOT(c##R##1, a1, _mm256_sign_epi8(w, x1));                                         \
    }
        QA_ROW(0) QA_ROW(1) QA_ROW(2) QA_ROW(3)
#undef QA_ROW
    }
    QA_END
}

/* qg_store for whole 8-column vectors (the rest of a row goes to qg_store): the same wrapping
 * integer terms, float32(acc) rounded to nearest, one float32 multiply (and add), rint as
 * round-to-nearest-even, max(f, lo) sending NaN to lo, then saturated packs (exact: the
 * values already lie in the output type's range). */
QA_T static void qa_store(const qg_args_t *p, int64_t m, int64_t n0, int cols, const int32_t *t,
                          int bias_safe) {
    int whole = p->mode == QG_OUT_Q8 && p->ibias && !bias_safe ? 0 : cols / 8 * 8;
    __m256i rc = _mm256_set1_epi32(p->rowc ? p->rowc[m] : 0);
    __m256i um = _mm256_set1_epi32(p->u ? p->u[m] : 0);
    __m256 sc1 = _mm256_set1_ps(p->mode == QG_OUT_I32 ? 0.0f
                                : p->scale[p->scale_idx == QG_PER_ROW ? m : 0]);
    int row_bias = p->bias_idx == QG_PER_ROW;
    __m256i ib1 = _mm256_set1_epi32(p->ibias && row_bias ? p->ibias[m] : 0);
    __m256 fb1 = _mm256_set1_ps(p->fbias && row_bias ? p->fbias[m] : 0.0f);
    float lo = p->out_signed ? -128.0f : 0.0f, hi = p->out_signed ? 127.0f : 255.0f;
    __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi), vzy = _mm256_set1_ps((float)p->zy);
    for (int j0 = 0; j0 < whole; j0 += 8) {
        int64_t n = n0 + j0;
        __m256i v = _mm256_loadu_si256((const __m256i *)(t + j0));
        if (p->rowc) v = _mm256_add_epi32(v, rc);
        if (p->colc) v = _mm256_add_epi32(v, _mm256_loadu_si256((const __m256i *)(p->colc + n)));
        if (p->u)
            v = _mm256_add_epi32(
                v, _mm256_mullo_epi32(um, _mm256_loadu_si256((const __m256i *)(p->v + n))));
        if (p->mode == QG_OUT_I32) {
            _mm256_storeu_si256((__m256i *)((int32_t *)p->out + m * p->ldo + n), v);
            continue;
        }
        __m256 sc = p->scale_idx == QG_PER_COL ? _mm256_loadu_ps(p->scale + n) : sc1;
        if (p->mode == QG_OUT_F32) {
            __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), sc);
            if (p->fbias) f = _mm256_add_ps(f, row_bias ? fb1 : _mm256_loadu_ps(p->fbias + n));
            _mm256_storeu_ps((float *)p->out + m * p->ldo + n, f);
            continue;
        }
        if (p->ibias)
            v = _mm256_add_epi32(
                v, row_bias ? ib1 : _mm256_loadu_si256((const __m256i *)(p->ibias + n)));
        __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), sc);
        f = _mm256_round_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        f = _mm256_add_ps(f, vzy);
        f = _mm256_min_ps(_mm256_max_ps(f, vlo), vhi);
        __m256i q = _mm256_cvttps_epi32(f);
        __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        __m128i b = p->out_signed ? _mm_packs_epi16(h, h) : _mm_packus_epi16(h, h);
        _mm_storel_epi64((__m128i *)((uint8_t *)p->out + m * p->ldo + n), b);
    }
    if (whole < cols) qg_store_row(p, m, n0 + whole, cols - whole, t + whole);
}

/* One job: rows [mb QG_MB, ...) against one panel, the inner dimension in blocks of QA_KC
 * groups so that a block of the panel (QA_KC x 256 bytes) stays in L1 while every 4-row tile of
 * the job runs over it; the sums wait in `tile` between blocks. */
QA_T void qg_job_avx2(const qg_args_t *p, int64_t mb, int64_t panel, int bias_safe,
                      const int32_t *corr) {
    int32_t tile[QG_MB * QG_NR];
    int64_t m0 = mb * QG_MB, m1 = (mb + 1) * QG_MB < p->m ? (mb + 1) * QG_MB : p->m;
    int64_t n0 = panel * QG_NR, groups = p->k / 4;
    int cols = (int)(p->n - n0 < QG_NR ? p->n - n0 : QG_NR);
    int chunks = (cols + 15) / 16;
    const uint8_t *bp = (const uint8_t *)p->bp + panel * groups * QG_NR * 4;
    memset(tile, 0, sizeof(int32_t) * (size_t)((m1 - m0) * QG_NR));
    for (int64_t g0 = 0; g0 < groups; g0 += QA_KC) {
        int64_t g1 = g0 + QA_KC < groups ? g0 + QA_KC : groups;
        for (int64_t m = m0; m < m1; m += QA_MR) {
            int mr = (int)(m1 - m < QA_MR ? m1 - m : QA_MR);
            const uint8_t *a = (const uint8_t *)p->a + m * p->lda;
            int32_t *acc = tile + (m - m0) * QG_NR;
            int32_t spare[QA_MR * QG_NR]; /* a short tile's rows past mr land here */
            if (mr < QA_MR) {
                memcpy(spare, acc, sizeof(int32_t) * (size_t)(mr * QG_NR));
                acc = spare;
            }
            for (int c = 0; c < chunks; c++) {
                if (p->swap)
                    qa_tile_su(a, p->lda, bp + 64 * c, g0, g1, mr, acc + 16 * c);
                else
                    qa_tile_us(a, p->lda, bp + 64 * c, g0, g1, mr, acc + 16 * c);
            }
            if (acc == spare)
                memcpy(tile + (m - m0) * QG_NR, spare, sizeof(int32_t) * (size_t)(mr * QG_NR));
        }
    }
    for (int64_t m = m0; m < m1; m++) {
        int32_t *t = tile + (m - m0) * QG_NR;
        /* undo the centring: + 128 * (row sum) or + 128 * (column sum), wrapping */
        for (int j = 0; j < cols; j++)
            t[j] = (int32_t)((uint32_t)t[j] + (uint32_t)(p->swap ? corr[m] : corr[n0 + j]));
        qa_store(p, m, n0, cols, t, bias_safe);
    }
}
#else
void qg_job_avx2(const qg_args_t *p, int64_t mb, int64_t panel, int bias_safe,
                 const int32_t *corr) {
    (void)p; (void)mb; (void)panel; (void)bias_safe; (void)corr;
}
#endif
