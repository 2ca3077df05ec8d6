/* Matrix products for decode on x86 CPUs with AVX2 and FMA: fp32, int8 and int4 weights.
 *
 * y[r, o] = sum_i W[o, i] * x[r, i] for a few activation rows r (decode: one row per sequence).
 * Each thread takes a slab of output rows and streams its share of the weights once; the
 * activations stay in fp32 and in cache. Packed weights are turned back into floats in
 * registers, never in memory. Built by build.py and loaded by kernels.py; the CPU twins
 * (linears.py) use PyTorch's paths where this cannot be built. Beside it: kernels_avx512.c for
 * CPUs with AVX-512 and kernels_portable.c (no intrinsics) for any other CPU; what all three
 * share is in common.h.
 *
 * Scales are bf16: the top 16 bits of an fp32, so a shift turns one back into a float.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void fp32_block(const float *x, const float *w, float *y, long rows, long in, long y_stride,
                       long n_out);
#define HAS_FP32_PANEL_ROWS     /* below, with intrinsics */
#define HAS_INT4_BLOCKED_TILE   /* below, with intrinsics */
#include "common.h"

static inline float sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The sums of the lanes of a, b, c and d, in that order, sharing their shuffles. */
static inline __m128 sum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 pairs = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(pairs), _mm256_extractf128_ps(pairs, 1));
}

/* 8 int8 codes -> 8 floats. */
static inline __m256 int8x8_to_float(const int8_t *codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes)));
}

/* The low 8 bytes of a register -> 8 floats. */
static inline __m256 uint8x8_to_float(__m128i bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

/* A tile of 4 output rows x `nr` (1 to 3) activation rows: 12 sums stay in registers, so each
 * weight loaded serves every activation row of the tile and each activation load 4 weight rows. */
static inline __attribute__((always_inline)) void fp32_tile(const float *x, const float *w, float *y,
                                                            long in, long out, const int nr) {
    __m256 acc[4][3];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 3; j++) acc[k][j] = _mm256_setzero_ps();
    for (long i = 0; i < in; i += 8) {
        /* the next tile's weight rows, one tile ahead: see kernels_avx512.c */
        for (int k = 4; k < 8; k++) _mm_prefetch((const char *)(w + k * in + i), _MM_HINT_T0);
        __m256 xv[3];
        for (int j = 0; j < nr; j++) xv[j] = _mm256_loadu_ps(x + j * in + i);
        for (int k = 0; k < 4; k++) {
            __m256 wv = _mm256_loadu_ps(w + k * in + i);
            for (int j = 0; j < nr; j++) acc[k][j] = _mm256_fmadd_ps(wv, xv[j], acc[k][j]);
        }
    }
    for (int j = 0; j < nr; j++)
        _mm_storeu_ps(y + j * out, sum4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
}

/* One weight row at a time against `nr` (1 to 4) activation rows, for small decode batches: the
 * weights are read as one sequential stream, with a prefetch per cache line two rows ahead, as in
 * kernels_avx512.c's fp32_stream_tile. `sum4` reduces each row's vector in the order fp32_tile
 * does, so a row gets the same bits whichever tile made it. One weight row at a time makes the
 * steadiest stream, and at 1 to 4 activation rows the step is bound by that stream, so this tile
 * replaced a 2-row tile (which had itself replaced the 4x3 tile for these rows). */
static inline __attribute__((always_inline)) void fp32_stream_tile(const float *x, const float *w,
                                                                   float *y, long in, long y_stride,
                                                                   const int nr) {
    __m256 acc[4];
    for (int j = 0; j < 4; j++) acc[j] = _mm256_setzero_ps();
    const float *ahead = w + 2 * in;
    for (long i = 0; i < in; i += 8) {
        if (i % 16 == 0) _mm_prefetch((const char *)(ahead + i), _MM_HINT_T0);
        __m256 wv = _mm256_loadu_ps(w + i);
        for (int j = 0; j < nr; j++)
            acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * in + i), acc[j]);
    }
    float sums[4];
    _mm_storeu_ps(sums, sum4(acc[0], acc[1], acc[2], acc[3]));
    for (int j = 0; j < nr; j++) y[j * y_stride] = sums[j];
}

/* W fp32 [n_out, in]; `n_out` a multiple of 4 and `in` of 8. */
static void fp32_block(const float *x, const float *w, float *y, long rows, long in, long y_stride,
                       long n_out) {
    if (rows <= 4 && rows * in <= X_IN_L1_FLOATS) {
        for (long o = 0; o < n_out; o++) {
            if (rows == 1) fp32_stream_tile(x, w + o * in, y + o, in, y_stride, 1);
            if (rows == 2) fp32_stream_tile(x, w + o * in, y + o, in, y_stride, 2);
            if (rows == 3) fp32_stream_tile(x, w + o * in, y + o, in, y_stride, 3);
            if (rows == 4) fp32_stream_tile(x, w + o * in, y + o, in, y_stride, 4);
        }
        return;
    }
    for (long o = 0; o < n_out; o += 4) {
        long r = 0;
        for (; r + 3 <= rows; r += 3) fp32_tile(x + r * in, w + o * in, y + r * y_stride + o, in, y_stride, 3);
        if (rows - r == 2) fp32_tile(x + r * in, w + o * in, y + r * y_stride + o, in, y_stride, 2);
        if (rows - r == 1) fp32_tile(x + r * in, w + o * in, y + r * y_stride + o, in, y_stride, 1);
    }
}

/* The "packed" path (common.h) with AVX2: only 3 activation rows fit the 16 registers (4 x 3
 * sums, 3 broadcasts, one weight vector), so 16 rows take 6 passes over each block of a panel. */
static inline __attribute__((always_inline)) void fp32_panel_block(const float *x, const float *p,
                                                                   float *acc, long in, long k0,
                                                                   long k1, const int nr) {
    __m256 sum[3][4];
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < 4; j++) sum[r][j] = _mm256_loadu_ps(acc + r * PANEL + 8 * j);
    for (long k = k0; k < k1; k++) {
        const float *pk = p + k * PANEL;
        _mm_prefetch((const char *)(pk + PANEL_AHEAD_FLOATS), _MM_HINT_T0);
        _mm_prefetch((const char *)(pk + PANEL_AHEAD_FLOATS + 16), _MM_HINT_T0);
        __m256 xk[3];
        for (int r = 0; r < nr; r++) xk[r] = _mm256_broadcast_ss(x + r * in + k);
        for (int j = 0; j < 4; j++) {
            __m256 w = _mm256_loadu_ps(pk + 8 * j);
            for (int r = 0; r < nr; r++) sum[r][j] = _mm256_fmadd_ps(w, xk[r], sum[r][j]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(acc + r * PANEL + 8 * j, sum[r][j]);
}

static void fp32_panel_rows(const float *x, const float *p, float *acc, long in, long k0, long k1,
                            long n) {
    long r = 0;
    for (; r + 3 <= n; r += 3) fp32_panel_block(x + r * in, p, acc + r * PANEL, in, k0, k1, 3);
    if (n - r == 2) fp32_panel_block(x + r * in, p, acc + r * PANEL, in, k0, k1, 2);
    if (n - r == 1) fp32_panel_block(x + r * in, p, acc + r * PANEL, in, k0, k1, 1);
}

/* fp32_tile's shape for int8 codes: each 8 codes become floats once for the tile's `nr` (1 to 3)
 * activation rows, not once per row (see kernels_avx512.c). */
static inline __attribute__((always_inline)) void int8_tile(const float *x, const int8_t *w,
                                                            const uint16_t *scales, float *y,
                                                            long in, long out, const int nr) {
    __m256 acc[4][3];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 3; j++) acc[k][j] = _mm256_setzero_ps();
    const int8_t *ahead = w + 4 * in * tiles_ahead(4 * in);
    for (long i = 0; i < in; i += 8) {
        if (i % 64 == 0)
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)(ahead + k * in + i), _MM_HINT_T0);
        __m256 xv[3];
        for (int j = 0; j < nr; j++) xv[j] = _mm256_loadu_ps(x + j * in + i);
        for (int k = 0; k < 4; k++) {
            __m256 wv = int8x8_to_float(w + k * in + i);
            for (int j = 0; j < nr; j++) acc[k][j] = _mm256_fmadd_ps(wv, xv[j], acc[k][j]);
        }
    }
    __m128 scale = _mm_set_ps(bf16_to_float(scales[3]), bf16_to_float(scales[2]),
                              bf16_to_float(scales[1]), bf16_to_float(scales[0]));
    for (int j = 0; j < nr; j++)
        _mm_storeu_ps(y + j * out, _mm_mul_ps(scale, sum4(acc[0][j], acc[1][j], acc[2][j], acc[3][j])));
}

/* W: codes [out, in] int8 and one bf16 scale per output row; `in` a multiple of 32. Output rows
 * in tiles of 4 (the last out % 4 one at a time); a row's result does not depend on the others. */
void int8_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                 long rows, long in, long out, int threads) {
    long tiled = out - out % 4;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o += 4) {
        if (o < tiled) {
            const int8_t *w = codes + o * in;
            long r = 0;
            for (; r + 3 <= rows; r += 3) int8_tile(x + r * in, w, scales + o, y + r * out + o, in, out, 3);
            float *yr = y + r * out + o;
            if (rows - r == 2) int8_tile(x + r * in, w, scales + o, yr, in, out, 2);
            if (rows - r == 1) int8_tile(x + r * in, w, scales + o, yr, in, out, 1);
            continue;
        }
        for (long k = o; k < out; k++) {
            const int8_t *w = codes + k * in;
            for (long r = 0; r < rows; r++) {
                __m256 sum = _mm256_setzero_ps();
                for (long i = 0; i < in; i += 8)
                    sum = _mm256_fmadd_ps(int8x8_to_float(w + i), _mm256_loadu_ps(x + r * in + i), sum);
                y[r * out + k] = bf16_to_float(scales[k]) * sum8(sum);
            }
        }
    }
}

/* One row of int8 codes against `nr` (1 or 2) activation rows, for int8_row_linear: the codes as
 * one sequential stream, each activation row with INT8_CHAINS sums taking turns over successive 8
 * codes (see kernels_avx512.c). 2 rows keep 8 sums in registers, which AVX2 has 16 of. */
#define INT8_CHAINS 4
static inline __attribute__((always_inline)) void int8_row(const float *x, const int8_t *w,
                                                           float scale, float *y, long in,
                                                           long y_stride, const int nr) {
    __m256 acc[2][INT8_CHAINS];
    for (int j = 0; j < nr; j++)
        for (int c = 0; c < INT8_CHAINS; c++) acc[j][c] = _mm256_setzero_ps();
    for (long i = 0; i < in; i += 8 * INT8_CHAINS) { /* in % 32 == 0 */
        if (i % 64 == 0) _mm_prefetch((const char *)(w + i + PREFETCH_AHEAD_BYTES), _MM_HINT_T0);
        for (int c = 0; c < INT8_CHAINS; c++) {
            __m256 wv = int8x8_to_float(w + i + 8 * c);
            for (int j = 0; j < nr; j++)
                acc[j][c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * in + i + 8 * c), acc[j][c]);
        }
    }
    for (int j = 0; j < nr; j++) {
        __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[j][0], acc[j][1]),
                                   _mm256_add_ps(acc[j][2], acc[j][3]));
        y[j * y_stride] = scale * sum8(sum);
    }
}

/* int8_linear's arguments, one code row at a time (see int8_row). */
void int8_row_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                     long rows, long in, long out, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o++) {
        const int8_t *w = codes + o * in;
        float scale = bf16_to_float(scales[o]);
        long r = 0;
        for (; r + 2 <= rows; r += 2) int8_row(x + r * in, w, scale, y + r * out + o, in, out, 2);
        if (r < rows) int8_row(x + r * in, w, scale, y + r * out + o, in, out, 1);
    }
}

/* W ~ (q - 8) * s + z per group of `group` inputs (a multiple of 32), q in 0..15.
 * packed [out, in / 2]: byte j holds code 2j in its low nibble and code 2j + 1 in its high one
 * (quant.pack_int4). scale_zero [in / group, out, 2] bf16.
 * With q_dot = sum q x over a group, the group adds s * q_dot + (z - 8 s) * sum x: the -8 and z
 * are applied once per group, not per weight. Returns 0, or -1 if out of memory. */
int int4_linear(const float *x, const uint8_t *packed, const uint16_t *scale_zero, float *y,
                long rows, long in, long out, long group, int threads) {
    long groups = in / group;
    float *x_split, *x_sums;
    if (int4_prepare(x, rows, in, group, &x_split, &x_sums)) return -1;
    const __m128i low_nibble = _mm_set1_epi8(15);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o++) {
        const uint8_t *w = packed + o * (in / 2);
        for (long r = 0; r < rows; r++) {
            const float *xr = x_split + r * in;
            __m256 total = _mm256_setzero_ps();
            float offsets = 0.0f;
            for (long g = 0; g < groups; g++) {
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (long i = g * group; i < (g + 1) * group; i += 32) {
                    __m128i bytes = _mm_loadu_si128((const __m128i *)(w + i / 2));
                    __m128i even = _mm_and_si128(bytes, low_nibble);
                    __m128i odd = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble);
                    a0 = _mm256_fmadd_ps(uint8x8_to_float(even), _mm256_loadu_ps(xr + i), a0);
                    a1 = _mm256_fmadd_ps(uint8x8_to_float(_mm_unpackhi_epi64(even, even)),
                                         _mm256_loadu_ps(xr + i + 8), a1);
                    a2 = _mm256_fmadd_ps(uint8x8_to_float(odd), _mm256_loadu_ps(xr + i + 16), a2);
                    a3 = _mm256_fmadd_ps(uint8x8_to_float(_mm_unpackhi_epi64(odd, odd)),
                                         _mm256_loadu_ps(xr + i + 24), a3);
                }
                const uint16_t *sz = scale_zero + (g * out + o) * 2;
                float scale = bf16_to_float(sz[0]), zero = bf16_to_float(sz[1]);
                __m256 q_dot = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
                total = _mm256_fmadd_ps(_mm256_set1_ps(scale), q_dot, total);
                offsets += (zero - 8 * scale) * x_sums[r * groups + g];
            }
            y[r * out + o] = sum8(total) + offsets;
        }
    }
    free(x_split);
    free(x_sums);
    return 0;
}

/* ---- int4 in PyTorch's CPU layout (see common.h) --------------------------------------------
 * A block of B (32 or 64) output rows: for each input k, B / 2 bytes, rows 0 to B/2 - 1 in the
 * low nibbles and the rest in the high ones. `nr` (1 or 2) activation rows keep B / 8 vectors of
 * a group's sums each in registers; the group's scales and offsets then go into totals kept in
 * memory, once per group. Each sum runs over k in order, so a row gets the same bits alone and
 * beside another. (common.h's plain-C tile, which this replaces here, kept its sums in memory
 * too: GCC stored them at every k, which made it several times slower than PyTorch's kernel.) */
static inline __attribute__((always_inline)) void int4_blocked_tile(
    const float *x, const float *x_sums, const uint8_t *bytes, const uint16_t *scale_zero, float *y,
    long in, long out, long o, long group, const int B, const int nr) {
    const __m128i low_nibble = _mm_set1_epi8(15);
    float total[2][64] = {{0}};
    long groups = in / group;
    for (long g = 0; g < groups; g++) {
        prefetch_next_scales(scale_zero, g, out, o, B);
        __m256 part[2][8];
        for (int r = 0; r < nr; r++)
            for (int v = 0; v < B / 8; v++) part[r][v] = _mm256_setzero_ps();
        for (long k = g * group; k < (g + 1) * group; k++) {
            __m256 xk[2];
            for (int r = 0; r < nr; r++) xk[r] = _mm256_broadcast_ss(x + r * in + k);
            for (int c = 0; c < B / 32; c++) {  /* 16 bytes: 32 rows */
                __m128i b = _mm_loadu_si128((const __m128i *)(bytes + k * (B / 2) + 16 * c));
                __m128i lo = _mm_and_si128(b, low_nibble);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low_nibble);
                const int v[4] = {2 * c, 2 * c + 1, B / 16 + 2 * c, B / 16 + 2 * c + 1};
                const __m128i nibbles[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
                for (int q = 0; q < 4; q++) {
                    __m256 w = uint8x8_to_float(nibbles[q]);
                    for (int r = 0; r < nr; r++) part[r][v[q]] = _mm256_fmadd_ps(w, xk[r], part[r][v[q]]);
                }
            }
        }
        const uint16_t *sz = scale_zero + (g * out + o) * 2;
        for (int v = 0; v < B / 8; v++) {
            /* 8 (scale, offset) bf16 pairs: one pair a 32-bit lane, the scale in its low half */
            __m256i pairs = _mm256_loadu_si256((const __m256i *)(sz + 16 * v));
            __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
            __m256 zero = _mm256_castsi256_ps(
                _mm256_and_si256(pairs, _mm256_set1_epi32((int)0xFFFF0000u)));
            __m256 offset = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), scale, zero);
            for (int r = 0; r < nr; r++) {
                __m256 t = _mm256_loadu_ps(total[r] + 8 * v);
                t = _mm256_fmadd_ps(scale, part[r][v], t);
                t = _mm256_fmadd_ps(offset, _mm256_set1_ps(x_sums[r * groups + g]), t);
                _mm256_storeu_ps(total[r] + 8 * v, t);
            }
        }
    }
    for (int r = 0; r < nr; r++) memcpy(y + r * out + o, total[r], B * sizeof(float));
}

