/* Eight-float vectors for the fp32 kernels, in GCC's vector extensions: one source
   that the compiler turns into AVX2 + FMA instructions (built with -mavx2 -mfma
   -mf16c), NEON on ARM64, or SSE2 pairs on any other x86-64. */
#ifndef PREFIXCHAT_F32_SIMD_H
#define PREFIXCHAT_F32_SIMD_H

#include <stdint.h>
#include <string.h>

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8v __attribute__((vector_size(32)));
typedef uint32_t u8v __attribute__((vector_size(32)));

#define LANES 8

static inline f8 splat(float s) { return (f8){s, s, s, s, s, s, s, s}; }

/* Unaligned loads and stores (memcpy compiles to one vector move). */
static inline f8 load8(const float *p) {
    f8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, f8 v) { memcpy(p, &v, sizeof v); }

static inline float hmax(f8 v) {
    float m = v[0];
    for (int i = 1; i < LANES; i++) m = v[i] > m ? v[i] : m;
    return m;
}

/* Lanes of a where mask (a comparison's all-ones lanes), else b. */
static inline f8 select8(i8v mask, f8 a, f8 b) {
    i8v ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    i8v r = (ia & mask) | (ib & ~mask);
    f8 f;
    memcpy(&f, &r, sizeof f);
    return f;
}

static inline f8 vmax(f8 a, f8 b) { return select8(a > b, a, b); }
static inline f8 vmin(f8 a, f8 b) { return select8(a < b, a, b); }

/* Widening 8 bytes or 8 bf16 values to floats. GCC's generic conversions of
   narrow vectors went lane by lane (vpinsrd), so AVX2 and NEON take their
   instructions; other CPUs the portable form. */
#if defined(__AVX2__)
#include <immintrin.h>

static inline i8v widen_u8(const uint8_t *p) {
    return (i8v)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static inline i8v widen_s8(const int8_t *p) {
    return (i8v)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static inline i8v widen_u16(const uint16_t *p) {
    return (i8v)_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
}

static inline f8 to_f8(i8v v) { return (f8)_mm256_cvtepi32_ps((__m256i)v); }

static inline float hsum(f8 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#elif defined(__ARM_NEON)
#include <arm_neon.h>

static inline i8v join4(int32x4_t lo, int32x4_t hi) {
    i8v v;
    memcpy(&v, &lo, 16);
    memcpy((char *)&v + 16, &hi, 16);
    return v;
}

static inline i8v widen_u8(const uint8_t *p) {
    const uint16x8_t h = vmovl_u8(vld1_u8(p));
    return join4(vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))),
                 vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(h))));
}

static inline i8v widen_s8(const int8_t *p) {
    const int16x8_t h = vmovl_s8(vld1_s8(p));
    return join4(vmovl_s16(vget_low_s16(h)), vmovl_s16(vget_high_s16(h)));
}

static inline i8v widen_u16(const uint16_t *p) {
    const uint16x8_t h = vld1q_u16(p);
    return join4(vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))),
                 vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(h))));
}

static inline f8 to_f8(i8v v) { return __builtin_convertvector(v, f8); }

static inline float hsum(f8 v) {
    float32x4_t lo, hi;
    memcpy(&lo, &v, 16);
    memcpy(&hi, (char *)&v + 16, 16);
    return vaddvq_f32(vaddq_f32(lo, hi));
}
#else
static inline i8v widen_u8(const uint8_t *p) {
    i8v v;
    for (int i = 0; i < LANES; i++) v[i] = p[i];
    return v;
}

static inline i8v widen_s8(const int8_t *p) {
    i8v v;
    for (int i = 0; i < LANES; i++) v[i] = p[i];
    return v;
}

static inline i8v widen_u16(const uint16_t *p) {
    i8v v;
    for (int i = 0; i < LANES; i++) v[i] = p[i];
    return v;
}

static inline f8 to_f8(i8v v) { return __builtin_convertvector(v, f8); }

static inline float hsum(f8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}
#endif

static inline f8 u8_to_f8(const uint8_t *p) { return to_f8(widen_u8(p)); }
static inline f8 s8_to_f8(const int8_t *p) { return to_f8(widen_s8(p)); }

/* The low and high nibbles of 8 bytes as floats. */
static inline void nibbles_to_f8(const uint8_t *p, f8 *lo, f8 *hi) {
    const i8v b = widen_u8(p);
    *lo = to_f8(b & 0x0F);
    *hi = to_f8(b >> 4);
}

/* 8 bf16 values widened to floats (exact: a bf16 is a float's top half). */
static inline f8 bf16_to_f8(const uint16_t *p) {
    const i8v u = widen_u16(p) << 16;
    f8 f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* An fp16 scale as a float. */
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h); /* immintrin.h: included with AVX2 above */
#elif defined(__aarch64__)
    __fp16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, u;
    if (exp == 0x1F) {
        u = sign | 0x7F800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (!man) {
        u = sign;
    } else { /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400u)) {
            man <<= 1;
            exp--;
        }
        u = sign | (exp << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* n fp16 scales as floats: a row's scales at once, eight to an instruction where
   F16C has one, so that the dot products broadcast each from memory instead of
   converting it in their loop. */
static inline void halves_to_floats(const uint16_t *h, float *f, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) f[i] = half_to_float(h[i]);
}

/* e^x to about an fp32 ulp: e^x = 2^k e^r with |r| <= ln2 / 2 (k rounded by the
   1.5 * 2^23 trick), e^r by Taylor to r^7; 0 far below fp32's range. */
static inline f8 exp8(f8 x) {
    x = vmin(vmax(x, splat(-87.0f)), splat(88.0f));
    const f8 magic = splat(12582912.0f);
    f8 k = (x * splat(1.44269504088896341f) + magic) - magic;
    f8 r = x - k * splat(0.693145751953125f);
    r = r - k * splat(1.428606765330187e-06f);
    f8 p = splat(1.0f / 5040.0f);
    p = p * r + splat(1.0f / 720.0f);
    p = p * r + splat(1.0f / 120.0f);
    p = p * r + splat(1.0f / 24.0f);
    p = p * r + splat(1.0f / 6.0f);
    p = p * r + splat(0.5f);
    p = p * r + splat(1.0f);
    p = p * r + splat(1.0f);
    i8v bits = (__builtin_convertvector(k, i8v) + 127) << 23;
    f8 scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Decode streams every weight once a step: read ahead of the hardware prefetcher. */
#define PREFETCH_BYTES 2048
static ALWAYS_INLINE void prefetch_ahead(const void *p) {
    __builtin_prefetch((const char *)p + PREFETCH_BYTES, 0, 3);
}

#endif
