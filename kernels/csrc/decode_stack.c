/* A whole decode step of a Llama-family model with quantized weights, in one call:
   every layer's norms, matmuls, rotary, KV store, attention, residuals and MLP
   for a few rows (one new token per sequence), then the final norm.

   Op by op it is the torch forward of inference/models/llama.py on the same C
   kernels, with the same bf16 roundings at the same places (each op's output is
   rounded to bf16 as torch rounds it). What it saves is the rest: a decode step
   of SmolLM2 is ~300 small ops, and their Python and dispatch costs, plus an
   OpenMP fork and join for each kernel, were as long as the matmuls themselves
   at one sequence. Here one parallel region runs the step; the threads share
   each matmul and each attention, and one of them does the small per-row ops
   between them while the others wait at the barrier. */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "stack.h"
#include "vec.h"


static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch and vcvtneps2bf16 do. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline void store_bf16(uint16_t *p, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

/* x += y, rounded to bf16 (torch's x + h in bf16). */
static void add_into(uint16_t *x, const uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n - i);
        store_bf16(x + i, _mm512_add_ps(load_bf16(x + i, m), load_bf16(y + i, m)), m);
    }
}

/* e^x to about an fp32 ulp (torch's silu uses Sleef's 1-ulp exp): e^x = 2^k e^r with
   |r| <= ln2 / 2 and e^r by Taylor to r^7. */
static inline __m512 exp_fine(__m512 x) {
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428606765330187e-06f), r); /* ln2 in two parts */
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    const float c[] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    for (int i = 0; i < 7; i++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c[i]));
    return _mm512_scalef_ps(p, k);
}

/* act = silu(gate) * up with torch's roundings (silu(g) = g / (1 + e^-g) in fp32,
   rounded, times up, rounded); gate and up are the two halves of each gate_up row. */
static void silu_mul(const uint16_t *gate_up, uint16_t *act, int64_t rows, int64_t inter) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *g = gate_up + r * 2 * inter, *u = g + inter;
        for (int64_t i = 0; i < inter; i += 16) {
            __mmask16 m = tail_mask(inter - i);
            __m512 x = load_bf16(g + i, m);
            __m512 e = exp_fine(_mm512_sub_ps(_mm512_setzero_ps(), x));
            __m512 s = round_bf16(_mm512_div_ps(x, _mm512_add_ps(one, e)));
            store_bf16(act + r * inter + i, _mm512_mul_ps(s, load_bf16(u + i, m)), m);
        }
    }
}

/* Rotary on n heads of one row, in place: x * cos + roll(x, D/2) * signed_sin, with
   x * cos rounded to bf16 first (torch.addcmul over x * cos). */
static void rotate(uint16_t *x, const uint16_t *cos, const uint16_t *sin, int64_t n,
                   int64_t head_dim) {
    float head[256];
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n; h++) {
        uint16_t *p = x + h * head_dim;
        for (int64_t c = 0; c < head_dim; c++) head[c] = from_bf16(p[c]);
        for (int64_t c = 0; c < head_dim; c++) {
            float a = from_bf16(to_bf16(head[c] * from_bf16(cos[c])));
            float rolled = head[(c + half) % head_dim];
            p[c] = to_bf16(fmaf(rolled, from_bf16(sin[c]), a));
        }
    }
}

/* y = xf W^T (+ bias) for the rows, the matmul shared by the region's threads. */
static void matmul(const stack_matmul *w, const float *xf, int64_t rows, uint16_t *y) {
    quant_matmul_tiles((int)w->kind, xf, 1, rows, w->in_pad, w->data, w->scale, w->out, y, 1);
    if (w->bias) {
#pragma omp single
        for (int64_t r = 0; r < rows; r++) add_into(y + r * w->out, w->bias, w->out);
    }
}

/* x [rows, hidden] bf16: the new tokens' embeddings in, the last layer's residual
   stream out; out [rows, hidden]: the final norm of it. cos and sin [rows, D]
   (sin sign-folded, as the torch forward builds them); slots [rows] the cache slot
   of each new token (-1: not stored); tables [rows, >= ceil(lens / block_size)]
   with rows table_stride apart and lens [rows] the context lengths, the new token
   included. The caches are one tensor [2, layers, blocks, block_size, kv_heads, D]
   at kv. Returns 0; 1 for no memory; 2 for a bad shape. */
int decode_stack(const stack_model *m, uint16_t *x, int64_t rows, const uint16_t *cos,
                 const uint16_t *sin, const int64_t *slots, uint16_t *kv, int64_t num_blocks,
                 const int64_t *tables, int64_t table_stride, const int64_t *lens,
                 uint16_t *out, int threads) {
    const int64_t hidden = m->hidden, hd = m->head_dim, heads = m->heads;
    const int64_t kv_heads = m->kv_heads, inter = m->inter;
    if (rows < 1 || rows > QUANT_MAX_ROWS || hd % 16 || hd > 256 || heads % kv_heads)
        return 2;
    const int64_t q_size = heads * hd, kv_size = kv_heads * hd, qkv_out = q_size + 2 * kv_size;
    const int64_t token = kv_size, layer_stride = num_blocks * m->block_size * token;
    int64_t in_pad, width;
    stack_widths(m, &in_pad, &width);
    if (m->layers < 1 || m->layer[0].qkv.out != qkv_out || m->layer[0].gate_up.out != 2 * inter
        || m->layer[0].q_norm || m->act != STACK_SILU)
        return 2;
    for (int64_t l = 0; l < m->layers; l++) /* Gemma 3's parts are the fp32 step's */
        if (m->layer[l].attn_out_norm || m->layer[l].mlp_out_norm || m->layer[l].window
            || m->layer[l].rope)
            return 2;
    float *xf = aligned_alloc(64, (size_t)quant_act_bytes(rows, in_pad));
    uint16_t *buf = malloc((size_t)(rows * (hidden + width + q_size + q_size + inter)) * 2);
    if (!xf || !buf) {
        free(xf);
        free(buf);
        return 1;
    }
    uint16_t *h = buf, *y = h + rows * hidden, *q = y + rows * width;
    uint16_t *attn = q + rows * q_size, *act = attn + rows * q_size;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = decode_attention_buffer(lens, rows, heads, kv_heads, hd, &failed);
        for (int64_t l = 0; l < m->layers; l++) {
            const stack_layer *L = &m->layer[l];
            uint16_t *k_cache = kv + l * layer_stride;
            uint16_t *v_cache = kv + (m->layers + l) * layer_stride;
#pragma omp single
            {
                for (int64_t r = 0; r < rows; r++)
                    rms_norm_row(x + r * hidden, L->input_norm, h + r * hidden, hidden, m->eps);
                quant_widen(xf, h, 1, rows, hidden, L->qkv.in_pad);
            }
            matmul(&L->qkv, xf, rows, y);
#pragma omp single
            for (int64_t r = 0; r < rows; r++) {
                uint16_t *row = y + r * qkv_out;
                rotate(row, cos + r * hd, sin + r * hd, heads + kv_heads, hd);
                memcpy(q + r * q_size, row, (size_t)q_size * 2);
                if (slots[r] >= 0) {
                    memcpy(k_cache + slots[r] * token, row + q_size, (size_t)kv_size * 2);
                    memcpy(v_cache + slots[r] * token, row + q_size + kv_size,
                           (size_t)kv_size * 2);
                }
            }
            decode_attention_tasks(q, k_cache, v_cache, tables, table_stride, lens, attn, rows,
                                   heads, kv_heads, hd, m->block_size, m->scale, scores);
#pragma omp single
            quant_widen(xf, attn, 1, rows, q_size, L->o.in_pad);
            matmul(&L->o, xf, rows, y);
#pragma omp single
            {
                add_into(x, y, rows * hidden);
                for (int64_t r = 0; r < rows; r++)
                    rms_norm_row(x + r * hidden, L->post_norm, h + r * hidden, hidden, m->eps);
                quant_widen(xf, h, 1, rows, hidden, L->gate_up.in_pad);
            }
            matmul(&L->gate_up, xf, rows, y);
#pragma omp single
            {
                silu_mul(y, act, rows, inter);
                quant_widen(xf, act, 1, rows, inter, L->down.in_pad);
            }
            matmul(&L->down, xf, rows, y);
#pragma omp single
            add_into(x, y, rows * hidden);
        }
#pragma omp single
        for (int64_t r = 0; r < rows; r++)
            rms_norm_row(x + r * hidden, m->norm, out + r * hidden, hidden, m->eps);
        free(scores);
    }
    free(xf);
    free(buf);
    return failed;
}
