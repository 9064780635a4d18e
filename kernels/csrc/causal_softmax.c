/* Causal softmax over bf16 attention scores, in place, for CPUs with AVX512-BF16.

   Scores [rows, length] of n queries that are the last n of `length` positions;
   row r holds query r % n (the heads of a KV group are folded into rows), which
   sees keys 0 .. length - n + r % n. Each row becomes its softmax over the visible
   keys, computed in fp32 and rounded to bf16 once, with zeros after them.

   Torch's softmax spends most of its time in a full-precision exp. The output is
   bf16 (relative step 2^-8), so a degree-5 polynomial exp (2e-6 relative error)
   gives the same rounded values to within one bf16 step, at about twice the
   speed; the causal mask comes from the row index instead of a mask tensor. */

#include <math.h>
#include <stdlib.h>

#include "vec.h"

/* One row: max, then exp and sum into the fp32 buffer, then scale and round. */
static void softmax_row(uint16_t *row, int64_t visible, int64_t length, float *buf) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < visible; c += 16) {
        __mmask16 m = tail_mask(visible - c);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, load_bf16(row + c, m));
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t c = 0; c < visible; c += 16) {
        __mmask16 m = tail_mask(visible - c);
        __m512 e = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(load_bf16(row + c, m), mx)));
        vsum = _mm512_add_ps(vsum, e);
        _mm512_storeu_ps(buf + c, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (int64_t c = 0; c < visible; c += 16) {
        __m256bh o = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(buf + c), inv));
        _mm256_mask_storeu_epi16(row + c, tail_mask(visible - c), (__m256i)o);
    }
    for (int64_t c = visible; c < length; c += 16) {
        _mm256_mask_storeu_epi16(row + c, tail_mask(length - c), _mm256_setzero_si256());
    }
}

/* Returns 0, or 1 where a thread could not get its row buffer (nothing is then
   guaranteed about the scores). */
int causal_softmax_bf16(uint16_t *scores, int64_t rows, int64_t n, int64_t length,
                        int threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        /* Rounded up to whole vectors: the exp loop stores 16 lanes at a time. */
        float *buf = aligned_alloc(64, (size_t)((length + 15) / 16) * 16 * sizeof(float));
        if (buf == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (buf != NULL) softmax_row(scores + r * length, length - n + r % n + 1, length, buf);
        }
        free(buf);
    }
    return failed;
}
