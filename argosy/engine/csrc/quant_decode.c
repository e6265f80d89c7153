/* One decode step of one sequence through every layer of a Llama-family model with quantized weights,
 * in a single call: the single-stream path (a one-token step) on the CPU.
 *
 * A 135M model has 30 layers of a dozen small operations each; as PyTorch ops each costs a dispatch
 * (microseconds) that outweighs its arithmetic, and a token took ~2.5x longer in Python than reading
 * its Q4 weights does. Here the threads stay in one OpenMP region for the whole step and meet at a
 * barrier between the phases of a layer: RMS norm, q/k/v, RoPE (Hugging Face's rotate-half layout),
 * the K/V write, attention over the paged cache, output projection, RMS norm, gate/up, SiLU, down.
 * Products go through quant_matmul.c's quant_row_dot, as the layer-by-layer path's single rows do; RMS
 * norm, RoPE, SiLU and attention are small_ops.c's and paged_attention.c's functions, as the layers call.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_blocks.h"

/* The layer plan (P_* fields): quant_blocks.h. */

/* y[0..rows) = W x for one quantized matrix; called by every thread of the region (an omp for).
 * xs: x's block sums, computed by the caller's single section. With int8 activations (types that have
 * an int8 product), x is quantized once into xq, kept while *xq_type says it holds x in that type; the
 * caller sets *xq_type to 0 when x changes. */
static void matvec(int64_t type, const uint8_t *w, int64_t rows, int64_t in, const float *x, const float *xs, float *y,
                   int64_t int8, uint8_t *xq, int64_t *xq_type)
{
    const int64_t row_bytes = in / quant_block_size(type) * quant_block_bytes(type);
    const int64_t act = int8 ? int8_activation_type(type) : 0;
    if (act) {
#pragma omp single
        if (*xq_type != act) {
            quantize_rows_q8(act, x, 1, in, xq);
            *xq_type = act;
        }
#pragma omp for schedule(static)
        for (int64_t o = 0; o < rows; o++)
            y[o] = int8_row_dot(type, w + o * row_bytes, in, xq);
        return;
    }
#pragma omp for schedule(static)
    for (int64_t o = 0; o < rows; o++)
        y[o] = quant_row_dot(type, w + o * row_bytes, in, x, xs);
}

static void block_sums(const float *x, int64_t in, float *xs)
{
    for (int64_t b = 0; b < in / 32; b++) {
        float s = 0.0f;
        for (int l = 0; l < 32; l++)
            s += x[32 * b + l];
        xs[b] = s;
    }
}

/* x [hidden]: the token's embedding in, its last hidden state (before the final norm) out.
 * plan [layers, PLAN_FIELDS]; cos, sin [head_dim / 2]; table: the sequence's block ids; ctx: tokens in
 * the cache after this one; slot: where this token's K/V go. Returns 0, -1 for a bad plan or slot, -2 out of memory. */
int64_t quant_decode_layers(int64_t layers, const int64_t *plan, float *x, int64_t hidden, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, int64_t inter, float eps, const float *cos,
                            const float *sin, const int64_t *table, int64_t ctx, int64_t slot, int64_t block_size,
                            int64_t num_blocks, float scale, int64_t threads,
                            int64_t int8)
{
    const int64_t qs = heads * head_dim, kvs = kv_heads * head_dim, num_slots = num_blocks * block_size;
    const int64_t widest = hidden > inter ? (hidden > qs ? hidden : qs) : (inter > qs ? inter : qs);
    if (slot < 0 || slot >= num_slots || ctx < 1 || widest % 32 || heads % kv_heads)
        return -1;
    for (int64_t t = 0; t < (ctx + block_size - 1) / block_size; t++)
        if (table[t] < 0 || table[t] >= num_blocks)
            return -1;
    float *xn = malloc(widest * sizeof(float)), *qkv = malloc((qs + 2 * kvs) * sizeof(float));
    float *attn = malloc(qs * sizeof(float)), *gu = malloc(2 * inter * sizeof(float)), *tmp = malloc(hidden * sizeof(float));
    float *xs = malloc(widest / 32 * sizeof(float));
    uint8_t *xq = malloc(widest / 32 * 36); /* x in int8 blocks (Q8_1: 36 bytes per 32) */
    int64_t xq_type = 0;
    const int failed = !xn || !qkv || !attn || !gu || !tmp || !xs || !xq;
    if (!failed) {
#pragma omp parallel num_threads(threads)
        {
            for (int64_t l = 0; l < layers; l++) {
                const int64_t *p = plan + l * PLAN_FIELDS;
                float *cache = (float *)p[P_KV];
#pragma omp single
                {
                    rms_norm_row(x, (const float *)p[P_ATTN_NORM], xn, hidden, eps);
                    block_sums(xn, hidden, xs);
                    xq_type = 0;
                }
                int64_t start = 0;
                for (int64_t s = 0; s < p[P_N_QKV]; s++) {
                    const int64_t *seg = p + P_QKV + 3 * s;
                    matvec(seg[0], (const uint8_t *)seg[1], seg[2], hidden, xn, xs, qkv + start, int8, xq, &xq_type);
                    start += seg[2];
                }
#pragma omp single
                {
                    rope_row(qkv, cos, sin, heads + kv_heads, head_dim); /* q and k lie side by side */
                    memcpy(cache + slot * kvs, qkv + qs, kvs * sizeof(float));
                    memcpy(cache + (num_slots + slot) * kvs, qkv + qs + kvs, kvs * sizeof(float));
                }
                paged_decode_attention_items(qkv, cache, table, (ctx + block_size - 1) / block_size, &ctx, attn, 1, heads,
                                             kv_heads, head_dim, block_size, num_blocks, scale, omp_get_num_threads());
#pragma omp single
                {
                    block_sums(attn, qs, xs);
                    xq_type = 0;
                }
                matvec(p[P_O], (const uint8_t *)p[P_O + 1], hidden, qs, attn, xs, tmp, int8, xq, &xq_type);
#pragma omp single
                {
                    for (int64_t d = 0; d < hidden; d++)
                        x[d] += tmp[d];
                    rms_norm_row(x, (const float *)p[P_FFN_NORM], xn, hidden, eps);
                    block_sums(xn, hidden, xs);
                    xq_type = 0;
                }
                start = 0;
                for (int64_t s = 0; s < p[P_N_GU]; s++) {
                    const int64_t *seg = p + P_GU + 3 * s;
                    matvec(seg[0], (const uint8_t *)seg[1], seg[2], hidden, xn, xs, gu + start, int8, xq, &xq_type);
                    start += seg[2];
                }
#pragma omp single
                {
                    silu_mul_row(gu, xn, inter);
                    block_sums(xn, inter, xs);
                    xq_type = 0;
                }
                matvec(p[P_DOWN], (const uint8_t *)p[P_DOWN + 1], hidden, inter, xn, xs, tmp, int8, xq, &xq_type);
#pragma omp single
                for (int64_t d = 0; d < hidden; d++)
                    x[d] += tmp[d];
            }
        }
    }
    free(xn);
    free(qkv);
    free(attn);
    free(gu);
    free(tmp);
    free(xs);
    free(xq);
    return failed ? -2 : 0;
}
