/* out [M, N] fp32 = x [M, K] fp32 @ W^T (+ bias [N] fp32), W [N, K] bf16 held in a blocked layout
 * (serving/kernels/linear_bf16.py says why a kernel and measures it).
 *
 * Layout (ddops_pack_bf16): columns in groups of 64 (N padded with zero rows to a multiple of 64),
 * K in pairs (padded with a zero column to even): element (n, k) sits at
 *   [n / 64][k / 2][n % 64][k % 2]
 * so one group's step over a pair of k is 256 contiguous bytes: 4 registers of 16 columns x 2 k.
 * A whole product reads the weights front to back in one stream, and each input row meets a
 * register of weights through one broadcast of its (k, k + 1) pair, with no sums across lanes.
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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define DDOPS_DPBF16 1
#endif

#define GROUP 64   /* columns per group: 4 registers of 16 fp32 lanes */
#define ROWS 4     /* input rows per pass over a group (4 x 4 accumulators) */

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

/* w [N, K] bf16 (row-major) -> blocked [ceil(N / 64), ceil(K / 2), 64, 2], zero padded */
void ddops_pack_bf16(const uint16_t *w, int64_t N, int64_t K, uint16_t *blocked)
{
    const int64_t pairs = (K + 1) / 2, groups = (N + GROUP - 1) / GROUP;
    memset(blocked, 0, (size_t)(groups * pairs * GROUP * 2) * sizeof(uint16_t));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            blocked[((n / GROUP * pairs + k / 2) * GROUP + n % GROUP) * 2 + k % 2] = w[n * K + k];
}

#ifdef DDOPS_DPBF16
/* NR input rows (a constant in each copy, so the NR x 4 sums stay in registers) against one group */
#define PASS(NR)                                                                                   \
    static void pass_##NR(const uint16_t *g, int64_t pairs, const uint32_t *xb, float *sums)       \
    {                                                                                              \
        __m512 acc[NR][4];                                                                         \
        for (int i = 0; i < NR; i++)                                                               \
            for (int j = 0; j < 4; j++)                                                            \
                acc[i][j] = _mm512_setzero_ps();                                                   \
        for (int64_t p = 0; p < pairs; p++) {                                                      \
            const uint16_t *step = g + p * GROUP * 2;                                              \
            const __m512i w0 = _mm512_loadu_si512((const void *)(step));                           \
            const __m512i w1 = _mm512_loadu_si512((const void *)(step + 32));                      \
            const __m512i w2 = _mm512_loadu_si512((const void *)(step + 64));                      \
            const __m512i w3 = _mm512_loadu_si512((const void *)(step + 96));                      \
            for (int i = 0; i < NR; i++) {                                                         \
                const __m512bh xi = (__m512bh)_mm512_set1_epi32((int)xb[i * pairs + p]);           \
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)w0, xi);                         \
                acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)w1, xi);                         \
                acc[i][2] = _mm512_dpbf16_ps(acc[i][2], (__m512bh)w2, xi);                         \
                acc[i][3] = _mm512_dpbf16_ps(acc[i][3], (__m512bh)w3, xi);                         \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < NR; i++)                                                               \
            for (int j = 0; j < 4; j++)                                                            \
                _mm512_storeu_ps(sums + i * GROUP + 16 * j, acc[i][j]);                            \
    }
PASS(1)
PASS(2)
PASS(3)
PASS(4)

static void pass(const uint16_t *g, int64_t pairs, const uint32_t *xb, int nr, float *sums)
{
    switch (nr) {
    case 1: pass_1(g, pairs, xb, sums); break;
    case 2: pass_2(g, pairs, xb, sums); break;
    case 3: pass_3(g, pairs, xb, sums); break;
    default: pass_4(g, pairs, xb, sums);
    }
}
#endif

/* 0 on success, 1 when the rounded input rows could not be allocated, 2 in a build without
 * AVX512_BF16 (nothing computed). Fewer than `min_rows` rows
 * run padded with zero rows (which may stream faster; serving.models.cpu_gemm.small_rows decides)
 * whose results are dropped. */
int ddops_linear_bf16(const float *x, int64_t M, int64_t x_stride, const uint16_t *blocked, int64_t N, int64_t K,
                      const float *bias, float *out, int64_t out_stride, int64_t min_rows, int threads)
{
#ifndef DDOPS_DPBF16
    (void)x, (void)M, (void)x_stride, (void)blocked, (void)N, (void)K, (void)bias, (void)out, (void)out_stride;
    (void)min_rows, (void)threads;
    return 2;
#else
    const int64_t pairs = (K + 1) / 2, groups = (N + GROUP - 1) / GROUP, rows = M < min_rows ? min_rows : M;
    uint32_t *xb = calloc((size_t)(rows * pairs), sizeof(uint32_t));   /* x rows as bf16 (k, k+1) pairs */
    if (xb == NULL)
        return 1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t p = 0; p < pairs; p++) {
            const uint16_t lo = to_bf16(x[m * x_stride + 2 * p]);
            const uint16_t hi = 2 * p + 1 < K ? to_bf16(x[m * x_stride + 2 * p + 1]) : 0;
            xb[m * pairs + p] = (uint32_t)lo | (uint32_t)hi << 16;
        }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= (1 << 16))
    for (int64_t gi = 0; gi < groups; gi++) {
        const uint16_t *g = blocked + gi * pairs * GROUP * 2;
        const int64_t n0 = gi * GROUP, live = N - n0 < GROUP ? N - n0 : GROUP;
        float sums[ROWS * GROUP];
        for (int64_t m0 = 0; m0 < rows; m0 += ROWS) {
            const int nr = rows - m0 < ROWS ? (int)(rows - m0) : ROWS;
            pass(g, pairs, xb + m0 * pairs, nr, sums);
            for (int i = 0; i < nr && m0 + i < M; i++)
                for (int64_t c = 0; c < live; c++)
                    out[(m0 + i) * out_stride + n0 + c] = sums[i * GROUP + c] + (bias ? bias[n0 + c] : 0.0f);
        }
    }
    free(xb);
    return 0;
#endif
}
