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

/* ---- attention of one new token against its cache ------------------------------------------
 * A job is one sequence, one key/value head and one chunk of ATTEND_CHUNK cached tokens. The
 * chunk's keys and values are read once for all the query heads that share them (GQA), and
 * chunks give the threads work when a batch has few sequences and few key/value heads. Each chunk
 * leaves its softmax unnormalized (its largest score, its total and its weighted sum of values);
 * a last pass merges the chunks, as flash-decoding does (Dao et al. 2023). How a row is cut into
 * chunks depends only on its length, so a row gets the same bits in any batch, on any thread
 * count. */
#define ATTEND_CHUNK 256
#define HEADS_AT_ONCE 4 /* query heads of a group per pass: their sums fit in registers */

/* Scratch floats attend_one needs: every head's scores, and each chunk's partial result. */
long attend_scratch_floats(long rows, long heads, long head_dim, long length) {
    long chunks = (length + ATTEND_CHUNK - 1) / ATTEND_CHUNK;
    return rows * heads * (length + chunks * (head_dim + 2));
}

/* `hn` query heads (q, head_dim apart) against n tokens of keys and values. Scores go to
 * scores[j * length + t]; head j's partial result, (largest score, total, head_dim sums), to
 * partial[j * partial_stride]. next_keys and next_values are where the next job starts: its
 * first tokens are asked for while this one ends. */
static inline __attribute__((always_inline)) void attend_chunk(
    const float *q, const float *keys, const float *values, long n, const float *next_keys,
    const float *next_values, long head_dim, float scale, float *scores, long length,
    float *partial, long partial_stride, const int hn) {
    /* ask for the cache PREFETCH_AHEAD_BYTES ahead: far enough to cover memory's latency */
    long ahead = PREFETCH_AHEAD_BYTES / (long)(sizeof(float) * head_dim);
    ahead = ahead < 2 ? 2 : ahead;
    /* Two tokens at a time: their dot products are independent sums, so neither waits for the
     * other's additions. The `omp simd` reductions let the compiler split each sum across vector
     * lanes (plain C may not reorder a float sum). */
    for (long t = 0; t < n; t += 2) {
        for (long u = t + ahead; u < t + ahead + 2; u++) {
            const float *k = u < n ? keys + u * head_dim : next_keys + (u - n) * head_dim;
            const float *v = u < n ? values + u * head_dim : next_values + (u - n) * head_dim;
            for (long i = 0; i < head_dim; i += 16) {
                __builtin_prefetch(k + i);
                __builtin_prefetch(v + i);
            }
        }
        const float *key = keys + t * head_dim, *key2 = key + head_dim;
        for (int j = 0; j < hn; j++) {
            const float *qh = q + j * head_dim;
            float dot = 0.0f, dot2 = 0.0f;
            if (t + 1 < n) {
                #pragma omp simd reduction(+ : dot, dot2)
                for (long i = 0; i < head_dim; i++) {
                    dot += qh[i] * key[i];
                    dot2 += qh[i] * key2[i];
                }
                scores[j * length + t + 1] = dot2 * scale;
            } else {
                #pragma omp simd reduction(+ : dot)
                for (long i = 0; i < head_dim; i++) dot += qh[i] * key[i];
            }
            scores[j * length + t] = dot * scale;
        }
    }
    for (int j = 0; j < hn; j++) {
        float *s = scores + j * length, top = -INFINITY, total = 0.0f;
        #pragma omp simd reduction(max : top)
        for (long t = 0; t < n; t++) top = s[t] > top ? s[t] : top;
        #pragma omp simd reduction(+ : total)
        for (long t = 0; t < n; t++) total += s[t] = exp_vectorizable(s[t] - top);
        partial[j * partial_stride] = top;
        partial[j * partial_stride + 1] = total;
    }
    /* The weighted sums of values, 32 columns at a time in local arrays that the compiler keeps
     * in registers (summing into memory made each token wait for the last one's store), even and
     * odd tokens apart so that each multiply-add need not wait for the one before. */
    for (long i0 = 0; i0 < head_dim; i0 += 32) {
        long width = head_dim - i0 < 32 ? head_dim - i0 : 32;
        float sums[HEADS_AT_ONCE][32] = {{0}}, odd[HEADS_AT_ONCE][32] = {{0}};
        const float *value = values + i0;
        if (width == 32) {
            long t = 0;
            for (; t + 2 <= n; t += 2, value += 2 * head_dim)
                for (int j = 0; j < hn; j++) {
                    float a = scores[j * length + t], b = scores[j * length + t + 1];
                    #pragma omp simd
                    for (long i = 0; i < 32; i++) {
                        sums[j][i] += a * value[i];
                        odd[j][i] += b * value[head_dim + i];
                    }
                }
            if (t < n)
                for (int j = 0; j < hn; j++) {
                    float a = scores[j * length + t];
                    #pragma omp simd
                    for (long i = 0; i < 32; i++) sums[j][i] += a * value[i];
                }
        } else {
            for (long t = 0; t < n; t++, value += head_dim)
                for (int j = 0; j < hn; j++)
                    for (long i = 0; i < width; i++) sums[j][i] += scores[j * length + t] * value[i];
        }
        for (int j = 0; j < hn; j++)
            for (long i = 0; i < width; i++)
                partial[j * partial_stride + 2 + i0 + i] = sums[j][i] + odd[j][i];
    }
}

/* attend_chunk with the head count as a constant, so that its loops over heads unroll. */
static void attend_heads(const float *q, const float *keys, const float *values, long n,
                         const float *next_keys, const float *next_values, long head_dim,
                         float scale, float *scores, long length, float *partial,
                         long partial_stride, long hn) {
#define ATTEND_CHUNK_OF(HN)                                                                       \
    attend_chunk(q, keys, values, n, next_keys, next_values, head_dim, scale, scores, length,   \
                 partial, partial_stride, HN)
    if (hn == 4) ATTEND_CHUNK_OF(4);
    else if (hn == 3) ATTEND_CHUNK_OF(3);
    else if (hn == 2) ATTEND_CHUNK_OF(2);
    else ATTEND_CHUNK_OF(1);
#undef ATTEND_CHUNK_OF
}

/* Where job `job` of attend_one starts in a layer's key (or value) cache. */
static inline long chunk_start(long job, long chunks, long kv_heads, long max_tokens,
                               long head_dim, long cache_stride) {
    long chunk = job % chunks, kv = job / chunks % kv_heads, row = job / chunks / kv_heads;
    return row * cache_stride + (kv * max_tokens + chunk * ATTEND_CHUNK) * head_dim;
}

/* One query token of each of `rows` sequences (in qkv, laid out as above) against its `length`
 * cached tokens; out [rows, heads, head_dim]. Each group of heads / kv_heads query heads shares
 * one key/value head (GQA). scratch: attend_scratch_floats(rows, heads, head_dim, length). */
void attend_one(const float *qkv, const float *k_cache, const float *v_cache, float *out,
                long heads, long kv_heads, long head_dim, long length, long max_tokens,
                float *scratch, int threads, long rows, long cache_stride) {
    float scale = 1.0f / sqrtf((float)head_dim);
    long width = (heads + 2 * kv_heads) * head_dim, group = heads / kv_heads;
    long chunks = (length + ATTEND_CHUNK - 1) / ATTEND_CHUNK, stride = head_dim + 2;
    float *partials = scratch + rows * heads * length; /* [rows, heads, chunks, stride] */
    /* two threads pay off above about 400 (query head, token) pairs on the CPUs tried */
    #pragma omp parallel num_threads(threads) if (rows * heads * length >= 512)
    {
        long jobs = rows * kv_heads * chunks;
        #pragma omp for schedule(static)
        for (long job = 0; job < jobs; job++) {
            long chunk = job % chunks, kv = job / chunks % kv_heads, row = job / chunks / kv_heads;
            long t0 = chunk * ATTEND_CHUNK;
            long n = length - t0 < ATTEND_CHUNK ? length - t0 : ATTEND_CHUNK;
            long at = chunk_start(job, chunks, kv_heads, max_tokens, head_dim, cache_stride);
            long next = chunk_start(job + 1 < jobs ? job + 1 : job, chunks, kv_heads, max_tokens,
                                    head_dim, cache_stride);
            for (long h0 = 0; h0 < group; h0 += HEADS_AT_ONCE) {
                long head = row * heads + kv * group + h0; /* the first of this pass's heads */
                const float *q = qkv + row * width + (kv * group + h0) * head_dim;
                float *scores = scratch + head * length + t0;
                float *partial = partials + (head * chunks + chunk) * stride;
                long hn = group - h0 < HEADS_AT_ONCE ? group - h0 : HEADS_AT_ONCE;
                attend_heads(q, k_cache + at, v_cache + at, n, k_cache + next, v_cache + next,
                             head_dim, scale, scores, length, partial, chunks * stride, hn);
            }
        }
        /* merge: out = sum_c e^(top_c - top) sums_c / sum_c e^(top_c - top) total_c */
        #pragma omp for schedule(static)
        for (long head = 0; head < rows * heads; head++) {
            const float *p = partials + head * chunks * stride;
            float top = -INFINITY, total = 0.0f;
            for (long c = 0; c < chunks; c++) top = p[c * stride] > top ? p[c * stride] : top;
            float *o = out + head * head_dim;
            for (long i = 0; i < head_dim; i++) o[i] = 0.0f;
            for (long c = 0; c < chunks; c++) {
                float weight = exp_vectorizable(p[c * stride] - top);
                total += weight * p[c * stride + 1];
                #pragma omp simd
                for (long i = 0; i < head_dim; i++) o[i] += weight * p[c * stride + 2 + i];
            }
            float inverse = 1.0f / total;
            #pragma omp simd
            for (long i = 0; i < head_dim; i++) o[i] *= inverse;
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
