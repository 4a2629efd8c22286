/* out [M, N] fp32 = x [M, K] fp32 @ W^T (+ bias [N] fp32), W [N, K] bf16 held in a blocked layout
 * (serving/kernels/linear_bf16.py says why a kernel and measures it).
 *
 * Layout (ddops_pack_bf16): columns in groups of 32 (N padded with zero rows to a multiple of 32),
 * K in pairs (padded with a zero column to even): element (n, k) sits at
 *   [n / 32][k / 2][n % 32][k % 2]
 * so one group's step over a pair of k is 128 contiguous bytes: 2 registers of 16 columns x 2 k.
 * A whole product reads the weights front to back in one stream, and each input row meets a
 * register of weights through one broadcast of its (k, k + 1) pair, with no sums across lanes.
 *
 * Up to 12 rows (24 sums in registers) meet each step while it is in registers, so a batch of 8
 * reads the weights once, in one stream, computing as it goes. Groups of 64 columns (4 registers)
 * held only 4 rows a pass: 8 rows read each group from memory in a first pass and again from
 * cache in a second, and the stream stood while the second ran. All of SmolLM2's products (layers
 * and head) at 8 rows took 26.8 -> 20.1 and 22.1 -> 19.8 ms in two runs (one core, medians of 21
 * interleaved), at 16 rows 35.3 -> 30.1 and 33.3 -> 31.0; at 1 and 4 rows the two layouts were
 * within the runs' noise (7 %). Software prefetching of the next group did not help (8 rows:
 * 23.7 -> 25.1 ms), nor did reading half a 64-column step a pass (27 ms: strided streams).
 *
 * Each x row is rounded to bf16 once (round to nearest even, as torch's .to(bfloat16)), so every
 * product is exactly a bf16 product; sums are fp32, over k pairs in order. Row m's results never
 * depend on the other rows or on M (the same instructions in the same order for every row), so
 * a sequence's logits are the same alone, batched and in a verify tree.
 *
 * The step is VDPBF16PS (16 lanes += a pair of bf16 products each). A build without AVX512_BF16
 * has no product: ddops_linear_bf16_native says so, and serving/kernels/linear_bf16.py leaves
 * bf16 weights to oneDNN there.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rms_scale.h"
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define DDOPS_DPBF16 1
#endif

#define GROUP 32   /* columns per group: 2 registers of 16 fp32 lanes */
#define ROWS 12    /* input rows per pass over a group (12 x 2 sums, 2 weights, 1 broadcast: 27 of 32 registers) */

static uint16_t to_bf16(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)          /* NaN stays a (quiet) NaN */
        return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);           /* round to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

/* 1 where this build multiplies with VDPBF16PS, 0 where ddops_linear_bf16 only returns 2 */
int ddops_linear_bf16_native(void)
{
#ifdef DDOPS_DPBF16
    return 1;
#else
    return 0;
#endif
}

/* w [N, K] bf16 (row-major) -> blocked [ceil(N / 32), ceil(K / 2), 32, 2], zero padded */
void ddops_pack_bf16(const uint16_t *w, int64_t N, int64_t K, uint16_t *blocked)
{
    const int64_t pairs = (K + 1) / 2, groups = (N + GROUP - 1) / GROUP;
    memset(blocked, 0, (size_t)(groups * pairs * GROUP * 2) * sizeof(uint16_t));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            blocked[((n / GROUP * pairs + k / 2) * GROUP + n % GROUP) * 2 + k % 2] = w[n * K + k];
}

#ifdef DDOPS_DPBF16
/* NR input rows against SPAN adjacent groups (NR and SPAN constants in each copy, so the
 * NR x 2 SPAN sums stay in registers): sums [NR, SPAN * 32]. Up to 4 rows take two groups at
 * once (two streams, 4 independent sums a row: 1 and 4 rows streamed as fast as 64-column
 * groups did); more rows take one. */
#define PASS(NR, SPAN)                                                                             \
    static void pass_##NR##_##SPAN(const uint16_t *g, int64_t pairs, const uint32_t *xb, float *sums)\
    {                                                                                              \
        __m512 acc[NR][2 * SPAN];                                                                  \
        for (int i = 0; i < NR; i++)                                                               \
            for (int j = 0; j < 2 * SPAN; j++)                                                     \
                acc[i][j] = _mm512_setzero_ps();                                                   \
        for (int64_t p = 0; p < pairs; p++) {                                                      \
            __m512i w[2 * SPAN];                                                                   \
            for (int j = 0; j < 2 * SPAN; j++)                                                     \
                w[j] = _mm512_loadu_si512((const void *)(g + (j / 2 * pairs + p) * GROUP * 2 + j % 2 * 32));\
            for (int i = 0; i < NR; i++) {                                                         \
                const __m512bh xi = (__m512bh)_mm512_set1_epi32((int)xb[i * pairs + p]);           \
                for (int j = 0; j < 2 * SPAN; j++)                                                 \
                    acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)w[j], xi);                   \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < NR; i++)                                                               \
            for (int j = 0; j < 2 * SPAN; j++)                                                     \
                _mm512_storeu_ps(sums + i * SPAN * GROUP + 16 * j, acc[i][j]);                     \
    }
PASS(1, 2)
PASS(2, 2)
PASS(3, 2)
PASS(4, 2)
PASS(1, 1)
PASS(2, 1)
PASS(3, 1)
PASS(4, 1)
PASS(5, 1)
PASS(6, 1)
PASS(7, 1)
PASS(8, 1)
PASS(9, 1)
PASS(10, 1)
PASS(11, 1)
PASS(12, 1)

typedef void (*Pass)(const uint16_t *, int64_t, const uint32_t *, float *);
static const Pass PAIRED[4] = {pass_1_2, pass_2_2, pass_3_2, pass_4_2};
static const Pass SINGLE[ROWS] = {pass_1_1, pass_2_1, pass_3_1, pass_4_1, pass_5_1, pass_6_1,
                                  pass_7_1, pass_8_1, pass_9_1, pass_10_1, pass_11_1, pass_12_1};
#endif

/* Row m's input, the values the product rounds to bf16 (K floats into `in`):
 *   x[m]                                      plain;
 *   x[m] * (mean(x[m]^2) + eps)^-1/2 * norm   with `norm` [K]: the RMSNorm before a projection,
 *                                             with rms_norm.c's scale (rms_scale.h);
 *   silu(x[m, :K]) * x[m, K:]                 with `swiglu` (x rows of 2K: gate, then up): the
 *                                             MLP's input to its down projection.
 * Fusing them here saves a call, a tensor and a pass over the rows per norm and MLP
 * (serving/kernels/linear_bf16.py has the figures). */
static void input_row(const float *x, int64_t K, const float *norm, float eps, int swiglu, float *in)
{
    if (swiglu) {
#pragma omp simd
        for (int64_t i = 0; i < K; i++)
            in[i] = x[i] / (1.0f + expf(-x[i])) * x[K + i];
        return;
    }
    if (norm == NULL) {
        memcpy(in, x, (size_t)K * sizeof(float));
        return;
    }
    const float scale = rms_scale(x, K, eps);
#pragma omp simd
    for (int64_t i = 0; i < K; i++)
        in[i] = x[i] * scale * norm[i];
}

/* out[m] = residual[m] + (the product + bias), then its first rope_heads heads of head_dim
 * rotated by cos, sin [M, head_dim] (`rotate`): 0 on success, 1 when the input rows could not
 * be allocated, 2 in a build without AVX512_BF16 (nothing computed). `norm`, `swiglu` (see
 * input_row), `bias`, `residual` and `cos` may each be absent (NULL, 0). Fewer than `min_rows` rows run
 * padded with zero rows (which may stream faster; serving.models.cpu_gemm.small_rows decides)
 * whose results are dropped. */
/* RoPE (rotate-half) of the first `heads` heads of D columns of each out row, in place:
 * row m's cos, sin [D] at cos + m * D, sin + m * D (the q and k heads of a q/k/v projection). */
static void rotate(float *out, int64_t M, int64_t out_stride, const float *cos, const float *sin, int64_t heads,
                   int64_t D)
{
    const int64_t half = D / 2;
    for (int64_t m = 0; m < M; m++) {
        const float *c = cos + m * D, *s = sin + m * D;
        for (int64_t h = 0; h < heads; h++) {
            float *o = out + m * out_stride + h * D;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = o[i], b = o[i + half];
                o[i] = a * c[i] - b * s[i];
                o[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}

int ddops_linear_bf16(const float *x, int64_t M, int64_t x_stride, const uint16_t *blocked, int64_t N, int64_t K,
                      const float *bias, const float *norm, float eps, int swiglu, const float *residual,
                      int64_t residual_stride, const float *cos, const float *sin, int64_t rope_heads,
                      int64_t head_dim, float *out, int64_t out_stride, int64_t min_rows, int threads)
{
#ifndef DDOPS_DPBF16
    (void)x, (void)M, (void)x_stride, (void)blocked, (void)N, (void)K, (void)bias, (void)norm, (void)eps;
    (void)swiglu, (void)residual, (void)residual_stride, (void)cos, (void)sin, (void)rope_heads, (void)head_dim;
    (void)out, (void)out_stride, (void)min_rows, (void)threads;
    return 2;
#else
    const int64_t pairs = (K + 1) / 2, groups = (N + GROUP - 1) / GROUP, rows = M < min_rows ? min_rows : M;
    uint32_t *xb = calloc((size_t)(rows * pairs), sizeof(uint32_t));   /* input rows as bf16 (k, k+1) pairs */
    float *in = malloc((size_t)(K + 1) * sizeof(float));
    if (xb == NULL || in == NULL) {
        free(xb), free(in);
        return 1;
    }
    in[K] = 0.0f;                                                       /* an odd K's zero column */
    for (int64_t m = 0; m < M; m++) {
        input_row(x + m * x_stride, K, norm, eps, swiglu, in);
        for (int64_t p = 0; p < pairs; p++)
            xb[m * pairs + p] = (uint32_t)to_bf16(in[2 * p]) | (uint32_t)to_bf16(in[2 * p + 1]) << 16;
    }
    free(in);
    /* a task: `span` groups (2 where a tile of at most 4 rows has a next group, else 1) x a tile of rows */
    const int64_t span = rows <= 4 ? 2 : 1, tasks = (groups + span - 1) / span;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= (1 << 16))
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t gi = t * span, spanned = gi + span <= groups ? span : 1;
        const uint16_t *g = blocked + gi * pairs * GROUP * 2;
        const int64_t n0 = gi * GROUP, width = spanned * GROUP, live = N - n0 < width ? N - n0 : width;
        float sums[ROWS * GROUP];
        for (int64_t m0 = 0; m0 < rows; m0 += ROWS) {
            const int nr = rows - m0 < ROWS ? (int)(rows - m0) : ROWS;
            (spanned == 2 ? PAIRED : SINGLE)[nr - 1](g, pairs, xb + m0 * pairs, sums);
            for (int i = 0; i < nr && m0 + i < M; i++) {
                float *dst = out + (m0 + i) * out_stride + n0;
                const float *add = residual ? residual + (m0 + i) * residual_stride + n0 : NULL;
                for (int64_t c = 0; c < live; c++) {
                    const float value = sums[i * width + c] + (bias ? bias[n0 + c] : 0.0f);
                    dst[c] = add ? add[c] + value : value;
                }
            }
        }
    }
    free(xb);
    if (cos != NULL)
        rotate(out, M, out_stride, cos, sin, rope_heads, head_dim);
    return 0;
#endif
}
