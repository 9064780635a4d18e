/* A Llama-family (or, in fp32, Gemma 3) model's weights as the fused decode steps read them
   (decode_stack.c in bf16, f32/decode.c in fp32); kernels/decode_stack.py fills
   the same structs with ctypes. Vectors (norms, biases) are in the step's dtype. */
#ifndef PREFIXCHAT_STACK_H
#define PREFIXCHAT_STACK_H

#include <stdint.h>

typedef struct {
    int64_t kind; /* a weight kind of kernels.h (bf16 step) or f32/f32.h (fp32 step) */
    const void *data;
    const uint16_t *scale;
    const void *bias; /* [out], or NULL */
    int64_t in, in_pad, out;
} stack_matmul;

typedef struct {
    const void *input_norm, *post_norm; /* [hidden] */
    stack_matmul qkv, o, gate_up, down;
    /* Qwen3's RMSNorm over each q and each k head before RoPE: [head_dim] each, or NULL
       (the fp32 step only; the bf16 step refuses a model that has them). */
    const void *q_norm, *k_norm;
    /* Gemma 3 (the fp32 step only): norms of the attention's and of the MLP's output
       before each joins the residual stream ([hidden] each, or NULL); a sliding window
       of `window` tokens (0: the whole context); which of the step's cos/sin sets the
       layer's RoPE takes (0 or 1). */
    const void *attn_out_norm, *mlp_out_norm;
    int64_t window, rope;
    /* Where the layer's K/V lie (the fp32 step; the bf16 step takes kv_slot = its index
       and group 0): slot kv_slot of the cache's layer axis, its slots and block tables
       those of KV group `group` (a model whose sliding layers keep only their window:
       inference/kv_groups.py). */
    int64_t kv_slot, group;
} stack_layer;

/* The MLP's activation on its gate. */
enum { STACK_SILU = 0, STACK_GELU_TANH = 1 };

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, inter, block_size;
    float eps, scale;
    const stack_layer *layer;
    const void *norm; /* the final norm's weight */
    int64_t act;      /* STACK_SILU or STACK_GELU_TANH (the fp32 step only) */
    /* The fp32 step: the cache's layer axis, and how far apart (in int64s) the KV
       groups' block tables lie; group g's slots are slots + g * rows; what the cache
       holds: 0 fp32, 1 bf16 (widened in registers), 2 int8 rows with a scale
       (f32/decode.c). */
    int64_t kv_layers, table_group_stride, kv_kind;
} stack_model;

/* The widest padded input and the widest output of any layer's matmuls: the sizes
   of a step's activation buffers. */
static inline void stack_widths(const stack_model *m, int64_t *in_pad, int64_t *width) {
    *in_pad = *width = 0;
    for (int64_t l = 0; l < m->layers; l++) {
        const stack_matmul *ws[4] = {&m->layer[l].qkv, &m->layer[l].o, &m->layer[l].gate_up,
                                     &m->layer[l].down};
        for (int i = 0; i < 4; i++) {
            *in_pad = ws[i]->in_pad > *in_pad ? ws[i]->in_pad : *in_pad;
            *width = ws[i]->out > *width ? ws[i]->out : *width;
        }
    }
}

#endif
