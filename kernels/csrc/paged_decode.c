/* Decode attention over the paged KV cache, for CPUs with AVX512-BF16.

   One query token per sequence attends to its sequence's cached keys and values,
   read in place through its block table: nothing is gathered or padded, so a step
   costs what its contexts hold, not batch x the longest one. Per (sequence, KV
   head) the heads sharing that KV head are done together, each key converted to
   fp32 once. Scores, softmax and the weighted sum of values stay in fp32; the
   output is rounded to bf16 once.

   Layout: query and out [batch, heads, head_dim]; caches [blocks, block_size,
   kv_heads, head_dim]; head h reads KV head h / (heads / kv_heads). */

#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "vec.h"

#define MAX_CHUNKS 16 /* head_dim up to 256, in 16-lane chunks */

/* chunks = head_dim / 16; a constant at the call sites that matter, so the loops
   over it unroll and the accumulators stay in registers. q32 holds the group's
   queries in fp32, scores group x len floats. */
static inline __attribute__((always_inline)) void
attend(const uint16_t *q, const uint16_t *k_cache, const uint16_t *v_cache,
       const int64_t *table, int64_t len, uint16_t *out, int64_t group, int64_t kv_heads,
       int64_t kv_head, int64_t block_size, float scale, float *q32, float *scores,
       const int chunks) {
    const int64_t head_dim = (int64_t)chunks * 16;
    /* Token t of the sequence is at slot `off` of block table[t / block_size]; the
       loops walk whole blocks to avoid a division per token. */
    const int64_t token_stride = kv_heads * head_dim;
    const int64_t block_stride = block_size * token_stride;
    for (int64_t i = 0; i < group * head_dim; i += 16)
        _mm512_storeu_ps(q32 + i, load_bf16(q + i, 0xFFFF));
    for (int64_t t0 = 0; t0 < len; t0 += block_size) {
        const uint16_t *k = k_cache + table[t0 / block_size] * block_stride + kv_head * head_dim;
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        for (int64_t off = 0; off < n; off++, k += token_stride) {
            __m512 kv[MAX_CHUNKS];
            for (int c = 0; c < chunks; c++) kv[c] = load_bf16(k + 16 * c, 0xFFFF);
            for (int64_t g = 0; g < group; g++) {
                __m512 acc = _mm512_setzero_ps();
                for (int c = 0; c < chunks; c++)
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(q32 + g * head_dim + 16 * c), kv[c], acc);
                scores[g * len + t0 + off] = _mm512_reduce_add_ps(acc) * scale;
            }
        }
    }
    for (int64_t g = 0; g < group; g++) {
        float *s = scores + g * len;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int64_t t = 0; t < len; t += 16) {
            __mmask16 m = tail_mask(len - t);
            vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, s + t));
        }
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t t = 0; t < len; t += 16) {
            __mmask16 m = tail_mask(len - t);
            __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + t), mx));
            e = _mm512_maskz_mov_ps(m, e);
            vsum = _mm512_add_ps(vsum, e);
            _mm512_mask_storeu_ps(s + t, m, e);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
        __m512 acc[MAX_CHUNKS];
        for (int c = 0; c < chunks; c++) acc[c] = _mm512_setzero_ps();
        for (int64_t t0 = 0; t0 < len; t0 += block_size) {
            const uint16_t *v =
                v_cache + table[t0 / block_size] * block_stride + kv_head * head_dim;
            const int64_t n = len - t0 < block_size ? len - t0 : block_size;
            for (int64_t off = 0; off < n; off++, v += token_stride) {
                const __m512 p = _mm512_set1_ps(s[t0 + off]);
                for (int c = 0; c < chunks; c++)
                    acc[c] = _mm512_fmadd_ps(p, load_bf16(v + 16 * c, 0xFFFF), acc[c]);
            }
        }
        for (int c = 0; c < chunks; c++) {
            __m256bh o = _mm512_cvtneps_pbh(_mm512_mul_ps(acc[c], inv));
            _mm256_storeu_si256((__m256i *)(out + g * head_dim + 16 * c), (__m256i)o);
        }
    }
}

static int64_t longest(const int64_t *lens, int64_t batch) {
    int64_t max_len = 0;
    for (int64_t b = 0; b < batch; b++) max_len = lens[b] > max_len ? lens[b] : max_len;
    return max_len;
}

float *decode_attention_buffer(const int64_t *lens, int64_t batch, int64_t heads,
                               int64_t kv_heads, int64_t head_dim, int *failed) {
    const int64_t group = heads / kv_heads;
    float *scores = malloc((size_t)(group * (longest(lens, batch) + head_dim)) * sizeof(float));
    if (scores == NULL) {
#pragma omp atomic write
        *failed = 1;
    }
    return scores;
}

void decode_attention_tasks(const uint16_t *query, const uint16_t *k_cache,
                            const uint16_t *v_cache, const int64_t *tables,
                            int64_t table_stride, const int64_t *lens, uint16_t *out,
                            int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
                            int64_t block_size, float scale, float *scores) {
    const int chunks = (int)(head_dim / 16);
    const int64_t group = heads / kv_heads;
    float *q32 = scores == NULL ? NULL : scores + group * longest(lens, batch);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < batch * kv_heads; task++) {
        if (scores == NULL) continue;
        const int64_t b = task / kv_heads, kh = task % kv_heads;
        const int64_t at = (b * heads + kh * group) * head_dim;
        const int64_t *table = tables + b * table_stride;
        if (chunks == 4)
            attend(query + at, k_cache, v_cache, table, lens[b], out + at, group, kv_heads, kh,
                   block_size, scale, q32, scores, 4);
        else if (chunks == 8)
            attend(query + at, k_cache, v_cache, table, lens[b], out + at, group, kv_heads, kh,
                   block_size, scale, q32, scores, 8);
        else
            attend(query + at, k_cache, v_cache, table, lens[b], out + at, group, kv_heads, kh,
                   block_size, scale, q32, scores, chunks);
    }
}

/* Returns 0; 1 where a thread could not get its score buffer; 2 for a head_dim
   that isn't a multiple of 16 up to 256. */
int paged_decode_attention_bf16(const uint16_t *query, const uint16_t *k_cache,
                                const uint16_t *v_cache, const int64_t *tables,
                                int64_t table_stride, const int64_t *lens, uint16_t *out,
                                int64_t batch, int64_t heads, int64_t kv_heads,
                                int64_t head_dim, int64_t block_size, float scale,
                                int threads) {
    if (head_dim % 16 || head_dim / 16 > MAX_CHUNKS) return 2;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = decode_attention_buffer(lens, batch, heads, kv_heads, head_dim, &failed);
        decode_attention_tasks(query, k_cache, v_cache, tables, table_stride, lens, out, batch,
                               heads, kv_heads, head_dim, block_size, scale, scores);
        free(scores);
    }
    return failed;
}
