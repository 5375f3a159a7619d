/* Projection of the Engram rows by F16 weights (SPEC §7): out[t, o] = sum_i w[o, i] * x[t, i].
 *
 * The weights stay F16 (half the bytes of float32); each is converted to float32
 * exactly as it is loaded (VCVTPH2PS on AVX-512F and F16C, an exact bit-level
 * conversion on the portable path) and multiplied with float32 inputs.
 *
 * Summation order (the precision contract; tests/engram/test_mixer.py's NumPy twin
 * reproduces it bit for bit): for each (t, o), 64 float32 partial sums p[j]; input
 * i goes to p[i % 64] in increasing i as p = p + (w * x), the product rounded to
 * float32 and then the sum (no fused multiply-add: the functions are compiled with
 * floating-point contraction off); then p[j] += p[j + s] for s = 32, 16, 8, 4, 2, 1
 * and j < s.  Every path gives the same bits.  The rows the engine projects hold
 * bf16 values (8 significant bits) and the weights 11, so every product is exact
 * and only the sums round.
 *
 * Paths: the same loops compiled for the build's baseline (portable), AVX2 + F16C
 * and AVX-512F (target attributes), chosen at run time with __builtin_cpu_supports.
 * A call computes up to EP_MAX_TOKENS tokens per pass over a weight row, so a
 * decode step (T = 1) or a few tokens read each weight once.
 */
#ifndef ENGRAM_PROJECT_SIMD_H
#define ENGRAM_PROJECT_SIMD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define EP_LANES 64
#define EP_MAX_TOKENS 4
#define EP_SLICE 1024      /* inputs per slice of the multi-token path (multiple of EP_LANES) */
#define EP_ROW_BLOCK 16    /* rows that share a pass over the slices */
#ifndef EP_PREFETCH
#define EP_PREFETCH 4096   /* halves ahead of the load (8 KiB): measured best of 512..16384 here */
#endif
#define EP_PORTABLE 0
#define EP_AVX2 1
#define EP_AVX512 2

#if defined(__clang__)
#define EP_NO_CONTRACT _Pragma("clang fp contract(off)")
#define EP_FUNC_ATTR
#elif defined(__GNUC__)
#define EP_NO_CONTRACT
#define EP_FUNC_ATTR __attribute__((optimize("fp-contract=off")))
#else
#define EP_NO_CONTRACT
#define EP_FUNC_ATTR
#endif

typedef union { float f; uint32_t u; } ep_f32u;

/* Exact F16 -> float32 on any CPU.  Normal and subnormal halves: the 15 magnitude bits
 * shifted into a float32 give the value times 2^-112, and the product by 2^112 is exact.
 * Infinities and NaNs keep their payload (a NaN made quiet, as VCVTPH2PS does). */
static inline float ep_h2f(uint16_t h) {
    ep_f32u v;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    if (em >= 0x7c00u) {
        uint32_t mant = (uint32_t)(em & 0x3ffu) << 13;
        v.u = sign | 0x7f800000u | mant | (mant ? 0x00400000u : 0u);
        return v.f;
    }
    v.u = em << 13;
    v.f = v.f * 5.192296858534828e+33f;   /* 2^112 */
    v.u |= sign;
    return v.f;
}

/* p[0] after folding the 64 partial sums (see above). */
EP_FUNC_ATTR static float ep_fold(float *p) {
    EP_NO_CONTRACT
    for (int s = EP_LANES / 2; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) p[j] = p[j] + p[j + s];
    return p[0];
}

/* Inputs past the last full block of 64 (the same lanes), then the fold. */
EP_FUNC_ATTR static float ep_finish(float *p, const uint16_t *wr, const float *xt, ptrdiff_t c, ptrdiff_t n) {
    EP_NO_CONTRACT
    for (ptrdiff_t i = c; i < n; i++) {
        float prod = ep_h2f(wr[i]) * xt[i];
        p[i - c] = p[i - c] + prod;
    }
    return ep_fold(p);
}

/* ---------------------------------------------------------------- portable */
EP_FUNC_ATTR static void ep_rows_portable(const uint16_t *w, ptrdiff_t n_in, const float *x, ptrdiff_t ldx,
                                          int T, ptrdiff_t r0, ptrdiff_t r1, float *out, ptrdiff_t ldo) {
    EP_NO_CONTRACT
    float p[EP_LANES], wf[EP_LANES];
    for (ptrdiff_t o = r0; o < r1; o++) {
        const uint16_t *wr = w + o * n_in;
        for (int t = 0; t < T; t++) {
            const float *xt = x + t * ldx;
            ptrdiff_t c = 0;
            for (int j = 0; j < EP_LANES; j++) p[j] = 0.0f;
            for (; c + EP_LANES <= n_in; c += EP_LANES) {
                for (int j = 0; j < EP_LANES; j++) wf[j] = ep_h2f(wr[c + j]);
                for (int j = 0; j < EP_LANES; j++) {
                    float prod = wf[j] * xt[c + j];
                    p[j] = p[j] + prod;
                }
            }
            out[t * ldo + o] = ep_finish(p, wr, xt, c, n_in);
        }
    }
}

static void ep_convert_portable(const uint16_t *w, ptrdiff_t n, float *out) {
    for (ptrdiff_t i = 0; i < n; i++) out[i] = ep_h2f(w[i]);
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define EP_HAVE_X86 1

/* The fold of ep_fold on 4 lanes held in a 128-bit register (s = 2, then 1). */
__attribute__((target("avx2"))) EP_FUNC_ATTR
static inline float ep_fold128(__m128 l) {
    EP_NO_CONTRACT
    l = _mm_add_ps(l, _mm_movehl_ps(l, l));
    l = _mm_add_ss(l, _mm_shuffle_ps(l, l, 1));
    return _mm_cvtss_f32(l);
}

/* ep_fold of lanes 0..63 held as a[q] = lanes 8q..8q+7 (the same additions, lane by lane). */
__attribute__((target("avx2"))) EP_FUNC_ATTR
static inline float ep_fold256(__m256 *a) {
    EP_NO_CONTRACT
    for (int q = 0; q < 4; q++) a[q] = _mm256_add_ps(a[q], a[q + 4]);   /* s = 32 */
    a[0] = _mm256_add_ps(a[0], a[2]);                                   /* s = 16 */
    a[1] = _mm256_add_ps(a[1], a[3]);
    a[0] = _mm256_add_ps(a[0], a[1]);                                   /* s = 8 */
    return ep_fold128(_mm_add_ps(_mm256_castps256_ps128(a[0]), _mm256_extractf128_ps(a[0], 1)));  /* s = 4 */
}

/* ---------------------------------------------------------------- AVX2 + F16C: one token a pass */
__attribute__((target("avx2,f16c"))) EP_FUNC_ATTR
static void ep_rows_avx2(const uint16_t *w, ptrdiff_t n_in, const float *x, ptrdiff_t ldx,
                         int T, ptrdiff_t r0, ptrdiff_t r1, float *out, ptrdiff_t ldo) {
    EP_NO_CONTRACT
    float p[EP_LANES];
    for (ptrdiff_t o = r0; o < r1; o++) {
        const uint16_t *wr = w + o * n_in;
        for (int t = 0; t < T; t++) {
            const float *xt = x + t * ldx;
            __m256 a[8];
            for (int q = 0; q < 8; q++) a[q] = _mm256_setzero_ps();
            ptrdiff_t c = 0;
            for (; c + EP_LANES <= n_in; c += EP_LANES) {
                for (int q = 0; q < 8; q++) {
                    __m256 wq = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wr + c + 8 * q)));
                    __m256 prod = _mm256_mul_ps(wq, _mm256_loadu_ps(xt + c + 8 * q));
                    a[q] = _mm256_add_ps(a[q], prod);
                }
            }
            if (c == n_in) {
                out[t * ldo + o] = ep_fold256(a);
            } else {
                for (int q = 0; q < 8; q++) _mm256_storeu_ps(p + 8 * q, a[q]);
                out[t * ldo + o] = ep_finish(p, wr, xt, c, n_in);
            }
        }
    }
}

__attribute__((target("avx2,f16c")))
static void ep_convert_avx2(const uint16_t *w, ptrdiff_t n, float *out) {
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i))));
    for (; i < n; i++) out[i] = ep_h2f(w[i]);
}

/* ep_fold of lanes 0..63 held as a[q] = lanes 16q..16q+15 (the same additions, lane by lane). */
__attribute__((target("avx512f"))) EP_FUNC_ATTR
static inline float ep_fold512(__m512 *a) {
    EP_NO_CONTRACT
    __m512 b0 = _mm512_add_ps(a[0], a[2]), b1 = _mm512_add_ps(a[1], a[3]);           /* s = 32 */
    b0 = _mm512_add_ps(b0, b1);                                                         /* s = 16 */
    __m256 lo = _mm512_castps512_ps256(b0);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b0), 1));
    lo = _mm256_add_ps(lo, hi);                                                         /* s = 8 */
    return ep_fold128(_mm_add_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1)));  /* s = 4 */
}

/* ---------------------------------------------------------------- AVX-512F: T tokens a pass */
#define EP_AVX512_TOKENS(T)                                                                      \
    __attribute__((target("avx512f"))) EP_FUNC_ATTR                                              \
    static void ep_row_avx512_##T(const uint16_t *wr, ptrdiff_t n_in, const float *x,            \
                                  ptrdiff_t ldx, float *out, ptrdiff_t ldo) {                    \
        EP_NO_CONTRACT                                                                           \
        __m512 a[T][4];                                                                          \
        float p[EP_LANES];                                                                       \
        for (int t = 0; t < T; t++)                                                              \
            for (int q = 0; q < 4; q++) a[t][q] = _mm512_setzero_ps();                           \
        ptrdiff_t c = 0;                                                                         \
        for (; c + EP_LANES <= n_in; c += EP_LANES) {                                            \
            __m512 wq[4];                                                                        \
            _mm_prefetch((const char *)(wr + c + EP_PREFETCH), _MM_HINT_T0);                     \
            _mm_prefetch((const char *)(wr + c + EP_PREFETCH + 32), _MM_HINT_T0);                \
            for (int q = 0; q < 4; q++)                                                          \
                wq[q] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wr + c + 16 * q))); \
            for (int t = 0; t < T; t++)                                                          \
                for (int q = 0; q < 4; q++) {                                                    \
                    __m512 prod = _mm512_mul_ps(wq[q], _mm512_loadu_ps(x + t * ldx + c + 16 * q)); \
                    a[t][q] = _mm512_add_ps(a[t][q], prod);                                      \
                }                                                                                \
        }                                                                                        \
        for (int t = 0; t < T; t++) {                                                            \
            if (c == n_in) {                                                                     \
                out[t * ldo] = ep_fold512(a[t]);                                                 \
            } else {                                                                             \
                for (int q = 0; q < 4; q++) _mm512_storeu_ps(p + 16 * q, a[t][q]);               \
                out[t * ldo] = ep_finish(p, wr, x + t * ldx, c, n_in);                           \
            }                                                                                    \
        }                                                                                        \
    }
EP_AVX512_TOKENS(1)

/* T tokens of rows [r0, r1) (at most EP_ROW_BLOCK rows), the inputs in slices of EP_SLICE: the
 * slice of x (T x 4 KiB) stays in L1 while every row of the block runs over it.  Each partial sum
 * still takes its inputs in increasing order (slices in order), so the bits are those of
 * ep_row_avx512_T; only the order in which rows are visited changes. */
#define EP_AVX512_SLICED(T)                                                                      \
    __attribute__((target("avx512f"))) EP_FUNC_ATTR                                              \
    static void ep_block_avx512_##T(const uint16_t *w, ptrdiff_t n_in, const float *x,          \
                                    ptrdiff_t ldx, ptrdiff_t r0, ptrdiff_t r1, float *out,       \
                                    ptrdiff_t ldo) {                                             \
        EP_NO_CONTRACT                                                                           \
        __m512 acc[EP_ROW_BLOCK][T][4];                                                          \
        float p[EP_LANES];                                                                       \
        const ptrdiff_t full = n_in - n_in % EP_LANES;                                           \
        for (ptrdiff_t o = r0; o < r1; o++)                                                      \
            for (int t = 0; t < T; t++)                                                          \
                for (int q = 0; q < 4; q++) acc[o - r0][t][q] = _mm512_setzero_ps();             \
        for (ptrdiff_t s0 = 0; s0 < full; s0 += EP_SLICE) {                                      \
            const ptrdiff_t s1 = s0 + EP_SLICE < full ? s0 + EP_SLICE : full;                    \
            for (ptrdiff_t o = r0; o < r1; o++) {                                                \
                const uint16_t *wr = w + o * n_in;                                               \
                __m512 a[T][4];                                                                  \
                for (int t = 0; t < T; t++)                                                      \
                    for (int q = 0; q < 4; q++) a[t][q] = acc[o - r0][t][q];                     \
                for (ptrdiff_t c = s0; c < s1; c += EP_LANES) {                                  \
                    __m512 wq[4];                                                                \
                    for (int q = 0; q < 4; q++)                                                  \
                        wq[q] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wr + c + 16 * q))); \
                    for (int t = 0; t < T; t++)                                                  \
                        for (int q = 0; q < 4; q++) {                                            \
                            __m512 prod = _mm512_mul_ps(wq[q], _mm512_loadu_ps(x + t * ldx + c + 16 * q)); \
                            a[t][q] = _mm512_add_ps(a[t][q], prod);                              \
                        }                                                                        \
                }                                                                                \
                for (int t = 0; t < T; t++)                                                      \
                    for (int q = 0; q < 4; q++) acc[o - r0][t][q] = a[t][q];                     \
            }                                                                                    \
        }                                                                                        \
        for (ptrdiff_t o = r0; o < r1; o++)                                                      \
            for (int t = 0; t < T; t++) {                                                        \
                if (full == n_in) {                                                              \
                    out[t * ldo + o] = ep_fold512(acc[o - r0][t]);                               \
                } else {                                                                         \
                    for (int q = 0; q < 4; q++) _mm512_storeu_ps(p + 16 * q, acc[o - r0][t][q]); \
                    out[t * ldo + o] = ep_finish(p, w + o * n_in, x + t * ldx, full, n_in);      \
                }                                                                                \
            }                                                                                    \
    }
EP_AVX512_SLICED(2)
EP_AVX512_SLICED(3)
EP_AVX512_SLICED(4)

__attribute__((target("avx512f")))
static void ep_rows_avx512(const uint16_t *w, ptrdiff_t n_in, const float *x, ptrdiff_t ldx,
                           int T, ptrdiff_t r0, ptrdiff_t r1, float *out, ptrdiff_t ldo) {
    if (T == 1) {  /* x (24 KiB for V4.1) stays in L1 whole: one row after the other */
        for (ptrdiff_t o = r0; o < r1; o++) ep_row_avx512_1(w + o * n_in, n_in, x, ldx, out + o, ldo);
        return;
    }
    for (ptrdiff_t b0 = r0; b0 < r1; b0 += EP_ROW_BLOCK) {
        ptrdiff_t b1 = b0 + EP_ROW_BLOCK < r1 ? b0 + EP_ROW_BLOCK : r1;
        for (int t0 = 0; t0 < T; t0 += EP_MAX_TOKENS) {
            int k = T - t0 < EP_MAX_TOKENS ? T - t0 : EP_MAX_TOKENS;
            const float *xs = x + t0 * ldx;
            float *os = out + t0 * ldo;
            switch (k) {
            case 1:
                for (ptrdiff_t o = b0; o < b1; o++) ep_row_avx512_1(w + o * n_in, n_in, xs, ldx, os + o, ldo);
                break;
            case 2: ep_block_avx512_2(w, n_in, xs, ldx, b0, b1, os, ldo); break;
            case 3: ep_block_avx512_3(w, n_in, xs, ldx, b0, b1, os, ldo); break;
            default: ep_block_avx512_4(w, n_in, xs, ldx, b0, b1, os, ldo); break;
            }
        }
    }
}

__attribute__((target("avx512f")))
static void ep_convert_avx512(const uint16_t *w, ptrdiff_t n, float *out) {
    ptrdiff_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i))));
    for (; i < n; i++) out[i] = ep_h2f(w[i]);
}

static int ep_cpu_path(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return EP_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return EP_AVX2;
    return EP_PORTABLE;
}
#else
#define EP_HAVE_X86 0
static int ep_cpu_path(void) { return EP_PORTABLE; }
#endif

/* Rows [r0, r1) of out (T tokens; token t's inputs at x + t * ldx, outputs at out + t * ldo). */
static void ep_rows(int path, const uint16_t *w, ptrdiff_t n_in, const float *x, ptrdiff_t ldx, int T,
                    ptrdiff_t r0, ptrdiff_t r1, float *out, ptrdiff_t ldo) {
#if EP_HAVE_X86
    if (path == EP_AVX512) { ep_rows_avx512(w, n_in, x, ldx, T, r0, r1, out, ldo); return; }
    if (path == EP_AVX2) { ep_rows_avx2(w, n_in, x, ldx, T, r0, r1, out, ldo); return; }
#endif
    ep_rows_portable(w, n_in, x, ldx, T, r0, r1, out, ldo);
}

/* n F16 values -> float32 (exact on every path). */
static void ep_convert(int path, const uint16_t *w, ptrdiff_t n, float *out) {
#if EP_HAVE_X86
    if (path == EP_AVX512) { ep_convert_avx512(w, n, out); return; }
    if (path == EP_AVX2) { ep_convert_avx2(w, n, out); return; }
#endif
    ep_convert_portable(w, n, out);
}

#endif
