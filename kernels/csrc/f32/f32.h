/* The fp32 kernels' pieces that the decode step (decode.c) calls from inside its
   own parallel region: each loop is an orphaned `omp for`, shared among the
   region's threads (a barrier at its end), or serial outside one. */
#ifndef PREFIXCHAT_F32_H
#define PREFIXCHAT_F32_H

#include <stdint.h>

/* Weight kinds: the quantized ones as kernels/quant_layout.py stores them (rows
   padded to in_pad, a multiple of 64), bf16 [out, in_pad] widened in registers, and
   plain fp32 [out, in_pad]. The same numbers as csrc/kernels.h where both have one. */
enum { F32_INT8 = 0, F32_INT4 = 1, F32_BF16 = 2, F32_UINT8 = 3, F32_PLAIN = 4 };
/* Rows a matmul takes together (its sums stay in registers), and rows a call takes:
   a tile of output columns is read for each group of F32_MAX_ROWS while in cache. */
#define F32_MAX_ROWS 8
#define F32_MAX_BATCH 32

/* y[batch, out] = x W^T for fp32 rows x [batch <= F32_MAX_BATCH, in_pad] (zeros past
   the real width) and a weight of `kind`; shared loop over tiles of output columns. */
void f32_matmul_tiles(int kind, const float *x, int64_t batch, int64_t in_pad, const void *w,
                      const uint16_t *w_scale, int64_t out, float *y);

/* 1 for a kind above. */
int f32_valid_kind(int kind);

/* Columns k .. k + 63 (k a multiple of 64) of weight row o as floats, exactly as
   torch's dequantize gives them. */
void f32_dequant_chunk(int kind, const void *w, const uint16_t *w_scale, int64_t in_pad,
                       int64_t o, int64_t k, float row[64]);

/* rows of x [rows, in] copied to act [rows, in_pad], zero-padded. */
void f32_pad_rows(float *act, const float *x, int64_t rows, int64_t in, int64_t in_pad);

/* Decode attention of batch x kv_heads tasks over caches [blocks, block_size,
   kv_heads, row] of kv_kind (0 fp32, 1 bf16, 2 int8 with a scale: decode.c); shared loop. scores: the thread's buffer of
   f32_attention_floats floats, or NULL (that thread's tasks are skipped). */
int64_t f32_attention_floats(const int64_t *lens, int64_t batch, int64_t heads,
                             int64_t kv_heads, int64_t head_dim);
void f32_attention_tasks(const float *query, const void *k_cache, const void *v_cache,
                         const int64_t *tables, int64_t table_stride, const int64_t *lens,
                         float *out, int64_t batch, int64_t heads, int64_t kv_heads,
                         int64_t head_dim, int64_t block_size, float scale, int64_t window,
                         int kv_kind, float *scores);

#endif
