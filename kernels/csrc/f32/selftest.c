/* The fp32 kernels' own test, in C, for a CPU that Python's tests cannot reach here:
   built with a cross compiler and run under qemu-user (ARM64's NEON path), and
   natively too. Each weight kind's matmul of 1..8 rows and GEMM of many, the
   dequantizers, and the paged decode and prefill attentions are held to plain scalar
   references; prints one line per
   check and a closing "N passed, N failed" line, and exits non-zero on a failure. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "f32.h"

int f32_int_dots(void);
int f32_linear(int kind, const float *x, int64_t rows, int64_t in, int64_t in_pad,
               const void *w, const uint16_t *w_scale, int64_t out, float *y, int threads);
int f32_dequant(int kind, const void *w, const uint16_t *w_scale, int64_t out, int64_t in,
                int64_t in_pad, float *dst, int threads);
int f32_gemm(int kind, const float *x, int64_t rows, int64_t in, int64_t in_pad, const void *w,
             const uint16_t *w_scale, int64_t out, float *y, int threads);
int f32_prefill_attention(const float *q, int64_t q_stride, const void *k_cache,
                          const void *v_cache, const int64_t *table, int64_t num_blocks, int64_t n,
                          int64_t length, float *out, int64_t heads, int64_t kv_heads,
                          int64_t head_dim, int64_t block_size, float scale, int kv_kind,
                          int threads);
int f32_paged_decode_attention(const float *query, const void *k_cache, const void *v_cache,
                               const int64_t *tables, int64_t table_stride, const int64_t *lens,
                               float *out, int64_t batch, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int64_t block_size, float scale, int64_t window,
                               int kv_kind, int threads);

static int passed, failed;

static uint32_t state = 12345u;
static float uniform(void) { /* in [-1, 1) */
    state = state * 1664525u + 1013904223u;
    return (float)(state >> 8) / (float)(1u << 23) - 1.0f;
}

/* An fp16 with a small exponent range, exact as a float: a scale of the tests. */
static uint16_t half_bits(float f, float *exact) {
    /* sign 0, exponent 10..14 (2^-5 .. 2^-1), mantissa random */
    const uint32_t e = 10u + (uint32_t)((uniform() + 1.0f) * 2.4f);
    const uint32_t m = (uint32_t)((uniform() + 1.0f) * 511.0f) & 0x3FFu;
    const uint16_t h = (uint16_t)((f < 0 ? 0x8000u : 0u) | (e << 10) | m);
    *exact = (f < 0 ? -1.0f : 1.0f) * ldexpf(1.0f + (float)m / 1024.0f, (int)e - 15);
    return h;
}

/* extra: a further bound per value (NULL: none). */
static void check_within(const char *what, const float *got, const double *want,
                         const double *scale, const double *extra, int64_t n) {
    double worst = 0.0;
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - want[i]);
        const double bound = 1e-5 * scale[i] + 1e-6 + (extra ? extra[i] : 0.0);
        if (err > bound || got[i] != got[i]) ok = 0;
        if (err / (scale[i] + 1e-30) > worst) worst = err / (scale[i] + 1e-30);
    }
    printf("%s %s (worst relative error %.2e)\n", ok ? "ok  " : "FAIL", what, worst);
    ok ? passed++ : failed++;
}

static void check(const char *what, const float *got, const double *want, const double *scale,
                  int64_t n) {
    check_within(what, got, want, scale, NULL, n);
}

/* W[out, in] as the reference sees it, built with each kind's stored bytes; lv: the
   part of each weight on its level (q d, q step; all of it for bf16 and fp32). */
static void make_weight(int kind, int64_t out, int64_t in, int64_t in_pad, void **data,
                        uint16_t **scale, double *w, double *lv) {
    const int64_t groups = in_pad / 32;
    *scale = calloc((size_t)(out * groups * 2 + 1), sizeof(uint16_t));
    if (kind == F32_INT4) {
        uint8_t *q = calloc((size_t)(out * in_pad / 2), 1);
        for (int64_t o = 0; o < out; o++)
            for (int64_t g = 0; g < groups; g++) {
                float d, m;
                (*scale)[(o * groups + g) * 2] = half_bits(1.0f, &d);
                (*scale)[(o * groups + g) * 2 + 1] = half_bits(uniform(), &m);
                for (int64_t j = 0; j < 32; j++) {
                    const int64_t c = g * 32 + j, chunk = c / 64 * 64, k = c - chunk;
                    const uint8_t level = c < in ? (uint8_t)((uniform() + 1.0f) * 7.99f) : 0;
                    uint8_t *byte = q + o * in_pad / 2 + chunk / 2 + (k & 31);
                    *byte |= (uint8_t)(k < 32 ? level : level << 4);
                    if (c < in) {
                        w[o * in + c] = (double)fmaf((float)level, d, m);
                        lv[o * in + c] = (double)level * d;
                    }
                }
            }
        *data = q;
    } else if (kind == F32_INT8 || kind == F32_UINT8) {
        uint8_t *q = calloc((size_t)(out * in_pad), 1);
        for (int64_t o = 0; o < out; o++)
            for (int64_t g = 0; g < groups; g++) {
                float d, m = 0.0f;
                const int64_t at = kind == F32_INT8 ? o * groups + g : (o * groups + g) * 2;
                (*scale)[at] = half_bits(1.0f, &d);
                if (kind == F32_UINT8) (*scale)[at + 1] = half_bits(uniform(), &m);
                for (int64_t j = 0; j < 32; j++) {
                    const int64_t c = g * 32 + j;
                    if (c >= in) continue;
                    if (kind == F32_INT8) {
                        const int8_t v = (int8_t)(uniform() * 127.0f);
                        q[o * in_pad + c] = (uint8_t)v;
                        w[o * in + c] = lv[o * in + c] = (double)((float)v * d);
                    } else {
                        const uint8_t v = (uint8_t)((uniform() + 1.0f) * 127.9f);
                        q[o * in_pad + c] = v;
                        const float step = d / 16.0f;
                        w[o * in + c] = (double)fmaf((float)v, step, m - 8.0f * step);
                        lv[o * in + c] = (double)v * step;
                    }
                }
            }
        *data = q;
    } else if (kind == F32_BF16) {
        uint16_t *b = calloc((size_t)(out * in_pad), sizeof(uint16_t));
        for (int64_t o = 0; o < out; o++)
            for (int64_t c = 0; c < in; c++) {
                float f = uniform();
                uint32_t u;
                memcpy(&u, &f, 4);
                u &= 0xFFFF0000u;
                memcpy(&f, &u, 4);
                b[o * in_pad + c] = (uint16_t)(u >> 16);
                w[o * in + c] = lv[o * in + c] = (double)f;
            }
        *data = b;
    } else {
        float *f = calloc((size_t)(out * in_pad), sizeof(float));
        for (int64_t o = 0; o < out; o++)
            for (int64_t c = 0; c < in; c++)
                w[o * in + c] = lv[o * in + c] = f[o * in_pad + c] = uniform();
        *data = f;
    }
}

/* want = x w^T in double, and mag = |x| |w|^T (the scale of its rounding). */
static void reference_matmul(const float *x, const double *w, int64_t rows, int64_t out,
                             int64_t in, double *want, double *mag) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double sum = 0.0, a = 0.0;
            for (int64_t c = 0; c < in; c++) {
                sum += (double)x[r * in + c] * w[o * in + c];
                a += fabs((double)x[r * in + c] * w[o * in + c]);
            }
            want[r * out + o] = sum;
            mag[r * out + o] = a;
        }
}

static void test_linear(int kind, const char *name, int64_t out, int64_t in) {
    const int64_t in_pad = (in + 63) / 64 * 64;
    double *w = calloc((size_t)(out * in), sizeof(double));
    double *lv = calloc((size_t)(out * in), sizeof(double));
    void *data;
    uint16_t *scale;
    make_weight(kind, out, in, in_pad, &data, &scale, w, lv);
    static float x[F32_MAX_BATCH * 1536], y[F32_MAX_BATCH * 1536], plain[1536 * 64];
    static double want[F32_MAX_BATCH * 1536], mag[F32_MAX_BATCH * 1536];
    static double rounding[F32_MAX_BATCH * 1536];
    static const int batches[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 31, F32_MAX_BATCH};
    for (int64_t i = 0; i < F32_MAX_BATCH * in; i++) x[i] = uniform();
    for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
        const int rows = batches[b];
        reference_matmul(x, w, rows, out, in, want, mag);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t o = 0; o < out; o++) {
                /* The integer dots round each group of 32 activations to int16: half a
                   step (amax / 65534) times the group's sum of |q d| (the offsets
                   multiply the activations' exact sum), 1 % over. */
                double e = 0.0;
                for (int64_t g = 0; g < in; g += 32) {
                    double amax = 0.0, wsum = 0.0;
                    for (int64_t c = g; c < in && c < g + 32; c++) {
                        amax = fmax(amax, fabs((double)x[r * in + c]));
                        wsum += fabs(lv[o * in + c]);
                    }
                    e += amax / 65534.0 * 1.01 * wsum;
                }
                rounding[r * out + o] = e;
            }
        const int rc = f32_linear(kind, x, rows, in, in_pad, data, scale, out, y, 2);
        char what[96];
        snprintf(what, sizeof what, "linear %s %lldx%lld, %d rows", name, (long long)out,
                 (long long)in, rows);
        if (rc) {
            printf("FAIL %s: returned %d\n", what, rc);
            failed++;
            continue;
        }
        const int ints = f32_int_dots() && rows <= 2 && kind != F32_BF16 && kind != F32_PLAIN;
        check_within(what, y, want, mag, ints ? rounding : NULL, rows * out);
    }
    if (out <= 64 && in <= 1536 && !f32_dequant(kind, data, scale, out, in, in_pad, plain, 2)) {
        int same = 1;
        for (int64_t i = 0; i < out * in; i++) same &= plain[i] == (float)w[i];
        printf("%s dequantize %s bit for bit\n", same ? "ok  " : "FAIL", name);
        same ? passed++ : failed++;
    }
    free(w);
    free(lv);
    free(data);
    free(scale);
}

/* The GEMM of many rows against a reference, and each row the same, bit for bit,
   when computed alone (a prompt's rows do not depend on the rows beside them). */
static void test_gemm(int kind, const char *name, int64_t out, int64_t in, int64_t rows) {
    const int64_t in_pad = (in + 63) / 64 * 64;
    double *w = calloc((size_t)(out * in), sizeof(double));
    double *lv = calloc((size_t)(out * in), sizeof(double));
    void *data;
    uint16_t *scale;
    make_weight(kind, out, in, in_pad, &data, &scale, w, lv);
    float *x = malloc((size_t)(rows * in) * sizeof(float));
    float *y = malloc((size_t)(rows * out) * sizeof(float));
    float *alone = malloc((size_t)out * sizeof(float));
    double *want = malloc((size_t)(rows * out) * sizeof(double));
    double *mag = malloc((size_t)(rows * out) * sizeof(double));
    for (int64_t i = 0; i < rows * in; i++) x[i] = uniform();
    reference_matmul(x, w, rows, out, in, want, mag);
    char what[96];
    snprintf(what, sizeof what, "gemm %s %lldx%lld, %lld rows", name, (long long)out,
             (long long)in, (long long)rows);
    int rc = f32_gemm(kind, x, rows, in, in_pad, data, scale, out, y, 2);
    if (rc) {
        printf("FAIL %s: returned %d\n", what, rc);
        failed++;
    } else {
        check(what, y, want, mag, rows * out);
        int same = 1;
        for (int64_t r = 0; r < rows; r += rows / 3 + 1) {
            rc |= f32_gemm(kind, x + r * in, 1, in, in_pad, data, scale, out, alone, 2);
            same &= !rc && !memcmp(alone, y + r * out, (size_t)out * sizeof(float));
        }
        printf("%s gemm %s: a row alone as in the batch\n", same ? "ok  " : "FAIL", name);
        same ? passed++ : failed++;
    }
    free(w), free(lv), free(data), free(scale), free(x), free(y), free(alone), free(want),
        free(mag);
}

/* The bf16 bits of f, truncated; f becomes the value they hold (exact as a float). */
static uint16_t to_bf16(float *f) {
    uint32_t u;
    memcpy(&u, f, sizeof u);
    u &= 0xFFFF0000u;
    memcpy(f, &u, sizeof u);
    return (uint16_t)(u >> 16);
}

/* An int8 cache row of n values (n int8, then the fp32 scale amax / 127) into dst; x
   becomes the values the row holds (int8 * scale). */
static void to_int8_row(float *x, int64_t n, uint8_t *dst) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float s = amax / 127.0f;
    for (int64_t i = 0; i < n; i++) {
        const int8_t q = (int8_t)(s > 0.0f ? nearbyintf(x[i] / s) : 0.0f);
        memcpy(dst + i, &q, 1);
        x[i] = (float)q * s;
    }
    memcpy(dst + n, &s, sizeof s);
}

/* Random K/V for `blocks` blocks of 16 tokens, and the caches of `kind` (0 fp32, 1 bf16,
   2 int8 rows with a scale) holding them: k and v become the values the caches hold. */
struct kv {
    float *k, *v;
    uint16_t *k16, *v16;
    uint8_t *k8, *v8;
    const void *k_cache, *v_cache;
};

static struct kv make_kv(int64_t blocks, int64_t kv_heads, int64_t head_dim, int kind) {
    const int64_t values = blocks * 16 * kv_heads * head_dim, rows = blocks * 16 * kv_heads;
    const int64_t row_bytes = head_dim + 4;
    struct kv c = {malloc((size_t)values * sizeof(float)), malloc((size_t)values * sizeof(float)),
                   malloc((size_t)values * sizeof(uint16_t)),
                   malloc((size_t)values * sizeof(uint16_t)), malloc((size_t)(rows * row_bytes)),
                   malloc((size_t)(rows * row_bytes)), NULL, NULL};
    for (int64_t i = 0; i < values; i++) {
        c.k[i] = uniform(), c.v[i] = uniform();
        if (kind == 1) c.k16[i] = to_bf16(&c.k[i]), c.v16[i] = to_bf16(&c.v[i]);
    }
    if (kind == 2)
        for (int64_t r = 0; r < rows; r++) {
            to_int8_row(c.k + r * head_dim, head_dim, c.k8 + r * row_bytes);
            to_int8_row(c.v + r * head_dim, head_dim, c.v8 + r * row_bytes);
        }
    c.k_cache = kind == 2 ? (const void *)c.k8 : kind == 1 ? (const void *)c.k16 : c.k;
    c.v_cache = kind == 2 ? (const void *)c.v8 : kind == 1 ? (const void *)c.v16 : c.v;
    return c;
}

static void free_kv(struct kv *c) {
    free(c->k), free(c->v), free(c->k16), free(c->v16), free(c->k8), free(c->v8);
}

static const char *kv_name(int kind) { return kind == 2 ? "int8" : kind == 1 ? "bf16" : "fp32"; }

/* One token's query (heads x head_dim) over the keys start .. last read through table,
   in double: want, and mag (the scale of its rounding, plus 1 for exp's ulps). p: a
   buffer of last + 1 doubles. */
static void reference_attention(const float *q, const struct kv *kv, const int64_t *table,
                                int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t start,
                                int64_t last, float scale, double *want, double *mag, double *p) {
    const int64_t token = kv_heads * head_dim;
    for (int64_t h = 0; h < heads; h++) {
        const int64_t kvh = h / (heads / kv_heads);
        double mx = -INFINITY, sum = 0.0;
        for (int64_t t = start; t <= last; t++) {
            const int64_t slot = table[t / 16] * 16 + t % 16;
            double s = 0.0;
            for (int64_t c = 0; c < head_dim; c++)
                s += (double)q[h * head_dim + c] * kv->k[slot * token + kvh * head_dim + c];
            p[t] = s * scale;
            mx = p[t] > mx ? p[t] : mx;
        }
        for (int64_t t = start; t <= last; t++) sum += p[t] = exp(p[t] - mx);
        for (int64_t i = 0; i < head_dim; i++) want[h * head_dim + i] = 0.0, mag[h * head_dim + i] = 1.0;
        for (int64_t t = start; t <= last; t++) {
            const int64_t slot = table[t / 16] * 16 + t % 16;
            for (int64_t i = 0; i < head_dim; i++) {
                const double val = kv->v[slot * token + kvh * head_dim + i];
                want[h * head_dim + i] += p[t] / sum * val;
                mag[h * head_dim + i] += p[t] / sum * fabs(val);
            }
        }
    }
}

/* window: a sliding window's length, or 0 for the whole context; kind: caches of fp32
   (0), bf16 (1) or int8 rows with a scale (2). */
static void test_attention(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t len,
                           int64_t window, int kind) {
    const int64_t start = window > 0 && len > window ? len - window : 0;
    const int64_t blocks = (len + 15) / 16 + 3;
    struct kv c = make_kv(blocks, kv_heads, head_dim, kind);
    float *q = malloc((size_t)(heads * head_dim) * sizeof(float));
    float *o = malloc((size_t)(heads * head_dim) * sizeof(float));
    double *want = malloc((size_t)(heads * head_dim) * sizeof(double));
    double *mag = malloc((size_t)(heads * head_dim) * sizeof(double));
    double *p = malloc((size_t)len * sizeof(double));
    int64_t table[64];
    for (int64_t i = 0; i < heads * head_dim; i++) q[i] = uniform();
    for (int64_t b = 0; b < blocks; b++) table[b] = blocks - 1 - b; /* out of order */
    const float scale = 1.0f / sqrtf((float)head_dim);
    reference_attention(q, &c, table, heads, kv_heads, head_dim, start, len - 1, scale, want, mag,
                        p);
    const int64_t lens[1] = {len};
    const int rc = f32_paged_decode_attention(q, c.k_cache, c.v_cache, table, blocks, lens, o, 1,
                                              heads, kv_heads, head_dim, 16, scale, window, kind,
                                              2);
    char what[160];
    snprintf(what, sizeof what,
             "decode attention %lld heads over %lld, dim %lld, %lld tokens, window %lld, %s KV",
             (long long)heads, (long long)kv_heads, (long long)head_dim, (long long)len,
             (long long)window, kv_name(kind));
    if (rc) {
        printf("FAIL %s: returned %d\n", what, rc);
        failed++;
    } else {
        check(what, o, want, mag, heads * head_dim);
    }
    free_kv(&c);
    free(q), free(o), free(want), free(mag), free(p);
}

/* Causal attention of the last n of len positions over caches of `kind` against a
   reference, and the same rows, bit for bit, when the whole prompt attends at once
   (a prefix-cache hit leaves what the rows compute unchanged). */
static void test_prefill(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t n,
                         int64_t len, int kind) {
    const int64_t blocks = (len + 15) / 16 + 2, qrow = heads * head_dim;
    struct kv c = make_kv(blocks, kv_heads, head_dim, kind);
    float *q = malloc((size_t)(len * qrow) * sizeof(float));
    float *o = malloc((size_t)(len * qrow) * sizeof(float));
    float *whole = malloc((size_t)(len * qrow) * sizeof(float));
    double *want = malloc((size_t)(n * qrow) * sizeof(double));
    double *mag = malloc((size_t)(n * qrow) * sizeof(double));
    double *p = malloc((size_t)len * sizeof(double));
    int64_t table[64];
    for (int64_t i = 0; i < len * qrow; i++) q[i] = uniform();
    for (int64_t b = 0; b < blocks; b++) table[b] = blocks - 1 - b; /* out of order */
    const float scale = 1.0f / sqrtf((float)head_dim);
    const float *mine = q + (len - n) * qrow; /* the last n queries */
    for (int64_t i = 0; i < n; i++)
        reference_attention(mine + i * qrow, &c, table, heads, kv_heads, head_dim, 0, len - n + i,
                            scale, want + i * qrow, mag + i * qrow, p);
    char what[160];
    snprintf(what, sizeof what,
             "prefill attention %lld heads over %lld, dim %lld, last %lld of %lld tokens, %s KV",
             (long long)heads, (long long)kv_heads, (long long)head_dim, (long long)n,
             (long long)len, kv_name(kind));
    int rc = f32_prefill_attention(mine, qrow, c.k_cache, c.v_cache, table, blocks, n, len, o,
                                   heads, kv_heads, head_dim, 16, scale, kind, 2);
    if (rc) {
        printf("FAIL %s: returned %d\n", what, rc);
        failed++;
    } else {
        check(what, o, want, mag, n * qrow);
        rc = f32_prefill_attention(q, qrow, c.k_cache, c.v_cache, table, blocks, len, len, whole,
                                   heads, kv_heads, head_dim, 16, scale, kind, 2);
        const int same = !rc && !memcmp(o, whole + (len - n) * qrow,
                                         (size_t)(n * qrow) * sizeof(float));
        printf("%s %s: as within the whole prompt\n", same ? "ok  " : "FAIL", what);
        same ? passed++ : failed++;
    }
    table[0] = blocks; /* past the caches: refused before anything is read */
    rc = f32_prefill_attention(mine, qrow, c.k_cache, c.v_cache, table, blocks, n, len, o, heads,
                               kv_heads, head_dim, 16, scale, kind, 2);
    printf("%s prefill attention refuses a block past the caches\n", rc == 2 ? "ok  " : "FAIL");
    rc == 2 ? passed++ : failed++;
    free_kv(&c);
    free(q), free(o), free(whole), free(want), free(mag), free(p);
}

int main(void) {
    static const char *names[] = {"int8", "int4", "bf16", "uint8", "fp32"};
    static const int64_t shapes[][2] = {{64, 576}, {70, 100}, {33, 1536}, {16, 64}};
    for (int kind = 0; kind <= F32_PLAIN; kind++)
        for (int s = 0; s < 4; s++) test_linear(kind, names[kind], shapes[s][0], shapes[s][1]);
    for (int kind = 0; kind <= F32_PLAIN; kind++) {
        test_gemm(kind, names[kind], 64, 576, 70);
        test_gemm(kind, names[kind], 37, 100, 13); /* tails of every block */
        test_gemm(kind, names[kind], 48, 1536, 520);
    }
    for (int kind = 0; kind <= 2; kind++) { /* fp32, bf16, int8 caches */
        test_prefill(9, 3, 64, 300, 300, kind);
        test_prefill(9, 3, 64, 37, 300, kind); /* after a prefix, mid-block */
        test_prefill(4, 4, 16, 1, 40, kind);
        test_prefill(8, 2, 256, 20, 150, kind);
        test_prefill(6, 1, 32, 5, 5, kind);
        test_attention(9, 3, 64, 1, 0, kind);
        test_attention(9, 3, 64, 100, 0, kind);
        test_attention(4, 4, 16, 37, 0, kind);
        test_attention(8, 2, 256, 300, 0, kind);
        test_attention(8, 2, 256, 300, 37, kind); /* a window starting mid-block */
        test_attention(4, 2, 32, 100, 1, kind);
        test_attention(4, 2, 32, 20, 64, kind); /* a window longer than the context */
    }
    printf("fp32 kernel checks: %d ok, %d failed\n", passed, failed);
    return failed != 0;
}
