/* float32 GEMM against a B packed once (a constant weight): C [M, N] = A [M, K] B [K, N]
 * (+ a bias row), on AVX-512F where the CPU has it.
 *
 * B is packed into panels of SG_NR = 32 columns: panel p holds, for k = 0 .. K-1, the 32
 * floats B[k, 32 p .. 32 p + 31] (zero past N). BLAS packs B on every call; a weight packed
 * once spares that pass, which is a sizeable part of the small-M products of a transformer
 * (M = the tokens). The register tile is 12 rows x 32 columns: 24 accumulators, two panel
 * vectors and an embedded broadcast of A per row and k. The inner dimension runs in blocks of
 * SG_KC so that a block of the panel stays in L1 across the row tiles; partial sums wait in C
 * between blocks (each output sums k in ascending order: one fixed rounding, whatever the
 * thread count).
 */
#include "native.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#define SG_NR 32
#define SG_MR 12
#define SG_KC 256
#define SG_MB 192 /* rows per job */

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 9 || defined(__clang__))
#define SG_HAVE 1
#include <immintrin.h>
#endif

int sgemm_packed_isa(void) {
#ifdef SG_HAVE
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return known;
#else
    return 0;
#endif
}

#ifdef SG_HAVE
#define SG_T __attribute__((target("avx512f,fma")))

/* c[r][0..31] (+)= sum over k in [k0, k1) of a[r][k] * panel[k][0..31], r < MR rows; the
 * first block starts from zero, later ones from what is in c. Columns past `cols` are left. */
#define SG_TILE(NAME, MR)                                                                     \
    SG_T __attribute__((noinline)) static void NAME(const float *a, int64_t lda,             \
                                                    const float *bp, int64_t k0, int64_t k1,  \
                                                    float *c, int64_t ldc, int first,         \
                                                    __mmask16 m0, __mmask16 m1) {            \
        __m512 acc[MR][2];                                                                    \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {                               \
            if (first) {                                                                      \
                acc[r][0] = _mm512_setzero_ps();                                              \
                acc[r][1] = _mm512_setzero_ps();                                              \
            } else {                                                                          \
                acc[r][0] = _mm512_maskz_loadu_ps(m0, c + r * ldc);                           \
                acc[r][1] = _mm512_maskz_loadu_ps(m1, c + r * ldc + 16);                      \
            }                                                                                 \
        }                                                                                     \
        for (int64_t k = k0; k < k1; k++) {                                                   \
            __m512 b0 = _mm512_loadu_ps(bp + k * SG_NR);                                      \
            __m512 b1 = _mm512_loadu_ps(bp + k * SG_NR + 16);                                 \
            _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {                           \
                __m512 av = _mm512_set1_ps(a[r * lda + k]);                                   \
                acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);                               \
                acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);                               \
            }                                                                                 \
        }                                                                                     \
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {                               \
            _mm512_mask_storeu_ps(c + r * ldc, m0, acc[r][0]);                                \
            _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc[r][1]);                           \
        }                                                                                     \
    }

SG_TILE(sg_tile12, 12)
SG_TILE(sg_tile8, 8)
SG_TILE(sg_tile4, 4)
SG_TILE(sg_tile1, 1)

/* Rows [m0, m1) of one panel, every tap and k block, then the bias. Tap t reads A at
 * a + offs[t] and the panel's rows t k .. (t + 1) k - 1. */
SG_T static void sg_job(const float *a, int64_t lda, const int64_t *offs, int ntaps,
                        int64_t m0, int64_t m1, int64_t k, const float *bp, int64_t n0,
                        int cols, const float *bias, float *c, int64_t ldc, int accumulate) {
    __mmask16 mk0 = (__mmask16)(cols >= 16 ? 0xffff : (1u << cols) - 1u);
    __mmask16 mk1 = (__mmask16)(cols >= 32 ? 0xffff : cols > 16 ? (1u << (cols - 16)) - 1u : 0);
    for (int t = 0; t < ntaps; t++) {
        const float *at = a + offs[t];
        const float *bt = bp + (int64_t)t * k * SG_NR; /* (the tiles index k from the tap) */
        for (int64_t k0 = 0; k0 < k; k0 += SG_KC) {
            int64_t k1 = k0 + SG_KC < k ? k0 + SG_KC : k;
            int first = !accumulate && t == 0 && k0 == 0;
            int64_t m = m0;
            for (; m + 12 <= m1; m += 12)
                sg_tile12(at + m * lda, lda, bt, k0, k1, c + m * ldc + n0, ldc, first, mk0, mk1);
            for (; m + 8 <= m1; m += 8)
                sg_tile8(at + m * lda, lda, bt, k0, k1, c + m * ldc + n0, ldc, first, mk0, mk1);
            for (; m + 4 <= m1; m += 4)
                sg_tile4(at + m * lda, lda, bt, k0, k1, c + m * ldc + n0, ldc, first, mk0, mk1);
            for (; m < m1; m++)
                sg_tile1(at + m * lda, lda, bt, k0, k1, c + m * ldc + n0, ldc, first, mk0, mk1);
        }
    }
    if (!accumulate && (k == 0 || ntaps == 0))
        for (int64_t m = m0; m < m1; m++) memset(c + m * ldc + n0, 0, sizeof(float) * cols);
    if (bias) {
        __m512 v0 = _mm512_maskz_loadu_ps(mk0, bias + n0);
        __m512 v1 = _mm512_maskz_loadu_ps(mk1, bias + n0 + 16);
        for (int64_t m = m0; m < m1; m++) {
            float *row = c + m * ldc + n0;
            _mm512_mask_storeu_ps(row, mk0, _mm512_add_ps(_mm512_maskz_loadu_ps(mk0, row), v0));
            _mm512_mask_storeu_ps(row + 16, mk1,
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(mk1, row + 16), v1));
        }
    }
}
#endif

/* C (+)= sum over taps t of A_t B_t (+ bias), A_t = the rows at a + offs[t] (stride lda),
 * B_t rows t k .. (t + 1) k - 1 of the packed B (sgemm_packed_isa() must be 1): a k x k
 * convolution as shifted row ranges of one padded image, or one plain GEMM (one tap at 0).
 * `accumulate`: onto what C holds (a bias and residual written first). */
void sgemm_packed(const float *a, int64_t lda, const int64_t *offs, int ntaps, int64_t m,
                  int64_t k, const float *bp, int64_t n, const float *bias, float *c,
                  int64_t ldc, int accumulate, int n_threads) {
#ifdef SG_HAVE
    int64_t panels = (n + SG_NR - 1) / SG_NR, mblocks = (m + SG_MB - 1) / SG_MB;
    /* blocks of equal size (whole tiles of 12 rows), so that each thread's share of the jobs,
     * contiguous in (block, panel) order, is the same work */
    int64_t mbr = (m + mblocks - 1) / (mblocks > 0 ? mblocks : 1);
    mbr = (mbr + SG_MR - 1) / SG_MR * SG_MR;
    if (mbr > 0) mblocks = (m + mbr - 1) / mbr;
    int64_t jobs = panels * mblocks;
    (void)n_threads;
#ifdef _OPENMP
    int nt = n_threads < 1 ? 1 : n_threads;
    if (nt > jobs) nt = (int)(jobs > 0 ? jobs : 1);
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t j = 0; j < jobs; j++) {
        int64_t p = j % panels, mb = j / panels;
        int64_t m0 = mb * mbr, m1 = m0 + mbr < m ? m0 + mbr : m;
        int64_t n0 = p * SG_NR;
        int cols = (int)(n - n0 < SG_NR ? n - n0 : SG_NR);
        sg_job(a, lda, offs, ntaps, m0, m1, k, bp + p * ntaps * k * SG_NR, n0, cols, bias, c,
               ldc, accumulate);
    }
#else
    (void)a; (void)lda; (void)offs; (void)ntaps; (void)m; (void)k; (void)bp; (void)n;
    (void)bias; (void)c; (void)ldc; (void)accumulate; (void)n_threads;
#endif
}
