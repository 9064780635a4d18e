/* Many-row matmuls (a prefill) against weights kept at their stored size: y = x W^T
   for fp32 x [rows, in] and a weight of any kind. Each thread takes its own panels
   of 16 output columns; a panel's weights for a block of the inner dimension are
   dequantized exactly (f32_dequant_chunk) into a small k-major buffer that stays in
   L1, and a 6 x 16 register tile of fp32 sums runs over it for every 6 rows of the
   block of x, which stays in L2 while the thread's panels go by.

   Why not torch's GEMM over dequantized tiles: MKL's sgemm, which torch calls,
   takes its fast kernels only on Intel CPUs (measured: docs/benchmarks.md), and
   each tile dequantized to memory is written and read back once more. The sums
   are fp32 in another order than MKL's, so the result is not MKL's bit for bit. */

#include <omp.h>

#include "f32.h"
#include "simd.h"
#include "tile.h"

/* Inner-dimension block (a multiple of 64, the dequantizer's chunk): a panel of
   KC x 16 floats is 24 KiB, in L1 beside the rows' broadcasts. */
#ifndef KC
#define KC 384
#endif
/* Rows of x a block takes: MC x KC floats (768 KiB) stay in L2 over the panels. */
#ifndef MC
#define MC 512
#endif

/* The panel of output columns n .. n + 15 (zeros past `out`) for inner columns
   k0 .. k0 + kc, k-major: panel[k * 16 + j]. */
static void pack_panel(int kind, const void *w, const uint16_t *w_scale, int64_t in_pad,
                       int64_t out, int64_t n, int64_t k0, int64_t kc, float *panel) {
    float row[64];
    for (int j = 0; j < NR; j++) {
        const int64_t o = n + j;
        for (int64_t k = 0; k < kc; k += 64) {
            const int64_t len = kc - k < 64 ? kc - k : 64;
            if (o < out) {
                f32_dequant_chunk(kind, w, w_scale, in_pad, o, k0 + k, row);
                for (int64_t i = 0; i < len; i++) panel[(k + i) * NR + j] = row[i];
            } else {
                for (int64_t i = 0; i < len; i++) panel[(k + i) * NR + j] = 0.0f;
            }
        }
    }
}

/* 1 where the register tile (tile.h) is measured to beat torch's kernels: AVX2
   builds. NEON has the registers for it but has not been measured; with SSE2 the
   12 sums spill. The kernels run, and are tested, everywhere. */
int f32_tiles_fast(void) {
#if defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

/* y[rows, out] = x[rows, in] W^T. Returns 0, or 2 for a bad shape or kind. */
int f32_gemm(int kind, const float *x, int64_t rows, int64_t in, int64_t in_pad, const void *w,
             const uint16_t *w_scale, int64_t out, float *y, int threads) {
    if (rows < 1 || in < 1 || in_pad % 64 || in > in_pad || out < 1 || !f32_valid_kind(kind))
        return 2;
    const int64_t panels = (out + NR - 1) / NR;
#pragma omp parallel num_threads(threads)
    {
        float panel[KC * NR] __attribute__((aligned(64)));
        const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
        /* Contiguous panels per thread: each writes only its own columns of y. */
        const int64_t p0 = panels * tid / nth, p1 = panels * (tid + 1) / nth;
        for (int64_t m0 = 0; m0 < rows; m0 += MC) {
            const int64_t mc = rows - m0 < MC ? rows - m0 : MC;
            for (int64_t k0 = 0; k0 < in; k0 += KC) {
                const int64_t kc = in - k0 < KC ? in - k0 : KC;
                for (int64_t p = p0; p < p1; p++) {
                    const int64_t n = p * NR, cols = out - n < NR ? out - n : NR;
                    pack_panel(kind, w, w_scale, in_pad, out, n, k0, kc, panel);
                    for (int64_t m = m0; m < m0 + mc; m += MR) {
                        const int64_t r = m0 + mc - m < MR ? m0 + mc - m : MR;
                        tile_rows(r, x + m * in + k0, in, panel, NR, kc, y + m * out + n, out,
                                  cols, k0 > 0);
                    }
                }
            }
        }
    }
    return 0;
}
