/* y = x W^T with W in GGML's block formats (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K) or in float32, float16 or bfloat16,
 * float32 x and y, on the CPU.
 *
 * The weights stay in their blocks and are dequantized inside the products; the activations stay
 * float32 (llama.cpp quantizes them to int8 for integer dot products: faster, but the answers move; a
 * step here is the dequantized model's, as a float32 model of the same weights computes it).
 * - One row (a single stream, bound by reading W): each block is widened in registers and multiplied
 *   into the row straight from the file's bytes, each weight byte read once. Per block of 32,
 *   sum_i (a q_i + c) x_i = a sum_i q_i x_i + c sum_i x_i, with the x block sums computed once.
 * - Several rows (a batch): each weight row is dequantized once into an L1-sized float buffer and
 *   multiplied into every activation row, four at a time (each loaded weight serves four rows).
 *
 * dequantize_rows_* write float32 exactly as GGML's (and the `gguf` package's) reference dequantization,
 * with no contraction of a * b + c into a fused multiply-add: bit for bit the same values.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#pragma GCC optimize("fp-contract=off")

#include "quant_blocks.h"


static float f16_to_f32(uint16_t h)
{
#if defined(__F16C__)
    return _cvtsh_ss(h); /* exact, as the conversion below */
#endif
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal half: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t rd16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Bytes per block and weights per block of a type; 0 for a type this file does not handle. */
int64_t quant_block_bytes(int64_t type)
{
    switch (type) {
    case Q8_0: return 34;
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case F16: case BF16: return 64; /* 32 values of 2 bytes */
    case F32: return 128;
    default: return 0;
    }
}

int64_t quant_block_size(int64_t type)
{
    return (type == Q4_K || type == Q5_K) ? 256 : 32;
}

/* The 6-bit scale and min of sub-block j of a K-quant super-block (GGML's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void dequant_row(int64_t type, const uint8_t *row, int64_t in, float *out);

/* Sums of x over each block of 32. */
static void block_sums(const float *x, int64_t in, float *xs)
{
    for (int64_t b = 0; b < in / 32; b++) {
        float s = 0.0f;
        for (int l = 0; l < 32; l++)
            s += x[32 * b + l];
        xs[b] = s;
    }
}

#if defined(__AVX512F__)
#define DIRECT_DOT 1
static inline __m512 widen_u8(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }
static inline __m512 widen_i8(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }
/* 16 float16 or bfloat16 values to float32: exact either way. */
static inline __m512 widen_half(int64_t type, const uint8_t *p)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)p);
    return type == F16 ? _mm512_cvtph_ps(v) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* sum_i q_i x_i over one block of 32 (lo: values 0..15, hi: 16..31), scaled, into acc. */
static inline __m512 block_fma(__m512 lo, __m512 hi, const float *x, float scale, __m512 acc)
{
    const __m512 t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x)));
    return _mm512_fmadd_ps(t, _mm512_set1_ps(scale), acc);
}

/* x . W[o] straight from the row's blocks; xs: x's block sums. */
float quant_row_dot(int64_t type, const uint8_t *w, int64_t in, const float *x, const float *xs)
{
    /* Two chains of accumulators: one would wait on the latency of each fused multiply-add. */
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    float offsets[2] = {0.0f, 0.0f};
    const int64_t bytes = quant_block_bytes(type);
    const __m128i low = _mm_set1_epi8(0x0F), one = _mm_set1_epi8(1);
    if (type == F32) {
        const float *wf = (const float *)w;
        for (int64_t b = 0; b < in / 32; b++) {
            const __m512 t = _mm512_mul_ps(_mm512_loadu_ps(wf + 32 * b), _mm512_loadu_ps(x + 32 * b));
            acc[b & 1] = _mm512_add_ps(acc[b & 1], _mm512_fmadd_ps(_mm512_loadu_ps(wf + 32 * b + 16),
                                                                   _mm512_loadu_ps(x + 32 * b + 16), t));
        }
    } else if (type == F16 || type == BF16) {
        for (int64_t b = 0; b < in / 32; b++) {
            const __m512 t = _mm512_mul_ps(widen_half(type, w + 64 * b), _mm512_loadu_ps(x + 32 * b));
            acc[b & 1] = _mm512_add_ps(acc[b & 1], _mm512_fmadd_ps(widen_half(type, w + 64 * b + 32),
                                                                   _mm512_loadu_ps(x + 32 * b + 16), t));
        }
    } else if (type == Q4_K || type == Q5_K) {
        for (int64_t s = 0; s < in / 256; s++) {
            const uint8_t *blk = w + s * bytes, *scales = blk + 4, *qh = blk + 16;
            const uint8_t *qs = blk + (type == Q5_K ? 48 : 16);
            const float d = f16_to_f32(rd16(blk)), dmin = f16_to_f32(rd16(blk + 2));
            for (int j = 0; j < 8; j++) { /* sub-block j: nibbles (j odd: high) of the 32 bytes of chunk j / 2 */
                uint8_t sc, m;
                scale_min_k4(j, scales, &sc, &m);
                __m128i v[2];
                for (int h = 0; h < 2; h++) {
                    const __m128i raw = _mm_loadu_si128((const __m128i *)(qs + 32 * (j / 2) + 16 * h));
                    v[h] = _mm_and_si128(j & 1 ? _mm_srli_epi16(raw, 4) : raw, low);
                    if (type == Q5_K) {
                        const __m128i bits = _mm_loadu_si128((const __m128i *)(qh + 16 * h));
                        v[h] = _mm_or_si128(v[h], _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(bits, j), one), 4));
                    }
                }
                const int64_t b = 8 * s + j;
                acc[j & 1] = block_fma(widen_u8(v[0]), widen_u8(v[1]), x + 32 * b, d * (float)sc, acc[j & 1]);
                offsets[j & 1] -= dmin * (float)m * xs[b];
            }
        }
    } else {
        for (int64_t b = 0; b < in / 32; b++) {
            const uint8_t *blk = w + b * bytes;
            const float d = f16_to_f32(rd16(blk));
            __m512 lo, hi;
            if (type == Q8_0) {
                lo = widen_i8(_mm_loadu_si128((const __m128i *)(blk + 2)));
                hi = widen_i8(_mm_loadu_si128((const __m128i *)(blk + 18)));
            } else {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (type == Q4_1 ? 4 : 2)));
                lo = widen_u8(_mm_and_si128(raw, low));
                hi = widen_u8(_mm_and_si128(_mm_srli_epi16(raw, 4), low));
                offsets[b & 1] += (type == Q4_1 ? f16_to_f32(rd16(blk + 2)) : -8.0f * d) * xs[b];
            }
            acc[b & 1] = block_fma(lo, hi, x + 32 * b, d, acc[b & 1]);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) + offsets[0] + offsets[1];
}
#else
float quant_row_dot(int64_t type, const uint8_t *w, int64_t in, const float *x, const float *xs)
{
    (void)xs;
    float buf[in], s = 0.0f;
    dequant_row(type, w, in, buf);
    for (int64_t i = 0; i < in; i++)
        s += buf[i] * x[i];
    return s;
}
#endif

#if defined(__AVX512F__)
/* out[k] = the sum of acc[k]'s 16 lanes, k < 16: a transposing tree (45 shuffles and adds for all 16
 * sums, against ~8 dependent ones per sum with _mm512_reduce_add_ps: a third of a 4 x 4 tile's time
 * over 576 inputs went to its 16 reductions). */
static void reduce16(const __m512 acc[16], float *out)
{
    __m512 b[8], c[4];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: (x0+x2, y0+y2, x1+x3, y1+y3), x, y = acc[2i], acc[2i+1] */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                             _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per 128-bit lane: that lane's sums of acc[4i..4i+3] */
        const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
        const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]));
        c[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
    }
    /* Across the four 128-bit lanes: lane 4i + j of the result is the sum of acc[4i + j]. */
    const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD)));
}
#endif

/* out[r * 4 + t] = w[r] . x[t] for weight rows w[0..nw) and activation rows x[0..nx) of `in` floats
 * (nw, nx <= 4): a 4 x 4 tile of accumulators, so each loaded vector serves four products. */
static void dot_tile(const float *w, int64_t nw, const float *x, int64_t nx, int64_t in, float *out)
{
    int64_t i = 0;
    float s[16] = {0};
#if defined(__AVX512F__)
    __m512 acc[16];
    for (int k = 0; k < 16; k++)
        acc[k] = _mm512_setzero_ps();
    if (nw == 4 && nx == 4) { /* the common case, unrolled so the accumulators stay in registers */
        for (; i + 16 <= in; i += 16) {
            const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + in + i);
            const __m512 x2 = _mm512_loadu_ps(x + 2 * in + i), x3 = _mm512_loadu_ps(x + 3 * in + i);
            for (int r = 0; r < 4; r++) {
                const __m512 wv = _mm512_loadu_ps(w + r * in + i);
                acc[4 * r] = _mm512_fmadd_ps(wv, x0, acc[4 * r]);
                acc[4 * r + 1] = _mm512_fmadd_ps(wv, x1, acc[4 * r + 1]);
                acc[4 * r + 2] = _mm512_fmadd_ps(wv, x2, acc[4 * r + 2]);
                acc[4 * r + 3] = _mm512_fmadd_ps(wv, x3, acc[4 * r + 3]);
            }
        }
    } else {
        for (; i + 16 <= in; i += 16)
            for (int64_t r = 0; r < nw; r++) {
                const __m512 wv = _mm512_loadu_ps(w + r * in + i);
                for (int64_t t = 0; t < nx; t++)
                    acc[4 * r + t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + t * in + i), acc[4 * r + t]);
            }
    }
    reduce16(acc, s);
#endif
    for (; i < in; i++)
        for (int64_t r = 0; r < nw; r++)
            for (int64_t t = 0; t < nx; t++)
                s[4 * r + t] += w[r * in + i] * x[t * in + i];
    for (int k = 0; k < 16; k++)
        out[k] = s[k];
}

/* A batch's product reads each weight row from memory once and then computes with it for a while: with
 * no overlap the two take turns (16 rows of SmolLM2's F16 layers, 30 layers' products: 14 ms a step
 * against 7 ms with the weights in cache). Asking for the rows PREFETCH_GROUPS groups of four ahead, a
 * few cache lines at each step of the current group's tiles, lets the reads run under the arithmetic
 * (10.5 ms); the hardware prefetchers stop at each 4 KiB page, and a burst of a whole group's lines at
 * once fills the queue of outstanding misses and gains little. */
#ifndef PREFETCH_GROUPS
#define PREFETCH_GROUPS 2
#endif

/* The rows of the group PREFETCH_GROUPS groups after the one starting at row o (none past the last row),
 * asked for into L2 over `steps` calls of prefetch_next, a share each. */
struct ahead {
    const uint8_t *p;
    int64_t at, step, end;
};

static inline struct ahead ahead_of(const uint8_t *w, int64_t o, int64_t out, int64_t row_bytes, int64_t steps)
{
    const int64_t first = o + PREFETCH_GROUPS * 4, rows = out - first;
    struct ahead a = {w + (rows > 0 ? first : 0) * row_bytes, 0, 0, (rows <= 0 ? 0 : rows < 4 ? rows : 4) * row_bytes};
    a.step = 64 * ((a.end / 64 + steps - 1) / steps);
    return a;
}

static inline void prefetch_next(struct ahead *a)
{
    for (const int64_t stop = a->at + a->step < a->end ? a->at + a->step : a->end; a->at < stop; a->at += 64)
        __builtin_prefetch(a->p + a->at, 0, 2);
}

/* y[t, o] (row stride ldy) = x[t] . W[o] for rows t < rows; W [out, in] in `type` blocks, x [rows, in].
 * Returns 0, or -1 for a type or width it cannot take (in must be a whole number of blocks), -2 when out of memory. */
int64_t quant_matmul_f32(int64_t type, const uint8_t *w, int64_t out, int64_t in, const float *x, int64_t rows,
                         float *y, int64_t ldy, int64_t threads)
{
    const int64_t bytes = quant_block_bytes(type), per_block = quant_block_size(type);
    if (bytes == 0 || in % per_block || in <= 0)
        return -1;
    const int64_t row_bytes = in / per_block * bytes;
#ifdef DIRECT_DOT
    if (rows <= 2) {
        float *xs = malloc((size_t)(rows * (in / 32)) * sizeof(float));
        if (!xs)
            return -2;
        for (int64_t t = 0; t < rows; t++)
            block_sums(x + t * in, in, xs + t * (in / 32));
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t o = 0; o < out; o++)
            for (int64_t t = 0; t < rows; t++)
                y[t * ldy + o] = quant_row_dot(type, w + o * row_bytes, in, x + t * in, xs + t * (in / 32));
        free(xs);
        return 0;
    }
#endif
    /* Every thread's buffer before the region: a thread short of memory cannot skip the omp for. */
    const int64_t stride = (in + 15) / 16 * 16;
    float *bufs = aligned_alloc(64, (size_t)(threads * 4 * stride) * sizeof(float));
    if (!bufs)
        return -2;
#pragma omp parallel num_threads(threads)
    {
        float *buf = bufs + omp_get_thread_num() * 4 * stride;
        /* Four weight rows at a time, each dequantized once into an L1-sized buffer. Handed out in
         * chunks as threads ask: in a server another thread (the event loop) takes a core now and
         * then, and with fixed shares the whole product would wait for the thread it delayed. */
#pragma omp for schedule(dynamic, 8)
        for (int64_t o = 0; o < out; o += 4) {
            const int64_t nw = out - o < 4 ? out - o : 4;
            const float *rows4 = (const float *)(w + o * row_bytes); /* float32 weights: used in place */
            if (type != F32) {
                for (int64_t r = 0; r < nw; r++)
                    dequant_row(type, w + (o + r) * row_bytes, in, buf + r * stride);
                rows4 = buf;
            }
            struct ahead ahead = ahead_of(w, o, out, row_bytes, (rows + 3) / 4); /* a share before each tile */
            float tile[16];
            for (int64_t t = 0; t < rows; t += 4) {
                const int64_t nx = rows - t < 4 ? rows - t : 4;
                prefetch_next(&ahead);
                if (stride == in) { /* (always so for float32 weights: whole blocks of 32) */
                    dot_tile(rows4, nw, x + t * in, nx, in, tile);
                } else {
                    for (int64_t r = 0; r < nw; r++)
                        dot_tile(buf + r * stride, 1, x + t * in, nx, in, tile + 4 * r);
                }
                for (int64_t r = 0; r < nw; r++)
                    for (int64_t k = 0; k < nx; k++)
                        y[(t + k) * ldy + o + r] = tile[4 * r + k];
            }
        }
    }
    free(bufs);
    return 0;
}

/* The same product with bfloat16 operands (float32 sums), where the CPU has AVX512-BF16: each weight row
 * dequantized as above, then rounded to bfloat16, and each activation row rounded once per call; one
 * vdpbf16ps does 32 multiply-adds where a float32 fused multiply-add does 16, so a batch's products take
 * about half the time. The rounding (8 significant bits) is the precision bfloat16 models are trained and
 * served in; products of one or two rows keep the float32 path (quant_matmul_f32). Returns -1 where this
 * build has no AVX512-BF16 (the caller then uses quant_matmul_f32), else as quant_matmul_f32. */
#if defined(__AVX512BF16__)
int64_t bf16_scratch_bytes(int64_t in) { return in * (int64_t)sizeof(float) + 4 * (in / 32) * 64; }

void bf16_round_rows(const float *x, int64_t rows, int64_t in, void *out)
{
    __m512bh *xb = out;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows * (in / 32); i++) /* 32 floats -> 32 bfloat16, round to nearest even */
        xb[i] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 32 * i + 16), _mm512_loadu_ps(x + 32 * i));
}

void bf16_product(int64_t type, const uint8_t *w, int64_t out, int64_t in, const void *x_rows, int64_t rows,
                  float *y, int64_t ldy, void *scratch)
{
    const int64_t row_bytes = in / quant_block_size(type) * quant_block_bytes(type);
    const int64_t n = in / 32; /* vectors of 32 bfloat16 per row */
    const int64_t per_group = (rows + 3) / 4 * n; /* steps of the tiles of one group of four weight rows */
    const __m512bh *xb = x_rows;
    float *buf = scratch; /* a row dequantized to float32, then the group's four rows in bfloat16 */
    __m512bh *wb = (__m512bh *)((uint8_t *)scratch + in * sizeof(float));
#pragma omp for schedule(dynamic, 8) /* as quant_matmul_f32's */
    for (int64_t o = 0; o < out; o += 4) {
        const int64_t nw = out - o < 4 ? out - o : 4;
        const __m512bh *wr[4]; /* the group's rows in bfloat16 */
        struct ahead ahead = ahead_of(w, o, out, row_bytes, per_group); /* over the steps of the tiles below */
        for (int64_t r = 0; r < 4; r++) {
            const uint8_t *row = w + (o + r) * row_bytes;
            wr[r] = wb + r * n;
            if (r >= nw) { /* a last partial group: zero rows, products discarded */
                memset(wb + r * n, 0, (size_t)n * 64);
            } else if (type == BF16) { /* already bfloat16, in this order */
                wr[r] = (const __m512bh *)row;
            } else if (type == F32) {
                const float *rf = (const float *)row;
                for (int64_t i = 0; i < n; i++)
                    wb[r * n + i] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(rf + 32 * i + 16), _mm512_loadu_ps(rf + 32 * i));
            } else if (type == F16) { /* exact to float32, then rounded once */
                for (int64_t i = 0; i < n; i++)
                    wb[r * n + i] = _mm512_cvtne2ps_pbh(widen_half(F16, row + 64 * i + 32), widen_half(F16, row + 64 * i));
            } else {
                dequant_row(type, row, in, buf);
                for (int64_t i = 0; i < n; i++)
                    wb[r * n + i] = _mm512_cvtne2ps_pbh(_mm512_load_ps(buf + 32 * i + 16), _mm512_load_ps(buf + 32 * i));
            }
        }
        for (int64_t t = 0; t < rows; t += 4) {
            const int64_t nx = rows - t < 4 ? rows - t : 4;
            const __m512bh *x0 = xb + t * n, *x1 = xb + (t + (nx > 1)) * n;
            const __m512bh *x2 = xb + (t + (nx > 2) * 2) * n, *x3 = xb + (t + (nx > 3) * 3) * n;
            __m512 acc[16];
            for (int k = 0; k < 16; k++)
                acc[k] = _mm512_setzero_ps();
            for (int64_t i = 0; i < n; i++) {
                prefetch_next(&ahead);
                const __m512bh a0 = x0[i], a1 = x1[i], a2 = x2[i], a3 = x3[i];
                for (int r = 0; r < 4; r++) {
                    const __m512bh wv = (__m512bh)_mm512_loadu_si512(wr[r] + i);
                    acc[4 * r] = _mm512_dpbf16_ps(acc[4 * r], wv, a0);
                    acc[4 * r + 1] = _mm512_dpbf16_ps(acc[4 * r + 1], wv, a1);
                    acc[4 * r + 2] = _mm512_dpbf16_ps(acc[4 * r + 2], wv, a2);
                    acc[4 * r + 3] = _mm512_dpbf16_ps(acc[4 * r + 3], wv, a3);
                }
            }
            float tile[16];
            reduce16(acc, tile);
            for (int64_t r = 0; r < nw; r++)
                for (int64_t k = 0; k < nx; k++)
                    y[(t + k) * ldy + o + r] = tile[4 * r + k];
        }
    }
}
#endif

int64_t quant_matmul_bf16(int64_t type, const uint8_t *w, int64_t out, int64_t in, const float *x, int64_t rows,
                          float *y, int64_t ldy, int64_t threads)
{
#if defined(__AVX512BF16__)
    const int64_t bytes = quant_block_bytes(type), per_block = quant_block_size(type);
    if (bytes == 0 || in % per_block || in <= 0 || in % 32)
        return -1;
    /* Every thread's scratch before the region: a thread short of memory cannot skip the omp for. */
    const int64_t scratch_bytes = (bf16_scratch_bytes(in) + 63) / 64 * 64;
    void *xb = aligned_alloc(64, (size_t)(rows * (in / 32)) * 64);
    uint8_t *scratch = aligned_alloc(64, (size_t)(threads * scratch_bytes));
    if (!xb || !scratch) {
        free(xb);
        free(scratch);
        return -2;
    }
    bf16_round_rows(x, rows, in, xb); /* outside a region: this thread does it all */
#pragma omp parallel num_threads(threads)
    bf16_product(type, w, out, in, xb, rows, y, ldy, scratch + omp_get_thread_num() * scratch_bytes);
    free(xb);
    free(scratch);
    return 0;
#else
    (void)type, (void)w, (void)out, (void)in, (void)x, (void)rows, (void)y, (void)ldy, (void)threads;
    return -1;
#endif
}

/* GGML's reference dequantization of `n` rows, picked by ids (or rows 0..n-1 when ids is NULL), to float32. */
int64_t dequantize_rows_f32(int64_t type, const uint8_t *w, int64_t in, const int64_t *ids, int64_t n, float *y)
{
    const int64_t bytes = quant_block_bytes(type), per_block = quant_block_size(type);
    if (bytes == 0 || in % per_block || in <= 0)
        return -1;
    const int64_t row_bytes = in / per_block * bytes;
    for (int64_t r = 0; r < n; r++)
        dequant_row(type, w + (ids ? ids[r] : r) * row_bytes, in, y + r * in);
    return 0;
}

static void dequant_row(int64_t type, const uint8_t *row, int64_t in, float *out)
{
    const int64_t bytes = quant_block_bytes(type);
    if (type == F32) {
        memcpy(out, row, (size_t)in * sizeof(float));
        return;
    }
    if (type == F16 || type == BF16) { /* widened exactly: a copy in float32 */
#if defined(__AVX512F__)
        for (int64_t i = 0; i < in; i += 16)
            _mm512_storeu_ps(out + i, widen_half(type, row + 2 * i));
        return;
#endif
        for (int64_t i = 0; i < in; i++) {
            const uint16_t h = rd16(row + 2 * i);
            if (type == F16) {
                out[i] = f16_to_f32(h);
            } else {
                const uint32_t bits = (uint32_t)h << 16;
                memcpy(out + i, &bits, 4);
            }
        }
        return;
    }
#if defined(__AVX512F__)
    /* The same arithmetic, 16 values at a time: a multiply, then an add (never fused), as the reference. */
    if (type == Q8_0 || type == Q4_0 || type == Q4_1) {
        const __m128i low = _mm_set1_epi8(0x0F);
        for (int64_t b = 0; b < in / 32; b++) {
            const uint8_t *blk = row + b * bytes;
            const __m512 d = _mm512_set1_ps(f16_to_f32(rd16(blk)));
            __m512 lo, hi;
            if (type == Q8_0) {
                lo = widen_i8(_mm_loadu_si128((const __m128i *)(blk + 2)));
                hi = widen_i8(_mm_loadu_si128((const __m128i *)(blk + 18)));
                lo = _mm512_mul_ps(lo, d);
                hi = _mm512_mul_ps(hi, d);
            } else if (type == Q4_0) {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 2)), eight = _mm_set1_epi8(8);
                lo = _mm512_mul_ps(d, widen_i8(_mm_sub_epi8(_mm_and_si128(raw, low), eight)));
                hi = _mm512_mul_ps(d, widen_i8(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), low), eight)));
            } else {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 4));
                const __m512 m = _mm512_set1_ps(f16_to_f32(rd16(blk + 2)));
                lo = _mm512_add_ps(_mm512_mul_ps(d, widen_u8(_mm_and_si128(raw, low))), m);
                hi = _mm512_add_ps(_mm512_mul_ps(d, widen_u8(_mm_and_si128(_mm_srli_epi16(raw, 4), low))), m);
            }
            _mm512_storeu_ps(out + 32 * b, lo);
            _mm512_storeu_ps(out + 32 * b + 16, hi);
        }
        return;
    }
#endif
    if (type == Q4_K || type == Q5_K) {
        for (int64_t s = 0; s < in / 256; s++) {
            const uint8_t *blk = row + s * bytes, *scales = blk + 4;
            const uint8_t *qh = type == Q5_K ? blk + 16 : NULL, *qs = blk + (type == Q5_K ? 48 : 16);
            const float d = f16_to_f32(rd16(blk)), dmin = f16_to_f32(rd16(blk + 2));
            for (int i = 0; i < 4; i++) {
                uint8_t sc, m;
                scale_min_k4(2 * i, scales, &sc, &m);
                const float d1 = d * (float)sc, m1 = dmin * (float)m;
                scale_min_k4(2 * i + 1, scales, &sc, &m);
                const float d2 = d * (float)sc, m2 = dmin * (float)m;
                for (int l = 0; l < 32; l++) {
                    int lo = qs[32 * i + l] & 0xF, hi = qs[32 * i + l] >> 4;
                    if (qh) {
                        lo += ((qh[l] >> (2 * i)) & 1) << 4;
                        hi += ((qh[l] >> (2 * i + 1)) & 1) << 4;
                    }
                    out[s * 256 + 64 * i + l] = d1 * (float)lo - m1;
                    out[s * 256 + 64 * i + 32 + l] = d2 * (float)hi - m2;
                }
            }
        }
        return;
    }
    for (int64_t b = 0; b < in / 32; b++) {
        const uint8_t *blk = row + b * bytes;
        const float d = f16_to_f32(rd16(blk));
        float *o = out + 32 * b;
        if (type == Q8_0) {
            for (int l = 0; l < 32; l++)
                o[l] = d * (float)(int8_t)blk[2 + l];
        } else if (type == Q4_0) {
            for (int l = 0; l < 16; l++) {
                o[l] = d * (float)((blk[2 + l] & 0xF) - 8);
                o[l + 16] = d * (float)((blk[2 + l] >> 4) - 8);
            }
        } else { /* Q4_1 */
            const float m = f16_to_f32(rd16(blk + 2));
            for (int l = 0; l < 16; l++) {
                o[l] = d * (float)(blk[4 + l] & 0xF) + m;
                o[l + 16] = d * (float)(blk[4 + l] >> 4) + m;
            }
        }
    }
}
