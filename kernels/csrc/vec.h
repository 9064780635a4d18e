/* AVX512 helpers shared by the CPU kernels: bf16 loads and rounding, tail masks, exp. */
#ifndef PREFIXCHAT_VEC_H
#define PREFIXCHAT_VEC_H

#include <immintrin.h>
#include <stdint.h>

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* v rounded to bf16 (nearest even), kept as fp32. */
static inline __m512 round_bf16(__m512 v) {
    __m256bh h = _mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
}

/* e^x for x <= 0: e^x = 2^k e^r with |r| <= ln2 / 2, e^r by its Taylor polynomial. */
static inline __m512 exp_nonpositive(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2 = _mm512_set1_ps(0.693147180559945f);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, ln2, x);
    __m512 p = _mm512_set1_ps(1.0f / 120.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k); /* p * 2^k; 0 far below fp32's range */
}

#endif
