/* Included once by decode_ops.h, after the helpers it uses (exp_vectorizable, PARALLEL_FROM).
 * The decode step's rotary embedding, cache write and attention, on a cache laid out in blocks. */
/* ---- the KV cache's layout -------------------------------------------------------------------
 * A layer's keys (and values) are blocks of [kv_heads, block_size, head_dim] floats, and row r's
 * token t lives in block tables[r * table_width + t / block_size]. That one layout serves both
 * caches: a contiguous KVCache [rows, kv_heads, max_tokens, head_dim] is the case block_size =
 * max_tokens with tables [[0], [1], ...]; a paged one (engine/paged_cache.py) gives each row
 * small blocks anywhere in its pool, and attention reads them in place through the tables, as
 * PagedAttention does (Kwon et al. 2023). Each row r holds one new token at positions[r]. */

/* Where token t of row `row`, key/value head `kv`, starts in a layer's keys (or values). */
static inline long kv_at(const long *tables, long table_width, long block_size, long kv_heads,
                         long head_dim, long row, long kv, long t) {
    long block = tables[row * table_width + t / block_size];
    return ((block * kv_heads + kv) * block_size + t % block_size) * head_dim;
}

/* qkv [rows, heads + 2 kv_heads, head_dim], one token of each of `rows` sequences: rotate q and
 * k in place (pairs i, i + d/2) by the rows of the cos and sin tables [positions, head_dim] at the
 * row's position, then store k and v there in the caches. */
void rope_and_store(float *qkv, const float *cos, const float *sin, long heads, long kv_heads,
                    long head_dim, float *k_cache, float *v_cache, const long *positions,
                    const long *tables, long table_width, long block_size, long rows,
                    int threads) {
    long half = head_dim / 2, width = (heads + 2 * kv_heads) * head_dim;
    #pragma omp parallel for num_threads(threads) schedule(static) if (rows * width >= PARALLEL_FROM)
    for (long row = 0; row < rows; row++) {
        float *token = qkv + row * width;
        const float *c = cos + positions[row] * head_dim, *s = sin + positions[row] * head_dim;
        for (long h = 0; h < heads + kv_heads; h++) {
            float *v = token + h * head_dim;
            for (long i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] + (-b) * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
        for (long h = 0; h < kv_heads; h++) {
            long at = kv_at(tables, table_width, block_size, kv_heads, head_dim, row, h,
                            positions[row]);
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
 * chunks depends only on its length, and where a chunk crosses a block only on the block size, so
 * a row gets the same bits in any batch, on any thread count. A chunk is read as segments, the
 * runs of its tokens that lie in one block. */
#define ATTEND_CHUNK 256
#define HEADS_AT_ONCE 4 /* query heads of a group per pass: their sums fit in registers */

static inline long chunks_of(long length) { return (length + ATTEND_CHUNK - 1) / ATTEND_CHUNK; }

/* Scratch floats attend_one needs for rows whose longest context is `length` tokens: every
 * head's scores, and each chunk's partial result. */
long attend_scratch_floats(long rows, long heads, long head_dim, long length) {
    return rows * heads * (length + chunks_of(length) * (head_dim + 2));
}

/* The segments of tokens [t0, t0 + n) of a row's key/value head `kv`: where each starts in the
 * layer's cache (seg_at) and its length (seg_len). Returns how many (at most n). */
static long chunk_segments(const long *tables, long table_width, long block_size, long kv_heads,
                           long head_dim, long row, long kv, long t0, long n, long *seg_at,
                           long *seg_len) {
    long count = 0;
    for (long t = t0; t < t0 + n; count++) {
        long left_in_block = block_size - t % block_size;
        seg_len[count] = left_in_block < t0 + n - t ? left_in_block : t0 + n - t;
        seg_at[count] = kv_at(tables, table_width, block_size, kv_heads, head_dim, row, kv, t);
        t += seg_len[count];
    }
    return count;
}

/* `hn` query heads (q, head_dim apart) against the n tokens of a chunk, in `segs` segments of
 * the caches. Scores go to scores[j * length + t]; head j's partial result, (largest score,
 * total, head_dim sums), to partial[j * partial_stride]. `next_at` is where the next job starts:
 * its first tokens are asked for while this one ends. */
static inline __attribute__((always_inline)) void attend_chunk(
    const float *q, const float *k_cache, const float *v_cache, const long *seg_at,
    const long *seg_len, long segs, long n, long next_at, long head_dim, float scale,
    float *scores, long length, float *partial, long partial_stride, const int hn) {
    /* Ask for the cache PREFETCH_AHEAD_BYTES ahead, far enough to cover memory's latency. The
     * token that far ahead is followed through the segments (small blocks lie anywhere), then on
     * into the next job: segment `ps`, token `po` of it (past the last segment, po counts tokens
     * into the next job). */
    long ahead = PREFETCH_AHEAD_BYTES / (long)(sizeof(float) * head_dim), ps = 0;
    long po = ahead < 2 ? 2 : ahead;
    while (ps < segs && po >= seg_len[ps]) po -= seg_len[ps++];
    /* Two tokens at a time: their dot products are independent sums, so neither waits for the
     * other's additions. The `omp simd` reductions let the compiler split each sum across vector
     * lanes (plain C may not reorder a float sum). */
    for (long s = 0, t0 = 0; s < segs; t0 += seg_len[s], s++) {
        const float *keys = k_cache + seg_at[s];
        long m = seg_len[s];
        float *seg_scores = scores + t0;
        for (long t = 0; t < m; t += 2) {
            for (long u = t; u < t + 2 && u < m; u++) { /* one token asked for per token scored */
                long at = (ps < segs ? seg_at[ps] : next_at) + po * head_dim;
                for (long i = 0; i < head_dim; i += 16) {
                    __builtin_prefetch(k_cache + at + i);
                    __builtin_prefetch(v_cache + at + i);
                }
                if (ps < segs && ++po == seg_len[ps]) ps++, po = 0;
                else if (ps >= segs) po++;
            }
            const float *key = keys + t * head_dim, *key2 = key + head_dim;
            for (int j = 0; j < hn; j++) {
                const float *qh = q + j * head_dim;
                float dot = 0.0f, dot2 = 0.0f;
                if (t + 1 < m) {
                    #pragma omp simd reduction(+ : dot, dot2)
                    for (long i = 0; i < head_dim; i++) {
                        dot += qh[i] * key[i];
                        dot2 += qh[i] * key2[i];
                    }
                    seg_scores[j * length + t + 1] = dot2 * scale;
                } else {
                    #pragma omp simd reduction(+ : dot)
                    for (long i = 0; i < head_dim; i++) dot += qh[i] * key[i];
                }
                seg_scores[j * length + t] = dot * scale;
            }
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
     * odd tokens of the chunk apart so that each multiply-add need not wait for the one before.
     * Even tokens always go to `sums` and odd ones to `odd`, in order, wherever the blocks cut. */
    for (long i0 = 0; i0 < head_dim; i0 += 32) {
        long width = head_dim - i0 < 32 ? head_dim - i0 : 32;
        float sums[HEADS_AT_ONCE][32] = {{0}}, odd[HEADS_AT_ONCE][32] = {{0}};
        for (long s = 0, t = 0; s < segs; s++) {
            const float *value = v_cache + seg_at[s] + i0;
            long end = t + seg_len[s];
            if (width == 32) {
                if (t % 2 == 1) { /* a segment that starts on an odd token */
                    for (int j = 0; j < hn; j++) {
                        float b = scores[j * length + t];
                        #pragma omp simd
                        for (long i = 0; i < 32; i++) odd[j][i] += b * value[i];
                    }
                    t++, value += head_dim;
                }
                for (; t + 2 <= end; t += 2, value += 2 * head_dim)
                    for (int j = 0; j < hn; j++) {
                        float a = scores[j * length + t], b = scores[j * length + t + 1];
                        #pragma omp simd
                        for (long i = 0; i < 32; i++) {
                            sums[j][i] += a * value[i];
                            odd[j][i] += b * value[head_dim + i];
                        }
                    }
                if (t < end) {
                    for (int j = 0; j < hn; j++) {
                        float a = scores[j * length + t];
                        #pragma omp simd
                        for (long i = 0; i < 32; i++) sums[j][i] += a * value[i];
                    }
                    t++;
                }
            } else {
                for (; t < end; t++, value += head_dim)
                    for (int j = 0; j < hn; j++)
                        for (long i = 0; i < width; i++)
                            sums[j][i] += scores[j * length + t] * value[i];
            }
        }
        for (int j = 0; j < hn; j++)
            for (long i = 0; i < width; i++)
                partial[j * partial_stride + 2 + i0 + i] = sums[j][i] + odd[j][i];
    }
}

/* attend_chunk with the head count as a constant, so that its loops over heads unroll. */
static void attend_heads(const float *q, const float *k_cache, const float *v_cache,
                         const long *seg_at, const long *seg_len, long segs, long n, long next_at,
                         long head_dim, float scale, float *scores, long length, float *partial,
                         long partial_stride, long hn) {
#define ATTEND_CHUNK_OF(HN)                                                                       \
    attend_chunk(q, k_cache, v_cache, seg_at, seg_len, segs, n, next_at, head_dim, scale, scores, \
                 length, partial, partial_stride, HN)
    if (hn == 4) ATTEND_CHUNK_OF(4);
    else if (hn == 3) ATTEND_CHUNK_OF(3);
    else if (hn == 2) ATTEND_CHUNK_OF(2);
    else ATTEND_CHUNK_OF(1);
#undef ATTEND_CHUNK_OF
}

/* Which row, key/value head and chunk job `job` is. first_job[r] is row r's first job; *row is
 * where the search starts (a thread takes its jobs in order, so its last job's row). */
static inline void find_job(long job, const long *first_job, const long *positions,
                            long *row, long *kv, long *chunk) {
    if (job < first_job[*row]) *row = 0;
    while (job >= first_job[*row + 1]) (*row)++;
    long chunks = chunks_of(positions[*row] + 1), local = job - first_job[*row];
    *kv = local / chunks;
    *chunk = local % chunks;
}

/* One query token of each of `rows` sequences (in qkv, laid out as above), row r at positions[r],
 * against its positions[r] + 1 cached tokens (its own included); out [rows, heads, head_dim].
 * Each group of heads / kv_heads query heads shares one key/value head (GQA). scratch:
 * attend_scratch_floats(rows, heads, head_dim, the longest row's length). */
void attend_one(const float *qkv, const float *k_cache, const float *v_cache, float *out,
                long heads, long kv_heads, long head_dim, const long *positions,
                const long *tables, long table_width, long block_size, float *scratch,
                int threads, long rows) {
    float scale = 1.0f / sqrtf((float)head_dim);
    long width = (heads + 2 * kv_heads) * head_dim, group = heads / kv_heads;
    long longest = 0, work = 0, stride = head_dim + 2;
    long first_job[rows + 1]; /* row r's jobs are first_job[r] to first_job[r + 1] - 1 */
    first_job[0] = 0;
    for (long r = 0; r < rows; r++) {
        long length = positions[r] + 1;
        longest = length > longest ? length : longest;
        work += length;
        first_job[r + 1] = first_job[r] + kv_heads * chunks_of(length);
    }
    long chunks = chunks_of(longest); /* a head's places for partial results */
    float *partials = scratch + rows * heads * longest; /* [rows, heads, chunks, stride] */
    /* two threads pay off above about 400 (query head, token) pairs on the CPUs tried */
    #pragma omp parallel num_threads(threads) if (heads * work >= 512)
    {
        long jobs = first_job[rows], row = 0, next_row = 0;
        long seg_at[ATTEND_CHUNK + 1], seg_len[ATTEND_CHUNK + 1];
        #pragma omp for schedule(static)
        for (long job = 0; job < jobs; job++) {
            long kv, chunk, next_kv, next_chunk;
            find_job(job, first_job, positions, &row, &kv, &chunk);
            find_job(job + 1 < jobs ? job + 1 : job, first_job, positions, &next_row, &next_kv,
                     &next_chunk);
            long length = positions[row] + 1, t0 = chunk * ATTEND_CHUNK;
            long n = length - t0 < ATTEND_CHUNK ? length - t0 : ATTEND_CHUNK;
            long segs = chunk_segments(tables, table_width, block_size, kv_heads, head_dim, row,
                                       kv, t0, n, seg_at, seg_len);
            long next_at = kv_at(tables, table_width, block_size, kv_heads, head_dim, next_row,
                                 next_kv, next_chunk * ATTEND_CHUNK);
            for (long h0 = 0; h0 < group; h0 += HEADS_AT_ONCE) {
                long head = row * heads + kv * group + h0; /* the first of this pass's heads */
                const float *q = qkv + row * width + (kv * group + h0) * head_dim;
                float *scores = scratch + head * longest + t0;
                float *partial = partials + (head * chunks + chunk) * stride;
                long hn = group - h0 < HEADS_AT_ONCE ? group - h0 : HEADS_AT_ONCE;
                attend_heads(q, k_cache, v_cache, seg_at, seg_len, segs, n, next_at, head_dim,
                             scale, scores, longest, partial, chunks * stride, hn);
            }
        }
        /* merge each row's own chunks: out = sum_c e^(top_c - top) sums_c / sum_c e^(top_c -
         * top) total_c */
        #pragma omp for schedule(static)
        for (long head = 0; head < rows * heads; head++) {
            const float *p = partials + head * chunks * stride;
            long own = chunks_of(positions[head / heads] + 1);
            float top = -INFINITY, total = 0.0f;
            for (long c = 0; c < own; c++) top = p[c * stride] > top ? p[c * stride] : top;
            float *o = out + head * head_dim;
            for (long i = 0; i < head_dim; i++) o[i] = 0.0f;
            for (long c = 0; c < own; c++) {
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
