/* AVX-512 path of the n-gram hash for layouts with 8 heads per order.
 *
 * The eight heads of one (layer, lookback) share the same 64-bit mix h and
 * differ only in the prime, so one 512-bit vector computes all eight
 * remainders with the reciprocal method of hashing.pyx (q = trunc(h * 1/p)
 * is within one of h // p for h < 2**63, p >= 8192; one correction each way).
 * Compiled with a target attribute and chosen at run time, so the extension
 * still loads on CPUs without AVX-512.  The portable path is the Cython loop.
 */
#ifndef ENGRAM_HASH_SIMD_H
#define ENGRAM_HASH_SIMD_H

#include <stdint.h>
#include <stddef.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ENGRAM_HAVE_AVX512_PATH 1

static int engram_cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
        && __builtin_cpu_supports("avx512vl");
}

/* ext[t + N - 1 - j] is the compressed id j tokens before token t (DEAD = -1). */
__attribute__((target("avx512f,avx512dq,avx512vl")))
static void engram_hash_batch_avx512(int L, int N, const uint64_t *mults, const uint64_t *primes,
                                     const double *inv, const uint64_t *offsets, int32_t pad,
                                     const int32_t *ext, ptrdiff_t T, uint32_t *out) {
    const int C = (N - 1) * 8;
    const __m512i zero = _mm512_setzero_si512();
    for (ptrdiff_t t = 0; t < T; t++) {
        int64_t ids[16];
        int dead = 0;
        for (int j = 0; j < N; j++) {
            int32_t v = ext[t + N - 1 - j];
            if (dead || v < 0) { dead = 1; v = pad; }
            ids[j] = v;
        }
        uint32_t *o = out + (ptrdiff_t)t * L * C;
        for (int l = 0; l < L; l++) {
            const uint64_t *m = mults + l * N;
            uint64_t h = (uint64_t)ids[0] * m[0];
            for (int k = 1; k < N; k++) {
                h ^= (uint64_t)ids[k] * m[k];
                const int col = l * C + (k - 1) * 8;
                __m512i p = _mm512_loadu_si512((const void *)(primes + col));
                __m512d iv = _mm512_loadu_pd(inv + col);
                __m512i hv = _mm512_set1_epi64((int64_t)h);
                __m512d hd = _mm512_set1_pd((double)(int64_t)h);
                __m512i q = _mm512_cvttpd_epi64(_mm512_mul_pd(hd, iv));
                __m512i r = _mm512_sub_epi64(hv, _mm512_mullo_epi64(q, p));
                __mmask8 neg = _mm512_cmplt_epi64_mask(r, zero);
                r = _mm512_mask_add_epi64(r, neg, r, p);
                __mmask8 big = _mm512_cmpge_epi64_mask(r, p);
                r = _mm512_mask_sub_epi64(r, big, r, p);
                r = _mm512_add_epi64(r, _mm512_loadu_si512((const void *)(offsets + col)));
                _mm256_storeu_si256((__m256i *)(o + col), _mm512_cvtepi64_epi32(r));
            }
        }
    }
}
#else
#define ENGRAM_HAVE_AVX512_PATH 0
static int engram_cpu_has_avx512(void) { return 0; }
static void engram_hash_batch_avx512(int L, int N, const uint64_t *mults, const uint64_t *primes,
                                     const double *inv, const uint64_t *offsets, int32_t pad,
                                     const int32_t *ext, ptrdiff_t T, uint32_t *out) {
    (void)L; (void)N; (void)mults; (void)primes; (void)inv; (void)offsets; (void)pad;
    (void)ext; (void)T; (void)out;
}
#endif

#endif
