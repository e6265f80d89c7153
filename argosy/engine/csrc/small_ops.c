/* The per-token small ops of a layer, float32, on the CPU: RMS norm, rotary embedding, SiLU times up.
 *
 * Each replaces several PyTorch ops (RMS norm: 8 dispatched ops; RoPE: 8; SiLU and the product: 3), whose dispatch costs
 * more than their arithmetic on a step of one token. Rows are split over the threads only when there
 * are many (a prefill chunk).
 */
#include <stdint.h>

#include "fast_exp.h"

void rope_row(float *x, const float *c, const float *s, int64_t heads, int64_t dim);

/* out = w * x / sqrt(mean(x^2) + eps) for one row, as transformers' LlamaRMSNorm in float32 (may alias). */
void rms_norm_row(const float *x, const float *w, float *out, int64_t dim, float eps)
{
    float ss = 0.0f;
    for (int64_t d = 0; d < dim; d++)
        ss += x[d] * x[d];
    const float inv = 1.0f / __builtin_sqrtf(ss / (float)dim + eps);
    for (int64_t d = 0; d < dim; d++)
        out[d] = w[d] * (x[d] * inv);
}

/* rms_norm_row over x, out [rows, dim] (may alias), w [dim]. */
void rms_norm_f32(const float *x, const float *w, float *out, int64_t rows, int64_t dim, float eps,
                  int64_t threads)
{
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * dim >= 1 << 16)
    for (int64_t r = 0; r < rows; r++)
        rms_norm_row(x + r * dim, w, out + r * dim, dim, eps);
}

/* Rotates, in place, the first `heads` heads of each of `rows` rows (row stride `stride` floats):
 * the rotate-half layout of Hugging Face checkpoints. cos, sin [rows, dim / 2]. */
void rope_f32(float *x, const float *cos, const float *sin, int64_t rows, int64_t stride, int64_t heads,
              int64_t dim, int64_t threads)
{
    const int64_t half = dim / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * heads * dim >= 1 << 16)
    for (int64_t r = 0; r < rows; r++)
        rope_row(x + r * stride, cos + r * half, sin + r * half, heads, dim);
}

/* One row of rope_f32: its first `heads` heads; cos, sin [dim / 2]. */
void rope_row(float *x, const float *c, const float *s, int64_t heads, int64_t dim)
{
    const int64_t half = dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *x1 = x + h * dim, *x2 = x1 + half;
        for (int64_t i = 0; i < half; i++) {
            const float a = x1[i], b = x2[i];
            x1[i] = a * c[i] - b * s[i];
            x2[i] = b * c[i] + a * s[i];
        }
    }
}

/* Writes each token's K and V rows into its cache slot: cache [2, slots, row]; k, v [rows] rows of `row`
 * floats, `k_stride`/`v_stride` apart (views into the fused qkv output). Returns the number of tokens
 * whose slot was out of range (not written). */
int64_t write_kv_f32(float *cache, const float *k, const float *v, int64_t k_stride, int64_t v_stride,
                     const int64_t *slots, int64_t rows, int64_t row, int64_t num_slots)
{
    int64_t bad = 0;
    float *v_cache = cache + num_slots * row;
    for (int64_t t = 0; t < rows; t++) {
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots) {
            bad++;
            continue;
        }
        __builtin_memcpy(cache + slot * row, k + t * k_stride, row * sizeof(float));
        __builtin_memcpy(v_cache + slot * row, v + t * v_stride, row * sizeof(float));
    }
    return bad;
}

/* out[i] = silu(gate[i]) * up[i] for one row of gu = [gate (inter), up (inter)]: the MLP's activation.
 * silu(g) = g / (1 + exp(-g)), with exp taken of -|g| only (fast_exp.h) and the halves mirrored. */
void silu_mul_row(const float *gu, float *out, int64_t inter)
{
    for (int64_t i = 0; i < inter; i++) {
        const float g = gu[i], e = exp_nonpositive(g < 0.0f ? g : -g), sig = (g < 0.0f ? e : 1.0f) / (1.0f + e);
        out[i] = g * sig * gu[inter + i];
    }
}

/* silu_mul_row over gu [rows, 2 * inter] into out [rows, inter]. */
void silu_mul_f32(const float *gu, float *out, int64_t rows, int64_t inter, int64_t threads)
{
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * inter >= 1 << 16)
    for (int64_t r = 0; r < rows; r++)
        silu_mul_row(gu + r * 2 * inter, out + r * inter, inter);
}
