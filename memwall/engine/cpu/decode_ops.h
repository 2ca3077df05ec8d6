/* Included once by common.h, so every kernel variant exports these. */
/* ---- the rest of a batch-1 decode step (engine/cpu/fast_decode.py) -----------------------------
 * One call each for what the readable engine does in several PyTorch operations: in decode those
 * operations cost more in dispatch than in arithmetic. Same formulas as engine/layers.py. */
#include <math.h>

/* x += delta (if delta is not NULL), then out = weight * (x / sqrt(mean(x^2) + eps)). */
void add_rmsnorm(float *x, const float *delta, const float *weight, float *out, long n, float eps) {
    if (delta != NULL)
        for (long i = 0; i < n; i++) x[i] += delta[i];
    float sum = 0.0f;
    for (long i = 0; i < n; i++) sum += x[i] * x[i];
    float inv = 1.0f / sqrtf(sum / (float)n + eps);
    for (long i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inv);
}

/* qkv [heads + 2 kv_heads, head_dim] of one token: rotate q and k in place (pairs i, i + d/2), then
 * store k and v at `position` of this layer's caches [kv_heads, max_tokens, head_dim]. */
void rope_and_store(float *qkv, const float *cos, const float *sin, long heads, long kv_heads,
                    long head_dim, float *k_cache, float *v_cache, long position, long max_tokens) {
    long half = head_dim / 2;
    for (long h = 0; h < heads + kv_heads; h++) {
        float *v = qkv + h * head_dim;
        for (long i = 0; i < half; i++) {
            float a = v[i], b = v[i + half];
            v[i] = a * cos[i] + (-b) * sin[i];
            v[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
    for (long h = 0; h < kv_heads; h++) {
        long at = (h * max_tokens + position) * head_dim;
        memcpy(k_cache + at, qkv + (heads + h) * head_dim, sizeof(float) * head_dim);
        memcpy(v_cache + at, qkv + (heads + kv_heads + h) * head_dim, sizeof(float) * head_dim);
    }
}

/* One query token against `length` cached tokens; each group of heads / kv_heads query heads
 * shares one key/value head (GQA). scratch: heads * length floats. */
void attend_one(const float *q, const float *k_cache, const float *v_cache, float *out, long heads,
                long kv_heads, long head_dim, long length, long max_tokens, float *scratch,
                int threads) {
    float scale = 1.0f / sqrtf((float)head_dim);
    #pragma omp parallel for num_threads(threads) schedule(static) if (length >= 256)
    for (long h = 0; h < heads; h++) {
        const float *qh = q + h * head_dim;
        const float *keys = k_cache + (h / (heads / kv_heads)) * max_tokens * head_dim;
        const float *values = v_cache + (h / (heads / kv_heads)) * max_tokens * head_dim;
        float *scores = scratch + h * length, top = -INFINITY, total = 0.0f;
        for (long t = 0; t < length; t++) {
            float dot = 0.0f;
            for (long i = 0; i < head_dim; i++) dot += qh[i] * keys[t * head_dim + i];
            scores[t] = dot * scale;
            top = scores[t] > top ? scores[t] : top;
        }
        for (long t = 0; t < length; t++) total += scores[t] = expf(scores[t] - top);
        float *oh = out + h * head_dim;
        for (long i = 0; i < head_dim; i++) oh[i] = 0.0f;
        for (long t = 0; t < length; t++) {
            float weight = scores[t] / total;
            for (long i = 0; i < head_dim; i++) oh[i] += weight * values[t * head_dim + i];
        }
    }
}

/* gate_up [2 d_ff] -> out [d_ff] = silu(gate) * up. */
void silu_mul(const float *gate_up, float *out, long d_ff) {
    for (long i = 0; i < d_ff; i++) {
        float g = gate_up[i];
        out[i] = g / (1.0f + expf(-g)) * gate_up[d_ff + i];
    }
}

void add_into(float *y, const float *bias, long n) {
    for (long i = 0; i < n; i++) y[i] += bias[i];
}
