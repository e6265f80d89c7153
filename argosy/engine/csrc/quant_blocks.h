/* Shared by quant_matmul.c and quant_decode.c: GGML block types and the product of one row. F32, F16 and
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
