/* Included once by common.h, so every kernel variant exports these. */
/* ---- the rest of a batch-1 decode step (engine/cpu/fast_decode.py) -----------------------------
 * One call each for what the readable engine does in several PyTorch operations: in decode those
 * operations cost more in dispatch than in arithmetic. Same formulas as engine/layers.py. */
#include <math.h>

/* exp(x) in plain arithmetic that the compiler vectorizes (libm's expf is a call per element):
 * exp(x) = 2^n exp(r) with n = round(x / ln 2) and |r| <= ln(2) / 2, exp(r) by its Taylor series
 * to r^7 (relative error below 1e-8 there). Clamped to the normal floats' range, which is more
 * than softmax and SiLU need. */
static inline float exp_vectorizable(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    /* round to nearest by adding and taking away 1.5 * 2^23 (floorf does not vectorize) */
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f; /* ln 2 in two parts */
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float two_to_n;
    memcpy(&two_to_n, &bits, sizeof two_to_n);
    return p * two_to_n;
}

/* Rows of a batched step are independent: from this many floats of work the elementwise ops
 * below run on all threads (a parallel region costs about a microsecond). */
#define PARALLEL_FROM 8192

/* For each of `rows` rows of n floats: x += delta (if delta is not NULL), then
 * out = weight * (x / sqrt(mean(x^2) + eps)). */
void add_rmsnorm(float *x, const float *delta, const float *weight, float *out, long rows, long n,
                 float eps, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * n >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        float *xr = x + r * n, *outr = out + r * n;
        if (delta != NULL)
            for (long i = 0; i < n; i++) xr[i] += delta[r * n + i];
        float sum = 0.0f;
        #pragma omp simd reduction(+ : sum)
        for (long i = 0; i < n; i++) sum += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(sum / (float)n + eps);
        for (long i = 0; i < n; i++) outr[i] = weight[i] * (xr[i] * inv);
    }
}

/* gate_up [rows, 2 d_ff] -> out [rows, d_ff] = silu(gate) * up. */
void silu_mul(const float *restrict gate_up, float *restrict out, long d_ff, long rows,
              int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * d_ff >= PARALLEL_FROM)
    for (long r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * d_ff, *up = gate + d_ff;
        float *outr = out + r * d_ff;
        #pragma omp simd
        for (long i = 0; i < d_ff; i++) outr[i] = gate[i] / (1.0f + exp_vectorizable(-gate[i])) * up[i];
    }
}

/* y [rows, n] += bias [n] */
void add_into(float *y, const float *bias, long n, long rows) {
    for (long r = 0; r < rows; r++, y += n)
        for (long i = 0; i < n; i++) y[i] += bias[i];
}

#include "decode_attention.h" /* rotary embedding, the cache write and attention */
