/* The fp32 kernels' reading of a KV cache row (decode.c, attention.c). */
#ifndef PREFIXCHAT_F32_KV_ROW_H
#define PREFIXCHAT_F32_KV_ROW_H

#include "simd.h"

#define MAX_CHUNKS 32 /* head_dim up to 256, in 8-lane chunks */

/* A cache row: one token's K or V of one KV head, as stored. fp32 and bf16 rows are
   head_dim values; an int8 row is head_dim int8 values then their fp32 scale (the row's
   largest magnitude / 127), kernels/kv_quant.py's layout: a quarter of fp32's bytes,
   half of bf16's, for a step that streams a long context. */
enum { KV_F32 = 0, KV_BF16 = 1, KV_INT8 = 2 };
#define KV_SCALE_BYTES 4 /* kv_quant.SCALE_BYTES */

static ALWAYS_INLINE int64_t kv_row_elems(int64_t head_dim, const int kind) {
    return kind == KV_INT8 ? head_dim + KV_SCALE_BYTES : head_dim;
}

static ALWAYS_INLINE int64_t kv_elem_bytes(const int kind) {
    return kind == KV_F32 ? 4 : kind == KV_BF16 ? 2 : 1;
}

/* The `chunks` x 8 values of the row at element `row` of a cache of `kind`, as floats
   (bf16 widened exactly; int8 times its scale, as kv_quant.dequantize rounds it). */
static ALWAYS_INLINE void load_row(const void *cache, int64_t row, f8 *out, const int chunks,
                                   const int kind) {
    if (kind == KV_INT8) {
        const int8_t *p = (const int8_t *)cache + row;
        float s;
        memcpy(&s, p + (int64_t)chunks * LANES, sizeof s);
        for (int c = 0; c < chunks; c++) out[c] = s8_to_f8(p + LANES * c) * splat(s);
    } else if (kind == KV_BF16) {
        for (int c = 0; c < chunks; c++) out[c] = bf16_to_f8((const uint16_t *)cache + row + LANES * c);
    } else {
        for (int c = 0; c < chunks; c++) out[c] = load8((const float *)cache + row + LANES * c);
    }
}

#endif
