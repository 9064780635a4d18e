/* Decode in fp32: attention of one new token per sequence over the paged KV cache,
   and a whole decode step of a Llama-family or Gemma 3 model in one call, as the torch
   forwards of inference/models/llama.py and gemma3.py compute it in fp32 (the same ops in the
   same order; sums in another order). One parallel region runs the step: the
   threads share each matmul and each attention, and one of them does the small
   per-row ops between them while the others wait at the barrier. */

#include <math.h>
#include <stdlib.h>

#include "../stack.h"
#include "f32.h"
#include "kv_row.h"
#include "simd.h"


/* heads rows of head_dim floats stored at element i of a cache of `kind`: bf16 rounds
   to nearest even (NaN kept quiet), as torch's float-to-bfloat16 conversion does; int8
   rounds x / scale to nearest even, as kv_quant.quantize does (bit for bit). */
static void store_kv(void *cache, int64_t i, const float *x, int64_t heads, int64_t head_dim,
                     int kind) {
    const int64_t n = heads * head_dim;
    if (kind == KV_F32) {
        memcpy((float *)cache + i, x, (size_t)n * sizeof(float));
    } else if (kind == KV_BF16) {
        uint16_t *dst = (uint16_t *)cache + i;
        for (int64_t j = 0; j < n; j++) {
            uint32_t u;
            memcpy(&u, x + j, sizeof u);
            if ((u & 0x7FFFFFFFu) > 0x7F800000u)
                dst[j] = (uint16_t)((u >> 16) | 0x40u);
            else
                dst[j] = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        }
    } else {
        for (int64_t h = 0; h < heads; h++) {
            const float *r = x + h * head_dim;
            int8_t *dst = (int8_t *)cache + i + h * kv_row_elems(head_dim, KV_INT8);
            float amax = 0.0f;
            for (int64_t j = 0; j < head_dim; j++) amax = fabsf(r[j]) > amax ? fabsf(r[j]) : amax;
            const float scale = amax / 127.0f;
            for (int64_t j = 0; j < head_dim; j++) {
                float q = scale > 0.0f ? nearbyintf(r[j] / scale) : 0.0f;
                q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
                dst[j] = (int8_t)q;
            }
            memcpy(dst + head_dim, &scale, sizeof scale);
        }
    }
}

/* K and V of `tokens` tokens (fp32 rows of kv_heads x head_dim, a token every
   key_stride / value_stride floats) stored at their slots in caches of kv_kind, rounded
   as the decode step stores its own; a slot below 0 (padding) is skipped. For a
   prefill's rows: torch took a dozen passes over them for int8 rows. Returns 2, having
   written nothing, for a bad kind or shape or a slot at or past `capacity` (the
   caches' tokens). */
int f32_store_kv(const float *key, int64_t key_stride, const float *value, int64_t value_stride,
                 void *k_cache, void *v_cache, const int64_t *slots, int64_t tokens,
                 int64_t capacity, int64_t kv_heads, int64_t head_dim, int kv_kind,
                 int threads) {
    if (kv_kind < KV_F32 || kv_kind > KV_INT8 || head_dim < 1 || kv_heads < 1) return 2;
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] >= capacity) return 2;
    const int64_t token = kv_heads * kv_row_elems(head_dim, kv_kind);
#pragma omp parallel for schedule(static) num_threads(threads) if (tokens * token >= 65536)
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        store_kv(k_cache, slots[t] * token, key + t * key_stride, kv_heads, head_dim, kv_kind);
        store_kv(v_cache, slots[t] * token, value + t * value_stride, kv_heads, head_dim, kv_kind);
    }
    return 0;
}

/* Softmax in place over n scores; returns 1 / their sum of exponentials. */
static float softmax_unnormalised(float *s, int64_t n) {
    f8 vm = splat(-INFINITY);
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES) vm = vmax(vm, load8(s + t));
    float mx = hmax(vm);
    for (; t < n; t++) mx = s[t] > mx ? s[t] : mx;
    f8 vs = splat(0.0f);
    for (t = 0; t + LANES <= n; t += LANES) {
        const f8 e = exp8(load8(s + t) - splat(mx));
        store8(s + t, e);
        vs += e;
    }
    float sum = hsum(vs);
    for (; t < n; t++) {
        s[t] = expf(s[t] - mx);
        sum += s[t];
    }
    return 1.0f / sum;
}

/* The `group` query heads that share KV head kv_head, over len cached tokens read in
   place through table; chunks = head_dim / 8, a constant at the call sites so the
   loops over it unroll. */
static ALWAYS_INLINE void attend(const float *q, const void *k_cache, const void *v_cache,
                                 const int64_t *table, int64_t start, int64_t len, float *out,
                                 int64_t group, int64_t kv_heads, int64_t kv_head,
                                 int64_t block_size, float scale, float *scores, const int chunks,
                                 const int kind) {
    const int64_t head_dim = (int64_t)chunks * LANES, row_elems = kv_row_elems(head_dim, kind);
    const int64_t token_stride = kv_heads * row_elems, block_stride = block_size * token_stride;
    const int64_t keys = len - start; /* the tokens start .. len - 1 */
    for (int64_t t0 = start - start % block_size; t0 < len; t0 += block_size) {
        const int64_t base = table[t0 / block_size] * block_stride + kv_head * row_elems;
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        for (int64_t off = t0 < start ? start - t0 : 0; off < n; off++) {
            const int64_t k = base + off * token_stride;
            f8 kv[MAX_CHUNKS];
            load_row(k_cache, k, kv, chunks, kind);
            for (int64_t g = 0; g < group; g++) {
                f8 acc = splat(0.0f);
                for (int c = 0; c < chunks; c++) acc += load8(q + g * head_dim + LANES * c) * kv[c];
                scores[g * keys + t0 + off - start] = hsum(acc) * scale;
            }
        }
    }
    float inv[64];
    for (int64_t g = 0; g < group; g++) {
        inv[g] = softmax_unnormalised(scores + g * keys, keys);
        for (int64_t i = 0; i < head_dim; i++) out[g * head_dim + i] = 0.0f;
    }
    for (int64_t t0 = start - start % block_size; t0 < len; t0 += block_size) {
        const int64_t base = table[t0 / block_size] * block_stride + kv_head * row_elems;
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        for (int64_t off = t0 < start ? start - t0 : 0; off < n; off++) {
            const int64_t v = base + off * token_stride;
            f8 vv[MAX_CHUNKS];
            load_row(v_cache, v, vv, chunks, kind);
            for (int64_t g = 0; g < group; g++) {
                const f8 p = splat(scores[g * keys + t0 + off - start]);
                float *o = out + g * head_dim;
                for (int c = 0; c < chunks; c++) store8(o + LANES * c, load8(o + LANES * c) + p * vv[c]);
            }
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < head_dim; i++) out[g * head_dim + i] *= inv[g];
}

int64_t f32_attention_floats(const int64_t *lens, int64_t batch, int64_t heads,
                             int64_t kv_heads, int64_t head_dim) {
    (void)head_dim;
    int64_t longest = 1;
    for (int64_t b = 0; b < batch; b++) longest = lens[b] > longest ? lens[b] : longest;
    return heads / kv_heads * longest;
}

void f32_attention_tasks(const float *query, const void *k_cache, const void *v_cache,
                         const int64_t *tables, int64_t table_stride, const int64_t *lens,
                         float *out, int64_t batch, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, int64_t block_size, float scale, int64_t window,
                         int kv_kind, float *scores) {
    const int64_t group = heads / kv_heads;
    const int chunks = (int)(head_dim / LANES);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < batch * kv_heads; task++) {
        if (!scores) continue;
        const int64_t b = task / kv_heads, h = task % kv_heads;
        const float *q = query + (b * heads + h * group) * head_dim;
        float *o = out + (b * heads + h * group) * head_dim;
        const int64_t *table = tables + b * table_stride;
        /* A sliding window sees the last `window` tokens only. */
        const int64_t start = window > 0 && lens[b] > window ? lens[b] - window : 0;
#define ATTEND_KV(C, B) attend(q, k_cache, v_cache, table, start, lens[b], o, group, kv_heads, h, block_size, scale, scores, C, B)
#define ATTEND(C) (kv_kind == KV_INT8 ? ATTEND_KV(C, KV_INT8) \
                   : kv_kind == KV_BF16 ? ATTEND_KV(C, KV_BF16) : ATTEND_KV(C, KV_F32))
        switch (chunks) {
        case 2: ATTEND(2); break;
        case 4: ATTEND(4); break;
        case 8: ATTEND(8); break;
        case 16: ATTEND(16); break;
        case 32: ATTEND(32); break;
        default: ATTEND(chunks); break;
        }
#undef ATTEND
#undef ATTEND_KV
    }
}

static int attention_shape_ok(int64_t heads, int64_t kv_heads, int64_t head_dim) {
    return kv_heads > 0 && heads % kv_heads == 0 && heads / kv_heads <= 64 && head_dim % LANES == 0
           && head_dim > 0 && head_dim <= LANES * MAX_CHUNKS;
}

/* query and out [batch, heads, head_dim]; caches [blocks, block_size, kv_heads, row]
   of kv_kind (KV_F32, KV_BF16: rows of head_dim; KV_INT8: rows of head_dim + 4 bytes);
   tables [batch, >= ceil(lens / block_size)] rows table_stride apart;
   window: a sliding window's length (each row sees its last `window` tokens), or 0.
   Returns 0, 1 for no memory, 2 for a bad shape. */
int f32_paged_decode_attention(const float *query, const void *k_cache, const void *v_cache,
                               const int64_t *tables, int64_t table_stride, const int64_t *lens,
                               float *out, int64_t batch, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int64_t block_size, float scale, int64_t window,
                               int kv_kind, int threads) {
    if (!attention_shape_ok(heads, kv_heads, head_dim) || kv_kind < KV_F32 || kv_kind > KV_INT8)
        return 2;
    const int64_t floats = f32_attention_floats(lens, batch, heads, kv_heads, head_dim);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc((size_t)floats * sizeof(float));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
        f32_attention_tasks(query, k_cache, v_cache, tables, table_stride, lens, out, batch, heads,
                            kv_heads, head_dim, block_size, scale, window, kv_kind, scores);
        free(scores);
    }
    return failed;
}

/* weight * (x / rms(x)), as torch's weight * F.rms_norm(x) in fp32; out zero-padded
   to pad columns (the next matmul's width). */
static void rms_norm_row(const float *x, const float *w, float *out, int64_t dim, int64_t pad,
                         float eps) {
    f8 acc = splat(0.0f);
    int64_t c = 0;
    for (; c + LANES <= dim; c += LANES) acc += load8(x + c) * load8(x + c);
    float ss = hsum(acc);
    for (; c < dim; c++) ss += x[c] * x[c];
    const float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (c = 0; c < dim; c++) out[c] = w[c] * (x[c] * r);
    for (; c < pad; c++) out[c] = 0.0f;
}

void f32_rms_norm(const float *x, const float *w, float *out, int64_t rows, int64_t dim,
                  float eps) {
    for (int64_t r = 0; r < rows; r++) rms_norm_row(x + r * dim, w, out + r * dim, dim, dim, eps);
}

/* x * cos + roll(x, D/2) * signed_sin on n heads of one row, in place. */
static void rotate(float *x, const float *cos, const float *sin, int64_t n, int64_t head_dim) {
    float head[256];
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n; h++) {
        float *p = x + h * head_dim;
        memcpy(head, p, (size_t)head_dim * sizeof(float));
        for (int64_t c = 0; c < head_dim; c++) p[c] = head[c] * cos[c] + head[(c + half) % head_dim] * sin[c];
    }
}

static void matmul(const stack_matmul *w, const float *act, int64_t rows, float *y) {
    f32_matmul_tiles((int)w->kind, act, rows, w->in_pad, w->data, w->scale, w->out, y);
    if (w->bias) {
        const float *b = w->bias;
#pragma omp single
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < w->out; i++) y[r * w->out + i] += b[i];
    }
}

/* The MLP's activation on gate g times up u, into a [inter], zero-padded to pad:
   silu(g) * u, or gelu-tanh(g) * u (0.5 g (1 + tanh y) is g * sigmoid(2y), y =
   sqrt(2 / pi) (g + 0.044715 g^3)). */
static void activate(const float *g, const float *u, float *a, int64_t inter, int64_t pad,
                     int64_t act) {
    int64_t i = 0;
    if (act == STACK_GELU_TANH) {
        const float c = 0.7978845608028654f, k = 0.044715f;
        for (; i + LANES <= inter; i += LANES) {
            const f8 gv = load8(g + i);
            const f8 y2 = splat(-2.0f * c) * (gv + splat(k) * gv * gv * gv);
            store8(a + i, gv / (splat(1.0f) + exp8(y2)) * load8(u + i));
        }
        for (; i < inter; i++)
            a[i] = g[i] / (1.0f + expf(-2.0f * c * (g[i] + k * g[i] * g[i] * g[i]))) * u[i];
    } else {
        for (; i + LANES <= inter; i += LANES) {
            const f8 gv = load8(g + i);
            store8(a + i, gv / (splat(1.0f) + exp8(-gv)) * load8(u + i));
        }
        for (; i < inter; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    for (; i < pad; i++) a[i] = 0.0f;
}

/* x += norm(y) where the layer norms a sub-layer's output (Gemma 3), else x += y;
   one row of hidden. */
static void add_output(float *x, const float *y, const float *norm, float *tmp, int64_t hidden,
                       float eps) {
    if (norm) {
        rms_norm_row(y, norm, tmp, hidden, hidden, eps);
        y = tmp;
    }
    for (int64_t i = 0; i < hidden; i++) x[i] += y[i];
}

/* The fp32 counterpart of decode_stack (csrc/decode_stack.c), same arguments; cos and
   sin hold one [rows, head_dim] set per RoPE the layers take (stack_layer.rope); with
   KV groups, slots and tables hold one set per group (stack_layer.group); the cache
   holds rows of m->kv_kind (KV_F32, KV_BF16 or KV_INT8). */
int f32_decode_stack(const stack_model *m, float *x, int64_t rows, const float *cos,
                     const float *sin, const int64_t *slots, void *kv, int64_t num_blocks,
                     const int64_t *tables, int64_t table_stride, const int64_t *lens, float *out,
                     int threads) {
    const int64_t hidden = m->hidden, hd = m->head_dim, heads = m->heads;
    const int64_t kv_heads = m->kv_heads, inter = m->inter;
    if (rows < 1 || rows > F32_MAX_BATCH || !attention_shape_ok(heads, kv_heads, hd) || m->layers < 1)
        return 2;
    const int64_t q_size = heads * hd, kv_size = kv_heads * hd, qkv_out = q_size + 2 * kv_size;
    const int kv_kind = (int)m->kv_kind;
    if (kv_kind < KV_F32 || kv_kind > KV_INT8) return 2;
    const int64_t token = kv_heads * kv_row_elems(hd, kv_kind);
    const int64_t layer_stride = num_blocks * m->block_size * token;
    const int64_t kv_elem = kv_elem_bytes(kv_kind);
    int64_t in_pad, width;
    stack_widths(m, &in_pad, &width);
    if (m->layer[0].qkv.out != qkv_out || m->layer[0].gate_up.out != 2 * inter) return 2;
    float *buf = malloc((size_t)(rows * (in_pad + width + 2 * q_size) + hidden) * sizeof(float));
    if (!buf) return 1;
    float *act = buf, *y = act + rows * in_pad, *q = y + rows * width, *attn = q + rows * q_size;
    float *normed = attn + rows * q_size; /* one row of a sub-layer's normed output */
    const int64_t floats = f32_attention_floats(lens, rows, heads, kv_heads, hd);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc((size_t)floats * sizeof(float));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
        for (int64_t l = 0; l < m->layers; l++) {
            const stack_layer *L = &m->layer[l];
            const int64_t k_at = L->kv_slot * layer_stride;
            const int64_t v_at = (m->kv_layers + L->kv_slot) * layer_stride;
            char *k_cache = (char *)kv + k_at * kv_elem, *v_cache = (char *)kv + v_at * kv_elem;
            const int64_t *slot = slots + L->group * rows;
            const int64_t *table = tables + L->group * m->table_group_stride;
#pragma omp single
            for (int64_t r = 0; r < rows; r++)
                rms_norm_row(x + r * hidden, L->input_norm, act + r * L->qkv.in_pad, hidden,
                             L->qkv.in_pad, m->eps);
            matmul(&L->qkv, act, rows, y);
#pragma omp single
            for (int64_t r = 0; r < rows; r++) {
                float *row = y + r * qkv_out;
                if (L->q_norm) { /* in place: a head's sum of squares is taken first */
                    for (int64_t h = 0; h < heads; h++)
                        rms_norm_row(row + h * hd, L->q_norm, row + h * hd, hd, hd, m->eps);
                    for (int64_t h = 0; h < kv_heads; h++)
                        rms_norm_row(row + q_size + h * hd, L->k_norm, row + q_size + h * hd, hd,
                                     hd, m->eps);
                }
                const int64_t at = (L->rope * rows + r) * hd;
                rotate(row, cos + at, sin + at, heads + kv_heads, hd);
                memcpy(q + r * q_size, row, (size_t)q_size * sizeof(float));
                if (slot[r] >= 0) {
                    store_kv(k_cache, slot[r] * token, row + q_size, kv_heads, hd, kv_kind);
                    store_kv(v_cache, slot[r] * token, row + q_size + kv_size, kv_heads, hd,
                             kv_kind);
                }
            }
            f32_attention_tasks(q, k_cache, v_cache, table, table_stride, lens, attn, rows, heads,
                                kv_heads, hd, m->block_size, m->scale, L->window, kv_kind, scores);
#pragma omp single
            f32_pad_rows(act, attn, rows, q_size, L->o.in_pad);
            matmul(&L->o, act, rows, y);
#pragma omp single
            for (int64_t r = 0; r < rows; r++) {
                float *xr = x + r * hidden;
                add_output(xr, y + r * hidden, L->attn_out_norm, normed, hidden, m->eps);
                rms_norm_row(xr, L->post_norm, act + r * L->gate_up.in_pad, hidden,
                             L->gate_up.in_pad, m->eps);
            }
            matmul(&L->gate_up, act, rows, y);
#pragma omp single
            for (int64_t r = 0; r < rows; r++) {
                const float *g = y + r * 2 * inter;
                activate(g, g + inter, act + r * L->down.in_pad, inter, L->down.in_pad, m->act);
            }
            matmul(&L->down, act, rows, y);
#pragma omp single
            for (int64_t r = 0; r < rows; r++)
                add_output(x + r * hidden, y + r * hidden, L->mlp_out_norm, normed, hidden, m->eps);
        }
#pragma omp single
        for (int64_t r = 0; r < rows; r++)
            rms_norm_row(x + r * hidden, m->norm, out + r * hidden, hidden, hidden, m->eps);
        free(scores);
    }
    free(buf);
    return failed;
}
