/* float32 <-> float16 conversion, bit for bit what NumPy's astype gives (its
 * npy_floatbits_to_halfbits / npy_halfbits_to_floatbits): round to nearest even, subnormals
 * kept, overflow (|x| >= 65520) to +-inf, -0.0 kept, and NaN payloads as NumPy moves them:
 * float32 -> float16 keeps the top 10 payload bits (sign | 0x7c00 | sig >> 13, and 0x7c01
 * where those bits are all zero, so the NaN stays a NaN), float16 -> float32 shifts the payload
 * up (sign | 0x7f800000 | sig << 13). Neither sets the quiet bit: a signalling NaN stays one.
 *
 * Three paths, picked at run time (the build passes no -march): AVX512F (16 lanes) and
 * F16C (8 lanes) use vcvtps2ph / vcvtph2ps, which round as IEEE says for every finite value,
 * ignore MXCSR's DAZ/FTZ for half subnormals, but quiet a signalling NaN; a vector whose
 * input or output holds a NaN is redone by the scalar code (rare, and exact by construction).
 * The scalar code is integer arithmetic (plus one exact float multiply), so it does not
 * depend on the FP environment either; it is the path on every other CPU.
 */
#include "native.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define CAST_X86 1
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------- scalar ----------------- */

static inline uint16_t f32_to_f16_bits(uint32_t f) {
    uint32_t sign = (f >> 16) & 0x8000u, a = f & 0x7fffffffu;
    if (a >= 0x7f800000u) { /* inf or NaN */
        uint32_t sig = (a & 0x7fffffu) >> 13;
        if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7c00u | (sig ? sig : 1u));
    }
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to 65536 or more */
    if (a >= 0x38800000u) /* a normal half: rebias the exponent, round the 13 dropped bits */
        return (uint16_t)(sign | ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13));
    /* a subnormal half or zero: m * 2^(e - 150) = (m >> s) half ulps of 2^-24, s = 126 - e */
    uint32_t e = a >> 23, s = 126u - e;
    if (e == 0 || s > 25u) return (uint16_t)sign; /* below 2^-25: rounds to zero */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t h = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    h += (rem > half) | ((rem == half) & h);
    return (uint16_t)(sign | h); /* (a carry into bit 10 makes the smallest normal: right) */
}

static inline uint32_t f16_to_f32_bits(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, a = (uint32_t)h & 0x7fffu;
    if (a >= 0x7c00u) return sign | 0x7f800000u | ((a & 0x3ffu) << 13);
    if (a >= 0x0400u) return sign | ((a << 13) + 0x38000000u);
    /* zero or subnormal: a * 2^-24, exact in float32 (and a normal float32 unless zero) */
    float v = (float)a * 5.9604644775390625e-08f;
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return sign | bits;
}

static void f32_to_f16_scalar(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t f;
        memcpy(&f, x + i, sizeof f);
        y[i] = f32_to_f16_bits(f);
    }
}

static void f16_to_f32_scalar(const uint16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t f = f16_to_f32_bits(x[i]);
        memcpy(y + i, &f, sizeof f);
    }
}

/* ---------------------------------------------------------------- x86 -------------------- */

#ifdef CAST_X86
#define CAST_RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

__attribute__((target("avx512f"))) static void f32_to_f16_avx512(const float *x, uint16_t *y,
                                                                 int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtps_ph(v, CAST_RNE));
        if (__builtin_expect(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0, 0))
            f32_to_f16_scalar(x + i, y + i, 16);
    }
    f32_to_f16_scalar(x + i, y + i, n - i);
}

__attribute__((target("avx512f"))) static void f16_to_f32_avx512(const uint16_t *x, float *y,
                                                                 int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_ps(y + i, v);
        if (__builtin_expect(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0, 0))
            f16_to_f32_scalar(x + i, y + i, 16);
    }
    f16_to_f32_scalar(x + i, y + i, n - i);
}

__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *x, uint16_t *y,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(v, CAST_RNE));
        if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0))
            f32_to_f16_scalar(x + i, y + i, 8);
    }
    f32_to_f16_scalar(x + i, y + i, n - i);
}

__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *x, float *y,
                                                                int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, v);
        if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0, 0))
            f16_to_f32_scalar(x + i, y + i, 8);
    }
    f16_to_f32_scalar(x + i, y + i, n - i);
}
#endif

int cast_f16_isa(void) {
#ifdef CAST_X86
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f")                                  ? 2
                : __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c") ? 1
                                                                                   : 0;
    }
    return known;
#else
    return 0;
#endif
}

/* One contiguous run on the path `isa` (already capped to what the CPU has). */
static void cast_run(const void *x, void *y, int64_t n, int to_half, int isa) {
#ifdef CAST_X86
    if (isa == 2) {
        if (to_half) f32_to_f16_avx512(x, y, n);
        else f16_to_f32_avx512(x, y, n);
        return;
    }
    if (isa == 1) {
        if (to_half) f32_to_f16_f16c(x, y, n);
        else f16_to_f32_f16c(x, y, n);
        return;
    }
#endif
    (void)isa;
    if (to_half) f32_to_f16_scalar(x, y, n);
    else f16_to_f32_scalar(x, y, n);
}

/* Elements [lo, hi) of x (float32 if to_half, else float16 bits) into y (the other type), in
 * blocks of 16384 on up to n_threads OpenMP threads (large spans only: a region's wake-up costs
 * more than a small conversion). isa: -1 the best the CPU has, else at most that path. */
void cast_f16_f32(const void *x, void *y, int64_t lo, int64_t hi, int to_half, int isa,
                  int n_threads) {
    int have = cast_f16_isa();
    isa = isa < 0 || isa > have ? have : isa;
    const int64_t block = 1 << 14, n = hi - lo, n_blocks = (n + block - 1) / block;
    const size_t xs = to_half ? 4 : 2, ys = to_half ? 2 : 4;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads) \
    if (n_threads > 1 && n >= (1 << 16))
#endif
    for (int64_t b = 0; b < n_blocks; b++) {
        int64_t a = lo + b * block, e = a + block < hi ? a + block : hi;
        cast_run((const char *)x + a * xs, (char *)y + a * ys, e - a, to_half, isa);
    }
    (void)n_threads;
}
