/* Attention of B new rows, each over its own keys where they lie in the pool: the rows of a
 * plain decode step (one per sequence) and those of a verify pass (a chain's or a tree's rows),
 * in one call (serving/kernels/decode_attention.py says why and when it runs).
 *
 * Layouts, element strides; q, k_new, v_new and out fp32, the pool fp32 or bf16 (kv_bf16):
 *   q       [B, H, D]   q[b, h, d]      at q + b * q_stride + h * D + d
 *   k_new   [B, KV, D]  the new key of row b at k_new + b * k_stride + kv * D (v_new alike)
 *   pool_k  [KV, R, D]  contiguous: row r of KV head kv at pool_k + (kv * R + r) * D (pool_v alike)
 *   writes  [B]         the pool row row b's new key and value go to; every row is written
 *                       before any is read, so a tree row reads its ancestors' new rows
 *   starts, prefix [B]: row b's keys are pool rows [starts[b], starts[b] + prefix[b]), then
 *   extra_offsets [B + 1], extra_rows: the pool rows extra_rows[extra_offsets[b] ..
 *                       extra_offsets[b + 1]) (a tree row's ancestors and itself, in order)
 *   out     [B, H, D]   contiguous
 * Query head h reads KV head h / G (G = H / KV), as the model's grouped-query attention does.
 *
 * Each (row, KV head) is one task: its G query heads score every key once, softmax in two
 * passes over a [G, n] buffer, then sum the values. A task reads only its own keys, so a row's
 * output does not depend on the rows beside it, and a row over the same keys gives the same bits
 * whether it is a decode row (all keys in the prefix) or a verify row (ancestors listed): the
 * same instructions run over the same values in the same order. That is what keeps speculative
 * output equal to plain output at T=0 to the last bit, whatever the dtype of the products.
 *
 * A bf16 pool halves the bytes a step reads (at batch 8 and long contexts they outweigh the
 * model's weights). Its rows widen to fp32 as they load, so every product and sum runs in fp32
 * as over an fp32 pool; the new rows are rounded to bf16 as they are written, to nearest even as
 * torch rounds them, so a row reads the same bits whether this kernel or torch wrote it.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* x rounded to bf16 (its top 16 bits), to nearest even; NaN to torch's 0x7FC0 (a bit test, as
 * -ffast-math folds isnan) */
static inline uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void write_row(const float *from, void *pool, int64_t at, int64_t D, int bf16)
{
    if (!bf16) {
        memcpy((float *)pool + at, from, D * sizeof(float));
        return;
    }
    uint16_t *to = (uint16_t *)pool + at;
    for (int64_t d = 0; d < D; d++)
        to[d] = to_bf16(from[d]);
}

static void write_new_rows(const float *k_new, int64_t k_stride, const float *v_new, int64_t v_stride,
                           void *pool_k, void *pool_v, int64_t R, const int64_t *writes,
                           int64_t B, int64_t KV, int64_t D, int bf16)
{
    for (int64_t b = 0; b < B; b++) {
        int64_t row = writes[b];
        for (int64_t kv = 0; kv < KV; kv++) {
            write_row(k_new + b * k_stride + kv * D, pool_k, (kv * R + row) * D, D, bf16);
            write_row(v_new + b * v_stride + kv * D, pool_v, (kv * R + row) * D, D, bf16);
        }
    }
}

/* W floats a vector; GCC and Clang lower it to the widest registers -march=native gives
 * (AVX-512: one, AVX2: two). aligned(4): rows need only float alignment. */
#define W 16
/* A step touches each layer's K/V once, so rows come from memory, not cache: while scoring,
 * ask for the key rows this far ahead and for the value rows the weighing reads next
 * (batch 8, contexts 120, 30 layers, one core: 3.0 -> 2.1 ms a step). */
#define PREFETCH_ROWS 8
typedef float vf __attribute__((vector_size(W * sizeof(float)), aligned(sizeof(float))));
typedef uint16_t vh __attribute__((vector_size(W * sizeof(uint16_t)), aligned(sizeof(uint16_t))));
typedef uint32_t vu __attribute__((vector_size(W * sizeof(uint32_t))));

/* W elements of a pool row from element c, as fp32 (a bf16 row's bits shifted up: exact) */
static inline __attribute__((always_inline)) vf load_w(const void *row, int64_t c, int bf16)
{
    if (!bf16)
        return *(const vf *)((const float *)row + c);
    vu bits = __builtin_convertvector(*(const vh *)((const uint16_t *)row + c), vu) << 16;
    vf out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline __attribute__((always_inline)) float load_1(const void *row, int64_t d, int bf16)
{
    if (!bf16)
        return ((const float *)row)[d];
    uint32_t bits = (uint32_t)((const uint16_t *)row)[d] << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline float sum_lanes(vf a)
{
    a += __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    a += __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    a += __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    a += __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return a[0];
}

/* Where key j of a task lies: pool row start + j for j < prefix, then the listed rows. */
typedef struct {
    const char *keys;      /* the KV head's pool rows: [R, D], fp32 or bf16 */
    const char *values;
    int64_t start, prefix;
    const int64_t *extra;  /* pool rows of keys prefix, prefix + 1, ... */
} Keys;

static inline int64_t key_row(const Keys *k, int64_t j)
{
    return j < k->prefix ? k->start + j : k->extra[j - k->prefix];
}

/* key j's row of `rows` (keys or values): D elements of 4 bytes, or 2 in a bf16 pool */
static inline __attribute__((always_inline)) const char *row_of(const Keys *k, const char *rows, int64_t j,
                                                               int64_t D, int bf16)
{
    return rows + key_row(k, j) * D * (bf16 ? 2 : 4);
}

/* scores [G, n]: q_g . k_j * scale. Inlined with D a constant (attend_task's callers), the
 * D / W products of a dot unroll into registers. */
static inline __attribute__((always_inline)) void score(const float *q, const Keys *keys, int64_t n, int64_t G,
                                                        const int64_t D, float scale, float *scores, int bf16)
{
    const int64_t bytes = D * (bf16 ? 2 : 4);
    for (int64_t j = 0; j < n; j++) {
        const char *kj = row_of(keys, keys->keys, j, D, bf16);
        const char *ahead = row_of(keys, keys->keys, j + PREFETCH_ROWS < n ? j + PREFETCH_ROWS : j, D, bf16);
        const char *vj = row_of(keys, keys->values, j, D, bf16);
        for (int64_t c = 0; c < bytes; c += 64) {   /* each cache line of a row */
            __builtin_prefetch(ahead + c);
            __builtin_prefetch(vj + c);
        }
        for (int64_t g = 0; g < G; g++) {
            const float *qg = q + g * D;
            float s = 0.0f;
            if (D % W == 0) {
                vf acc = {0};
                for (int64_t c = 0; c < D; c += W)
                    acc += *(const vf *)(qg + c) * load_w(kj, c, bf16);
                s = sum_lanes(acc);
            } else {
                for (int64_t d = 0; d < D; d++)
                    s += qg[d] * load_1(kj, d, bf16);
            }
            scores[g * n + j] = s * scale;
        }
    }
}

/* one query head: p = softmax(scores [n]) in place; out [D] = sum_j p_j values_j */
static inline __attribute__((always_inline)) void weigh(float *scores, const Keys *keys, int64_t n,
                                                        const int64_t D, float *out, int bf16)
{
    float top = scores[0];
    for (int64_t j = 1; j < n; j++)
        top = scores[j] > top ? scores[j] : top;
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; j++) {
        scores[j] = expf(scores[j] - top);
        total += scores[j];
    }
    const float inv = 1.0f / total;
    if (D % W == 0 && D <= 16 * W) {
        vf acc[16] = {{0}};
        for (int64_t j = 0; j < n; j++) {
            const float p = scores[j];
            const char *vj = row_of(keys, keys->values, j, D, bf16);
            for (int64_t c = 0; c < D / W; c++)
                acc[c] += p * load_w(vj, c * W, bf16);
        }
        for (int64_t c = 0; c < D / W; c++)
            *(vf *)(out + c * W) = acc[c] * inv;
        return;
    }
    memset(out, 0, D * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        const float p = scores[j];
        const char *vj = row_of(keys, keys->values, j, D, bf16);
#pragma omp simd
        for (int64_t d = 0; d < D; d++)
            out[d] += p * load_1(vj, d, bf16);
    }
#pragma omp simd
    for (int64_t d = 0; d < D; d++)
        out[d] *= inv;
}

/* one (row, KV head): its G query heads over its n keys; scores a [G, n] buffer */
static inline __attribute__((always_inline)) void attend_task(const float *q, const Keys *keys, int64_t n,
                                                              int64_t G, const int64_t D, float scale,
                                                              float *scores, float *out, int bf16)
{
    score(q, keys, n, G, D, scale, scores, bf16);
    for (int64_t g = 0; g < G; g++)
        weigh(scores + g * n, keys, n, D, out + g * D, bf16);
}

/* the usual head sizes, and each pool dtype, get code with D and the dtype constants */
static void attend_any(const float *q, const Keys *keys, int64_t n, int64_t G, int64_t D, float scale,
                       float *scores, float *out, int bf16)
{
    switch (D * 2 + (bf16 != 0)) {
    case 128: attend_task(q, keys, n, G, 64, scale, scores, out, 0); break;
    case 129: attend_task(q, keys, n, G, 64, scale, scores, out, 1); break;
    case 256: attend_task(q, keys, n, G, 128, scale, scores, out, 0); break;
    case 257: attend_task(q, keys, n, G, 128, scale, scores, out, 1); break;
    case 512: attend_task(q, keys, n, G, 256, scale, scores, out, 0); break;
    case 513: attend_task(q, keys, n, G, 256, scale, scores, out, 1); break;
    default: attend_task(q, keys, n, G, D, scale, scores, out, bf16 != 0);
    }
}

int ddops_rows_attention(const float *q, int64_t q_stride, const float *k_new, int64_t k_stride,
                         const float *v_new, int64_t v_stride, void *pool_k, void *pool_v, int64_t R,
                         const int64_t *writes, const int64_t *starts, const int64_t *prefix,
                         const int64_t *extra_offsets, const int64_t *extra_rows, float *out,
                         int64_t B, int64_t H, int64_t KV, int64_t D, float scale, int kv_bf16, int threads)
{
    const int64_t G = H / KV, elem = kv_bf16 ? 2 : 4;
    int failed = 0;
    write_new_rows(k_new, k_stride, v_new, v_stride, pool_k, pool_v, R, writes, B, KV, D, kv_bf16);
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1) reduction(| : failed)
    for (int64_t task = 0; task < B * KV; task++) {
        const int64_t b = task / KV, kv = task % KV;
        const int64_t n = prefix[b] + extra_offsets[b + 1] - extra_offsets[b];
        const Keys keys = {(const char *)pool_k + kv * R * D * elem, (const char *)pool_v + kv * R * D * elem,
                           starts[b], prefix[b], extra_rows + extra_offsets[b]};
        float *scores = malloc((size_t)(G * n) * sizeof(float));
        if (scores == NULL) {
            failed = 1;
            continue;
        }
        const float *qb = q + b * q_stride + kv * G * D;
        float *ob = out + (b * H + kv * G) * D;
        attend_any(qb, &keys, n, G, D, scale, scores, ob, kv_bf16);
        free(scores);
    }
    return failed;
}
