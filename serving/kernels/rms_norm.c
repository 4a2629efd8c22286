/* RMSNorm of fp32 rows: out = x * (mean(x^2) + eps)^-1/2 * weight, as F.rms_norm computes it
 * (serving/kernels/rms_norm.py says why a kernel).
 *
 * x holds outer x inner rows of H elements: row (a, b) at x + a * outer_stride + b * inner_stride,
 * its elements contiguous (a [T, hidden] activation: inner = 1; q or k heads viewed out of a
 * projection's output, [T, heads, D]: both strides). out is contiguous [outer, inner, H].
 */
#include <stdint.h>

#include "rms_scale.h"

void ddops_rms_norm_f32(const float *x, int64_t outer, int64_t outer_stride, int64_t inner,
                        int64_t inner_stride, const float *weight, int64_t H, float eps, float *out)
{
    for (int64_t a = 0; a < outer; a++) {
        for (int64_t b = 0; b < inner; b++) {
            const float *row = x + a * outer_stride + b * inner_stride;
            float *dst = out + (a * inner + b) * H;
            const float scale = rms_scale(row, H, eps);
#pragma omp simd
            for (int64_t i = 0; i < H; i++)
                dst[i] = row[i] * scale * weight[i];
        }
    }
}
