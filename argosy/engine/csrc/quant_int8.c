/* Products with int8 activations, as llama.cpp's CPU backend computes them (an option: ARGOSY_INT8_ACTIVATIONS).
 *
 * Each activation row is quantized to GGML's Q8_0 blocks (for Q8_0 and Q4_0 weights) or Q8_1 blocks (for
 * Q4_1), bit for bit as ggml's x86 quantize_row_q8_0/q8_1: per block of 32, amax = max |x|, d = amax / 127,
 * q = round-half-to-even(x * (127 / amax)), d stored as float16; Q8_1 also stores s = float16(d * sum q).
 * A product is then, per block, an integer dot product of the weight's and the activation's integers
 * scaled by d_w d_x, plus m_w s_x for Q4_1 (its offset), summed in float32 lanes as ggml does.
 * Where the CPU has AVX2, 32 byte products per instruction (AVX512-VNNI: one vpdpbusd); else plain C.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#pragma GCC optimize("fp-contract=off")

#include "quant_blocks.h"

static inline float half_to_float(uint16_t h)
{
#if defined(__F16C__)
    return _cvtsh_ss(h); /* exact, as the conversion below */
#endif
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float f;
    if (exp == 0) { /* zero or subnormal: man * 2^-24, exact */
        f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    const uint32_t bits = sign | (exp == 0x1f ? 0x7f800000 | (man << 13) : ((exp + 112) << 23) | (man << 13));
    memcpy(&f, &bits, 4);
    return f;
}

/* float32 -> float16, round to nearest even (as F16C's vcvtps2ph with rounding mode 0). */
static uint16_t float_to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (x >> 16) & 0x8000;
    x &= 0x7fffffff;
    if (x >= 0x7f800000) /* inf or nan */
        return sign | 0x7c00 | (x > 0x7f800000 ? 0x200 : 0);
    if (x >= 0x477ff000) /* rounds past 65504 */
        return sign | 0x7c00;
    if (x < 0x38800000) { /* below 2^-14: a subnormal half, man = round(|f| * 2^24) */
        const float m = rintf(ldexpf(f < 0 ? -f : f, 24));
        return sign | (uint16_t)m;
    }
    const uint32_t mant = x & 0x1fff, base = (x - 0x38000000) >> 13; /* exponent rebiased, 10 bits kept */
    const uint32_t up = mant > 0x1000 || (mant == 0x1000 && (base & 1));
    return sign | (uint16_t)(base + up);
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

int64_t int8_activation_type(int64_t weight_type)
{
    return weight_type == Q8_0 || weight_type == Q4_0 ? Q8_0 : weight_type == Q4_1 ? Q8_1 : 0;
}

int64_t int8_block_bytes(int64_t act_type) { return act_type == Q8_1 ? 36 : 34; }

/* rows x [in] float32 -> GGML Q8_0 (34-byte) or Q8_1 (36-byte) blocks, rows one after the other. */
int64_t quantize_rows_q8(int64_t act_type, const float *x, int64_t rows, int64_t in, uint8_t *out)
{
    if ((act_type != Q8_0 && act_type != Q8_1) || in % 32)
        return -1;
    const int64_t bytes = int8_block_bytes(act_type), head = act_type == Q8_1 ? 4 : 2;
    for (int64_t b = 0; b < rows * (in / 32); b++) {
        const float *v = x + 32 * b;
        uint8_t *blk = out + b * bytes;
        float amax = 0.0f;
        for (int l = 0; l < 32; l++)
            amax = fmaxf(amax, fabsf(v[l]));
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int l = 0; l < 32; l++) {
            const int q = (int)rintf(v[l] * id); /* the default rounding mode: half to even */
            blk[head + l] = (uint8_t)(int8_t)q;
            sum += q;
        }
        put16(blk, float_to_half(d));
        if (act_type == Q8_1)
            put16(blk + 2, float_to_half(d * (float)sum));
    }
    return 0;
}

#if defined(__AVX2__)
/* sum of u8 a times i8 b over each group of four bytes, as eight int32 lanes. */
static inline __m256i dot_u8_i8(__m256i a, __m256i b)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

static inline __m256i nibbles32(const uint8_t *qs) /* 16 bytes -> their 16 low nibbles, then 16 high */
{
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
#endif

/* One weight row of `in` values in `type` blocks times one activation row in its int8 blocks. */
float int8_row_dot(int64_t type, const uint8_t *w, int64_t in, const uint8_t *xq)
{
    const int64_t wb = quant_block_bytes(type), xb = int8_block_bytes(int8_activation_type(type));
    const int64_t nb = in / 32, woff = type == Q4_1 ? 4 : 2, xoff = type == Q4_1 ? 4 : 2;
    float offsets = 0.0f;
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wk = w + b * wb, *xk = xq + b * xb;
        const __m256i x8 = _mm256_loadu_si256((const __m256i *)(xk + xoff));
        __m256i isum;
        if (type == Q4_1) {
            isum = dot_u8_i8(nibbles32(wk + woff), x8);
            offsets += half_to_float(get16(wk + 2)) * half_to_float(get16(xk + 2));
        } else { /* signed weights: |w| times x with w's sign */
            const __m256i w8 = type == Q4_0 ? _mm256_sub_epi8(nibbles32(wk + woff), _mm256_set1_epi8(8))
                                            : _mm256_loadu_si256((const __m256i *)(wk + woff));
            isum = dot_u8_i8(_mm256_sign_epi8(w8, w8), _mm256_sign_epi8(x8, w8));
        }
        const float scale = half_to_float(get16(wk)) * half_to_float(get16(xk));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(isum), acc);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    return _mm_cvtss_f32(s4) + offsets;
#else
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wk = w + b * wb, *xk = xq + b * xb;
        const int8_t *x8 = (const int8_t *)(xk + xoff);
        int isum = 0;
        for (int l = 0; l < 32; l++) {
            int q;
            if (type == Q8_0)
                q = (int8_t)wk[woff + l];
            else
                q = (l < 16 ? wk[woff + l] & 0xF : wk[woff + l - 16] >> 4) - (type == Q4_0 ? 8 : 0);
            isum += q * x8[l];
        }
        if (type == Q4_1)
            offsets += half_to_float(get16(wk + 2)) * half_to_float(get16(xk + 2));
        sum += half_to_float(get16(wk)) * half_to_float(get16(xk)) * (float)isum;
    }
    return sum + offsets;
#endif
}

/* y[t, o] (row stride ldy) = x[t] . W[o] with x quantized to int8 blocks first. 0, -1 (a type without
 * an int8 product, or a width that is not whole blocks), -2 (out of memory). */
int64_t quant_matmul_int8(int64_t type, const uint8_t *w, int64_t out, int64_t in, const float *x, int64_t rows,
                          float *y, int64_t ldy, int64_t threads)
{
    const int64_t act = int8_activation_type(type);
    if (act == 0 || in % 32 || in <= 0)
        return -1;
    const int64_t xrow = in / 32 * int8_block_bytes(act), row_bytes = in / 32 * quant_block_bytes(type);
    uint8_t *xq = malloc((size_t)(rows * xrow));
    if (!xq)
        return -2;
    quantize_rows_q8(act, x, rows, in, xq);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < out; o++)
        for (int64_t t = 0; t < rows; t++) /* a weight row (a few hundred bytes) stays in L1 across t */
            y[t * ldy + o] = int8_row_dot(type, w + o * row_bytes, in, xq + t * xrow);
    free(xq);
    return 0;
}
