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

/* qkv [rows, heads + 2 kv_heads, head_dim], one token of each of `rows` sequences at the same
 * position: rotate q and k in place (pairs i, i + d/2), then store k and v at `position` of each
 * sequence's caches [kv_heads, max_tokens, head_dim], `cache_stride` floats apart. */
void rope_and_store(float *qkv, const float *cos, const float *sin, long heads, long kv_heads,
                    long head_dim, float *k_cache, float *v_cache, long position, long max_tokens,
                    long rows, long cache_stride, int threads) {
    long half = head_dim / 2, width = (heads + 2 * kv_heads) * head_dim;
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * width >= PARALLEL_FROM)
    for (long row = 0; row < rows; row++) {
        float *token = qkv + row * width;
        for (long h = 0; h < heads + kv_heads; h++) {
            float *v = token + h * head_dim;
            for (long i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * cos[i] + (-b) * sin[i];
                v[i + half] = b * cos[i + half] + a * sin[i + half];
            }
        }
        for (long h = 0; h < kv_heads; h++) {
            long at = row * cache_stride + (h * max_tokens + position) * head_dim;
            memcpy(k_cache + at, token + (heads + h) * head_dim, sizeof(float) * head_dim);
            memcpy(v_cache + at, token + (heads + kv_heads + h) * head_dim,
                   sizeof(float) * head_dim);
        }
    }
}

/* One query token of each of `rows` sequences (in qkv, laid out as above) against its `length`
 * cached tokens; out [rows, heads, head_dim]. Each group of heads / kv_heads query heads shares
 * one key/value head (GQA). scratch: rows * heads * length floats. The `omp simd` reductions let
 * the compiler split each sum across vector lanes (plain C may not reorder a float sum): without
 * them this was a scalar loop, and at a few hundred tokens of context attention took as long as
 * a layer's weights. */
void attend_one(const float *qkv, const float *k_cache, const float *v_cache, float *out,
                long heads, long kv_heads, long head_dim, long length, long max_tokens,
                float *scratch, int threads, long rows, long cache_stride) {
    float scale = 1.0f / sqrtf((float)head_dim);
    long width = (heads + 2 * kv_heads) * head_dim;
    /* two threads pay off above about 400 (query head, token) pairs on the CPUs tried */
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * heads * length >= 512)
    for (long job = 0; job < rows * heads; job++) {
        long row = job / heads, h = job % heads;
        long kv = row * cache_stride + (h / (heads / kv_heads)) * max_tokens * head_dim;
        const float *qh = qkv + row * width + h * head_dim;
        const float *keys = k_cache + kv, *values = v_cache + kv;
        /* the next job's cache, whose first tokens are asked for while this job ends */
        long next = job + 1 < rows * heads ? job + 1 : job;
        long next_kv = (next / heads) * cache_stride
                       + ((next % heads) / (heads / kv_heads)) * max_tokens * head_dim;
        float *scores = scratch + job * length, top = -INFINITY, total = 0.0f;
        /* Two tokens at a time: their dot products are independent sums, so neither waits for
         * the other's additions. */
        for (long t = 0; t < length; t += 2) {
            /* the cache comes from memory: ask for tokens t + 8 and t + 9 now */
            for (long ahead = t + 8; ahead < t + 10; ahead++) {
                const float *k_ahead = keys + ahead * head_dim, *v_ahead = values + ahead * head_dim;
                if (ahead >= length) {
                    k_ahead = k_cache + next_kv + (ahead - length) * head_dim;
                    v_ahead = v_cache + next_kv + (ahead - length) * head_dim;
                }
                for (long i = 0; i < head_dim; i += 16) {
                    __builtin_prefetch(k_ahead + i);
                    __builtin_prefetch(v_ahead + i);
                }
            }
            const float *key = keys + t * head_dim, *key2 = key + head_dim;
            float dot = 0.0f, dot2 = 0.0f;
            if (t + 1 < length) {
                #pragma omp simd reduction(+ : dot, dot2)
                for (long i = 0; i < head_dim; i++) {
                    dot += qh[i] * key[i];
                    dot2 += qh[i] * key2[i];
                }
                scores[t + 1] = dot2 * scale;
            } else {
                #pragma omp simd reduction(+ : dot)
                for (long i = 0; i < head_dim; i++) dot += qh[i] * key[i];
            }
            scores[t] = dot * scale;
        }
        #pragma omp simd reduction(max : top)
        for (long t = 0; t < length; t++) top = scores[t] > top ? scores[t] : top;
        #pragma omp simd reduction(+ : total)
        for (long t = 0; t < length; t++) total += scores[t] = exp_vectorizable(scores[t] - top);
        /* The weighted sum of values, 32 columns at a time in local arrays that the compiler
         * keeps in registers (summing into `out` made each token wait for the last one's store),
         * even and odd tokens apart so that each multiply-add need not wait for the one before. */
        float inverse = 1.0f / total;
        for (long i0 = 0; i0 < head_dim; i0 += 32) {
            long n = head_dim - i0 < 32 ? head_dim - i0 : 32;
            float sums[32] = {0}, odd[32] = {0};
            const float *value = values + i0;
            if (n == 32) {
                long t = 0;
                for (; t + 2 <= length; t += 2, value += 2 * head_dim) {
                    #pragma omp simd
                    for (long i = 0; i < 32; i++) {
                        sums[i] += scores[t] * value[i];
                        odd[i] += scores[t + 1] * value[head_dim + i];
                    }
                }
                if (t < length) {
                    #pragma omp simd
                    for (long i = 0; i < 32; i++) sums[i] += scores[t] * value[i];
                }
                #pragma omp simd
                for (long i = 0; i < 32; i++) sums[i] += odd[i];
            } else {
                for (long t = 0; t < length; t++, value += head_dim)
                    for (long i = 0; i < n; i++) sums[i] += scores[t] * value[i];
            }
            for (long i = 0; i < n; i++) out[job * head_dim + i0 + i] = sums[i] * inverse;
        }
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
