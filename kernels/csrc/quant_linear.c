/* Matmuls against weight-only quantized weights, for CPUs with AVX512.

   Weights W [out, in] are stored with each row padded with zeros to in_pad, a
   multiple of 64:
   - int8: symmetric per group of 32 along a row, q = round(w / s) in [-127, 127],
     int8 [out, in_pad], fp16 scales [out, in_pad / 32] (llama.cpp's Q8_0: 8.5 bits a
     weight).
   - int4: per group of 32 along a row, w = q * d + m with q in [0, 15] (llama.cpp's
     Q4_1: 5 bits a weight), two nibbles per byte: in each 64-column chunk, byte j
     holds column j in its low nibble and column 32 + j in its high one, so one load
     and a shift give the chunk's 64 columns in order. fp16 (d, m) pairs
     [out, in_pad / 32, 2].
   - uint8: per group of 32 along a row, w = (q - 8) * d / 16 + m with q in [0, 255]:
     int4's grid with each step cut in 16, so a Q4_1 group's level k is its level
     16 k + 8. uint8 [out, in_pad], fp16 (d, m) pairs [out, in_pad / 32, 2] (9 bits a
     weight). q * d / 16 is exact in fp32 and so, where m and d are not far apart in
     scale, is m - d / 2, so a weight takes one rounding, the one a Q4_1 weight read as
     fp32 took (see block_scales).

   A few rows of x [rows, in] multiply W with each weight dequantized in registers
   (in fp32, as dequant_* writes it) and fp32 sums; each output is rounded once. The
   weights are taken in x's dtype, as the many-row path (dequant_* then oneDNN) takes
   them, so a row's products do not depend on the path its batch takes:
   - fp32 x: fp32 products of the exact weights;
   - bf16 x: each weight rounded to bf16 and bf16 dot products in dot_bf16's order,
     so a decode row gets, bit for bit, what the plain bf16 matmul of the dequantized
     weight gives (a bf16 engine's own decode), and the products a prefill takes from
     its packed copy, summed in oneDNN's order. (Exact weights with bf16 x made a
     decode and a recomputed prefix differ by a few bf16 ulps in many outputs, and
     int8's greedy replies part from a bf16 engine's of the same weights at
     near-ties; figures: docs/benchmarks.md.)
   (Quantizing the activations for integer dot products was tried: each output moved
   enough to flip a greedy choice between a decode and a recompute.)
   Decoding is bound by reading the weights, which this reads at their packed size. */

#include <stdlib.h>

#include "kernels.h"
#include "vec.h"

#define MAX_ROWS QUANT_MAX_ROWS
#define TILE 16

/* Room for fp32 rows, which bf16 ones take half of. */
int64_t quant_act_bytes(int64_t rows, int64_t in_pad) {
    int64_t bytes = rows * in_pad * (int64_t)sizeof(float);
    return (bytes + 63) / 64 * 64; /* aligned_alloc takes whole alignments */
}

/* x rows as the kernels read them, each padded with zeros to in_pad so the padded
   weights add nothing: bf16 rows where x is bf16, fp32 ones otherwise, from the
   buffer's start. */
void quant_widen(float *act, const void *x, int bf16, int64_t rows, int64_t in, int64_t in_pad) {
    uint16_t *xb = (uint16_t *)act;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < in_pad; c += 32) {
            __m512 v[2];
            for (int j = 0; j < 2; j++) {
                const int64_t at = c + 16 * j;
                v[j] = _mm512_setzero_ps();
                if (at < in) {
                    __mmask16 m = tail_mask(in - at);
                    v[j] = bf16 ? load_bf16((const uint16_t *)x + r * in + at, m)
                                : _mm512_maskz_loadu_ps(m, (const float *)x + r * in + at);
                }
                if (bf16)
                    _mm256_storeu_si256((__m256i *)(xb + r * in_pad + at),
                                        (__m256i)_mm512_cvtneps_pbh(v[j]));
                else
                    _mm512_store_ps(act + r * in_pad + at, v[j]);
            }
        }
    }
}

static float *widen_rows(const void *x, int bf16, int64_t rows, int64_t in, int64_t in_pad) {
    float *act = aligned_alloc(64, (size_t)quant_act_bytes(rows, in_pad));
    if (act) quant_widen(act, x, bf16, rows, in, in_pad);
    return act;
}

/* Each decode step streams the weights from memory once, and the hardware
   prefetcher alone kept too few lines in flight for the slower loops (a quantized
   row's conversions). Reading 2 KiB ahead made single-stream decode markedly faster
   where that bound it, for every weight kind (1 and 4 KiB did as well; figures:
   docs/benchmarks.md). Past a row's end it reaches into the next row, which the
   same thread takes next. always_inline: as a plain static inline function, GCC 12 at
   -O3 dropped every prefetch (a call with no effect). */
#define PREFETCH_BYTES 2048

static inline __attribute__((always_inline)) void prefetch_ahead(const void *p) {
    _mm_prefetch((const char *)p + PREFETCH_BYTES, _MM_HINT_T0);
}

/* A row's sums: up to four (fp32 products, see CHAINS) or two (bf16 dot products,
   see dot_chunk). */
static inline __attribute__((always_inline)) void zero_sums(__m512 acc[MAX_ROWS][4], const int R) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
}

/* One or two rows get four sums each, so that the adds of one chain overlap. */
#define CHAINS(R) ((R) <= 2 ? 4 : 1)

/* acc[r] += w[0..3] . x[r][k .. k + 64] for 64 dequantized weights in w4. */
static inline __attribute__((always_inline)) void fma_rows(
    __m512 acc[MAX_ROWS][4], const __m512 w4[4], const float *xf, int64_t in_pad, int64_t k,
    const int R) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++)
            acc[r][j % CHAINS(R)] = _mm512_fmadd_ps(
                w4[j], _mm512_load_ps(xf + r * in_pad + k + 16 * j), acc[r][j % CHAINS(R)]);
}

static inline __attribute__((always_inline)) void sum_rows(
    __m512 acc[MAX_ROWS][4], const int R, __m512 *res) {
    for (int r = 0; r < R; r++) {
        __m512 t = acc[r][0];
        for (int j = 1; j < CHAINS(R); j++) t = _mm512_add_ps(t, acc[r][j]);
        res[r] = t;
    }
}

/* An fp16 scale, broadcast as fp32. */
static inline __m512 half_scale(uint16_t s) {
    return _mm512_cvtph_ps(_mm256_set1_epi16((short)s));
}

/* 16 weights of a byte each as fp32: int8's q * scale, or with_offset, uint8's
   q * step + offset (step passed as scale). */
static inline __attribute__((always_inline)) __m512 byte_weights(
    const void *w, __m512 scale, __m512 offset, const int with_offset) {
    __m128i q = _mm_loadu_si128((const __m128i *)w);
    if (with_offset) return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), scale, offset);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), scale);
}

/* A block of up to BLOCK columns' scales (groups of them) as fp32: int8's scale of
   group g at sc[g]; uint8's step at sc[2 g] and offset at sc[2 g + 1] (8 groups at a
   time). Converting each group's scales on its own (a broadcast and a vcvtph2ps each,
   on the shuffle port with the byte widening) bound the loops, uint8's four per chunk
   most; they are read back by broadcasts from memory. A block holds a whole row of
   SmolLM2's (576 columns), where blocks of 512 took two passes, the second for two
   groups (4-5 % of the int8 engine's decode on AMX).
   uint8's step d / 16 and offset m - 8 * step make q * step + offset (q - 8) * step + m,
   the product exact and one rounding in all, wherever the offset is exact in fp32 (m
   and d / 2 within 2^13 of each other: every group of SmolLM2). */
#define BLOCK 1024
static inline __attribute__((always_inline)) void block_scales(
    const uint16_t *ws, int64_t k0, int groups, const int offset, float *sc) {
    if (offset) {
        const __m512 by = _mm512_setr_ps(1.0f / 16, 1, 1.0f / 16, 1, 1.0f / 16, 1, 1.0f / 16, 1,
                                         1.0f / 16, 1, 1.0f / 16, 1, 1.0f / 16, 1, 1.0f / 16, 1);
        const __m512 eight = _mm512_setr_ps(0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8, 0, 8);
        for (int i = 0; i < groups; i += 8) {
            /* (d, m) -> (step, m) -> (step, m - 8 step) */
            __m512 v = _mm512_mul_ps(by, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                             tail_mask(2 * (groups - i)), ws + (k0 / 32 + i) * 2)));
            _mm512_storeu_ps(sc + 2 * i, _mm512_fnmadd_ps(_mm512_moveldup_ps(v), eight, v));
        }
    } else {
        for (int i = 0; i < groups; i += 16)
            _mm512_storeu_ps(sc + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                         tail_mask(groups - i), ws + k0 / 32 + i)));
    }
}

/* The 64 weights of the chunk at column k0 + k as fp32, 16 to a vector, with the
   block's scales from block_scales. */
static inline __attribute__((always_inline)) void chunk_weights(
    const void *w, const float *sc, int64_t k0, int64_t k, const int offset, __m512 w4[4]) {
    const int64_t g = k / 32;
    for (int j = 0; j < 4; j++) {
        const int64_t i = offset ? 2 * (g + j / 2) : g + j / 2;
        w4[j] = byte_weights((const int8_t *)w + k0 + k + 16 * j, _mm512_set1_ps(sc[i]),
                             offset ? _mm512_set1_ps(sc[i + 1]) : _mm512_setzero_ps(), offset);
    }
}

/* The same with one int4 weight row. Each group's 16 possible weights, q * d + m,
   make a table of one vector; a nibble, zero-extended to 32 bits, indexes it
   (vpermps reads the low 4 bits, so the high nibble needs only a shift). */
static inline __attribute__((always_inline)) void dot_int4(
    const uint8_t *w, const uint16_t *ws, const float *xf, int64_t in_pad, const int R,
    __m512 *res) {
    __m512 acc[MAX_ROWS][4];
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    zero_sums(acc, R);
    for (int64_t k = 0; k < in_pad; k += 64) {
        if (!(k & 64)) prefetch_ahead(w + k / 2);
        const uint16_t *g = ws + k / 16; /* (d, m) of this chunk's two groups */
        const __m512 t0 = _mm512_fmadd_ps(levels, half_scale(g[0]), half_scale(g[1]));
        const __m512 t1 = _mm512_fmadd_ps(levels, half_scale(g[2]), half_scale(g[3]));
        /* bytes 0-15: columns 0-15 (low nibbles) and 32-47 (high); bytes 16-31: 16-31, 48-63 */
        __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + k / 2)));
        __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + k / 2 + 16)));
        __m512 w4[4];
        w4[0] = _mm512_permutexvar_ps(b0, t0);
        w4[1] = _mm512_permutexvar_ps(b1, t0);
        w4[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), t1);
        w4[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), t1);
        fma_rows(acc, w4, xf, in_pad, k, R);
    }
    sum_rows(acc, R, res);
}

/* The bf16 dot products all bf16 x takes, whatever its weights: the same sums in
   the same order, so that a quantized row's result is, bit for bit, the plain bf16
   matmul's with its dequantized weights. Each row keeps two sums, for each 64-column
   chunk's first and second 32 columns: acc[r][0, 1] += the 64 bf16 weights at column
   k (w0: k .. k + 31, w1: the rest) . x[r]. */
static inline __attribute__((always_inline)) void dot_chunk(
    __m512 acc[MAX_ROWS][4], __m512bh w0, __m512bh w1, const uint16_t *xb, int64_t in_pad,
    int64_t k, const int R) {
    for (int r = 0; r < R; r++) {
        const uint16_t *xr = xb + r * in_pad + k;
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w0, (__m512bh)_mm512_loadu_si512(xr));
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w1, (__m512bh)_mm512_loadu_si512(xr + 32));
    }
}

static inline __attribute__((always_inline)) void sum_chunks(
    __m512 acc[MAX_ROWS][4], const int R, __m512 *res) {
    for (int r = 0; r < R; r++) res[r] = _mm512_add_ps(acc[r][0], acc[r][1]);
}

/* The R rows' dot products with one plain bf16 weight row: bf16 dot products, fp32
   sums (what oneDNN computes for a bf16 matmul, in another order). */
static inline __attribute__((always_inline)) void dot_bf16(
    const uint16_t *w, const uint16_t *xb, int64_t in_pad, const int R, __m512 *res) {
    __m512 acc[MAX_ROWS][4];
    zero_sums(acc, R);
    for (int64_t k = 0; k < in_pad; k += 64) {
        prefetch_ahead(w + k);
        prefetch_ahead(w + k + 32);
        dot_chunk(acc, (__m512bh)_mm512_loadu_si512(w + k),
                  (__m512bh)_mm512_loadu_si512(w + k + 32), xb, in_pad, k, R);
    }
    sum_chunks(acc, R, res);
}

/* The R rows' dot products with one weight row of a byte a weight: int8, each weight
   q * s of its group of 32, or uint8 (offset: a constant 1 in the inlined callers).
   fp32 rows (xf) take fp32 products of the exact weights; bf16 rows (xb, bf16 a
   constant 1) the weights rounded to bf16, 32 at a time, and dot_bf16's sums (two
   conversions and a dot product a row for 64 weights, against four FMAs). */
static inline __attribute__((always_inline)) void dot_bytes(
    const void *w, const uint16_t *ws, const float *xf, const uint16_t *xb, int64_t in_pad,
    const int R, const int offset, const int bf16, __m512 *res) {
    __m512 acc[MAX_ROWS][4];
    zero_sums(acc, R);
    for (int64_t k0 = 0; k0 < in_pad; k0 += BLOCK) {
        const int groups = (int)((in_pad - k0 < BLOCK ? in_pad - k0 : BLOCK) / 32);
        float sc[2 * BLOCK / 32];
        block_scales(ws, k0, groups, offset, sc);
        for (int64_t k = 0; k < groups * 32; k += 64) {
            __m512 w4[4];
            prefetch_ahead((const uint8_t *)w + k0 + k);
            chunk_weights(w, sc, k0, k, offset, w4);
            if (bf16)
                dot_chunk(acc, _mm512_cvtne2ps_pbh(w4[1], w4[0]),
                          _mm512_cvtne2ps_pbh(w4[3], w4[2]), xb, in_pad, k0 + k, R);
            else
                fma_rows(acc, w4, xf, in_pad, k0 + k, R);
        }
    }
    if (bf16)
        sum_chunks(acc, R, res);
    else
        sum_rows(acc, R, res);
}

/* dot_int4 for bf16 x: a chunk's two groups' 16 weights each, q * d + m, rounded to
   bf16 make one table of 32 that a nibble (the second group's with 16 added),
   zero-extended to 16 bits, indexes (vpermw), giving a group's 32 bf16 weights at a
   time; then dot_bf16's sums. dm: the chunk's two (d, m) pairs as fp32. (The table's
   conversion makes a row slower than bf16 dot products of the exact levels scaled per
   group would be, but those do not give a bf16 engine's weights; what it costs per
   host: docs/benchmarks.md.) */
static inline __attribute__((always_inline)) void int4_chunk_bf16(
    __m512 acc[MAX_ROWS][4], const uint8_t *w, const float *dm, int64_t k,
    const uint16_t *xb, int64_t in_pad, const int R) {
    const __m512 levels = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i table = (__m512i)_mm512_cvtne2ps_pbh(
        _mm512_fmadd_ps(levels, _mm512_set1_ps(dm[2]), _mm512_set1_ps(dm[3])),
        _mm512_fmadd_ps(levels, _mm512_set1_ps(dm[0]), _mm512_set1_ps(dm[1])));
    if (!(k & 64)) prefetch_ahead(w + k / 2); /* a 64-byte line holds two chunks */
    /* low nibbles: the chunk's columns 0-31 (first group); high: 32-63 */
    const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w + k / 2)));
    const __m512i first = _mm512_and_si512(b, _mm512_set1_epi16(0x0F));
    const __m512i second = _mm512_or_si512(_mm512_srli_epi16(b, 4), _mm512_set1_epi16(0x10));
    dot_chunk(acc, (__m512bh)_mm512_permutexvar_epi16(first, table),
              (__m512bh)_mm512_permutexvar_epi16(second, table), xb, in_pad, k, R);
}

/* Columns go in blocks (block_scales's), whose (d, m) pairs are converted to fp32
   together. */
static inline __attribute__((always_inline)) void dot_int4_bf16(
    const uint8_t *w, const uint16_t *ws, const uint16_t *xb, int64_t in_pad, const int R,
    __m512 *res) {
    __m512 acc[MAX_ROWS][4];
    zero_sums(acc, R);
    for (int64_t k0 = 0; k0 < in_pad; k0 += BLOCK) {
        const int64_t n = in_pad - k0 < BLOCK ? in_pad - k0 : BLOCK;
        float dm[2 * BLOCK / 32];
        for (int64_t i = 0; i < n / 16; i += 16)
            _mm512_storeu_ps(dm + i, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                                         tail_mask(n / 16 - i), ws + k0 / 16 + i)));
        for (int64_t k = 0; k < n; k += 64)
            int4_chunk_bf16(acc, w, dm + k / 16, k0 + k, xb, in_pad, R);
    }
    sum_chunks(acc, R, res);
}

/* The horizontal sums of 16 vectors, v[j]'s in lane j: four rounds of shuffles and
   adds, 45 instructions where a reduction each took about 8. With SmolLM2's short rows
   (576 columns) that made int4 and int8 decode 5-8 % faster on AMX (bf16 level). Every
   kind's outputs go through it, so the bf16 kernels keep one order of sums among them. */
static inline __m512 sum_16(const __m512 v[TILE]) {
    __m512 t[8], u[4], w[2];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: v2i's and v2i+1's two pair sums */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* per 128-bit lane: rows 4i .. 4i + 3, a lane's share each */
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++) /* lanes 0 + 2 and 1 + 3 of u2i, then of u2i+1 */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                         _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}

static inline void store_row(void *dst, int bf16, int64_t i, __m512 v, __mmask16 m) {
    if (bf16) {
        __m256bh h = _mm512_cvtneps_pbh(v);
        _mm256_mask_storeu_epi16((uint16_t *)dst + i, m, (__m256i)h);
    } else {
        _mm512_mask_storeu_ps((float *)dst + i, m, v);
    }
}

/* One tile of up to TILE output columns for all rows: each column's sums as vectors,
   summed across together. */
#define TILE_BODY(DOT_CALL)                                                               \
    do {                                                                                  \
        __m512 part[MAX_ROWS][TILE];                                                      \
        __m512 res[MAX_ROWS];                                                             \
        int n = (int)(out - o0 < TILE ? out - o0 : TILE);                                 \
        for (int j = 0; j < n; j++) {                                                     \
            int64_t o = o0 + j;                                                           \
            switch (rows) {                                                               \
            case 1: DOT_CALL(1); break;                                                   \
            case 2: DOT_CALL(2); break;                                                   \
            case 3: DOT_CALL(3); break;                                                   \
            case 4: DOT_CALL(4); break;                                                   \
            case 5: DOT_CALL(5); break;                                                   \
            case 6: DOT_CALL(6); break;                                                   \
            case 7: DOT_CALL(7); break;                                                   \
            default: DOT_CALL(8); break;                                                  \
            }                                                                             \
            for (int r = 0; r < rows; r++) part[r][j] = res[r];                           \
        }                                                                                 \
        for (int j = n; j < TILE; j++)                                                    \
            for (int r = 0; r < rows; r++) part[r][j] = _mm512_setzero_ps();              \
        for (int r = 0; r < rows; r++)                                                    \
            store_row(y, y_bf16, r * out + o0, sum_16(part[r]), tail_mask(n));           \
    } while (0)

/* The tiles of output columns, shared by the region's threads. */
#define TILE_LOOP(DOT_CALL)                                                               \
    _Pragma("omp for schedule(static)") for (int64_t t = 0; t < tiles; t++) {             \
        int64_t o0 = t * TILE;                                                            \
        TILE_BODY(DOT_CALL);                                                              \
    }

void quant_matmul_tiles(int kind, const float *xf, int x_bf16, int64_t rows, int64_t in_pad,
                        const void *w, const uint16_t *w_scale, int64_t out, void *y,
                        int y_bf16) {
    const int64_t tiles = (out + TILE - 1) / TILE;
    const uint16_t *xb = (const uint16_t *)xf; /* the same rows where x is bf16 */
    const int8_t *w8 = w;
    const uint8_t *w4 = w;
    const uint16_t *wb = w;
    /* bf16 x: each kind's weights rounded to bf16 (see the top of this file) */
#define DOT8(R) dot_bytes(w8 + o * in_pad, w_scale + o * in_pad / 32, xf, xb, in_pad, R, 0, 0, res)
#define DOT8B(R) dot_bytes(w8 + o * in_pad, w_scale + o * in_pad / 32, xf, xb, in_pad, R, 0, 1, res)
#define DOTU8(R) dot_bytes(w4 + o * in_pad, w_scale + o * in_pad / 16, xf, xb, in_pad, R, 1, 0, res)
#define DOTU8B(R) dot_bytes(w4 + o * in_pad, w_scale + o * in_pad / 16, xf, xb, in_pad, R, 1, 1, res)
#define DOTB(R) dot_bf16(wb + o * in_pad, xb, in_pad, R, res)
#define DOT4(R) dot_int4(w4 + o * in_pad / 2, w_scale + o * in_pad / 16, xf, in_pad, R, res)
#define DOT4B(R) dot_int4_bf16(w4 + o * in_pad / 2, w_scale + o * in_pad / 16, xb, in_pad, R, res)
    if (kind == PLAIN_BF16)
        TILE_LOOP(DOTB)
    else if (kind == QUANT_INT8 && x_bf16)
        TILE_LOOP(DOT8B)
    else if (kind == QUANT_INT8)
        TILE_LOOP(DOT8)
    else if (kind == QUANT_UINT8 && x_bf16)
        TILE_LOOP(DOTU8B)
    else if (kind == QUANT_UINT8)
        TILE_LOOP(DOTU8)
    else if (x_bf16)
        TILE_LOOP(DOT4B)
    else
        TILE_LOOP(DOT4)
#undef DOT8
#undef DOT8B
#undef DOTU8
#undef DOTU8B
#undef DOTB
#undef DOT4
#undef DOT4B
}

static int quant_linear(int kind, const void *x, int x_bf16, int64_t rows, int64_t in,
                        int64_t in_pad, const void *w, const uint16_t *w_scale, int64_t out,
                        void *y, int y_bf16, int threads) {
    if (rows < 1 || rows > MAX_ROWS || in_pad % 64 || in > in_pad) return 2;
    float *xf = widen_rows(x, x_bf16, rows, in, in_pad);
    if (!xf) return 1;
    /* A thread wake-up costs more than a small matrix's work. */
#pragma omp parallel num_threads(threads) if (out * in_pad >= 65536)
    quant_matmul_tiles(kind, xf, x_bf16, rows, in_pad, w, w_scale, out, y, y_bf16);
    free(xf);
    return 0;
}

/* y[rows, out] = x[rows, in] W^T for int8 W; rows 1..8. Returns 0, 1 for no memory,
   2 for a bad shape. */
int quant_linear_int8(const void *x, int x_bf16, int64_t rows, int64_t in, int64_t in_pad,
                      const int8_t *w, const uint16_t *w_scale, int64_t out, void *y,
                      int y_bf16, int threads) {
    return quant_linear(QUANT_INT8, x, x_bf16, rows, in, in_pad, w, w_scale, out, y, y_bf16,
                        threads);
}

/* The same for plain bf16 W [out, in_pad] and bf16 x. */
int matmul_bf16(const uint16_t *x, int64_t rows, int64_t in, int64_t in_pad, const uint16_t *w,
                int64_t out, uint16_t *y, int threads) {
    return quant_linear(PLAIN_BF16, x, 1, rows, in, in_pad, w, NULL, out, y, 1, threads);
}

/* The same for uint8 W. */
int quant_linear_uint8(const void *x, int x_bf16, int64_t rows, int64_t in, int64_t in_pad,
                       const uint8_t *w, const uint16_t *w_scale, int64_t out, void *y,
                       int y_bf16, int threads) {
    return quant_linear(QUANT_UINT8, x, x_bf16, rows, in, in_pad, w, w_scale, out, y, y_bf16,
                        threads);
}

/* The same for int4 W (packed nibbles). */
int quant_linear_int4(const void *x, int x_bf16, int64_t rows, int64_t in, int64_t in_pad,
                      const uint8_t *w, const uint16_t *w_scale, int64_t out, void *y,
                      int y_bf16, int threads) {
    return quant_linear(QUANT_INT4, x, x_bf16, rows, in, in_pad, w, w_scale, out, y, y_bf16,
                        threads);
}

/* W of a byte a weight, int8 or uint8 (with_offset), as bf16 or fp32 [out, in] (the
   padding dropped), for many-row matmuls. */
static inline __attribute__((always_inline)) void dequant_bytes(
    const void *w, const uint16_t *w_scale, int64_t out, int64_t in, int64_t in_pad, void *dst,
    int bf16, int threads, const int with_offset) {
#pragma omp parallel for schedule(static) num_threads(threads) if (out * in >= 65536)
    for (int64_t o = 0; o < out; o++) {
        const int8_t *row = (const int8_t *)w + o * in_pad;
        const uint16_t *ws = w_scale + o * in_pad / (with_offset ? 16 : 32);
        for (int64_t k0 = 0; k0 < in; k0 += BLOCK) {
            const int groups = (int)((in_pad - k0 < BLOCK ? in_pad - k0 : BLOCK) / 32);
            float sc[2 * BLOCK / 32];
            block_scales(ws, k0, groups, with_offset, sc);
            for (int64_t k = 0; k < groups * 32 && k0 + k < in; k += 64) {
                __m512 w4[4];
                chunk_weights(row, sc, k0, k, with_offset, w4);
                for (int j = 0; j < 4; j++) {
                    const int64_t c = k0 + k + 16 * j;
                    if (c < in) store_row(dst, bf16, o * in + c, w4[j], tail_mask(in - c));
                }
            }
        }
    }
}

void dequant_int8(const int8_t *w, const uint16_t *w_scale, int64_t out, int64_t in,
                  int64_t in_pad, void *dst, int bf16, int threads) {
    dequant_bytes(w, w_scale, out, in, in_pad, dst, bf16, threads, 0);
}

void dequant_uint8(const uint8_t *w, const uint16_t *w_scale, int64_t out, int64_t in,
                   int64_t in_pad, void *dst, int bf16, int threads) {
    dequant_bytes(w, w_scale, out, in, in_pad, dst, bf16, threads, 1);
}

void dequant_int4(const uint8_t *w, const uint16_t *w_scale, int64_t out, int64_t in,
                       int64_t in_pad, void *dst, int bf16, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (out * in >= 65536)
    for (int64_t o = 0; o < out; o++) {
        const uint8_t *row = w + o * in_pad / 2;
        const uint16_t *sc = w_scale + o * in_pad / 16;
        for (int64_t c = 0; c < in; c += 16) {
            __mmask16 m = tail_mask(in - c);
            int64_t chunk = c / 64 * 64, j = c - chunk; /* j: 0, 16, 32 or 48 */
            __m128i b = _mm_loadu_si128((const __m128i *)(row + chunk / 2 + (j & 31)));
            if (j >= 32) b = _mm_srli_epi16(b, 4);
            b = _mm_and_si128(b, _mm_set1_epi8(0x0F));
            __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
            const uint16_t *g = sc + c / 32 * 2;
            __m512 v = _mm512_fmadd_ps(q, half_scale(g[0]), half_scale(g[1]));
            store_row(dst, bf16, o * in + c, v, m);
        }
    }
}
