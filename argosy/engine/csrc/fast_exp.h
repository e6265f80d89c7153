/* A float exp the compiler vectorizes (libm's expf is a call per value): for the softmax of
 * paged_attention.c and the SiLU of small_ops.c. */
#pragma once
#include <stdint.h>

/* exp(x) for x <= 0 (Cephes' expf: a polynomial on x - n ln 2, times 2^n); unlike libm's expf the
 * compiler vectorizes it. Relative error ~1e-7. */
static inline float exp_nonpositive(float x)
{
    x = x < -87.0f ? -87.0f : x; /* exp(-87) ~ 1.6e-38: still a normal float */
    const float n = __builtin_floorf(x * 1.44269504f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    __builtin_memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}
