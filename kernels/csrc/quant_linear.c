/* Matmuls against weight-only quantized weights, for CPUs with AVX512-VNNI.

   Weights W [out, in] are stored with each row padded with zeros to in_pad, a
   multiple of 64:
   - int8: symmetric per output row, q = round(w / s[o]) in [-127, 127], int8
     [out, in_pad], fp32 scales [out].
   - int4: symmetric per group of 32 along a row, q in [-8, 7] stored as the
     nibble q + 8, two per byte: in each 64-column chunk, byte j holds column j in
     its low nibble and column 32 + j in its high one, so one load and a shift give
     the chunk's 64 columns in order. bf16 scales [out, in_pad / 32].

   A few rows of x [rows, in] (bf16 or fp32) are quantized to int8 per block of 32
   columns, then each dot product runs on vpdpbusd (u8 x s8 -> s32): the weight is
   the unsigned operand (int8 weights offset by 128, int4 nibbles as stored) and
   the offset's contribution, offset * sum(x), is taken away per row (int8) or per
   lane (int4). Blocks are scaled and summed in fp32; each output is rounded once.
   Many rows are not done here: the caller dequantizes (dequant_*) and uses oneDNN. */

#include <stdlib.h>
#include <string.h>

#include "vec.h"

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni")))
#define MAX_ROWS 8
#define TILE 16

/* The activation rows in the form the dot products read: int8 values, the scale
   of each 4-column lane (its block's), and offset * (sum of the lane's 4 values). */
typedef struct {
    int8_t *q;      /* rows x in_pad */
    float *scale;   /* rows x in_pad / 4 */
    int32_t *corr;  /* rows x in_pad / 4 */
    float *row_corr; /* rows: sum over lanes of scale * corr (int8 weights) */
} act_t;

VNNI static inline __m512 load_row(const void *x, int bf16, int64_t c, __mmask16 m) {
    if (bf16) return load_bf16((const uint16_t *)x + c, m);
    return _mm512_maskz_loadu_ps(m, (const float *)x + c);
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One row x[in] -> act row r, with `offset` as the weight's unsigned offset. */
VNNI static void quantize_row(const void *x, int bf16, int64_t in, int64_t in_pad,
                              int offset, act_t *a, int64_t r) {
    int8_t *q = a->q + r * in_pad;
    float *scale = a->scale + r * in_pad / 4;
    int32_t *corr = a->corr + r * in_pad / 4;
    const __m512i off = _mm512_set1_epi8((char)offset);
    __m256 total = _mm256_setzero_ps();
    for (int64_t c = 0; c < in_pad; c += 32) {
        __m512 v0 = _mm512_setzero_ps(), v1 = _mm512_setzero_ps();
        if (c < in) v0 = load_row(x, bf16, c, tail_mask(in - c));
        if (c + 16 < in) v1 = load_row(x, bf16, c + 16, tail_mask(in - c - 16));
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float s = amax / 127.0f;
        __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)));
        __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)));
        _mm_storeu_si128((__m128i *)(q + c), q0);
        _mm_storeu_si128((__m128i *)(q + c + 16), q1);
        /* offset * sum of each lane's 4 values, by the same instruction. */
        __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
        __m256i lane = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(off), both);
        _mm256_storeu_si256((__m256i *)(corr + c / 4), lane);
        __m256 sv = _mm256_set1_ps(s);
        _mm256_storeu_ps(scale + c / 4, sv);
        total = _mm256_add_ps(total, _mm256_mul_ps(sv, _mm256_cvtepi32_ps(lane)));
    }
    a->row_corr[r] = hsum256(total);
}

static int act_alloc(act_t *a, int64_t rows, int64_t in_pad) {
    size_t nq = (size_t)(rows * in_pad), nl = (size_t)(rows * in_pad / 4);
    /* One block, each part a multiple of 64 bytes long. */
    size_t bytes = nq + 8 * nl + 64 * sizeof(float) + 64;
    char *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) return 1;
    a->q = (int8_t *)p;
    a->scale = (float *)(p + nq);
    a->corr = (int32_t *)(p + nq + 4 * nl);
    a->row_corr = (float *)(p + nq + 8 * nl);
    return 0;
}

VNNI static void prepare(const void *x, int bf16, int64_t rows, int64_t in, int64_t in_pad,
                         int offset, act_t *a) {
    const size_t esize = bf16 ? 2 : 4;
    for (int64_t r = 0; r < rows; r++)
        quantize_row((const char *)x + r * in * esize, bf16, in, in_pad, offset, a, r);
}

VNNI static inline void store_out(void *y, int bf16, int64_t out, int64_t r, int64_t o0,
                                  const float *v, int n) {
    __mmask16 m = tail_mask(n);
    __m512 f = _mm512_maskz_loadu_ps(m, v);
    if (bf16) {
        __m256bh h = _mm512_cvtneps_pbh(f);
        _mm256_mask_storeu_epi16((uint16_t *)y + r * out + o0, m, (__m256i)h);
    } else {
        _mm512_mask_storeu_ps((float *)y + r * out + o0, m, f);
    }
}

/* The R rows' dot products with one int8 weight row, as fp32 sums of scaled blocks. */
VNNI static inline __attribute__((always_inline)) void dot_int8(
    const int8_t *w, const act_t *a, int64_t in_pad, const int R, float *res) {
    __m512 acc[MAX_ROWS];
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < in_pad; k += 64) {
        __m512i wu = _mm512_xor_si512(_mm512_loadu_si512(w + k), flip); /* q + 128 */
        for (int r = 0; r < R; r++) {
            __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu,
                                            _mm512_loadu_si512(a->q + r * in_pad + k));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d),
                                     _mm512_loadu_ps(a->scale + r * in_pad / 4 + k / 4), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) res[r] = _mm512_reduce_add_ps(acc[r]) - a->row_corr[r];
}

/* Same with one int4 weight row: two groups per 64-column chunk, each lane's offset
   taken away before scaling (the weight scale differs per group). */
VNNI static inline __attribute__((always_inline)) void dot_int4(
    const uint8_t *w, const uint16_t *ws, const act_t *a, int64_t in_pad, const int R,
    float *res) {
    __m512 acc[MAX_ROWS];
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i high16 = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < in_pad; k += 64) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(w + k / 2));
        __m512i wu = _mm512_and_si512(
            _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1), low4);
        uint32_t pair;
        memcpy(&pair, ws + k / 32, 4);
        __m512i t = _mm512_set1_epi32((int)pair);
        /* lanes 0-7: the first group's bf16 scale as fp32, lanes 8-15: the second's */
        __m512 sw = _mm512_castsi512_ps(_mm512_mask_blend_epi32(
            0xFF00, _mm512_slli_epi32(t, 16), _mm512_and_si512(t, high16)));
        for (int r = 0; r < R; r++) {
            __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu,
                                            _mm512_loadu_si512(a->q + r * in_pad + k));
            d = _mm512_sub_epi32(d, _mm512_loadu_si512(a->corr + r * in_pad / 4 + k / 4));
            __m512 s = _mm512_mul_ps(sw, _mm512_loadu_ps(a->scale + r * in_pad / 4 + k / 4));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) res[r] = _mm512_reduce_add_ps(acc[r]);
}

/* One tile of up to TILE output columns for all rows. */
#define TILE_BODY(DOT_CALL, SCALE_EXPR)                                                   \
    do {                                                                                  \
        float tmp[MAX_ROWS][TILE];                                                        \
        float res[MAX_ROWS];                                                              \
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
            for (int r = 0; r < rows; r++) tmp[r][j] = res[r] * (SCALE_EXPR);             \
        }                                                                                 \
        for (int r = 0; r < rows; r++) store_out(y, y_bf16, out, r, o0, tmp[r], n);       \
    } while (0)

/* y[rows, out] = x[rows, in] W^T for int8 W; rows 1..8. Returns 0, 1 for no memory,
   2 for a bad shape. */
VNNI int quant_linear_int8(const void *x, int x_bf16, int64_t rows, int64_t in, int64_t in_pad,
                           const int8_t *w, const float *w_scale, int64_t out, void *y,
                           int y_bf16, int threads) {
    if (rows < 1 || rows > MAX_ROWS || in_pad % 64 || in > in_pad) return 2;
    act_t a;
    if (act_alloc(&a, rows, in_pad)) return 1;
    prepare(x, x_bf16, rows, in, in_pad, 128, &a);
    int64_t tiles = (out + TILE - 1) / TILE;
#define DOT8(R) dot_int8(w + o * in_pad, &a, in_pad, R, res)
    /* A thread wake-up costs more than a small matrix's work. */
#pragma omp parallel for schedule(static) num_threads(threads) if (out * in_pad >= 65536)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t o0 = t * TILE;
        TILE_BODY(DOT8, w_scale[o]);
    }
#undef DOT8
    free(a.q);
    return 0;
}

/* The same for int4 W (packed nibbles, bf16 group scales). */
VNNI int quant_linear_int4(const void *x, int x_bf16, int64_t rows, int64_t in, int64_t in_pad,
                           const uint8_t *w, const uint16_t *w_scale, int64_t out, void *y,
                           int y_bf16, int threads) {
    if (rows < 1 || rows > MAX_ROWS || in_pad % 64 || in > in_pad) return 2;
    act_t a;
    if (act_alloc(&a, rows, in_pad)) return 1;
    prepare(x, x_bf16, rows, in, in_pad, 8, &a);
    int64_t tiles = (out + TILE - 1) / TILE;
#define DOT4(R) dot_int4(w + o * in_pad / 2, w_scale + o * in_pad / 32, &a, in_pad, R, res)
#pragma omp parallel for schedule(static) num_threads(threads) if (out * in_pad >= 65536)
    for (int64_t t = 0; t < tiles; t++) {
        int64_t o0 = t * TILE;
        TILE_BODY(DOT4, 1.0f);
    }
#undef DOT4
    free(a.q);
    return 0;
}

VNNI static inline void store_row(void *dst, int bf16, int64_t i, __m512 v, __mmask16 m) {
    if (bf16) {
        __m256bh h = _mm512_cvtneps_pbh(v);
        _mm256_mask_storeu_epi16((uint16_t *)dst + i, m, (__m256i)h);
    } else {
        _mm512_mask_storeu_ps((float *)dst + i, m, v);
    }
}

/* W as bf16 or fp32 [out, in] (the padding dropped), for many-row matmuls. */
VNNI void dequant_int8(const int8_t *w, const float *w_scale, int64_t out, int64_t in,
                       int64_t in_pad, void *dst, int bf16, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (out * in >= 65536)
    for (int64_t o = 0; o < out; o++) {
        const __m512 s = _mm512_set1_ps(w_scale[o]);
        for (int64_t c = 0; c < in; c += 16) {
            __mmask16 m = tail_mask(in - c);
            __m128i q = _mm_maskz_loadu_epi8(m, w + o * in_pad + c);
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), s);
            store_row(dst, bf16, o * in + c, v, m);
        }
    }
}

VNNI void dequant_int4(const uint8_t *w, const uint16_t *w_scale, int64_t out, int64_t in,
                       int64_t in_pad, void *dst, int bf16, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (out * in >= 65536)
    for (int64_t o = 0; o < out; o++) {
        const uint8_t *row = w + o * in_pad / 2;
        const uint16_t *sc = w_scale + o * in_pad / 32;
        for (int64_t c = 0; c < in; c += 16) {
            __mmask16 m = tail_mask(in - c);
            int64_t chunk = c / 64 * 64, j = c - chunk; /* j: 0, 16, 32 or 48 */
            __m128i b = _mm_loadu_si128((const __m128i *)(row + chunk / 2 + (j & 31)));
            if (j >= 32) b = _mm_srli_epi16(b, 4);
            b = _mm_and_si128(b, _mm_set1_epi8(0x0F));
            __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(b), _mm512_set1_epi32(8));
            float s;
            uint32_t bits = (uint32_t)sc[c / 32] << 16;
            memcpy(&s, &bits, 4);
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(s));
            store_row(dst, bf16, o * in + c, v, m);
        }
    }
}
