/* Matmuls of a few fp32 rows against weights kept at their stored size: int8
   (Q8_0's grid), uint8 (Q4_1's grid cut in 16), int4 (Q4_1), bf16 or fp32 (the
   layouts of kernels/quant_layout.py). Each weight is widened to fp32 in registers
   (q * d, q * step + offset, q * d + m: one rounding, as torch's dequantize gives
   it; bf16 exactly) and multiplied with fp32 sums, except where one or two rows of
   a quantized kind scale a group's sum instead (SUMS_ON_LEVELS), a sum that AVX2
   takes on integers (INT_DOTS). Decoding reads the weights at their stored size;
   many-row matmuls take the dequantizers below, a tile at a time, then a GEMM. */

#include <stdlib.h>

#include "f32.h"
#include "simd.h"

#define MAX_ROWS F32_MAX_ROWS
#define TILE 16
/* One or two rows keep four sums each so that the adds of a chain overlap. */
#define CHAINS(R) ((R) <= 2 ? 4 : 1)

static ALWAYS_INLINE void zero_sums(f8 acc[MAX_ROWS][4], const int R) {
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = splat(0.0f);
}

static ALWAYS_INLINE void sum_rows(f8 acc[MAX_ROWS][4], const int R, float *res) {
    for (int r = 0; r < R; r++) {
        f8 t = acc[r][0];
        for (int j = 1; j < CHAINS(R); j++) t += acc[r][j];
        res[r] = hsum(t);
    }
}

/* acc[r] += w . x[r][k .. k + 8], chain j. */
static ALWAYS_INLINE void fma_rows(f8 acc[MAX_ROWS][4], f8 w, const float *x, int64_t in_pad,
                                   int64_t k, int j, const int R) {
    for (int r = 0; r < R; r++) acc[r][j % CHAINS(R)] += w * load8(x + r * in_pad + k);
}

/* A group of 32 levels q[0..3] (as floats) against 32 activations of a row: sum(q x). */
static ALWAYS_INLINE f8 group_dot(const f8 q[4], const float *x) {
    f8 a = q[0] * load8(x);
    a += q[1] * load8(x + 8);
    a += q[2] * load8(x + 16);
    a += q[3] * load8(x + 24);
    return a;
}

/* Rows of one or two sequences (a decode) are bound by this arithmetic, not by
   reading the bytes: there int8, int4 and uint8 take a group's sum on the levels,
   d sum(q x) (+ m sum(x)), which saves widening each weight to q d (+ m): a multiply
   per 8 weights, for the same value but for fp32's roundings (measured:
   docs/benchmarks.md). More rows share each widened weight, so they take it. */
#define SUMS_ON_LEVELS(R) ((R) <= 2)

/* The sums of each row's groups of 32 activations, xs[r * groups + g], for the
   offsets of int4 and uint8. */
static void group_sums(const float *x, int64_t in_pad, int64_t rows, float *xs) {
    const int64_t groups = in_pad / 32;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float *p = x + r * in_pad + 32 * g;
            xs[r * groups + g] = hsum((load8(p) + load8(p + 8)) + (load8(p + 16) + load8(p + 24)));
        }
}

/* int4: each 64-column chunk packs column j in byte j's low nibble and 32 + j in
   its high one; (d, m) fp16 pairs per group of 32. One or two rows sum on the
   levels, d sum(q x) + m sum(x) with the group sums xs, reading the high nibble as
   16 q (a mask, no shift) and its sums divided by 16 at the end (exact); the
   partial sums stay in registers as each widened nibble is used (held in an array
   across rows, they went through the stack). */
static ALWAYS_INLINE void dot_int4(const uint8_t *w, const uint16_t *ws, const float *x,
                                   const float *xs, int64_t in_pad, const int R, float *res) {
    f8 acc[MAX_ROWS][4];
    zero_sums(acc, R);
    if (SUMS_ON_LEVELS(R)) {
        const int64_t groups = in_pad / 32;
        float sc[2 * groups], off[MAX_ROWS] = {0};
        halves_to_floats(ws, sc, 2 * groups);
        for (int64_t k = 0; k < in_pad; k += 64) {
            if (!(k & 64)) prefetch_ahead(w + k / 2);
            const float *g = sc + k / 16;
            f8 a[MAX_ROWS], b[MAX_ROWS];
            for (int r = 0; r < R; r++) a[r] = b[r] = splat(0.0f);
            for (int j = 0; j < 4; j++) {
                const i8v q = widen_u8(w + k / 2 + 8 * j);
                const f8 lo = to_f8(q & 0x0F), hi = to_f8(q & 0xF0);
                for (int r = 0; r < R; r++) {
                    a[r] += lo * load8(x + r * in_pad + k + 8 * j);
                    b[r] += hi * load8(x + r * in_pad + k + 32 + 8 * j);
                }
            }
            for (int r = 0; r < R; r++) {
                acc[r][0] += splat(g[0]) * a[r];
                acc[r][1] += splat(g[2]) * b[r]; /* 16 times its share */
                off[r] += g[1] * xs[r * groups + k / 32] + g[3] * xs[r * groups + k / 32 + 1];
            }
        }
        for (int r = 0; r < R; r++) acc[r][1] *= splat(1.0f / 16.0f);
        sum_rows(acc, R, res);
        for (int r = 0; r < R; r++) res[r] += off[r];
        return;
    }
    for (int64_t k = 0; k < in_pad; k += 64) {
        if (!(k & 64)) prefetch_ahead(w + k / 2);
        const uint16_t *g = ws + k / 16;
        const f8 d0 = splat(half_to_float(g[0])), m0 = splat(half_to_float(g[1]));
        const f8 d1 = splat(half_to_float(g[2])), m1 = splat(half_to_float(g[3]));
        for (int j = 0; j < 4; j++) {
            f8 lo, hi;
            nibbles_to_f8(w + k / 2 + 8 * j, &lo, &hi);
            fma_rows(acc, lo * d0 + m0, x, in_pad, k + 8 * j, j, R);
            fma_rows(acc, hi * d1 + m1, x, in_pad, k + 32 + 8 * j, j + 1, R);
        }
    }
    sum_rows(acc, R, res);
}

/* int8: q * d per group of 32, its fp16 scales read into floats once a row. */
static ALWAYS_INLINE void dot_int8(const int8_t *w, const uint16_t *ws, const float *x,
                                   int64_t in_pad, const int R, float *res) {
    f8 acc[MAX_ROWS][4];
    zero_sums(acc, R);
    float sc[in_pad / 32];
    halves_to_floats(ws, sc, in_pad / 32);
    for (int64_t k = 0; k < in_pad; k += 64) {
        prefetch_ahead(w + k);
        f8 q[8];
        for (int j = 0; j < 8; j++) q[j] = s8_to_f8(w + k + 8 * j);
        const f8 d0 = splat(sc[k / 32]), d1 = splat(sc[k / 32 + 1]);
        if (SUMS_ON_LEVELS(R)) {
            for (int r = 0; r < R; r++) {
                acc[r][0] += d0 * group_dot(q, x + r * in_pad + k);
                acc[r][1] += d1 * group_dot(q + 4, x + r * in_pad + k + 32);
            }
        } else {
            for (int j = 0; j < 4; j++) fma_rows(acc, q[j] * d0, x, in_pad, k + 8 * j, j, R);
            for (int j = 0; j < 4; j++) fma_rows(acc, q[4 + j] * d1, x, in_pad, k + 32 + 8 * j, j, R);
        }
    }
    sum_rows(acc, R, res);
}

/* uint8 (offset): q * step + (m - 8 step), step = d / 16; one or two rows sum on
   the levels as int4, step sum(q x) + (m - 8 step) sum(x). */
static ALWAYS_INLINE void dot_uint8(const uint8_t *w, const uint16_t *ws, const float *x,
                                    const float *xs, int64_t in_pad, const int R, float *res) {
    f8 acc[MAX_ROWS][4];
    zero_sums(acc, R);
    if (SUMS_ON_LEVELS(R)) {
        const int64_t groups = in_pad / 32;
        float sc[2 * groups], off[MAX_ROWS] = {0};
        halves_to_floats(ws, sc, 2 * groups);
        for (int64_t k = 0; k < in_pad; k += 32) {
            prefetch_ahead(w + k);
            const int64_t g = k / 32;
            const float step = sc[2 * g] * (1.0f / 16.0f), shift = sc[2 * g + 1] - 8.0f * step;
            f8 q[4];
            for (int j = 0; j < 4; j++) q[j] = u8_to_f8(w + k + 8 * j);
            for (int r = 0; r < R; r++) {
                acc[r][g % 2] += splat(step) * group_dot(q, x + r * in_pad + k);
                off[r] += shift * xs[r * groups + g];
            }
        }
        sum_rows(acc, R, res);
        for (int r = 0; r < R; r++) res[r] += off[r];
        return;
    }
    for (int64_t k = 0; k < in_pad; k += 32) {
        prefetch_ahead(w + k);
        const float step = half_to_float(ws[k / 16]) * (1.0f / 16.0f);
        const f8 scale = splat(step), shift = splat(half_to_float(ws[k / 16 + 1]) - 8.0f * step);
        for (int j = 0; j < 4; j++) {
            const int64_t c = k + 8 * j;
            fma_rows(acc, u8_to_f8(w + c) * scale + shift, x, in_pad, c, j, R);
        }
    }
    sum_rows(acc, R, res);
}

#if defined(__AVX2__)
/* One or two rows on AVX2 take int8, uint8 and int4 weights as integers: each group
   of 32 activations rounded to int16 on its own scale (amax / 32767), and the
   weights' levels times them summed exactly in int32 (vpmaddwd), a group's sum then
   scaled by its two scales in fp32. Widening every weight to a float cost more
   instructions than this host's memory takes to deliver it; the rounding moves an
   activation by at most 2^-16 of its group's largest, far finer than bf16's. */
#define INT_DOTS 1
#define INT_DOT_ROWS 2 /* f32_kernels.INT_DOT_ROWS */

/* rows of x [rows, in_pad] as int16 levels xq and a scale a group, xsc[r * groups + g]. */
static void int16_rows(const float *x, int64_t in_pad, int64_t rows, int16_t *xq, float *xsc) {
    const int64_t groups = in_pad / 32;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            const float *p = x + r * in_pad + 32 * g;
            __m256 v[4], m = _mm256_setzero_ps();
            for (int j = 0; j < 4; j++) {
                v[j] = _mm256_loadu_ps(p + 8 * j);
                m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
            }
            /* A group below 1e-30 counts as zeros (32767 / amax would overflow near
               fp32's smallest normals): it moves no normal output. */
            const float amax = hmax((f8)m), kept = amax > 1e-30f ? amax : 0.0f;
            xsc[r * groups + g] = kept / 32767.0f;
            const __m256 inv = _mm256_set1_ps(kept > 0.0f ? 32767.0f / kept : 0.0f);
            /* packs interleaves 128-bit lanes; the permute puts columns back in order. */
            for (int j = 0; j < 4; j += 2) {
                const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));
                const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(v[j + 1], inv));
                _mm256_storeu_si256((__m256i *)(xq + r * in_pad + 32 * g + 8 * j),
                                    _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
            }
        }
}

static ALWAYS_INLINE __m256i load16(const int16_t *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

/* sum(w x) over 32 columns: 16-bit weights w0 (columns 0..15), w1 (16..31). */
static ALWAYS_INLINE __m256 group_idot(__m256i w0, __m256i w1, const int16_t *xq) {
    return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_madd_epi16(w0, load16(xq)),
                                               _mm256_madd_epi16(w1, load16(xq + 16))));
}

/* The 8-bit kinds on integers: int8, d sx sum(q xq) a group; uint8 (offsets), step sx
   sum(q xq) + (m - 8 step) sum(x), step = d / 16. */
static ALWAYS_INLINE void idot_8bit(const uint8_t *w, const uint16_t *ws, const int16_t *xq,
                                    const float *xsc, const float *xs, int64_t in_pad,
                                    const int offsets, const int R, float *res) {
    const int64_t groups = in_pad / 32, per_group = offsets ? 2 : 1;
    float sc[per_group * groups], off[INT_DOT_ROWS] = {0};
    halves_to_floats(ws, sc, per_group * groups);
    __m256 acc[INT_DOT_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        prefetch_ahead(w + 32 * g);
        const __m128i b0 = _mm_loadu_si128((const __m128i *)(w + 32 * g));
        const __m128i b1 = _mm_loadu_si128((const __m128i *)(w + 32 * g + 16));
        const __m256i w0 = offsets ? _mm256_cvtepu8_epi16(b0) : _mm256_cvtepi8_epi16(b0);
        const __m256i w1 = offsets ? _mm256_cvtepu8_epi16(b1) : _mm256_cvtepi8_epi16(b1);
        const float d = offsets ? sc[2 * g] * (1.0f / 16.0f) : sc[g];
        for (int r = 0; r < R; r++) {
            acc[r][g & 1] = _mm256_fmadd_ps(group_idot(w0, w1, xq + r * in_pad + 32 * g),
                                            _mm256_set1_ps(d * xsc[r * groups + g]),
                                            acc[r][g & 1]);
            if (offsets) off[r] += (sc[2 * g + 1] - 8.0f * d) * xs[r * groups + g];
        }
    }
    for (int r = 0; r < R; r++) res[r] = hsum((f8)_mm256_add_ps(acc[r][0], acc[r][1])) + off[r];
}

/* int4 on integers: a 64-column chunk's low nibbles are group 2c, its high ones 2c + 1;
   d sx sum(q xq) + m sum(x) a group. */
static ALWAYS_INLINE void idot_int4(const uint8_t *w, const uint16_t *ws, const int16_t *xq,
                                    const float *xsc, const float *xs, int64_t in_pad,
                                    const int R, float *res) {
    const int64_t groups = in_pad / 32;
    float sc[2 * groups], off[INT_DOT_ROWS] = {0};
    halves_to_floats(ws, sc, 2 * groups);
    const __m256i low = _mm256_set1_epi16(0x0F);
    __m256 acc[INT_DOT_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g += 2) {
        const uint8_t *b = w + 16 * g;
        if (!(g & 2)) prefetch_ahead(b);
        const __m256i b0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b));
        const __m256i b1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + 16)));
        const __m256i lo0 = _mm256_and_si256(b0, low), lo1 = _mm256_and_si256(b1, low);
        const __m256i hi0 = _mm256_srli_epi16(b0, 4), hi1 = _mm256_srli_epi16(b1, 4);
        for (int r = 0; r < R; r++) {
            const int16_t *x = xq + r * in_pad + 32 * g;
            const float *s = xsc + r * groups + g;
            acc[r][0] = _mm256_fmadd_ps(group_idot(lo0, lo1, x), _mm256_set1_ps(sc[2 * g] * s[0]),
                                        acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(group_idot(hi0, hi1, x + 32),
                                        _mm256_set1_ps(sc[2 * g + 2] * s[1]), acc[r][1]);
            off[r] += sc[2 * g + 1] * xs[r * groups + g] + sc[2 * g + 3] * xs[r * groups + g + 1];
        }
    }
    for (int r = 0; r < R; r++) res[r] = hsum((f8)_mm256_add_ps(acc[r][0], acc[r][1])) + off[r];
}
#else
#define INT_DOTS 0
#endif

static ALWAYS_INLINE void dot_bf16(const uint16_t *w, const float *x, int64_t in_pad,
                                   const int R, float *res) {
    f8 acc[MAX_ROWS][4];
    zero_sums(acc, R);
    for (int64_t k = 0; k < in_pad; k += 32) {
        prefetch_ahead(w + k);
        for (int j = 0; j < 4; j++) fma_rows(acc, bf16_to_f8(w + k + 8 * j), x, in_pad, k + 8 * j, j, R);
    }
    sum_rows(acc, R, res);
}

static ALWAYS_INLINE void dot_plain(const float *w, const float *x, int64_t in_pad,
                                    const int R, float *res) {
    f8 acc[MAX_ROWS][4];
    zero_sums(acc, R);
    for (int64_t k = 0; k < in_pad; k += 32) {
        prefetch_ahead(w + k);
        prefetch_ahead(w + k + 16);
        for (int j = 0; j < 4; j++) fma_rows(acc, load8(w + k + 8 * j), x, in_pad, k + 8 * j, j, R);
    }
    sum_rows(acc, R, res);
}

#define ROW_SWITCH(DOT_CALL)                                                              \
    switch (rows) {                                                                       \
    case 1: DOT_CALL(1); break;                                                           \
    case 2: DOT_CALL(2); break;                                                           \
    case 3: DOT_CALL(3); break;                                                           \
    case 4: DOT_CALL(4); break;                                                           \
    case 5: DOT_CALL(5); break;                                                           \
    case 6: DOT_CALL(6); break;                                                           \
    case 7: DOT_CALL(7); break;                                                           \
    default: DOT_CALL(8); break;                                                          \
    }

#define TILE_LOOP_OF(SWITCH, DOT_CALL)                                                   \
    _Pragma("omp for schedule(static)") for (int64_t t = 0; t < tiles; t++) {             \
        const int64_t end = (t + 1) * TILE < out ? (t + 1) * TILE : out;                  \
        for (int64_t r0 = 0; r0 < batch; r0 += MAX_ROWS) {                                \
            const int64_t rows = batch - r0 < MAX_ROWS ? batch - r0 : MAX_ROWS;           \
            const float *x = xs + r0 * in_pad;                                            \
            for (int64_t o = t * TILE; o < end; o++) {                                    \
                float res[MAX_ROWS] = {0};                                                \
                SWITCH(DOT_CALL)                                                          \
                for (int64_t r = 0; r < rows; r++) y[(r0 + r) * out + o] = res[r];        \
            }                                                                             \
        }                                                                                 \
    }
#define TILE_LOOP(DOT_CALL) TILE_LOOP_OF(ROW_SWITCH, DOT_CALL)
/* The integer dots take one or two rows (INT_DOT_ROWS). */
#define TWO_ROW_SWITCH(DOT_CALL)                                                          \
    if (rows == 1)                                                                        \
        DOT_CALL(1);                                                                      \
    else                                                                                  \
        DOT_CALL(2);

void f32_matmul_tiles(int kind, const float *xs, int64_t batch, int64_t in_pad, const void *w,
                      const uint16_t *w_scale, int64_t out, float *y) {
    const int64_t tiles = (out + TILE - 1) / TILE;
    const uint8_t *wb = w;
    /* The offsets' group sums (int4, uint8), each thread its own: in_pad / 32 adds of
       eight a row, and at most F32_MAX_BATCH rows of in_pad / 32 floats on the stack. */
    const int offsets = kind == F32_INT4 || kind == F32_UINT8;
    float sums[offsets ? batch * in_pad / 32 : 1];
    if (offsets) group_sums(xs, in_pad, batch, sums);
#if INT_DOTS
    /* A decode of one or two sequences takes the integer dots. */
    const int ints = batch <= INT_DOT_ROWS && kind != F32_BF16 && kind != F32_PLAIN;
    int16_t xq[ints ? batch * in_pad : 1];
    float xsc[ints ? batch * in_pad / 32 : 1];
    if (ints) int16_rows(xs, in_pad, batch, xq, xsc);
    /* Each macro's rows start at x, row r0 of xs. */
#define IDOT8(R) idot_8bit(wb + o * in_pad, w_scale + o * in_pad / 32, xq + (x - xs), \
                           xsc + (x - xs) / 32, NULL, in_pad, 0, R, res)
#define IDOTU8(R) idot_8bit(wb + o * in_pad, w_scale + o * in_pad / 16, xq + (x - xs), \
                            xsc + (x - xs) / 32, sums + (x - xs) / 32, in_pad, 1, R, res)
#define IDOT4(R) idot_int4(wb + o * in_pad / 2, w_scale + o * in_pad / 16, xq + (x - xs), \
                           xsc + (x - xs) / 32, sums + (x - xs) / 32, in_pad, R, res)
    if (ints) {
        if (kind == F32_INT8)
            TILE_LOOP_OF(TWO_ROW_SWITCH, IDOT8)
        else if (kind == F32_UINT8)
            TILE_LOOP_OF(TWO_ROW_SWITCH, IDOTU8)
        else
            TILE_LOOP_OF(TWO_ROW_SWITCH, IDOT4)
        return;
    }
#undef IDOT8
#undef IDOTU8
#undef IDOT4
#endif
#define DOT8(R) dot_int8((const int8_t *)wb + o * in_pad, w_scale + o * in_pad / 32, x, in_pad, R, res)
#define DOTU8(R) dot_uint8(wb + o * in_pad, w_scale + o * in_pad / 16, x, \
                           sums + r0 * in_pad / 32, in_pad, R, res)
#define DOT4(R) dot_int4(wb + o * in_pad / 2, w_scale + o * in_pad / 16, x, \
                         sums + r0 * in_pad / 32, in_pad, R, res)
#define DOTB(R) dot_bf16((const uint16_t *)w + o * in_pad, x, in_pad, R, res)
#define DOTF(R) dot_plain((const float *)w + o * in_pad, x, in_pad, R, res)
    if (kind == F32_INT8)
        TILE_LOOP(DOT8)
    else if (kind == F32_UINT8)
        TILE_LOOP(DOTU8)
    else if (kind == F32_INT4)
        TILE_LOOP(DOT4)
    else if (kind == F32_BF16)
        TILE_LOOP(DOTB)
    else
        TILE_LOOP(DOTF)
#undef DOT8
#undef DOTU8
#undef DOT4
#undef DOTB
#undef DOTF
}

void f32_pad_rows(float *act, const float *x, int64_t rows, int64_t in, int64_t in_pad) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(act + r * in_pad, x + r * in, (size_t)in * sizeof(float));
        memset(act + r * in_pad + in, 0, (size_t)(in_pad - in) * sizeof(float));
    }
}

/* 1 where one or two rows of a quantized kind take the integer dots (int16 activations). */
int f32_int_dots(void) { return INT_DOTS; }

/* y[rows, out] = x[rows, in] W^T; rows 1..F32_MAX_BATCH. Returns 0, 1 for no memory, 2
   for a bad shape or kind. */
int f32_linear(int kind, const float *x, int64_t rows, int64_t in, int64_t in_pad,
               const void *w, const uint16_t *w_scale, int64_t out, float *y, int threads) {
    if (rows < 1 || rows > F32_MAX_BATCH || in_pad % 64 || in > in_pad || !f32_valid_kind(kind)) return 2;
    float *act = malloc((size_t)(rows * in_pad) * sizeof(float));
    if (!act) return 1;
    f32_pad_rows(act, x, rows, in, in_pad);
    /* A thread wake-up costs more than a small matrix's work. */
#pragma omp parallel num_threads(threads) if (out * in_pad >= 65536)
    f32_matmul_tiles(kind, act, rows, in_pad, w, w_scale, out, y);
    free(act);
    return 0;
}

/* Columns k .. k + 63 of weight row o as floats (k a multiple of 64). */
void f32_dequant_chunk(int kind, const void *w, const uint16_t *w_scale, int64_t in_pad,
                       int64_t o, int64_t k, float row[64]) {
    if (kind == F32_INT4) {
        const uint8_t *b = (const uint8_t *)w + o * in_pad / 2 + k / 2;
        const uint16_t *g = w_scale + o * in_pad / 16 + k / 16;
        const float d0 = half_to_float(g[0]), m0 = half_to_float(g[1]);
        const float d1 = half_to_float(g[2]), m1 = half_to_float(g[3]);
        for (int j = 0; j < 32; j++) {
            row[j] = (float)(b[j] & 0x0F) * d0 + m0;
            row[32 + j] = (float)(b[j] >> 4) * d1 + m1;
        }
    } else if (kind == F32_INT8) {
        const int8_t *q = (const int8_t *)w + o * in_pad + k;
        const uint16_t *s = w_scale + o * in_pad / 32 + k / 32;
        /* Scales read once per 32 values: per value, the call kept the loop scalar. */
        const float s0 = half_to_float(s[0]), s1 = half_to_float(s[1]);
        for (int j = 0; j < 32; j++) {
            row[j] = (float)q[j] * s0;
            row[32 + j] = (float)q[32 + j] * s1;
        }
    } else if (kind == F32_UINT8) {
        const uint8_t *q = (const uint8_t *)w + o * in_pad + k;
        const uint16_t *s = w_scale + o * in_pad / 16 + k / 16;
        for (int h = 0; h < 2; h++) {
            const float step = half_to_float(s[2 * h]) * (1.0f / 16.0f);
            const float shift = half_to_float(s[2 * h + 1]) - 8.0f * step;
            for (int j = 32 * h; j < 32 * h + 32; j++) row[j] = (float)q[j] * step + shift;
        }
    } else if (kind == F32_BF16) {
        const uint16_t *b = (const uint16_t *)w + o * in_pad + k;
        for (int j = 0; j < 64; j++) {
            const uint32_t u = (uint32_t)b[j] << 16;
            memcpy(row + j, &u, sizeof(float));
        }
    } else {
        memcpy(row, (const float *)w + o * in_pad + k, 64 * sizeof(float));
    }
}

int f32_valid_kind(int kind) { return kind >= F32_INT8 && kind <= F32_PLAIN; }

/* W as fp32 [out, in] (the padding dropped), for many-row matmuls. */
int f32_dequant(int kind, const void *w, const uint16_t *w_scale, int64_t out, int64_t in,
                int64_t in_pad, float *dst, int threads) {
    if (in_pad % 64 || in > in_pad || !f32_valid_kind(kind)) return 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (out * in >= 65536)
    for (int64_t o = 0; o < out; o++) {
        float row[64];
        for (int64_t k = 0; k < in; k += 64) {
            f32_dequant_chunk(kind, w, w_scale, in_pad, o, k, row);
            const int64_t n = in - k < 64 ? in - k : 64;
            memcpy(dst + o * in + k, row, (size_t)n * sizeof(float));
        }
    }
    return 0;
}
