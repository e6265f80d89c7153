/* y = W x for one row x, float32, on the CPU: the products of a step that decodes a single sequence.
 *
 * Such a step reads every weight once, so it is bound by memory bandwidth. Each thread takes one
 * contiguous range of rows (one run of memory) and streams it a row at a time: on the 2-core test
 * machine that read 24-41 GB/s, where four rows at a time (four streams) read 20-30 GB/s and oneDNN's
 * matrix-vector product 14-23 GB/s (/tmp-style microbenchmark, 2026-12-03).
 * Layouts, contiguous: w [out, in], x [in], y [out].
 */
#include <stdint.h>

typedef float vec16 __attribute__((vector_size(64), aligned(4)));
#define V16(p) (*(const vec16 *)(p))

void matvec_f32(const float *w, const float *x, float *y, int64_t out, int64_t in, int64_t threads)
{
    const int64_t vec_end = in - in % 16;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < out; o++) {
        const float *row = w + o * in;
        vec16 sum = {0};
        for (int64_t i = 0; i < vec_end; i += 16)
            sum += V16(row + i) * V16(x + i);
        float r = 0.0f;
        for (int j = 0; j < 16; j++)
            r += sum[j];
        for (int64_t i = vec_end; i < in; i++)
            r += row[i] * x[i];
        y[o] = r;
    }
}
