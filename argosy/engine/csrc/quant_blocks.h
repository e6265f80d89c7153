/* Shared by quant_matmul.c, quant_decode.c and quant_decode_batch.c: GGML block types, the product of one
 * row, a batch's products inside a caller's OpenMP region, and the per-layer plan the decode paths read. F32, F16 and
 * BF16 rows are taken as blocks of 32 values (128 or 64 bytes, no scale), so that every loop here walks blocks. */
#pragma once
#include <stdint.h>

enum { Q8_0 = 8, Q8_1 = 9, Q4_0 = 2, Q4_1 = 3, Q4_K = 12, Q5_K = 13, F32 = 0, F16 = 1, BF16 = 30 }; /* GGML's type numbers */

int64_t quant_block_bytes(int64_t type);
int64_t quant_block_size(int64_t type);
/* x . W[o] for one row of `in` weights in `type` blocks; xs: x's sums over each block of 32. */
float quant_row_dot(int64_t type, const uint8_t *w, int64_t in, const float *x, const float *xs);
/* quant_int8.c: the activation block type of a weight type's int8 product (Q8_0, Q8_1; 0: none), its bytes
 * per block of 32, a row of activations quantized to it, and one weight row times one such row. */
int64_t int8_activation_type(int64_t weight_type);
int64_t int8_block_bytes(int64_t act_type);
int64_t quantize_rows_q8(int64_t act_type, const float *x, int64_t rows, int64_t in, uint8_t *out);
float int8_row_dot(int64_t type, const uint8_t *w, int64_t in, const uint8_t *xq);

/* quant_matmul.c, with AVX512-BF16 only: a batch's bfloat16 products from inside an OpenMP region (each
 * is an orphaned omp for: every thread of the region calls it). xb holds `rows` activation rows rounded
 * to bfloat16 (bf16_round_rows: in / 32 vectors of 64 bytes each); scratch, bf16_scratch_bytes(in) per
 * thread. y[t * ldy + o] = x[t] . W[o]. */
int64_t bf16_scratch_bytes(int64_t in);
void bf16_round_rows(const float *x, int64_t rows, int64_t in, void *xb);
void bf16_product(int64_t type, const uint8_t *w, int64_t out, int64_t in, const void *xb, int64_t rows, float *y,
                  int64_t ldy, void *scratch);

/* paged_attention.c: decode attention for n sequences from inside an OpenMP region of `threads` threads. */
void paged_decode_attention_items(const float *q, const float *cache, const int64_t *tables, int64_t table_width,
                                  const int64_t *lens, float *out, int64_t n, int64_t heads, int64_t kv_heads,
                                  int64_t dim, int64_t block_size, int64_t num_blocks, float scale, int64_t threads);

/* small_ops.c: one row's RMS norm, RoPE and SiLU(gate) * up, as the layer-by-layer path computes them. */
void rms_norm_row(const float *x, const float *w, float *out, int64_t dim, float eps);
void rope_row(float *x, const float *cos, const float *sin, int64_t heads, int64_t dim);
void silu_mul_row(const float *gu, float *out, int64_t inter);

/* One layer's plan for the decode paths (quant_decode.py builds it): int64 fields, pointers as integers. */
enum {
    P_ATTN_NORM, P_FFN_NORM, P_KV, P_N_QKV, P_QKV, /* P_QKV: 3 x (type, ptr, rows) */
    P_O = P_QKV + 9, P_N_GU = P_O + 2, P_GU, /* P_O: (type, ptr); P_GU: 2 x (type, ptr, rows) */
    P_DOWN = P_GU + 6, PLAN_FIELDS = P_DOWN + 2 /* P_DOWN: (type, ptr) */
};
