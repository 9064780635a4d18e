/* GGUF Q6_K blocks onto the uint8 kind (kernels/quant_linear.py), in one pass.

   Q6_K's sub-blocks of 16 with 8-bit scales fit none of our grids, so a loader
   quantizes their values again. This gives, bit for bit, what the gguf package's
   dequantizer followed by quant_linear.quantize(values, "uint8") gives (the same fp32
   operations in the same order: (d * scale) * q, then per group of 32 the fp16 minimum
   m, the fp16 step (max - m) / 15, and each level rint((w - m) / (step / 16)) + 8,
   clamped to a byte), without the fp32 tensor between them: an 8B file's Q6_K layers
   took most of its first start that way. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define QK 256
#define BLOCK_BYTES 210
#define GROUP 32

static float widen(_Float16 h) { return (float)h; }

void q6k_to_uint8(const uint8_t *blocks, int64_t nblocks, uint8_t *levels, _Float16 *scales)
{
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        const uint8_t *blk = blocks + b * BLOCK_BYTES;
        const uint8_t *ql = blk, *qh = blk + QK / 2;
        const int8_t *sc = (const int8_t *)(blk + QK / 2 + QK / 4);
        _Float16 dh;
        memcpy(&dh, blk + BLOCK_BYTES - 2, sizeof dh);
        const float d = widen(dh);
        float v[QK];
        for (int half = 0; half < 2; half++) {
            const uint8_t *l = ql + 64 * half, *h = qh + 32 * half;
            const int8_t *s = sc + 8 * half;
            float *y = v + 128 * half;
            for (int i = 0; i < 32; i++) {
                const int is = i / 16;
                const int q1 = (int)((l[i] & 0xF) | ((h[i] & 3) << 4)) - 32;
                const int q2 = (int)((l[i + 32] & 0xF) | (((h[i] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((l[i] >> 4) | (((h[i] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((l[i + 32] >> 4) | (((h[i] >> 6) & 3) << 4)) - 32;
                y[i] = (d * (float)s[is]) * (float)q1;
                y[i + 32] = (d * (float)s[is + 2]) * (float)q2;
                y[i + 64] = (d * (float)s[is + 4]) * (float)q3;
                y[i + 96] = (d * (float)s[is + 6]) * (float)q4;
            }
        }
        for (int g = 0; g < QK / GROUP; g++) {
            const float *w = v + g * GROUP;
            float lo = w[0], hi = w[0];
            for (int i = 1; i < GROUP; i++) {
                lo = w[i] < lo ? w[i] : lo;
                hi = w[i] > hi ? w[i] : hi;
            }
            const _Float16 m16 = (_Float16)lo;
            const float m = widen(m16);
            const _Float16 d16 = (_Float16)((hi - m) / 15.0f);
            const float step = widen(d16);
            const float inv = step > 0 ? 1.0f / (step / 16.0f) : 0.0f;
            uint8_t *out = levels + b * QK + g * GROUP;
            for (int i = 0; i < GROUP; i++) {
                float q = rintf((w[i] - m) * inv) + 8.0f;
                q = q < 0.0f ? 0.0f : (q > 255.0f ? 255.0f : q);
                out[i] = (uint8_t)q;
            }
            scales[(b * (QK / GROUP) + g) * 2] = d16;
            scales[(b * (QK / GROUP) + g) * 2 + 1] = m16;
        }
    }
}
