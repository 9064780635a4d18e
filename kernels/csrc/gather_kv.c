/* One sequence's K or V, gathered from the paged cache straight into head-major
   order for batched matmuls: out [kv_heads, len, head_dim] from cache [blocks,
   block_size, kv_heads, head_dim] through the block table. One pass over the
   context instead of torch's two (index_select of the blocks, then a transposing
   copy). Plain copies: any element size and head_dim. */

#include <stdint.h>
#include <string.h>

void gather_head_major(const char *cache, const int64_t *table, int64_t len, char *out,
                       int64_t kv_heads, int64_t head_bytes, int64_t block_size, int threads) {
    const int64_t blocks = (len + block_size - 1) / block_size;
    const int64_t token_bytes = kv_heads * head_bytes;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t h = 0; h < kv_heads; h++) {
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t t0 = b * block_size;
            const int64_t n = len - t0 < block_size ? len - t0 : block_size;
            const char *src = cache + table[b] * block_size * token_bytes + h * head_bytes;
            char *dst = out + (h * len + t0) * head_bytes;
            for (int64_t off = 0; off < n; off++)
                memcpy(dst + off * head_bytes, src + off * token_bytes, (size_t)head_bytes);
        }
    }
}
