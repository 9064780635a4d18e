/* The pieces of the CPU kernels that the fused decode stack (decode_stack.c)
   calls from inside its own parallel region. Each loop below is an orphaned
   `omp for`: run inside a parallel region it is shared among that region's
   threads (with a barrier at its end), run outside one it is serial. */
#ifndef PREFIXCHAT_KERNELS_H
#define PREFIXCHAT_KERNELS_H

#include <stdint.h>

/* Weight kinds: int8, int4 and uint8 as quant_linear.c stores them; bf16 plain
   [out, in_pad]. */
enum { QUANT_INT8 = 0, QUANT_INT4 = 1, PLAIN_BF16 = 2, QUANT_UINT8 = 3 };
#define QUANT_MAX_ROWS 8

/* Bytes of the activations buffer that quant_widen fills for rows of in_pad. */
int64_t quant_act_bytes(int64_t rows, int64_t in_pad);

/* rows of x (bf16 or fp32, `in` wide) prepared in act (64-byte aligned,
   quant_act_bytes long) as the matmuls read them: in x's dtype, padded to in_pad. */
void quant_widen(float *act, const void *x, int x_bf16, int64_t rows, int64_t in, int64_t in_pad);

/* y[rows, out] = x W^T for a quantized or bf16 W (see quant_linear.c) and x prepared
   in act by quant_widen with the same x_bf16 (bf16 W takes bf16 x only); shared loop. */
void quant_matmul_tiles(int kind, const float *act, int x_bf16, int64_t rows, int64_t in_pad,
                        const void *w, const uint16_t *w_scale, int64_t out, void *y,
                        int y_bf16);

/* One bf16 row's RMSNorm (see rms_norm.c). */
void rms_norm_row(const uint16_t *x, const uint16_t *w, uint16_t *out, int64_t dim, float eps);

/* A thread's score buffer for decode_attention_tasks (malloc'd); NULL for no memory,
   and *failed set. */
float *decode_attention_buffer(const int64_t *lens, int64_t batch, int64_t heads,
                               int64_t kv_heads, int64_t head_dim, int *failed);

/* Decode attention of batch x kv_heads tasks (see paged_decode.c); shared loop.
   scores: the calling thread's decode_attention_buffer, or NULL, which skips the
   thread's tasks (the caller reports the failure). */
void decode_attention_tasks(const uint16_t *query, const uint16_t *k_cache,
                            const uint16_t *v_cache, const int64_t *tables,
                            int64_t table_stride, const int64_t *lens, uint16_t *out,
                            int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim,
                            int64_t block_size, float scale, float *scores);

#endif
