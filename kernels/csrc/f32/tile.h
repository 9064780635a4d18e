/* The register tile of the fp32 GEMMs (gemm.c, attention.c): up to 6 rows of x
   times a k-major panel of 16 columns, 12 vectors of fp32 sums. Each output's sum
   runs over k in order, whatever the rows and columns around it. */
#ifndef PREFIXCHAT_F32_TILE_H
#define PREFIXCHAT_F32_TILE_H

#include "simd.h"

#define MR 6
#define NR 16

/* y[R rows, cols] (+)= x[R rows, kc] panel, where panel row k (16 floats) lies at
   panel + k * ldb; R <= MR, cols <= NR. */
static ALWAYS_INLINE void tile(const int R, const float *x, int64_t ldx, const float *panel,
                               int64_t ldb, int64_t kc, float *y, int64_t ldy, int64_t cols,
                               int add) {
    f8 acc[MR][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = splat(0.0f);
    for (int64_t k = 0; k < kc; k++) {
        const f8 b0 = load8(panel + k * ldb), b1 = load8(panel + k * ldb + 8);
        for (int r = 0; r < R; r++) {
            const f8 a = splat(x[r * ldx + k]);
            acc[r][0] += a * b0;
            acc[r][1] += a * b1;
        }
    }
    for (int r = 0; r < R; r++) {
        float *dst = y + r * ldy;
        if (cols == NR) {
            if (add) {
                store8(dst, load8(dst) + acc[r][0]);
                store8(dst + 8, load8(dst + 8) + acc[r][1]);
            } else {
                store8(dst, acc[r][0]);
                store8(dst + 8, acc[r][1]);
            }
        } else {
            float t[NR];
            store8(t, acc[r][0]);
            store8(t + 8, acc[r][1]);
            for (int64_t j = 0; j < cols; j++) dst[j] = add ? dst[j] + t[j] : t[j];
        }
    }
}

static inline void tile_rows(int64_t rows, const float *x, int64_t ldx, const float *panel,
                             int64_t ldb, int64_t kc, float *y, int64_t ldy, int64_t cols,
                             int add) {
    switch (rows) {
    case 6: tile(6, x, ldx, panel, ldb, kc, y, ldy, cols, add); break;
    case 5: tile(5, x, ldx, panel, ldb, kc, y, ldy, cols, add); break;
    case 4: tile(4, x, ldx, panel, ldb, kc, y, ldy, cols, add); break;
    case 3: tile(3, x, ldx, panel, ldb, kc, y, ldy, cols, add); break;
    case 2: tile(2, x, ldx, panel, ldb, kc, y, ldy, cols, add); break;
    default: tile(1, x, ldx, panel, ldb, kc, y, ldy, cols, add); break;
    }
}

#endif
