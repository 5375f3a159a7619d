/* Kernels of the row codec e4m3_e8m0_32_row264 (SPEC §5).
 *
 * A row is 256 E4M3 codes then 8 E8M0 scale bytes; value j uses code raw[j]
 * and scale raw[256 + j / 32].  The rule: e4m3 * 2^(s-127) computed exactly in
 * float32, then the float32 bits rounded to bfloat16 with round-to-nearest-even.
 *
 * Decode works on the bits and never has a subnormal float32 operand (they
 * cost a microcode assist per vector on x86):
 *   - the E4M3 magnitude becomes a normal float32 (rebias the exponent, or
 *     mag / 512 for exponent 0);
 *   - a normal result is that float with s - 127 added to its exponent field;
 *     it has 4 significant bits, so bf16 rounding leaves it as it is;
 *   - a subnormal result (only for s <= 9) is rounded to bf16 as k << 16 with
 *     k = RNE(|value| * 2^133), computed in float32 from normal operands.
 * The sign bit of the code is copied.  Exact on every path; the tests compare
 * every (code, scale) pair with a literal NumPy twin of the rule.
 *
 * Check, per value: with mag = code & 0x7F the value is bad iff mag >= thr[s],
 * where thr[s] = 127 (NaN code only) for s <= 246; for 247 <= s <= 254 it is the
 * code of 2^(255-s) (|e4m3| >= 2^(255-s) gives |value| >= 2^128: float32 overflow;
 * no finite product rounds up to infinity, its significand has 4 bits); 0 for the
 * NaN scale 255.
 *
 * Paths: the same loops compiled three times, for the build's baseline (SSE2 on
 * x86-64, NEON on arm64), and with target attributes for AVX2 and AVX-512 on
 * x86-64 (chosen at run time with __builtin_cpu_supports).  GCC and clang
 * vectorize them at -O3; all operations are exact integer or IEEE float32
 * operations (no -ffast-math), so every path gives the same bits.
 */
#ifndef ENGRAM_CODEC_SIMD_H
#define ENGRAM_CODEC_SIMD_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

#define ENGRAM_CODEC_PORTABLE 0
#define ENGRAM_CODEC_AVX2 1
#define ENGRAM_CODEC_AVX512 2

#define ENGRAM_CODEC_ROW_BYTES 264
#define ENGRAM_CODEC_ROW_VALUES 256
#define ENGRAM_CODEC_BLOCK 32

/* scale byte -> check threshold on code & 0x7F (see above). */
static uint8_t engram_codec_thr[256];

static void engram_codec_init(void) {
    for (int s = 0; s < 256; s++) {
        if (s <= 246) engram_codec_thr[s] = 127;
        else if (s <= 254) engram_codec_thr[s] = (uint8_t)((262 - s) << 3);   /* code of 2^(255-s) */
        else engram_codec_thr[s] = 0;
    }
}

#if defined(__GNUC__) || defined(__clang__)
#define ENGRAM_INLINE static inline __attribute__((always_inline))
#else
#define ENGRAM_INLINE static inline
#endif

typedef union { float f; uint32_t u; } engram_f32u;

/* E4M3 magnitude of mag = code & 0x7F as float32 bits (a normal float32 or +0). */
ENGRAM_INLINE uint32_t engram_codec_mag_bits(uint32_t mag) {
    engram_f32u nrm, sub;
    nrm.u = (mag << 20) + (120u << 23);                  /* exponent 1..15: rebias 7 -> 127 */
    sub.f = (float)(int32_t)mag * 0.001953125f;          /* exponent 0: mag / 512 */
    uint32_t is_sub = 0u - (uint32_t)(mag < 8u);
    return (sub.u & is_sub) | (nrm.u & ~is_sub);
}

/* Block of 32 values with scale byte s >= 10: every nonzero result is a normal
 * float32 (>= 2^-9 * 2^-117), so the product is an exponent add and bf16 rounding
 * changes nothing (4 significant bits).  Integer operations only. */
ENGRAM_INLINE void engram_codec_block_normal(const uint8_t *restrict c, uint32_t s, float *restrict o) {
    const uint32_t add = (s - 127u) << 23;
    for (int j = 0; j < ENGRAM_CODEC_BLOCK; j++) {
        uint32_t code = c[j];
        uint32_t mag = code & 0x7Fu;
        uint32_t nz = 0u - (uint32_t)(mag != 0u);
        uint32_t r = ((engram_codec_mag_bits(mag) + add) & nz) | ((code & 0x80u) << 24);
        memcpy(o + j, &r, 4);
    }
}

/* Block with scale byte s <= 9: results below 2^-126 are float32 subnormals.
 * Their bf16 bits are k << 16 with k = RNE(|value| * 2^133) (the rounding of the
 * float32 bits at bit 16; k = 128 carries into the exponent as it should), and
 * |value| * 2^133 = e4m3 * 2^(s+6) < 2^7 is computed without subnormal operands;
 * RNE to an integer by adding and subtracting 1.5 * 2^23.  Normal results are
 * exponent adds as above. */
ENGRAM_INLINE void engram_codec_block_small(const uint8_t *restrict c, uint32_t s, float *restrict o) {
    const uint32_t add = (s - 127u) << 23;
    engram_f32u f;
    f.u = (s + 6u + 127u) << 23;                         /* 2^(s+6) */
    for (int j = 0; j < ENGRAM_CODEC_BLOCK; j++) {
        uint32_t code = c[j];
        uint32_t mag = code & 0x7Fu;
        engram_f32u v;
        v.u = engram_codec_mag_bits(mag);
        uint32_t is_norm = 0u - (uint32_t)(((v.u >> 23) + s) >= 128u);
        float y = v.f * f.f;
        y = (y + 12582912.0f) - 12582912.0f;
        uint32_t sub = ((uint32_t)(int32_t)y) << 16;
        uint32_t r = (((v.u + add) & is_norm) | (sub & ~is_norm)) | ((code & 0x80u) << 24);
        memcpy(o + j, &r, 4);
    }
}

ENGRAM_INLINE void engram_codec_decode_row_body(const uint8_t *restrict raw, float *restrict out) {
    for (int b = 0; b < 8; b++) {
        uint32_t s = raw[256 + b];
        if (s >= 10u)
            engram_codec_block_normal(raw + b * ENGRAM_CODEC_BLOCK, s, out + b * ENGRAM_CODEC_BLOCK);
        else
            engram_codec_block_small(raw + b * ENGRAM_CODEC_BLOCK, s, out + b * ENGRAM_CODEC_BLOCK);
    }
}

/* 0 when the row is good, nonzero otherwise (no column). */
ENGRAM_INLINE int engram_codec_row_bad_body(const uint8_t *restrict raw) {
    uint8_t acc = 0;
    for (int b = 0; b < 8; b++) {
        const uint8_t thr = engram_codec_thr[raw[256 + b]];
        const uint8_t *c = raw + b * ENGRAM_CODEC_BLOCK;
        uint8_t bad = 0;
        for (int j = 0; j < ENGRAM_CODEC_BLOCK; j++)
            bad |= (uint8_t)(((uint8_t)(c[j] & 0x7F)) >= thr);
        acc |= bad;
    }
    return acc;
}

/* First bad column of a row, -1 if none (scalar; run only on rows found bad). */
static int engram_codec_first_bad(const uint8_t *raw) {
    for (int j = 0; j < ENGRAM_CODEC_ROW_VALUES; j++)
        if ((raw[j] & 0x7F) >= engram_codec_thr[raw[256 + j / ENGRAM_CODEC_BLOCK]]) return j;
    return -1;
}

#define ENGRAM_CODEC_DEFINE(SUFFIX, ATTR)                                                        \
    ATTR static void engram_codec_decode_rows_##SUFFIX(const uint8_t *raw, ptrdiff_t n,          \
                                                       float *out) {                              \
        for (ptrdiff_t i = 0; i < n; i++)                                                         \
            engram_codec_decode_row_body(raw + i * ENGRAM_CODEC_ROW_BYTES,                        \
                                         out + i * ENGRAM_CODEC_ROW_VALUES);                      \
    }                                                                                             \
    /* Index of the first row that is bad, or n. */                                              \
    ATTR static ptrdiff_t engram_codec_find_bad_##SUFFIX(const uint8_t *raw, ptrdiff_t n) {       \
        for (ptrdiff_t i = 0; i < n; i++)                                                         \
            if (engram_codec_row_bad_body(raw + i * ENGRAM_CODEC_ROW_BYTES)) return i;            \
        return n;                                                                                 \
    }

ENGRAM_CODEC_DEFINE(portable, )

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ENGRAM_CODEC_HAVE_X86 1
ENGRAM_CODEC_DEFINE(avx2, __attribute__((target("avx2"))))
ENGRAM_CODEC_DEFINE(avx512, __attribute__((target("avx512f,avx512bw,avx512vl"))))

static int engram_codec_cpu_path(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl"))
        return ENGRAM_CODEC_AVX512;
    if (__builtin_cpu_supports("avx2")) return ENGRAM_CODEC_AVX2;
    return ENGRAM_CODEC_PORTABLE;
}
#else
#define ENGRAM_CODEC_HAVE_X86 0
static int engram_codec_cpu_path(void) { return ENGRAM_CODEC_PORTABLE; }
#endif

static void engram_codec_decode_rows(int path, const uint8_t *raw, ptrdiff_t n, float *out) {
#if ENGRAM_CODEC_HAVE_X86
    if (path == ENGRAM_CODEC_AVX512) { engram_codec_decode_rows_avx512(raw, n, out); return; }
    if (path == ENGRAM_CODEC_AVX2) { engram_codec_decode_rows_avx2(raw, n, out); return; }
#endif
    (void)path;
    engram_codec_decode_rows_portable(raw, n, out);
}

static ptrdiff_t engram_codec_find_bad(int path, const uint8_t *raw, ptrdiff_t n) {
#if ENGRAM_CODEC_HAVE_X86
    if (path == ENGRAM_CODEC_AVX512) return engram_codec_find_bad_avx512(raw, n);
    if (path == ENGRAM_CODEC_AVX2) return engram_codec_find_bad_avx2(raw, n);
#endif
    (void)path;
    return engram_codec_find_bad_portable(raw, n);
}

#endif
