/* RMSNorm of bf16 rows, for CPUs with AVX512-BF16, in transformers' order of
   roundings: each row normalised in fp32 and rounded to bf16, then multiplied by
   the bf16 weight and rounded again. Torch composes it from about a dozen ops,
   whose dispatch was most of a decode step's small-op time (docs/benchmarks.md). */

#include <math.h>

#include "kernels.h"
#include "vec.h"

void rms_norm_row(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t dim,
                     float eps) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < dim; c += 16) {
        __m512 v = load_bf16(x + c, tail_mask(dim - c));
        acc = _mm512_fmadd_ps(v, v, acc);
    }
    const __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)dim + eps));
    for (int64_t c = 0; c < dim; c += 16) {
        __mmask16 m = tail_mask(dim - c);
        __m512 y = round_bf16(_mm512_mul_ps(load_bf16(x + c, m), r));
        __m256bh o = _mm512_cvtneps_pbh(_mm512_mul_ps(y, load_bf16(w + c, m)));
        _mm256_mask_storeu_epi16(out + c, m, (__m256i)o);
    }
}

void rms_norm_bf16(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t rows,
                   int64_t dim, float eps, int threads) {
    /* A thread wake-up costs more than a few rows of work. */
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * dim >= 16384)
    for (int64_t r = 0; r < rows; r++) rms_norm_row(x + r * dim, w, out + r * dim, dim, eps);
}
