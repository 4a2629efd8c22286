/* The RMSNorm scale of a row: 1 / sqrt(mean(x^2) + eps) over its H floats, as F.rms_norm
 * computes it. One definition for rms_norm.c and linear_bf16.c's fused norm, so the two
 * normalise alike (serving/kernels/build.py keys a build by the headers it includes too). */
#ifndef DDOPS_RMS_SCALE_H
#define DDOPS_RMS_SCALE_H
#include <math.h>
#include <stdint.h>

static inline float rms_scale(const float *x, int64_t H, float eps)
{
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t i = 0; i < H; i++)
        squares += x[i] * x[i];
    return 1.0f / sqrtf(squares / (float)H + eps);
}
#endif
