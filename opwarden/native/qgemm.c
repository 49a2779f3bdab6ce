/* 8-bit integer GEMM with an exact int32 accumulator, and the epilogues the quantized
 * operators need (int32 out, float rescale, requantize to 8 bits).
 *
 * Rows: [M, K] (row stride lda), uint8, or int8 with `swap`. Columns: packed once per operand
 * into panels of QG_NR columns: panel p, group g of 4 k's holds QG_NR * 4 bytes, column j at
 * [4 j + r] = B[4 g + r, p QG_NR + j]; int8 panels against uint8 rows, uint8 against int8.
 * The accumulator is sum_k row * col plus the zero-point terms the caller supplies (colc[n] +
 * rowc[m] + u[m] v[n]: the expansion of sum (row - zr)(col - zc)), all in int32 arithmetic
 * that wraps modulo 2**32 as a 32-bit accumulator does, so it equals the exact integer sum
 * whenever that fits int32 (any K up to 33025 for 8-bit operands), as onnxruntime's does.
 *
 * The products run on AVX512-VNNI (vpdpbusd: four u8 * s8 products summed into each int32
 * lane, no intermediate saturation) where the CPU has it, chosen at run time; elsewhere a
 * portable loop with the same integer arithmetic. The epilogue's float steps are the NumPy
 * reference's: float(acc) rounded to nearest, one float32 multiply, one float32 add, no FMA
 * contraction; requantization rounds half to even (rintf) and saturates, NaN to the minimum.
 */
#include "native.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#define QG_MR 6   /* rows per register tile */

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 9 || defined(__clang__))
#define QG_HAVE_VNNI 1
#include <immintrin.h>
#endif

#if defined(__GNUC__)
#define QG_INLINE static inline __attribute__((always_inline))
#else
#define QG_INLINE static inline
#endif

/* The group of 4 bytes at k0 of a row (fewer at the tail, zero-filled). */
QG_INLINE int32_t qg_load4(const uint8_t *p, int64_t k0, int64_t k) {
    int32_t v = 0;
    int64_t n = k - k0 < 4 ? k - k0 : 4;
    memcpy(&v, p + k0, (size_t)n);
    return v;
}

/* tile[r][j] = sum_k row r [k] * panel [k, j] for r < mr, portable. */
static void qg_tile_generic(const uint8_t *a, int64_t lda, const uint8_t *bp, int64_t k, int mr,
                            int swap, int32_t *tile) {
    int64_t groups = (k + 3) / 4;
    memset(tile, 0, sizeof(int32_t) * QG_MR * QG_NR);
    for (int r = 0; r < mr; r++) {
        int32_t *t = tile + r * QG_NR;
        const uint8_t *ar = a + r * lda;
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *bg = bp + g * QG_NR * 4;
            int32_t av[4] = {0, 0, 0, 0};
            for (int q = 0; q < 4 && 4 * g + q < k; q++)
                av[q] = swap ? (int32_t)(int8_t)ar[4 * g + q] : (int32_t)ar[4 * g + q];
            if (swap) {
                for (int j = 0; j < QG_NR; j++)
                    t[j] += av[0] * bg[4 * j] + av[1] * bg[4 * j + 1] + av[2] * bg[4 * j + 2] +
                            av[3] * bg[4 * j + 3];
            } else {
                const int8_t *sb = (const int8_t *)bg;
                for (int j = 0; j < QG_NR; j++)
                    t[j] += av[0] * sb[4 * j] + av[1] * sb[4 * j + 1] + av[2] * sb[4 * j + 2] +
                            av[3] * sb[4 * j + 3];
            }
        }
    }
}

/* The epilogue of row m, columns n0..n0+cols-1 (t: their raw sums). */
QG_INLINE void qg_store(const qg_args_t *p, int64_t m, int64_t n0, int cols, const int32_t *t) {
    int32_t v[QG_NR];
    uint32_t rc = p->rowc ? (uint32_t)p->rowc[m] : 0u;
    for (int j = 0; j < cols; j++) v[j] = (int32_t)((uint32_t)t[j] + rc);
    if (p->colc)
        for (int j = 0; j < cols; j++)
            v[j] = (int32_t)((uint32_t)v[j] + (uint32_t)p->colc[n0 + j]);
    if (p->u) {
        uint32_t um = (uint32_t)p->u[m];
        for (int j = 0; j < cols; j++)
            v[j] = (int32_t)((uint32_t)v[j] + um * (uint32_t)p->v[n0 + j]);
    }
    if (p->mode == QG_OUT_I32) {
        memcpy((int32_t *)p->out + m * p->ldo + n0, v, sizeof(int32_t) * (size_t)cols);
        return;
    }
    float sc[QG_NR];
    for (int j = 0; j < cols; j++)
        sc[j] = p->scale[p->scale_idx == QG_PER_COL ? n0 + j
                                                    : (p->scale_idx == QG_PER_ROW ? m : 0)];
    if (p->mode == QG_OUT_F32) {
        float *y = (float *)p->out + m * p->ldo + n0;
        if (p->fbias) {
            for (int j = 0; j < cols; j++) {
                float f = (float)v[j] * sc[j];
                y[j] = f + p->fbias[p->bias_idx == QG_PER_ROW ? m : n0 + j];
            }
        } else {
            for (int j = 0; j < cols; j++) y[j] = (float)v[j] * sc[j];
        }
        return;
    }
    /* QG_OUT_Q8: saturate(rint(float(acc + bias) * scale) + zy) */
    float f[QG_NR];
    if (p->ibias) {
        for (int j = 0; j < cols; j++)
            f[j] = (float)((int64_t)v[j] +
                           p->ibias[p->bias_idx == QG_PER_ROW ? m : n0 + j]);
    } else {
        for (int j = 0; j < cols; j++) f[j] = (float)v[j];
    }
    float zy = (float)p->zy, lo = p->out_signed ? -128.0f : 0.0f;
    float hi = p->out_signed ? 127.0f : 255.0f;
    for (int j = 0; j < cols; j++) {
        float g = rintf(f[j] * sc[j]) + zy;
        f[j] = g >= lo ? (g <= hi ? g : hi) : lo; /* NaN fails both tests: the minimum */
    }
    if (p->out_signed) {
        int8_t *y = (int8_t *)p->out + m * p->ldo + n0;
        for (int j = 0; j < cols; j++) y[j] = (int8_t)(int32_t)f[j];
    } else {
        uint8_t *y = (uint8_t *)p->out + m * p->ldo + n0;
        for (int j = 0; j < cols; j++) y[j] = (uint8_t)(int32_t)f[j];
    }
}

void qg_store_row(const qg_args_t *p, int64_t m, int64_t n0, int cols, const int32_t *t) {
    qg_store(p, m, n0, cols, t);
}

/* One job: rows [mb QG_MB, ...) against one panel; `tile_fn` computes a register tile. */
#define QG_JOB_BODY(TILE)                                                                     \
    int32_t tile[QG_MR * QG_NR];                                                              \
    int64_t m1 = (mb + 1) * QG_MB < p->m ? (mb + 1) * QG_MB : p->m;                           \
    int64_t n0 = panel * QG_NR;                                                               \
    int cols = (int)(p->n - n0 < QG_NR ? p->n - n0 : QG_NR);                                  \
    const uint8_t *bp = (const uint8_t *)p->bp + panel * ((p->k + 3) / 4) * QG_NR * 4;        \
    for (int64_t m = mb * QG_MB; m < m1; m += QG_MR) {                                        \
        int mr = (int)(m1 - m < QG_MR ? m1 - m : QG_MR);                                      \
        const uint8_t *a = (const uint8_t *)p->a + m * p->lda;                                \
        TILE;                                                                                 \
        for (int r = 0; r < mr; r++) qg_store(p, m + r, n0, cols, tile + r * QG_NR);          \
    }

static void qg_job_generic(const qg_args_t *p, int64_t mb, int64_t panel) {
    QG_JOB_BODY(qg_tile_generic(a, p->lda, bp, p->k, mr, p->swap, tile))
}

#ifdef QG_HAVE_VNNI
#define QG_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

/* SWAP 0: broadcast u8 row bytes times s8 panel vectors; 1: s8 rows times u8 panels. */
#define QG_DP(c, row, col, SWAP) \
    ((SWAP) ? _mm512_dpbusd_epi32((c), (col), (row)) : _mm512_dpbusd_epi32((c), (row), (col)))

/* One group of 4 k's for row R: its 4 bytes (v##R) broadcast against the 4 panel vectors. */
#define QG_ROW_STEP(R, SWAP)                                                                  \
    {                                                                                         \
        __m512i va = _mm512_set1_epi32(v##R);                                                 \
        c##R##0 = QG_DP(c##R##0, va, b0, SWAP);                                               \
        c##R##1 = QG_DP(c##R##1, va, b1, SWAP);                                               \
        c##R##2 = QG_DP(c##R##2, va, b2, SWAP);                                               \
        c##R##3 = QG_DP(c##R##3, va, b3, SWAP);                                               \
    }
#define QG_GROUP(bg, SWAP)                                                                    \
    {                                                                                         \
        __m512i b0 = _mm512_loadu_si512((const void *)(bg));                                  \
        __m512i b1 = _mm512_loadu_si512((const void *)((bg) + 64));                           \
        __m512i b2 = _mm512_loadu_si512((const void *)((bg) + 128));                          \
        __m512i b3 = _mm512_loadu_si512((const void *)((bg) + 192));                          \
        QG_ROW_STEP(0, SWAP) QG_ROW_STEP(1, SWAP) QG_ROW_STEP(2, SWAP)                        \
        QG_ROW_STEP(3, SWAP) QG_ROW_STEP(4, SWAP) QG_ROW_STEP(5, SWAP)                        \
    }
#define QG_DECL(R)                                                                            \
    __m512i c##R##0 = _mm512_setzero_si512(), c##R##1 = c##R##0, c##R##2 = c##R##0,           \
            c##R##3 = c##R##0;                                                                \
    const uint8_t *r##R = a + (R < mr ? R : 0) * lda; /* rows past mr repeat row 0 */
#define QG_LOAD(R) memcpy(&v##R, r##R + 4 * g, 4);
#define QG_PUT(R)                                                                             \
    if (R < mr) {                                                                             \
        _mm512_storeu_si512((void *)(tile + R * QG_NR), c##R##0);                             \
        _mm512_storeu_si512((void *)(tile + R * QG_NR + 16), c##R##1);                        \
        _mm512_storeu_si512((void *)(tile + R * QG_NR + 32), c##R##2);                        \
        _mm512_storeu_si512((void *)(tile + R * QG_NR + 48), c##R##3);                        \
    }

/* A 6 x 64 register tile: 24 accumulators, 4 panel vectors and a broadcast. */
#define QG_TILE_VNNI(NAME, SWAP)                                                              \
    QG_VNNI __attribute__((noinline)) static void NAME(const uint8_t *a, int64_t lda, const uint8_t *bp, int64_t k,  \
                                int mr, int32_t *tile) {                                      \
        QG_DECL(0) QG_DECL(1) QG_DECL(2) QG_DECL(3) QG_DECL(4) QG_DECL(5)                     \
        int32_t v0, v1, v2, v3, v4, v5;                                                       \
        for (int64_t g = 0; g < k / 4; g++) { /* k is a multiple of 4 */                       \
            QG_LOAD(0) QG_LOAD(1) QG_LOAD(2) QG_LOAD(3) QG_LOAD(4) QG_LOAD(5)                 \
            QG_GROUP(bp + g * QG_NR * 4, SWAP)                                                \
        }                                                                                     \
        QG_PUT(0) QG_PUT(1) QG_PUT(2) QG_PUT(3) QG_PUT(4) QG_PUT(5)                           \
    }

QG_TILE_VNNI(qg_tile_vnni_us, 0)
QG_TILE_VNNI(qg_tile_vnni_su, 1)

/* qg_store in 16-lane vectors: the same integer terms (wrapping adds and multiplies), the
 * same float steps (cvtepi32_ps rounds to nearest as the C conversion does; roundscale to
 * nearest even is rintf; max(f, lo) sends NaN to lo). A vector whose int32 bias add would
 * overflow (where the scalar path adds in int64) goes to qg_store. */
QG_VNNI static void qg_store_avx512(const qg_args_t *p, int64_t m, int64_t n0, int cols,
                                    const int32_t *t, int bias_safe) {
    if (p->mode == QG_OUT_I32) {
        qg_store(p, m, n0, cols, t);
        return;
    }
    __m512i rc = _mm512_set1_epi32(p->rowc ? p->rowc[m] : 0);
    __m512i um = _mm512_set1_epi32(p->u ? p->u[m] : 0);
    __m512 sc1 = _mm512_set1_ps(p->scale[p->scale_idx == QG_PER_ROW ? m : 0]);
    int row_bias = p->bias_idx == QG_PER_ROW;
    __m512i ib1 = _mm512_set1_epi32(p->ibias && row_bias ? p->ibias[m] : 0);
    __m512 fb1 = _mm512_set1_ps(p->fbias && row_bias ? p->fbias[m] : 0.0f);
    float lo = p->out_signed ? -128.0f : 0.0f, hi = p->out_signed ? 127.0f : 255.0f;
    __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi), vzy = _mm512_set1_ps((float)p->zy);
    for (int j0 = 0; j0 < cols; j0 += 16) {
        int w = cols - j0 < 16 ? cols - j0 : 16;
        __mmask16 mk = (__mmask16)((1u << w) - 1u);
        int64_t n = n0 + j0;
        __m512i v = _mm512_maskz_loadu_epi32(mk, t + j0);
        if (p->rowc) v = _mm512_add_epi32(v, rc);
        if (p->colc) v = _mm512_add_epi32(v, _mm512_maskz_loadu_epi32(mk, p->colc + n));
        if (p->u)
            v = _mm512_add_epi32(v, _mm512_mullo_epi32(um, _mm512_maskz_loadu_epi32(mk, p->v + n)));
        __m512 sc = p->scale_idx == QG_PER_COL ? _mm512_maskz_loadu_ps(mk, p->scale + n) : sc1;
        if (p->mode == QG_OUT_F32) {
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), sc);
            if (p->fbias)
                f = _mm512_add_ps(f, row_bias ? fb1 : _mm512_maskz_loadu_ps(mk, p->fbias + n));
            _mm512_mask_storeu_ps((float *)p->out + m * p->ldo + n, mk, f);
            continue;
        }
        if (p->ibias && bias_safe) {
            v = _mm512_add_epi32(v, row_bias ? ib1 : _mm512_maskz_loadu_epi32(mk, p->ibias + n));
        } else if (p->ibias) {
            __m512i b = row_bias ? ib1 : _mm512_maskz_loadu_epi32(mk, p->ibias + n);
            __m512i sum = _mm512_add_epi32(v, b);
            __m512i ovf = _mm512_and_si512(_mm512_xor_si512(v, sum), _mm512_xor_si512(b, sum));
            if (_mm512_mask_cmplt_epi32_mask(mk, ovf, _mm512_setzero_si512())) {
                int32_t raw[16];
                _mm512_storeu_si512((void *)raw, _mm512_maskz_loadu_epi32(mk, t + j0));
                qg_store(p, m, n, w, raw);
                continue;
            }
            v = sum;
        }
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), sc);
        f = _mm512_roundscale_ps(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        f = _mm512_add_ps(f, vzy);
        f = _mm512_min_ps(_mm512_max_ps(f, vlo), vhi);
        __m512i q = _mm512_cvttps_epi32(f);
        _mm512_mask_cvtepi32_storeu_epi8((uint8_t *)p->out + m * p->ldo + n, mk, q);
    }
}

static void qg_job_vnni(const qg_args_t *p, int64_t mb, int64_t panel, int bias_safe) {
    int32_t tile[QG_MR * QG_NR];
    int64_t m1 = (mb + 1) * QG_MB < p->m ? (mb + 1) * QG_MB : p->m;
    int64_t n0 = panel * QG_NR;
    int cols = (int)(p->n - n0 < QG_NR ? p->n - n0 : QG_NR);
    const uint8_t *bp = (const uint8_t *)p->bp + panel * ((p->k + 3) / 4) * QG_NR * 4;
    for (int64_t m = mb * QG_MB; m < m1; m += QG_MR) {
        int mr = (int)(m1 - m < QG_MR ? m1 - m : QG_MR);
        const uint8_t *a = (const uint8_t *)p->a + m * p->lda;
        if (p->swap)
            qg_tile_vnni_su(a, p->lda, bp, p->k, mr, tile);
        else
            qg_tile_vnni_us(a, p->lda, bp, p->k, mr, tile);
        for (int r = 0; r < mr; r++)
            qg_store_avx512(p, m + r, n0, cols, tile + r * QG_NR, bias_safe);
    }
}

static int qg_cpu_vnni(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vnni");
    }
    return known;
}
#endif

int qgemm_isa(void) {
#ifdef QG_HAVE_VNNI
    if (qg_cpu_vnni()) return 1;
#endif
    return qg_cpu_avx2() ? 2 : 0;
}

/* Can no accumulator plus bias overflow int32? |sum (row - zr)(col - zc)| <= 65025 k, so the
 * accumulator is the exact sum, and with every |bias| below 2**31 - 65025 k so is the bias
 * add: the epilogue then needs no overflow test (the scalar path adds in int64). */
static int qg_bias_safe(const qg_args_t *p) {
    if (!p->ibias) return 1;
    int64_t limit = ((int64_t)1 << 31) - 1 - (int64_t)65025 * p->k;
    if (limit <= 0) return 0;
    int64_t nb = p->bias_idx == QG_PER_ROW ? p->m : p->n;
    for (int64_t i = 0; i < nb; i++) {
        int64_t b = p->ibias[i];
        if (b >= limit || -b >= limit) return 0;
    }
    return 1;
}

int qgemm_8bit(const qg_args_t *p, int n_threads) {
    int isa = p->portable == 1 ? 0 : qgemm_isa();
    if (p->portable == 2 && isa == 1) isa = qg_cpu_avx2() ? 2 : 0; /* tests: AVX2 on VNNI */
    int32_t *corr = NULL;
    if (isa == 2) { /* the centring's correction terms, and the int8 operand's -128 test */
        int64_t lines = p->swap ? p->m : (p->n + QG_NR - 1) / QG_NR * QG_NR;
        corr = (int32_t *)malloc((size_t)(lines > 0 ? lines : 1) * sizeof(int32_t));
        if (corr && p->sums) {
            int64_t given = p->swap ? p->m : p->n;
            for (int64_t i = 0; i < lines; i++)
                corr[i] = i < given ? (int32_t)((uint32_t)p->sums[i] * 128u) : 0;
        } else if (!corr || !qg_avx2_sums(p, corr)) {
            isa = 0;
        }
    }
    int bias_safe = isa ? qg_bias_safe(p) : 0;
    int64_t mblocks = (p->m + QG_MB - 1) / QG_MB, panels = (p->n + QG_NR - 1) / QG_NR;
    int64_t jobs = mblocks * panels;
    (void)n_threads;
#ifdef _OPENMP
    int nt = n_threads < 1 ? 1 : n_threads;
    if (nt > jobs) nt = (int)(jobs > 0 ? jobs : 1);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
#endif
    for (int64_t j = 0; j < jobs; j++) {
#ifdef QG_HAVE_VNNI
        if (isa == 1) {
            qg_job_vnni(p, j / panels, j % panels, bias_safe);
            continue;
        }
#endif
        if (isa == 2) {
            qg_job_avx2(p, j / panels, j % panels, bias_safe, corr);
            continue;
        }
        qg_job_generic(p, j / panels, j % panels);
    }
    free(corr);
    return isa;
}

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if defined(__SSE2__)
/* 16 bytes p[0], p[2], ..., p[30] (reads p[0..31]). */
static inline __m128i qg_even16(const uint8_t *p) {
    __m128i lo = _mm_loadu_si128((const __m128i *)p);
    __m128i hi = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i m = _mm_set1_epi16(0x00ff);
    return _mm_packus_epi16(_mm_and_si128(lo, m), _mm_and_si128(hi, m));
}
#endif

/* d[4 t + r] = s_r[t st] for t < len (st 1 or 2): four source rows interleaved into 32-bit
 * columns. */
static inline void qg_interleave4(const uint8_t *s0, const uint8_t *s1, const uint8_t *s2,
                                  const uint8_t *s3, int len, int64_t st, uint8_t *d) {
    int t = 0;
#if defined(__SSE2__)
    /* stride 2: the last element stays scalar, so the 32-byte loads end inside the rows */
    for (; st == 2 && t + 16 <= len - 1; t += 16) {
        __m128i r0 = qg_even16(s0 + 2 * t), r1 = qg_even16(s1 + 2 * t);
        __m128i r2 = qg_even16(s2 + 2 * t), r3 = qg_even16(s3 + 2 * t);
        __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
        __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
        _mm_storeu_si128((__m128i *)(d + 4 * t), _mm_unpacklo_epi16(t0, t2));
        _mm_storeu_si128((__m128i *)(d + 4 * t + 16), _mm_unpackhi_epi16(t0, t2));
        _mm_storeu_si128((__m128i *)(d + 4 * t + 32), _mm_unpacklo_epi16(t1, t3));
        _mm_storeu_si128((__m128i *)(d + 4 * t + 48), _mm_unpackhi_epi16(t1, t3));
    }
    for (; st == 1 && t + 16 <= len; t += 16) {
        __m128i r0 = _mm_loadu_si128((const __m128i *)(s0 + t));
        __m128i r1 = _mm_loadu_si128((const __m128i *)(s1 + t));
        __m128i r2 = _mm_loadu_si128((const __m128i *)(s2 + t));
        __m128i r3 = _mm_loadu_si128((const __m128i *)(s3 + t));
        __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
        __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
        _mm_storeu_si128((__m128i *)(d + 4 * t), _mm_unpacklo_epi16(t0, t2));
        _mm_storeu_si128((__m128i *)(d + 4 * t + 16), _mm_unpackhi_epi16(t0, t2));
        _mm_storeu_si128((__m128i *)(d + 4 * t + 32), _mm_unpacklo_epi16(t1, t3));
        _mm_storeu_si128((__m128i *)(d + 4 * t + 48), _mm_unpackhi_epi16(t1, t3));
    }
#endif
    for (; t < len; t++) {
        d[4 * t] = s0[t * st];
        d[4 * t + 1] = s1[t * st];
        d[4 * t + 2] = s2[t * st];
        d[4 * t + 3] = s3[t * st];
    }
}

#ifdef QG_HAVE_VNNI
#define QG_AVX512BW __attribute__((target("avx512f,avx512bw,avx512vl")))

/* qg_interleave4 for any run length: masked loads (which never touch the bytes they leave
 * out, so a run may end at the buffer's end) and a masked 64-byte store per 16 pixels. The
 * short rows of the small feature maps (14, 7 pixels) are all tail to the SSE2 loop. */
QG_AVX512BW __attribute__((noinline)) static void qg_interleave4_avx512(
    const uint8_t *s0, const uint8_t *s1, const uint8_t *s2, const uint8_t *s3, int len,
    int64_t st, uint8_t *d) {
    for (int t = 0; t < len; t += 16) {
        int w = len - t < 16 ? len - t : 16;
        __m128i r0, r1, r2, r3;
        if (st == 1) {
            __mmask16 m = (__mmask16)((1u << w) - 1u);
            r0 = _mm_maskz_loadu_epi8(m, s0 + t);
            r1 = _mm_maskz_loadu_epi8(m, s1 + t);
            r2 = _mm_maskz_loadu_epi8(m, s2 + t);
            r3 = _mm_maskz_loadu_epi8(m, s3 + t);
        } else { /* stride 2: bytes 0, 2, .., 2 (w - 1) of the next 2 w - 1 */
            __mmask32 m = (__mmask32)((1ull << (2 * w - 1)) - 1ull);
            r0 = _mm256_cvtepi16_epi8(_mm256_maskz_loadu_epi8(m, s0 + 2 * t));
            r1 = _mm256_cvtepi16_epi8(_mm256_maskz_loadu_epi8(m, s1 + 2 * t));
            r2 = _mm256_cvtepi16_epi8(_mm256_maskz_loadu_epi8(m, s2 + 2 * t));
            r3 = _mm256_cvtepi16_epi8(_mm256_maskz_loadu_epi8(m, s3 + 2 * t));
        }
        __m128i t0 = _mm_unpacklo_epi8(r0, r1), t1 = _mm_unpackhi_epi8(r0, r1);
        __m128i t2 = _mm_unpacklo_epi8(r2, r3), t3 = _mm_unpackhi_epi8(r2, r3);
        __m512i z = _mm512_castsi128_si512(_mm_unpacklo_epi16(t0, t2));
        z = _mm512_inserti32x4(z, _mm_unpackhi_epi16(t0, t2), 1);
        z = _mm512_inserti32x4(z, _mm_unpacklo_epi16(t1, t3), 2);
        z = _mm512_inserti32x4(z, _mm_unpackhi_epi16(t1, t3), 3);
        __mmask64 sm = w == 16 ? ~(__mmask64)0 : (__mmask64)((1ull << (4 * w)) - 1ull);
        _mm512_mask_storeu_epi8((void *)(d + 4 * t), sm, z);
    }
}

static int qg_cpu_avx512bw(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
    }
    return known;
}
#endif

/* Offset in a padded [c, hp, wp] image of im2col row kk's first tap. */
static inline int64_t qg_src_off(int64_t kk, int64_t kh, int64_t kw, int64_t hp, int64_t wp,
                                 int64_t dh, int64_t dw) {
    int64_t ci = kk / (kh * kw), i = (kk / kw) % kh, jj = kk % kw;
    return ci * hp * wp + i * dh * wp + jj * dw;
}

void qg_pack_im2col_u8(const uint8_t *x, int64_t c, int64_t hp, int64_t wp, int64_t kh,
                       int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh,
                       int64_t ow, uint8_t *packed, int32_t *colsum, int n_threads) {
    int64_t k = c * kh * kw, groups = (k + 3) / 4, pix = oh * ow;
    int64_t panels = (pix + QG_NR - 1) / QG_NR;
    int wide = 0;
#ifdef QG_HAVE_VNNI
    wide = qg_cpu_avx512bw();
#endif
    (void)wide;
    /* every row's source offset, once: three divisions a row, in every panel, cost as much as
     * the copy of a small map */
    int64_t *koff = (int64_t *)malloc((size_t)(k > 0 ? k : 1) * sizeof(int64_t));
    if (koff)
        for (int64_t kk = 0; kk < k; kk++) koff[kk] = qg_src_off(kk, kh, kw, hp, wp, dh, dw);
    (void)n_threads;
#ifdef _OPENMP
    int nt = n_threads < 1 ? 1 : n_threads;
    if (nt > panels) nt = (int)(panels > 0 ? panels : 1);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
#endif
    for (int64_t pn = 0; pn < panels; pn++) {
        int64_t off[QG_NR];
        int run0[QG_NR], runlen[QG_NR], runs = 0;
        int64_t p0 = pn * QG_NR;
        int cols = (int)(pix - p0 < QG_NR ? pix - p0 : QG_NR);
        for (int j = 0; j < cols; j++) {
            int64_t q = p0 + j;
            off[j] = (q / ow) * sh * wp + (q % ow) * sw;
        }
        /* runs of pixels whose source bytes step by st (the stride along a row if 2, else 1:
         * consecutive, as whole rows of a 1x1 convolution are) */
        int64_t st = sw == 2 ? 2 : 1;
        for (int j = 0; j < cols;) {
            int j0 = j;
            while (j + 1 < cols && off[j + 1] == off[j] + st) j++;
            j++;
            run0[runs] = j0;
            runlen[runs++] = j - j0;
        }
        uint8_t *dst = packed + pn * groups * QG_NR * 4;
        if (cols < QG_NR || k % 4) memset(dst, 0, (size_t)(groups * QG_NR * 4));
        for (int64_t g = 0; g < groups; g++) {
            uint8_t *dg = dst + g * QG_NR * 4;
            if (4 * g + 4 <= k) {
                const uint8_t *src[4];
                for (int r = 0; r < 4; r++) {
                    int64_t kk = 4 * g + r;
                    src[r] = x + (koff ? koff[kk] : qg_src_off(kk, kh, kw, hp, wp, dh, dw));
                }
                for (int u = 0; u < runs; u++) {
                    int64_t o = off[run0[u]];
#ifdef QG_HAVE_VNNI
                    if (wide) {
                        qg_interleave4_avx512(src[0] + o, src[1] + o, src[2] + o, src[3] + o,
                                              runlen[u], st, dg + 4 * run0[u]);
                        continue;
                    }
#endif
                    qg_interleave4(src[0] + o, src[1] + o, src[2] + o, src[3] + o, runlen[u],
                                   st, dg + 4 * run0[u]);
                }
            } else {
                for (int64_t kk = 4 * g; kk < k; kk++) {
                    const uint8_t *sr =
                        x + (koff ? koff[kk] : qg_src_off(kk, kh, kw, hp, wp, dh, dw));
                    for (int j = 0; j < cols; j++) dg[4 * j + (kk % 4)] = sr[off[j]];
                }
            }
        }
        if (colsum) {
            for (int j = 0; j < cols; j++) {
                int32_t sum = 0;
                for (int64_t g = 0; g < groups; g++) {
                    const uint8_t *e = dst + g * QG_NR * 4 + 4 * j;
                    sum += e[0] + e[1] + e[2] + e[3];
                }
                colsum[p0 + j] = sum;
            }
        }
    }
    free(koff);
}
