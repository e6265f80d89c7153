/* Decode attention read straight from the paged KV cache: float32, on the CPU.
 *
 * Gathering each decode's blocks into one tensor and calling SDPA on it reads every K/V twice (the
 * copy, then attention) and does GQA's small matrix products one by one. Here each block is read once,
 * through the block table, with an online softmax, and the query heads that share a KV head are done
 * together. Work is split over sequences (or, with fewer sequences than twice the threads, over
 * (sequence, run of KV heads) pairs) with OpenMP: the same libgomp and thread count as PyTorch's.
 *
 * Layouts, all contiguous: q, out [n, heads, dim]; cache [2, num_blocks, block_size, kv_heads, dim];
 * tables [n, table_width] of block ids (entries past a sequence's last block are never read);
 * lens [n], tokens of context, >= 1. heads is a multiple of kv_heads.
 */
#include <stdint.h>

#include "fast_exp.h"

/* Blocks read ahead. Within this host's noise of none (2026-12-03); kept for CPUs whose hardware
 * prefetcher does not follow a block table. */
#define PREFETCH_BLOCKS 2

typedef float vec16 __attribute__((vector_size(64), aligned(4)));
#define V16(p) (*(const vec16 *)(p))

static inline float hsum(vec16 v)
{
    float r = 0.0f;
    for (int j = 0; j < 16; j++)
        r += v[j];
    return r;
}

static inline float dot(const float *a, const float *b, int64_t dim)
{
    if (dim % 16 == 0) {
        vec16 s0 = {0};
        for (int64_t d = 0; d < dim; d += 16)
            s0 += V16(a + d) * V16(b + d);
        return hsum(s0);
    }
    float r = 0.0f;
    for (int64_t d = 0; d < dim; d++)
        r += a[d] * b[d];
    return r;
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define FAST_DIM(dim) ((dim) == 64 || (dim) == 128)

/* out[k] = the sum of the 16 lanes of p[k], k < 16, by a transposing tree (as csrc/quant_matmul.c). */
static inline void reduce16(const __m512 p[16], float *out)
{
    __m512 b[8], c[4];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * i], p[2 * i + 1]), _mm512_unpackhi_ps(p[2 * i], p[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[2 * i]), _mm512_castps_pd(b[2 * i + 1]))));
    const __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    const __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88), _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, 0x88), _mm512_shuffle_f32x4(e0, e1, 0xDD)));
}

/* s[t] = q . k_t * scale for t < count <= 16 (k_t = k + t * row): 16 dot products, then one tree for
 * all their sums (a horizontal sum per product cost more than the product). */
static inline void scores16(const float *q, const float *k, int64_t count, int64_t row, int dim, float scale, float *s)
{
    __m512 p[16];
    for (int t = 0; t < 16; t++) {
        if (t >= count) {
            p[t] = _mm512_setzero_ps();
            continue;
        }
        const float *kt = k + t * row;
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(kt));
        for (int c = 16; c < dim; c += 16)
            a = _mm512_fmadd_ps(_mm512_loadu_ps(q + c), _mm512_loadu_ps(kt + c), a);
        p[t] = a;
    }
    float sums[16]; /* s may have room for fewer than 16 (a block of 8) */
    reduce16(p, sums);
    for (int t = 0; t < count; t++)
        s[t] = sums[t] * scale;
}

/* acc[0..dim) += sum_t p[t] v_t for t < count: tokens outer, so the dim / 16 accumulators are independent. */
static inline void weighted_sum(const float *p, const float *v, int64_t count, int64_t row, int dim, float *acc)
{
    __m512 a[8];
    for (int c = 0; c < dim / 16; c++)
        a[c] = _mm512_loadu_ps(acc + 16 * c);
    for (int64_t t = 0; t < count; t++) {
        const __m512 pt = _mm512_set1_ps(p[t]);
        for (int c = 0; c < dim / 16; c++)
            a[c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v + t * row + 16 * c), a[c]);
    }
    for (int c = 0; c < dim / 16; c++)
        _mm512_storeu_ps(acc + 16 * c, a[c]);
}
#else
#define FAST_DIM(dim) 0
#endif

/* One sequence, KV heads h0..h1-1; q and out point at the first of their query heads. */
static void attend(const float *q, const float *k_cache, const float *v_cache, const int64_t *table,
                   int64_t len, float *out, int64_t h0, int64_t h1, int64_t group, int64_t dim,
                   int64_t row, int64_t block_size, float scale)
{
    const int64_t rows = (h1 - h0) * group; /* query heads */
    float acc[rows * dim], m[rows], l[rows], s[rows * block_size];
    for (int64_t r = 0; r < rows; r++) {
        m[r] = -1e30f; /* not -inf: the exp below never sees an infinity */
        l[r] = 0.0f;
    }
    for (int64_t d = 0; d < rows * dim; d++)
        acc[d] = 0.0f;
    const int64_t span = (h1 - h0) * dim; /* floats of a token's row that this call reads */

    for (int64_t start = 0; start < len; start += block_size) {
        const int64_t b = start / block_size;
        for (int64_t ahead = (b == 0 ? 1 : PREFETCH_BLOCKS); ahead <= PREFETCH_BLOCKS; ahead++) {
            if (start + ahead * block_size >= len)
                break;
            const int64_t offset = (table[b + ahead] * block_size * row) + h0 * dim;
            for (int64_t t = 0; t < block_size; t++)
                for (int64_t d = 0; d < span; d += 16) {
                    __builtin_prefetch(k_cache + offset + t * row + d);
                    __builtin_prefetch(v_cache + offset + t * row + d);
                }
        }
        const int64_t count = len - start < block_size ? len - start : block_size;
        for (int64_t h = h0; h < h1; h++) {
            const int64_t offset = table[b] * block_size * row + h * dim;
            const int64_t r0 = (h - h0) * group, r1 = r0 + group;
#if defined(__AVX512F__)
            if (FAST_DIM(dim)) {
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t t0 = 0; t0 < count; t0 += 16) /* dim a constant in each call: unrolled */
                        if (dim == 64)
                            scores16(q + r * dim, k_cache + offset + t0 * row, count - t0 < 16 ? count - t0 : 16, row,
                                     64, scale, s + r * block_size + t0);
                        else
                            scores16(q + r * dim, k_cache + offset + t0 * row, count - t0 < 16 ? count - t0 : 16, row,
                                     128, scale, s + r * block_size + t0);
            } else
#endif
            for (int64_t t = 0; t < count; t++)
                for (int64_t r = r0; r < r1; r++)
                    s[r * block_size + t] = dot(q + r * dim, k_cache + offset + t * row, dim) * scale;
            for (int64_t r = r0; r < r1; r++) { /* online softmax: rescale what came before */
                float *sr = s + r * block_size, mx = m[r], sum = 0.0f;
                for (int64_t t = 0; t < count; t++)
                    mx = sr[t] > mx ? sr[t] : mx;
                const float rescale = exp_nonpositive(m[r] - mx); /* 0 on the first block */
                for (int64_t t = 0; t < count; t++) {
                    sr[t] = exp_nonpositive(sr[t] - mx);
                    sum += sr[t];
                }
                l[r] = l[r] * rescale + sum;
                m[r] = mx;
                for (int64_t d = 0; d < dim; d++)
                    acc[r * dim + d] *= rescale;
            }
            const float *v = v_cache + offset;
            for (int64_t r = r0; r < r1; r++) {
                const float *p = s + r * block_size;
                float *a = acc + r * dim;
#if defined(__AVX512F__)
                if (FAST_DIM(dim)) {
                    if (dim == 64)
                        weighted_sum(p, v, count, row, 64, a);
                    else
                        weighted_sum(p, v, count, row, 128, a);
                    continue;
                }
#endif
                if (dim % 16 == 0) {
                    for (int64_t d = 0; d < dim; d += 16) { /* one register accumulates over the block */
                        vec16 sum = V16(a + d);
                        for (int64_t t = 0; t < count; t++)
                            sum += p[t] * V16(v + t * row + d);
                        *(vec16 *)(a + d) = sum;
                    }
                } else {
                    for (int64_t t = 0; t < count; t++)
                        for (int64_t d = 0; d < dim; d++)
                            a[d] += p[t] * v[t * row + d];
                }
            }
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t d = 0; d < dim; d++)
            out[r * dim + d] = acc[r * dim + d] / l[r];
}

/* The work of paged_decode_attention_f32 for the `threads` threads of an enclosing OpenMP region (an
 * orphaned omp for: every thread calls it; outside a region, the caller does it all). */
void paged_decode_attention_items(const float *q, const float *cache, const int64_t *tables,
                                  int64_t table_width, const int64_t *lens, float *out, int64_t n,
                                  int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size,
                                  int64_t num_blocks, float scale, int64_t threads)
{
    const int64_t group = heads / kv_heads, row = kv_heads * dim;
    const float *v_cache = cache + num_blocks * block_size * row;
    /* Whole token rows per sequence read memory in longer runs; split heads only to use every thread. */
    /* Parts of a sequence's KV heads: whole rows where there are enough sequences; else runs of heads,
     * two per thread (one head apiece read 13% slower for a lone 12-head decode, 2026-12-03). */
    int64_t parts = n >= 2 * threads ? 1 : 2 * threads;
    parts = parts > kv_heads ? kv_heads : parts;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < n * parts; item++) {
        const int64_t i = item / parts, part = item % parts;
        const int64_t h0 = part * kv_heads / parts, h1 = (part + 1) * kv_heads / parts;
        attend(q + (i * heads + h0 * group) * dim, cache, v_cache, tables + i * table_width, lens[i],
               out + (i * heads + h0 * group) * dim, h0, h1, group, dim, row, block_size, scale);
    }
}

void paged_decode_attention_f32(const float *q, const float *cache, const int64_t *tables,
                                int64_t table_width, const int64_t *lens, float *out, int64_t n,
                                int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size,
                                int64_t num_blocks, float scale, int64_t threads)
{
#pragma omp parallel num_threads(threads)
    paged_decode_attention_items(q, cache, tables, table_width, lens, out, n, heads, kv_heads, dim, block_size,
                                 num_blocks, scale, threads);
}
