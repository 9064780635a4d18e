/* Causal attention of a prompt (or a chunk of one) in fp32 over its sequence's paged
   KV cache: n queries, the last n of `length` positions, each seeing every key up to
   its own. The K and V of each KV head are widened once per call (K into k-major
   panels of 16 keys, V as rows), then each task, the query heads of one KV head
   over a block of queries, runs the register tile of tile.h over key chunks with an
   online softmax (a running max and sum per row, the output rescaled as the max
   grows). torch's CPU flash kernel ran these shapes at a quarter of the tile's
   arithmetic rate (docs/benchmarks.md).

   A row's result does not depend on the block or the chunk it was computed in:
   chunks start at fixed key positions, a key past the row's own adds an exact zero,
   and a chunk wholly past it leaves the row as it was. So a prompt prefilled whole,
   in chunks, or after a prefix-cache hit attends each position the same. */

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "f32.h"
#include "kv_row.h"
#include "simd.h"
#include "tile.h"

#define QB 16  /* queries a task takes (times the heads of a KV group: its rows) */
#define KB 128 /* keys a chunk takes: a multiple of NR */

static ALWAYS_INLINE void widen_kv(const void *k_cache, const void *v_cache,
                                   const int64_t *table, int64_t t, int64_t kv_heads,
                                   int64_t block_size, float *kt, float *vv, int64_t lpad,
                                   const int chunks, const int kind) {
    const int64_t head_dim = (int64_t)chunks * LANES, row_elems = kv_row_elems(head_dim, kind);
    const int64_t token = (table[t / block_size] * block_size + t % block_size) * kv_heads;
    for (int64_t h = 0; h < kv_heads; h++) {
        f8 k[MAX_CHUNKS], v[MAX_CHUNKS];
        load_row(k_cache, (token + h) * row_elems, k, chunks, kind);
        load_row(v_cache, (token + h) * row_elems, v, chunks, kind);
        float *panel = kt + (h * lpad + t - t % NR) * head_dim + t % NR;
        for (int c = 0; c < chunks; c++)
            for (int i = 0; i < LANES; i++) panel[(c * LANES + i) * NR] = k[c][i];
        float *row = vv + (h * lpad + t) * head_dim;
        for (int c = 0; c < chunks; c++) store8(row + LANES * c, v[c]);
    }
}

/* One task: queries q0 .. q0 + count - 1 of the heads of KV head h. s: rows x KB
   scores, o: rows x head_dim sums, m, l: rows' running max and sum. */
static void attend_block(const float *q, int64_t q_stride, const float *kt, const float *vv,
                         int64_t lpad, int64_t n, int64_t length, int64_t q0, int64_t count,
                         float *out, int64_t heads, int64_t group, int64_t h, int64_t head_dim,
                         float scale, float *qp, float *s, float *o, float *m, float *l) {
    const int64_t rows = count * group, prefix = length - n;
    /* Row r = (query i, group member g), i * group + g. */
    for (int64_t i = 0; i < count; i++)
        for (int64_t g = 0; g < group; g++) {
            memcpy(qp + (i * group + g) * head_dim,
                   q + (q0 + i) * q_stride + (h * group + g) * head_dim,
                   (size_t)head_dim * sizeof(float));
            m[i * group + g] = -INFINITY;
            l[i * group + g] = 0.0f;
        }
    memset(o, 0, (size_t)(rows * head_dim) * sizeof(float));
    const float *kh = kt + h * lpad * head_dim, *vh = vv + h * lpad * head_dim;
    const int64_t end = prefix + q0 + count; /* keys any row of the task sees */
    for (int64_t c0 = 0; c0 < end; c0 += KB) {
        const int64_t width = end - c0 < KB ? (end - c0 + NR - 1) / NR * NR : KB;
        for (int64_t j = 0; j < width; j += NR)
            for (int64_t r = 0; r < rows; r += MR)
                tile_rows(rows - r < MR ? rows - r : MR, qp + r * head_dim, head_dim,
                          kh + (c0 + j) * head_dim, NR, head_dim, s + r * KB + j, KB, NR, 0);
        for (int64_t r = 0; r < rows; r++) {
            float *sr = s + r * KB;
            const int64_t seen = prefix + q0 + r / group + 1 - c0; /* keys c0 .. own */
            const int64_t valid = seen < width ? seen : width;
            if (valid <= 0) { /* a chunk wholly past this row: it adds nothing */
                memset(sr, 0, (size_t)width * sizeof(float));
                continue;
            }
            /* Whole vectors, then the partial one masked: the scalar loops were a
               third of the time at 2,048 tokens. */
            const int64_t full = valid / LANES * LANES;
            f8 vm = splat(m[r]);
            for (int64_t j = 0; j < full; j += LANES) {
                const f8 x = load8(sr + j) * splat(scale);
                store8(sr + j, x);
                vm = vmax(vm, x);
            }
            float mx = hmax(vm);
            for (int64_t j = full; j < valid; j++) {
                sr[j] *= scale;
                mx = sr[j] > mx ? sr[j] : mx;
            }
            f8 sum = splat(0.0f);
            for (int64_t j = 0; j < full; j += LANES) {
                const f8 e = exp8(load8(sr + j) - splat(mx));
                store8(sr + j, e);
                sum += e;
            }
            if (full < width) {
                const i8v lane = {0, 1, 2, 3, 4, 5, 6, 7};
                const f8 e = select8(lane < (int32_t)(valid - full),
                                     exp8(load8(sr + full) - splat(mx)), splat(0.0f));
                store8(sr + full, e);
                sum += e;
                for (int64_t j = full + LANES; j < width; j += LANES) store8(sr + j, splat(0.0f));
            }
            const float alpha = expf(m[r] - mx); /* 0 while the row had nothing */
            m[r] = mx;
            l[r] = l[r] * alpha + hsum(sum);
            if (alpha != 1.0f)
                for (int64_t d = 0; d < head_dim; d += LANES)
                    store8(o + r * head_dim + d, load8(o + r * head_dim + d) * splat(alpha));
        }
        for (int64_t d = 0; d < head_dim; d += NR)
            for (int64_t r = 0; r < rows; r += MR)
                tile_rows(rows - r < MR ? rows - r : MR, s + r * KB, KB, vh + c0 * head_dim + d,
                          head_dim, width, o + r * head_dim + d, head_dim, NR, 1);
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i = r / group, g = r % group;
        float *dst = out + ((q0 + i) * heads + h * group + g) * head_dim;
        const float inv = 1.0f / l[r];
        for (int64_t d = 0; d < head_dim; d++) dst[d] = o[r * head_dim + d] * inv;
    }
}

/* q: n query rows of heads x head_dim floats, a row every q_stride floats; table: the
   sequence's blocks; caches [blocks, block_size, kv_heads, row] of kv_kind (kv_row.h);
   out [n, heads, head_dim]. Returns 0, 1 for no memory, 2 for a bad shape or kind or a
   block of the table outside the caches' num_blocks (before anything is read). */
int f32_prefill_attention(const float *q, int64_t q_stride, const void *k_cache,
                          const void *v_cache, const int64_t *table, int64_t num_blocks, int64_t n,
                          int64_t length, float *out, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          int64_t block_size, float scale, int kv_kind, int threads) {
    if (kv_kind < KV_F32 || kv_kind > KV_INT8 || head_dim % NR || head_dim < NR ||
        head_dim > MAX_CHUNKS * LANES || kv_heads < 1 || heads % kv_heads || n < 1 ||
        n > length || block_size < 1)
        return 2;
    for (int64_t b = 0; b < (length + block_size - 1) / block_size; b++)
        if (table[b] < 0 || table[b] >= num_blocks) return 2;
    const int64_t group = heads / kv_heads, lpad = (length + KB - 1) / KB * KB;
    const int64_t rows = QB * group, blocks = (n + QB - 1) / QB;
    float *kt = calloc((size_t)(kv_heads * lpad * head_dim), sizeof(float));
    float *vv = calloc((size_t)(kv_heads * lpad * head_dim), sizeof(float));
    if (!kt || !vv) {
        free(kt);
        free(vv);
        return 1;
    }
    int failed = 0;
    const int chunks = (int)(head_dim / LANES);
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < length; t++) {
#define WIDEN(C, K) widen_kv(k_cache, v_cache, table, t, kv_heads, block_size, kt, vv, lpad, C, K)
#define WIDEN_KIND(C) (kv_kind == KV_INT8 ? WIDEN(C, KV_INT8) \
                       : kv_kind == KV_BF16 ? WIDEN(C, KV_BF16) : WIDEN(C, KV_F32))
            switch (chunks) { /* constants, so that the row loops unroll */
            case 8: WIDEN_KIND(8); break;
            case 16: WIDEN_KIND(16); break;
            default: WIDEN_KIND(chunks); break;
            }
#undef WIDEN_KIND
#undef WIDEN
        }
        float *buf = malloc((size_t)(rows * (2 * head_dim + KB + 2)) * sizeof(float));
        if (!buf) failed = 1;
        /* Later blocks see more keys: they go first, so that the threads end together. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < blocks * kv_heads; task++) {
            if (!buf) continue;
            const int64_t b = blocks - 1 - task / kv_heads, h = task % kv_heads;
            const int64_t q0 = b * QB, count = n - q0 < QB ? n - q0 : QB;
            float *qp = buf, *o = qp + rows * head_dim, *s = o + rows * head_dim;
            attend_block(q, q_stride, kt, vv, lpad, n, length, q0, count, out, heads, group, h,
                         head_dim, scale, qp, s, o, s + rows * KB, s + rows * KB + rows);
        }
        free(buf);
    }
    free(kt);
    free(vv);
    return failed ? 1 : 0;
}
