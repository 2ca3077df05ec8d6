/* The parts of memwall's CPU kernels that every instruction-set variant shares.
 *
 * Each variant (kernels_avx2.c for AVX2, kernels_avx512.c, kernels_portable.c) defines
 *     static void fp32_block(const float *x, const float *w, float *y,
 *                            long rows, long in, long y_stride, long n_out);
 * which sets y[r * y_stride + k] = sum_i w[k * in + i] * x[r * in + i] for r < rows and
 * k < n_out (a multiple of 4), then includes this file once. Everything here is plain C: the
 * compiler vectorizes it for the variant's instruction set.
 *
 * Many activation rows (prefill, big batches) with int8/int4 weights: each thread turns a chunk
 * of CHUNK weight rows into floats in a scratch buffer that stays in its cache, then runs the fp32
 * tile over every activation row. The weights are converted once per call, not once per row.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 16
/* Rows of x that a small-batch decode tile keeps in L1 beside its weights: 32 KiB of floats,
 * two thirds of a 48 KiB L1 (and all of a 32 KiB one, where the weights then stream past). */
#define X_IN_L1_FLOATS 8192

/* How far ahead the int8 decode tiles ask for codes. They used to ask one tile ahead, as the
 * fp32 tiles do (9 KB and more for SmolLM2's shapes), but 4 rows of int8 codes are 2.3 KB at 576
 * inputs: that close, a line is asked for less than memory's latency before it is needed. 8 KiB
 * ahead covers that latency, and the int8 step got faster with it (AVX-512 and AVX2 builds alike);
 * 16 KiB was no better. */
#define PREFETCH_AHEAD_BYTES 8192

/* The whole tiles of `tile_bytes` that cover PREFETCH_AHEAD_BYTES (at least one). */
static inline long tiles_ahead(long tile_bytes) {
    return (PREFETCH_AHEAD_BYTES + tile_bytes - 1) / tile_bytes;
}

static inline float bf16_to_float(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

/* Bit 0: AVX2 and FMA; bit 1: AVX-512 F/BW/VL/DQ; bit 2: AVX-512 VNNI. Read with cpuid (and the
 * OS's saved-state flags) by the compiler's runtime, so a VM that hides AVX-512 reports none. */
int memwall_cpu_features(void) {
    int features = 0;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) features |= 1;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        features |= 2;
    if (__builtin_cpu_supports("avx512vnni")) features |= 4;
#endif
    return features;
}

/* A row's result depends neither on the other rows nor on the thread count, so batched decode
 * gives each sequence the same bits as decoding it alone. */
void fp32_linear(const float *x, const float *w, float *y, long rows, long in, long out,
                 int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o += 4) fp32_block(x, w + o * in, y + o, rows, in, out, 4);
}

/* ---- fp32 weights packed in panels (the "packed" path) -----------------------------------------
 * W [out, in] stored as panels of PANEL output rows, each [in][PANEL] (kernels.pack_panels;
 * the last panel padded with zero rows). For each input k a panel's weights lie side by side, so
 * a thread reads its panels as one sequential stream, and the tile is an outer product: x[r][k]
 * broadcast times the panel's weights at k, added into PANEL sums per activation row. Nothing is
 * summed across a register at the end, and each output's sum runs over k in order, whatever the
 * tile: a row gets the same bits at any batch size.
 * The row-major 4x4 tile above computes and waits for memory by turns once it has 8 rows or more
 * (its time was close to the sum of the weight stream and its arithmetic, each timed alone). Here
 * every k asks for the panel's lines PANEL_AHEAD_FLOATS ahead, an even trickle far enough ahead
 * for memory's latency, so the loads overlap the arithmetic instead of alternating with it: at 8
 * rows this comes close to a bare read of the weights. Much nearer (2-4 KiB) is too close for the
 * latency; 8 to 32 KiB do about equally well. */
#define PANEL 32
#define PANEL_AHEAD_FLOATS 4096 /* 16 KiB */

/* Passes over K_BLOCK inputs at a time: a pass covers rows of the tile's height, and 8 KiB of the
 * panel stays in L1 for the next pass over the same inputs, the sums waiting in `acc` between
 * blocks. Made over whole panels (72-192 KiB for SmolLM2), the passes after the first read them
 * from L2, which costs most where a tile covers few rows (AVX2's 3) and so many passes are made;
 * blocks of 32 or 64 inputs keep them in L1 (128 is too many). Each output's sum still runs over
 * k in order, so a row gets the same bits at any batch size. */
#define K_BLOCK 64
#define ROWS_AT_ONCE 64 /* acc's rows: 8 KiB on the stack */

/* The variant's tiles over `n` activation rows (at most ROWS_AT_ONCE), inputs k0 to k1 of one
 * panel, each tile's sums taken from and left in acc [n][PANEL]. */
static void fp32_panel_rows(const float *x, const float *p, float *acc, long in, long k0, long k1,
                            long n);

#ifndef HAS_FP32_PANEL_ROWS
/* `nr` (1 or 2) rows, in plain C. */
static inline __attribute__((always_inline)) void fp32_panel_block(const float *x, const float *p,
                                                                   float *acc, long in, long k0,
                                                                   long k1, const int nr) {
    for (long k = k0; k < k1; k++) {
        __builtin_prefetch(p + k * PANEL + PANEL_AHEAD_FLOATS);
        __builtin_prefetch(p + k * PANEL + PANEL_AHEAD_FLOATS + 16);
        for (int r = 0; r < nr; r++) {
            float xk = x[r * in + k];
            for (int j = 0; j < PANEL; j++) acc[r * PANEL + j] += p[k * PANEL + j] * xk;
        }
    }
}

static void fp32_panel_rows(const float *x, const float *p, float *acc, long in, long k0, long k1,
                            long n) {
    long r = 0;
    for (; r + 2 <= n; r += 2) fp32_panel_block(x + r * in, p, acc + r * PANEL, in, k0, k1, 2);
    if (r < n) fp32_panel_block(x + r * in, p, acc + r * PANEL, in, k0, k1, 1);
}
#endif

void fp32_packed_linear(const float *x, const float *panels, float *y, long rows, long in,
                        long out, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o += PANEL) {
        const float *p = panels + o * in;
        long width = out - o < PANEL ? out - o : PANEL;
        float acc[ROWS_AT_ONCE * PANEL];
        for (long r0 = 0; r0 < rows; r0 += ROWS_AT_ONCE) {
            long n = rows - r0 < ROWS_AT_ONCE ? rows - r0 : ROWS_AT_ONCE;
            memset(acc, 0, n * PANEL * sizeof(float));
            for (long k0 = 0; k0 < in; k0 += K_BLOCK) {
                long k1 = k0 + K_BLOCK < in ? k0 + K_BLOCK : in;
                fp32_panel_rows(x + r0 * in, p, acc, in, k0, k1, n);
            }
            for (long r = 0; r < n; r++)
                memcpy(y + (r0 + r) * out + o, acc + r * PANEL, width * sizeof(float));
        }
    }
}

static void dequantize_int8_rows(const int8_t *codes, const uint16_t *scales, long n, long in,
                                 float *dst) {
    for (long k = 0; k < n; k++) {
        float scale = bf16_to_float(scales[k]);
        for (long i = 0; i < in; i++) dst[k * in + i] = (float)codes[k * in + i] * scale;
    }
}

/* (q - 8) * s + z in the same order of operations as quant.dequantize_int4. */
static void dequantize_int4_rows(const uint8_t *packed, const uint16_t *scale_zero, long o, long n,
                                 long in, long out, long group, float *dst) {
    for (long k = 0; k < n; k++) {
        const uint8_t *bytes = packed + (o + k) * (in / 2);
        float *row = dst + k * in;
        for (long i = 0; i < in; i += 2) {
            row[i] = (float)(bytes[i / 2] & 15);
            row[i + 1] = (float)(bytes[i / 2] >> 4);
        }
        for (long g = 0; g < in / group; g++) {
            const uint16_t *sz = scale_zero + (g * out + o + k) * 2;
            float scale = bf16_to_float(sz[0]), zero = bf16_to_float(sz[1]);
            for (long i = g * group; i < (g + 1) * group; i++) row[i] = (row[i] - 8.0f) * scale + zero;
        }
    }
}

/* `out` a multiple of 4. Returns 0, or -1 if a scratch buffer could not be allocated. */
int int8_linear_many(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                     long rows, long in, long out, int threads) {
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        float *chunk = malloc(sizeof(float) * CHUNK * in);
        #pragma omp for schedule(static)
        for (long o = 0; o < out; o += CHUNK) {
            long n = out - o < CHUNK ? out - o : CHUNK;
            if (chunk == NULL) { failed = 1; continue; }
            dequantize_int8_rows(codes + o * in, scales + o, n, in, chunk);
            fp32_block(x, chunk, y + o, rows, in, out, n);
        }
        free(chunk);
    }
    return failed ? -1 : 0;
}

int int4_linear_many(const float *x, const uint8_t *packed, const uint16_t *scale_zero, float *y,
                     long rows, long in, long out, long group, int threads) {
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        float *chunk = malloc(sizeof(float) * CHUNK * in);
        #pragma omp for schedule(static)
        for (long o = 0; o < out; o += CHUNK) {
            long n = out - o < CHUNK ? out - o : CHUNK;
            if (chunk == NULL) { failed = 1; continue; }
            dequantize_int4_rows(packed, scale_zero, o, n, in, out, group, chunk);
            fp32_block(x, chunk, y + o, rows, in, out, n);
        }
        free(chunk);
    }
    return failed ? -1 : 0;
}

/* ---- int8 weights and int8 activations ("w8a8") --------------------------------------------
 * Each activation row is rounded to int8 with a scale of its own (its largest magnitude / 127),
 * so that a dot product is a sum of integer products, exact in int32, times two scales; batched
 * rows and every variant get the same bits. The activations lose precision (half a step, up to
 * 0.4% of the row's largest value, per element), where the other int8 paths keep them in fp32:
 * so calibration never picks this path; it is pinned (MEMWALL_KERNEL_PATH=int8:w8a8). With
 * AVX-512 VNNI (kernels_avx512.c), one instruction multiplies and adds 64 pairs of bytes. */

/* x [rows, in] -> xq [rows, in] int8, x_scale [rows] and xq_sum [rows] (the sum of each row's
 * codes), in one allocation, which the caller frees through *x_scale. Returns 0, or -1 if out of
 * memory. */
static int quantize_activations(const float *x, long rows, long in, int8_t **xq, float **x_scale,
                                int32_t **xq_sum) {
    char *block = malloc(rows * (in + sizeof(float) + sizeof(int32_t)));
    if (block == NULL) return -1;
    *x_scale = (float *)block;
    *xq_sum = (int32_t *)(block + rows * sizeof(float));
    *xq = (int8_t *)(block + rows * (sizeof(float) + sizeof(int32_t)));
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * in;
        float largest = 0.0f;
        for (long i = 0; i < in; i++) largest = fabsf(xr[i]) > largest ? fabsf(xr[i]) : largest;
        float scale = largest > 0.0f ? largest / 127.0f : 1.0f, inverse = 1.0f / scale;
        int32_t sum = 0;
        for (long i = 0; i < in; i++) {
            float q = nearbyintf(xr[i] * inverse);
            int8_t code = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
            (*xq)[r * in + i] = code;
            sum += code;
        }
        (*x_scale)[r] = scale;
        (*xq_sum)[r] = sum;
    }
    return 0;
}

/* One output (row o of the codes, activation row r) in plain C: the integer dot, then the scales
 * in a fixed order, which the VNNI kernel repeats. */
static inline float w8a8_one(const int8_t *w, const int8_t *xq, long in, float w_scale,
                             float x_scale) {
    int32_t dot = 0;
    for (long i = 0; i < in; i++) dot += (int32_t)w[i] * xq[i];
    return w_scale * x_scale * (float)dot;
}

static void w8a8_plain(const int8_t *xq, const float *x_scale, const int8_t *codes,
                       const uint16_t *scales, float *y, long rows, long in, long out,
                       int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o++)
        for (long r = 0; r < rows; r++)
            y[r * out + o] = w8a8_one(codes + o * in, xq + r * in, in, bf16_to_float(scales[o]),
                                      x_scale[r]);
}

#ifndef HAS_W8A8_LINEAR
/* x [rows, in] fp32 rounded to int8 per row, against codes [out, in] int8 and a bf16 scale per
 * output row. Returns 0, or -1 if out of memory. */
int w8a8_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y, long rows,
                long in, long out, int threads) {
    int8_t *xq;
    float *x_scale;
    int32_t *xq_sum;
    if (quantize_activations(x, rows, in, &xq, &x_scale, &xq_sum)) return -1;
    w8a8_plain(xq, x_scale, codes, scales, y, rows, in, out, threads);
    free(x_scale);
    return 0;
}
#endif

/* x regrouped for the int4 kernels: per 32 inputs, the 16 even-indexed values then the 16
 * odd-indexed ones, the order in which they meet the low and then the high nibbles of 16 bytes.
 * Also the sum of x over each group, which carries the offsets. */
static int int4_prepare(const float *x, long rows, long in, long group, float **x_split,
                        float **x_sums) {
    long groups = in / group;
    *x_split = malloc(sizeof(float) * rows * in);
    *x_sums = malloc(sizeof(float) * rows * groups);
    if (*x_split == NULL || *x_sums == NULL) {
        free(*x_split);
        free(*x_sums);
        return -1;
    }
    for (long i = 0; i < rows * in; i++)
        (*x_split)[i - i % 32 + (i % 2) * 16 + (i % 32) / 2] = x[i];
    for (long r = 0; r < rows * groups; r++) {
        (*x_sums)[r] = 0.0f;
        for (long i = 0; i < group; i++) (*x_sums)[r] += x[r * group + i];
    }
    return 0;
}

/* ---- int4 in PyTorch's CPU kernel layout ----------------------------------------------------
 * aten._convert_weight_to_int4pack_for_cpu stores codes [out, in] as [out / B, in, B / 2] bytes:
 * for each block of B output rows (64 with AVX-512, 32 with AVX2) and each input k, byte j holds
 * row j in its low nibble and row j + B / 2 in its high one (quant.from_cpu_kernel_layout).
 * So the B weights of one input sit side by side: vector lanes are output rows, each input's
 * activation is broadcast, and a group's (scale, offset) are applied once to B lanes of sums, not
 * once per row with a horizontal sum. The loops below are plain C over lanes, for the portable
 * build; the AVX2 and AVX-512 files have their own with intrinsics, because GCC kept this tile's
 * sums in memory (a store per weight vector, several times slower than sums in registers). */

/* Asks for the (scale, offset) pairs of group g for the next block of `block` rows: block * 4
 * bytes in a row, but each group's lie out * 4 bytes from the last, too scattered for the
 * hardware prefetcher to follow; asked for in time, they no longer stall the next block. */
static inline void prefetch_next_scales(const uint16_t *scale_zero, long g, long out, long o,
                                        long block) {
    const char *next = (const char *)(scale_zero + (g * out + o + block) * 2);
    for (long line = 0; line < block * 4; line += 64) __builtin_prefetch(next + line);
}

static float *group_sums(const float *x, long rows, long in, long group) {
    long groups = in / group;
    float *sums = malloc(sizeof(float) * rows * groups);
    if (sums == NULL) return NULL;
    for (long r = 0; r < rows * groups; r++) {
        sums[r] = 0.0f;
        for (long i = 0; i < group; i++) sums[r] += x[r * group + i];
    }
    return sums;
}

#ifdef HAS_INT4_BLOCKED_TILE
/* The variant's own tile, with intrinsics, defined after this header. */
static inline __attribute__((always_inline)) void int4_blocked_tile(
    const float *x, const float *x_sums, const uint8_t *bytes, const uint16_t *scale_zero, float *y,
    long in, long out, long o, long group, const int B, const int nr);
#else
/* One block of B output rows starting at o, for `nr` (1 or 2) activation rows. */
static inline __attribute__((always_inline)) void int4_blocked_tile(
    const float *x, const float *x_sums, const uint8_t *bytes, const uint16_t *scale_zero, float *y,
    long in, long out, long o, long group, const int B, const int nr) {
    float total[2][64] = {{0}}, part[2][64];
    long groups = in / group;
    for (long g = 0; g < groups; g++) {
        prefetch_next_scales(scale_zero, g, out, o, B);
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < B; j++) part[r][j] = 0.0f;
        for (long k = g * group; k < (g + 1) * group; k++) {
            const uint8_t *b = bytes + k * (B / 2);
            for (int r = 0; r < nr; r++) {
                float xk = x[r * in + k];
                for (int j = 0; j < B / 2; j++) {
                    part[r][j] += (float)(b[j] & 15) * xk;
                    part[r][j + B / 2] += (float)(b[j] >> 4) * xk;
                }
            }
        }
        const uint16_t *sz = scale_zero + (g * out + o) * 2;
        for (int r = 0; r < nr; r++) {
            float sum_x = x_sums[r * groups + g];
            for (int j = 0; j < B; j++) {
                float scale = bf16_to_float(sz[2 * j]), zero = bf16_to_float(sz[2 * j + 1]);
                total[r][j] += scale * part[r][j] + (zero - 8.0f * scale) * sum_x;
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < B; j++) y[r * out + o + j] = total[r][j];
}

#endif

/* x [rows, in] against codes in PyTorch's layout with blocks of `block` (32 or 64) rows; `out` a
 * multiple of `block`, `in` of `group`. Returns 0, or -1 if out of memory.
 * The block size is a constant inside the OpenMP loop. In a function called with 32 and with 64,
 * GCC outlines one OpenMP body for both, with the size a run-time value in the tile, whose sums
 * then no longer stay in registers: the int4 step was much slower, most of all at 2 to 16 rows. */
int int4_blocked_linear(const float *x, const uint8_t *packed, const uint16_t *scale_zero, float *y,
                        long rows, long in, long out, long group, long block, int threads) {
    float *x_sums = group_sums(x, rows, in, group);
    if (x_sums == NULL || (block != 32 && block != 64)) {
        free(x_sums);
        return -1;
    }
    long groups = in / group;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o += block) {
        const uint8_t *bytes = packed + o * (in / 2);
        long r = 0;
#define MEMWALL_INT4_ROWS(B, n)                                                                   \
        int4_blocked_tile(x + r * in, x_sums + r * groups, bytes, scale_zero, y + r * out, in,   \
                          out, o, group, B, n)
        if (block == 64) {
            for (; r + 2 <= rows; r += 2) MEMWALL_INT4_ROWS(64, 2);
            if (r < rows) MEMWALL_INT4_ROWS(64, 1);
        } else {
            for (; r + 2 <= rows; r += 2) MEMWALL_INT4_ROWS(32, 2);
            if (r < rows) MEMWALL_INT4_ROWS(32, 1);
        }
#undef MEMWALL_INT4_ROWS
    }
    free(x_sums);
    return 0;
}

/* Many rows: each thread dequantizes one block of rows at a time into its cache and runs the
 * fp32 tile over every activation row. */
int int4_blocked_linear_many(const float *x, const uint8_t *packed, const uint16_t *scale_zero,
                             float *y, long rows, long in, long out, long group, long block,
                             int threads) {
    int failed = 0;
    #pragma omp parallel num_threads(threads)
    {
        float *chunk = malloc(sizeof(float) * block * in);
        #pragma omp for schedule(static)
        for (long o = 0; o < out; o += block) {
            if (chunk == NULL) { failed = 1; continue; }
            const uint8_t *bytes = packed + o * (in / 2);
            /* Row by row, so the writes are contiguous: writing a column at a time strides by
             * `in` floats, which for in = 1536 maps every row onto the same few cache sets. */
            for (long j = 0; j < block / 2; j++)
                for (long k = 0; k < in; k++) {
                    uint8_t byte = bytes[k * (block / 2) + j];
                    chunk[j * in + k] = (float)(byte & 15);
                    chunk[(j + block / 2) * in + k] = (float)(byte >> 4);
                }
            for (long j = 0; j < block; j++)
                for (long g = 0; g < in / group; g++) {
                    const uint16_t *sz = scale_zero + (g * out + o + j) * 2;
                    float scale = bf16_to_float(sz[0]), zero = bf16_to_float(sz[1]);
                    float *w = chunk + j * in + g * group;
                    for (long i = 0; i < group; i++) w[i] = (w[i] - 8.0f) * scale + zero;
                }
            fp32_block(x, chunk, y + o, rows, in, out, block);
        }
        free(chunk);
    }
    return failed ? -1 : 0;
}

/* ---- bf16 weights and activations (a model loaded in bf16) ------------------------------------
 * Each product is exact in fp32 (a bf16 value widens to fp32 by a shift) and the sums run in
 * fp32, rounded to bf16 once at the end, as PyTorch's bf16 matmul does; a decode step reads half
 * fp32's bytes. Plain C: GCC vectorizes the widening and the sums (omp simd). */

/* fp32 -> bf16, rounding to nearest even (NaN kept a NaN). */
static inline uint16_t float_to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x40);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/* y [rows, out] = x [rows, in] @ w [out, in]^T, all bf16; x widened to fp32 once, four output
 * rows to an OpenMP iteration (one to an iteration was slower in most runs). Returns 0, or -1 if
 * out of memory. */
int bf16_linear(const uint16_t *x, const uint16_t *w, uint16_t *y, long rows, long in, long out,
                int threads) {
    float *xf = malloc(sizeof(float) * rows * in);
    if (xf == NULL) return -1;
    for (long i = 0; i < rows * in; i++) xf[i] = bf16_to_float(x[i]);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o += 4) {
        long n = out - o < 4 ? out - o : 4;
        for (long r = 0; r < rows; r++) {
            const float *xr = xf + r * in;
            for (long j = 0; j < n; j++) {
                const uint16_t *wj = w + (o + j) * in;
                float sum = 0.0f;
                #pragma omp simd reduction(+ : sum)
                for (long k = 0; k < in; k++) sum += xr[k] * bf16_to_float(wj[k]);
                y[r * out + o + j] = float_to_bf16(sum);
            }
        }
    }
    free(xf);
    return 0;
}

#include "decode_ops.h"
#include "decode_step.h"
