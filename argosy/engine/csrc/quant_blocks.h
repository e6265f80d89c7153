/* Shared by quant_matmul.c and quant_decode.c: GGML block types and the product of one row. */
#pragma once
#include <stdint.h>

enum { Q8_0 = 8, Q4_0 = 2, Q4_1 = 3, Q4_K = 12, Q5_K = 13 }; /* GGML's type numbers */

int64_t quant_block_bytes(int64_t type);
int64_t quant_block_size(int64_t type);
/* x . W[o] for one row of `in` weights in `type` blocks; xs: x's sums over each block of 32. */
float quant_row_dot(int64_t type, const uint8_t *w, int64_t in, const float *x, const float *xs);
