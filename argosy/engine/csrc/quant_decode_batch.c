/* One decode step of several sequences through every layer of a Llama-family model with quantized (or
 * 16-bit) weights, in a single call: the batched counterpart of quant_decode.c, for steps where every
 * token is a decode and products take bfloat16 operands (quant_batch_dtype).
 *
 * Layer by layer, a step of 16 decodes of SmolLM2 spent about a quarter of its time outside the
 * products and attention: a dozen PyTorch ops per layer, ~150 OpenMP regions opened and closed, and the
 * second thread spinning while Python ran. Here the threads stay in one region for the whole step and
 * every phase of a layer is split between them: RMS norm, q/k/v (quant_matmul.c's bfloat16 products),
 * RoPE and the K/V writes, attention over the paged cache (paged_attention.c), output projection,
 * residual add and RMS norm, gate/up, SiLU, down, residual add. The products, attention, norms, RoPE
 * and SiLU are the very functions the layer-by-layer path calls (small_ops.c is built into both
 * libraries), so a step computes the same numbers bit for bit: a test checks.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_blocks.h"

#if defined(__AVX512BF16__)
/* y [T, width] (row stride ldy) = x [T, in] times the segments' stacked rows; xb: scratch for x in bfloat16. */
static void product(const int64_t *segs, int64_t n_segs, int64_t in, const float *x, int64_t T, float *y,
                    int64_t ldy, void *xb, void *scratch)
{
    bf16_round_rows(x, T, in, xb);
    int64_t start = 0;
    for (int64_t s = 0; s < n_segs; s++) {
        const int64_t *seg = segs + 3 * s; /* (type, ptr, rows) */
        bf16_product(seg[0], (const uint8_t *)seg[1], seg[2], in, xb, T, y + start, ldy, scratch);
        start += seg[2];
    }
}
#endif

/* x [T, hidden]: each sequence's new token's embedding in, its last hidden state (before the final norm)
 * out. plan [layers, PLAN_FIELDS] (quant_decode.py); cos, sin [T, head_dim / 2]; tables [T, table_width]
 * block ids; lens [T] tokens in each sequence's cache after this one; slots [T] where its K/V go.
 * Returns 0; -1 for a bad slot, length or block table, or a build without AVX512-BF16; -2 out of memory. */
int64_t quant_decode_batch(int64_t layers, const int64_t *plan, float *x, int64_t T, int64_t hidden, int64_t heads,
                           int64_t kv_heads, int64_t head_dim, int64_t inter, float eps, const float *cos,
                           const float *sin, const int64_t *tables, int64_t table_width, const int64_t *lens,
                           const int64_t *slots, int64_t block_size, int64_t num_blocks, float scale, int64_t threads)
{
#if defined(__AVX512BF16__)
    const int64_t qs = heads * head_dim, kvs = kv_heads * head_dim, qkvw = qs + 2 * kvs;
    const int64_t num_slots = num_blocks * block_size, half = head_dim / 2;
    const int64_t wide = hidden > inter ? (hidden > qs ? hidden : qs) : (inter > qs ? inter : qs);
    if (T < 1 || hidden % 32 || inter % 32 || qs % 32 || heads % kv_heads || threads < 1)
        return -1;
    for (int64_t t = 0; t < T; t++) {
        if (slots[t] < 0 || slots[t] >= num_slots || lens[t] < 1 || lens[t] > table_width * block_size)
            return -1;
        for (int64_t b = 0; b < (lens[t] + block_size - 1) / block_size; b++)
            if (tables[t * table_width + b] < 0 || tables[t * table_width + b] >= num_blocks)
                return -1;
    }
    const int64_t scratch_bytes = (bf16_scratch_bytes(wide) + 63) / 64 * 64;
    float *xn = malloc(T * wide * sizeof(float)), *qkv = malloc(T * qkvw * sizeof(float));
    float *q = malloc(T * qs * sizeof(float)), *attn = malloc(T * qs * sizeof(float));
    float *gu = malloc(T * 2 * inter * sizeof(float)), *tmp = malloc(T * hidden * sizeof(float));
    void *xb = aligned_alloc(64, (size_t)(T * (wide / 32) * 64));
    uint8_t *scratch = aligned_alloc(64, (size_t)(threads * scratch_bytes));
    const int failed = !xn || !qkv || !q || !attn || !gu || !tmp || !xb || !scratch;
    if (!failed) {
#pragma omp parallel num_threads(threads)
        {
            void *mine = scratch + omp_get_thread_num() * scratch_bytes;
            for (int64_t l = 0; l < layers; l++) {
                const int64_t *p = plan + l * PLAN_FIELDS;
                float *cache = (float *)p[P_KV];
#pragma omp for schedule(static)
                for (int64_t t = 0; t < T; t++)
                    rms_norm_row(x + t * hidden, (const float *)p[P_ATTN_NORM], xn + t * hidden, hidden, eps);
                product(p + P_QKV, p[P_N_QKV], hidden, xn, T, qkv, qkvw, xb, mine);
                /* Every new K/V is written before any attention reads the cache (the barrier ending this
                 * loop): a sequence may read blocks another one in this batch writes (prefix hits). */
#pragma omp for schedule(static)
                for (int64_t t = 0; t < T; t++) {
                    float *row = qkv + t * qkvw;
                    rope_row(row, cos + t * half, sin + t * half, heads + kv_heads, head_dim); /* q, k side by side */
                    memcpy(q + t * qs, row, qs * sizeof(float));
                    memcpy(cache + slots[t] * kvs, row + qs, kvs * sizeof(float));
                    memcpy(cache + (num_slots + slots[t]) * kvs, row + qs + kvs, kvs * sizeof(float));
                }
                paged_decode_attention_items(q, cache, tables, table_width, lens, attn, T, heads, kv_heads, head_dim,
                                             block_size, num_blocks, scale, omp_get_num_threads());
                const int64_t o_seg[3] = {p[P_O], p[P_O + 1], hidden};
                product(o_seg, 1, qs, attn, T, tmp, hidden, xb, mine);
#pragma omp for schedule(static)
                for (int64_t t = 0; t < T; t++) {
                    float *xt = x + t * hidden;
                    for (int64_t d = 0; d < hidden; d++)
                        xt[d] += tmp[t * hidden + d];
                    rms_norm_row(xt, (const float *)p[P_FFN_NORM], xn + t * hidden, hidden, eps);
                }
                product(p + P_GU, p[P_N_GU], hidden, xn, T, gu, 2 * inter, xb, mine);
#pragma omp for schedule(static)
                for (int64_t t = 0; t < T; t++)
                    silu_mul_row(gu + t * 2 * inter, xn + t * inter, inter);
                const int64_t down_seg[3] = {p[P_DOWN], p[P_DOWN + 1], hidden};
                product(down_seg, 1, inter, xn, T, tmp, hidden, xb, mine);
#pragma omp for schedule(static)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t d = 0; d < hidden; d++)
                        x[t * hidden + d] += tmp[t * hidden + d];
            }
        }
    }
    free(xn);
    free(qkv);
    free(q);
    free(attn);
    free(gu);
    free(tmp);
    free(xb);
    free(scratch);
    return failed ? -2 : 0;
#else
    (void)layers, (void)plan, (void)x, (void)T, (void)hidden, (void)heads, (void)kv_heads, (void)head_dim;
    (void)inter, (void)eps, (void)cos, (void)sin, (void)tables, (void)table_width, (void)lens, (void)slots;
    (void)block_size, (void)num_blocks, (void)scale, (void)threads;
    return -1;
#endif
}
