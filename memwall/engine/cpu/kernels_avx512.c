/* memwall's CPU kernels for x86 CPUs with AVX-512 (F, BW, VL, DQ): the AVX2 kernels of
 * kernels_avx2.c with 16 floats per register, twice the registers, and masked loads for
 * widths that are not a multiple of 16.
 *
 * The int8/int4 kernels still turn the codes into floats and multiply fp32 activations. VNNI's
 * integer dot products would need the activations rounded to int8 as well (llama.cpp does that);
 * at one to a few rows the float conversion already keeps up with memory, so the activations stay
 * exact and the results match the reference path to rounding.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void fp32_block(const float *x, const float *w, float *y, long rows, long in, long y_stride,
                       long n_out);
#define HAS_INT4_BLOCKED_TILE   /* below, with intrinsics */
#define HAS_W8A8_LINEAR         /* below, with VNNI where the CPU has it */
#define HAS_FP32_PANEL_ROWS     /* below, with intrinsics */
#include "common.h"

/* The sums of the lanes of a, b, c and d, in that order: the four reductions share their
 * shuffles (about a third of the instructions of four separate ones, which at several activation
 * rows were a fifth of a tile's work). */
static inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512d ab2 = _mm512_castps_pd(ab), cd2 = _mm512_castps_pd(cd);
    __m512 abcd = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ab2, cd2)),
                                _mm512_castpd_ps(_mm512_unpackhi_pd(ab2, cd2)));
    __m256 half = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
    return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

/* 4 output rows x `nr` (1 to 4) activation rows: 16 sums in registers, each weight vector used
 * for every row of the tile. Each iteration asks for the same cache line of the next tile's 4
 * weight rows, one tile ahead. */
static inline __attribute__((always_inline)) void fp32_tile(const float *x, const float *w, float *y,
                                                            long in, long y_stride, const int nr) {
    __m512 acc[4][4];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 4; j++) acc[k][j] = _mm512_setzero_ps();
    long i = 0;
    for (; i + 16 <= in; i += 16) {
        for (int k = 4; k < 8; k++) _mm_prefetch((const char *)(w + k * in + i), _MM_HINT_T0);
        __m512 xv[4];
        for (int j = 0; j < nr; j++) xv[j] = _mm512_loadu_ps(x + j * in + i);
        for (int k = 0; k < 4; k++) {
            __m512 wv = _mm512_loadu_ps(w + k * in + i);
            for (int j = 0; j < nr; j++) acc[k][j] = _mm512_fmadd_ps(wv, xv[j], acc[k][j]);
        }
    }
    if (i < in) {
        __mmask16 tail = (__mmask16)((1u << (in - i)) - 1);
        __m512 xv[4];
        for (int j = 0; j < nr; j++) xv[j] = _mm512_maskz_loadu_ps(tail, x + j * in + i);
        for (int k = 0; k < 4; k++) {
            __m512 wv = _mm512_maskz_loadu_ps(tail, w + k * in + i);
            for (int j = 0; j < nr; j++) acc[k][j] = _mm512_fmadd_ps(wv, xv[j], acc[k][j]);
        }
    }
    for (int j = 0; j < nr; j++)
        _mm_storeu_ps(y + j * y_stride, sum4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]));
}

/* 1 to 4 activation rows (decode, small batches): one weight row at a time against the `nr`
 * rows of x, so that the weights are read as one sequential stream, with a steady trickle of
 * prefetches (each iteration asks for the cache line two weight rows ahead). The sums are reduced
 * with `sum4` in the 4x4 tile's order, so a row gets the same bits whichever tile made it.
 * Fewer weight rows at a time make a steadier stream, and at 1 to 4 activation rows the step is
 * bound by that stream, so one weight row beats 2, and 2 beat 4. With more activation rows the
 * arithmetic per weight grows and the 4x4 tile's reuse of each loaded weight across rows catches
 * up (about even at 6 rows, ahead at 8), so 5 rows and more keep the 4x4 tile. */
#define STREAM_MAX_ROWS 4
static inline __attribute__((always_inline)) void fp32_stream_tile(const float *x, const float *w,
                                                                   float *y, long in, long y_stride,
                                                                   const int nr) {
    __m512 acc[STREAM_MAX_ROWS];
    for (int j = 0; j < nr; j++) acc[j] = _mm512_setzero_ps();
    const float *ahead = w + 2 * in;
    long i = 0;
    for (; i + 16 <= in; i += 16) {
        _mm_prefetch((const char *)(ahead + i), _MM_HINT_T0);
        __m512 wv = _mm512_loadu_ps(w + i);
        for (int j = 0; j < nr; j++)
            acc[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + j * in + i), acc[j]);
    }
    if (i < in) {
        __mmask16 tail = (__mmask16)((1u << (in - i)) - 1);
        __m512 wv = _mm512_maskz_loadu_ps(tail, w + i);
        for (int j = 0; j < nr; j++)
            acc[j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(tail, x + j * in + i), acc[j]);
    }
    const __m512 zero = _mm512_setzero_ps();
    float sums[4];
    _mm_storeu_ps(sums, sum4(acc[0], nr > 1 ? acc[1] : zero, nr > 2 ? acc[2] : zero,
                             nr > 3 ? acc[3] : zero));
    for (int j = 0; j < nr; j++) y[j * y_stride] = sums[j];
}

static void fp32_block(const float *x, const float *w, float *y, long rows, long in, long y_stride,
                       long n_out) {
    if (rows <= STREAM_MAX_ROWS) {
        for (long o = 0; o < n_out; o++) { /* the row count as a constant, so the loops unroll */
            if (rows == 1) fp32_stream_tile(x, w + o * in, y + o, in, y_stride, 1);
            if (rows == 2) fp32_stream_tile(x, w + o * in, y + o, in, y_stride, 2);
            if (rows == 3) fp32_stream_tile(x, w + o * in, y + o, in, y_stride, 3);
            if (rows == 4) fp32_stream_tile(x, w + o * in, y + o, in, y_stride, 4);
        }
        return;
    }
    for (long o = 0; o < n_out; o += 4) {
        const float *wo = w + o * in;
        long r = 0;
        for (; r + 4 <= rows; r += 4) fp32_tile(x + r * in, wo, y + r * y_stride + o, in, y_stride, 4);
        float *yr = y + r * y_stride + o;
        if (rows - r == 3) fp32_tile(x + r * in, wo, yr, in, y_stride, 3);
        if (rows - r == 2) fp32_tile(x + r * in, wo, yr, in, y_stride, 2);
        if (rows - r == 1) fp32_tile(x + r * in, wo, yr, in, y_stride, 1);
    }
}

/* The "packed" path (common.h): `nr` (1 to 12) activation rows against inputs k0 to k1 of one
 * panel of 32 outputs, 2 x nr sums in registers, taken from and left in `acc` [nr][PANEL]. */
static inline __attribute__((always_inline)) void fp32_panel_block(const float *x, const float *p,
                                                                   float *acc, long in, long k0,
                                                                   long k1, const int nr) {
    __m512 acc_lo[12], acc_hi[12];
    for (int r = 0; r < nr; r++) {
        acc_lo[r] = _mm512_loadu_ps(acc + r * PANEL);
        acc_hi[r] = _mm512_loadu_ps(acc + r * PANEL + 16);
    }
    for (long k = k0; k < k1; k++) {
        const float *pk = p + k * PANEL;
        _mm_prefetch((const char *)(pk + PANEL_AHEAD_FLOATS), _MM_HINT_T0);
        _mm_prefetch((const char *)(pk + PANEL_AHEAD_FLOATS + 16), _MM_HINT_T0);
        __m512 w_lo = _mm512_loadu_ps(pk), w_hi = _mm512_loadu_ps(pk + 16);
        for (int r = 0; r < nr; r++) {
            __m512 xk = _mm512_set1_ps(x[r * in + k]);
            acc_lo[r] = _mm512_fmadd_ps(w_lo, xk, acc_lo[r]);
            acc_hi[r] = _mm512_fmadd_ps(w_hi, xk, acc_hi[r]);
        }
    }
    for (int r = 0; r < nr; r++) {
        _mm512_storeu_ps(acc + r * PANEL, acc_lo[r]);
        _mm512_storeu_ps(acc + r * PANEL + 16, acc_hi[r]);
    }
}

/* 12 rows at a time, then 8, 4, 2 and 1 (each row count a constant, so the loops unroll). At 16
 * rows, streamed, 12 + 4 took 0.71-0.80x the 4x4 tile's time and 8 + 8 0.76-0.80x; panels 16
 * wide (one register x 16 rows) streamed as fast but computed 1.1x slower from cache. */
static void fp32_panel_rows(const float *x, const float *p, float *acc, long in, long k0, long k1,
                            long n) {
    long r = 0;
#define MEMWALL_PANEL_ROWS(nr) fp32_panel_block(x + r * in, p, acc + r * PANEL, in, k0, k1, nr)
    for (; r + 12 <= n; r += 12) MEMWALL_PANEL_ROWS(12);
    if (n - r >= 8) { MEMWALL_PANEL_ROWS(8); r += 8; }
    if (n - r >= 4) { MEMWALL_PANEL_ROWS(4); r += 4; }
    if (n - r >= 2) { MEMWALL_PANEL_ROWS(2); r += 2; }
    if (n - r >= 1) MEMWALL_PANEL_ROWS(1);
#undef MEMWALL_PANEL_ROWS
}

static inline __m512 int8x16_to_float(const int8_t *codes) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)codes)));
}

/* 4 output rows of int8 codes x `nr` (1 to 4) activation rows: fp32_tile's shape, with each 16
 * codes turned into floats once for every activation row of the tile (a kernel that converted
 * them once per row was compute-bound from 2 rows: 47 / 73 / 174 us at 1 / 4 / 8 rows for
 * 3072x576). Codes are requested PREFETCH_AHEAD_BYTES ahead, a cache line per 64 codes. */
static inline __attribute__((always_inline)) void int8_tile(const float *x, const int8_t *w,
                                                            const uint16_t *scales, float *y,
                                                            long in, long y_stride, const int nr) {
    __m512 acc[4][4];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 4; j++) acc[k][j] = _mm512_setzero_ps();
    const int8_t *ahead = w + 4 * in * tiles_ahead(4 * in);
    for (long i = 0; i < in; i += 16) {
        if (i % 64 == 0)
            for (int k = 0; k < 4; k++) _mm_prefetch((const char *)(ahead + k * in + i), _MM_HINT_T0);
        __m512 xv[4];
        for (int j = 0; j < nr; j++) xv[j] = _mm512_loadu_ps(x + j * in + i);
        for (int k = 0; k < 4; k++) {
            __m512 wv = int8x16_to_float(w + k * in + i);
            for (int j = 0; j < nr; j++) acc[k][j] = _mm512_fmadd_ps(wv, xv[j], acc[k][j]);
        }
    }
    __m128 scale = _mm_set_ps(bf16_to_float(scales[3]), bf16_to_float(scales[2]),
                              bf16_to_float(scales[1]), bf16_to_float(scales[0]));
    for (int j = 0; j < nr; j++)
        _mm_storeu_ps(y + j * y_stride,
                      _mm_mul_ps(scale, sum4(acc[0][j], acc[1][j], acc[2][j], acc[3][j])));
}

/* codes [out, in] int8, one bf16 scale per output row; `in` a multiple of 32. Output rows in
 * tiles of 4 (the last out % 4 one at a time); a row's result does not depend on the others. */
void int8_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                 long rows, long in, long out, int threads) {
    long tiled = out - out % 4;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o += 4) {
        if (o < tiled) {
            const int8_t *w = codes + o * in;
            long r = 0;
            for (; r + 4 <= rows; r += 4) int8_tile(x + r * in, w, scales + o, y + r * out + o, in, out, 4);
            float *yr = y + r * out + o;
            if (rows - r == 3) int8_tile(x + r * in, w, scales + o, yr, in, out, 3);
            if (rows - r == 2) int8_tile(x + r * in, w, scales + o, yr, in, out, 2);
            if (rows - r == 1) int8_tile(x + r * in, w, scales + o, yr, in, out, 1);
            continue;
        }
        for (long k = o; k < out; k++) {
            const int8_t *w = codes + k * in;
            for (long r = 0; r < rows; r++) {
                __m512 sum = _mm512_setzero_ps();
                for (long i = 0; i < in; i += 16)
                    sum = _mm512_fmadd_ps(int8x16_to_float(w + i), _mm512_loadu_ps(x + r * in + i), sum);
                y[r * out + k] = bf16_to_float(scales[k]) * _mm512_reduce_add_ps(sum);
            }
        }
    }
}

/* One row of int8 codes against `nr` (1 to 4) activation rows, for int8_row_linear. The codes
 * are read as one sequential stream, asked for PREFETCH_AHEAD_BYTES ahead, and each 16 become
 * floats once for all nr rows. A row's sum would be one chain of dependent multiply-adds, 16
 * codes per FMA latency, which can be slower than memory delivers them; so each activation row
 * keeps INT8_CHAINS sums that take turns over successive 16 codes. */
#define INT8_CHAINS 4
static inline __attribute__((always_inline)) void int8_row(const float *x, const int8_t *w,
                                                           float scale, float *y, long in,
                                                           long y_stride, const int nr) {
    __m512 acc[4][INT8_CHAINS];
    for (int j = 0; j < nr; j++)
        for (int c = 0; c < INT8_CHAINS; c++) acc[j][c] = _mm512_setzero_ps();
    long i = 0;
    for (; i + 16 * INT8_CHAINS <= in; i += 16 * INT8_CHAINS) {
        _mm_prefetch((const char *)(w + i + PREFETCH_AHEAD_BYTES), _MM_HINT_T0);
        for (int c = 0; c < INT8_CHAINS; c++) {
            __m512 wv = int8x16_to_float(w + i + 16 * c);
            for (int j = 0; j < nr; j++)
                acc[j][c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + j * in + i + 16 * c), acc[j][c]);
        }
    }
    for (int c = 0; i < in; i += 16, c++) { /* in % 64 is 0 or 32 */
        __m512 wv = int8x16_to_float(w + i);
        for (int j = 0; j < nr; j++)
            acc[j][c] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + j * in + i), acc[j][c]);
    }
    for (int j = 0; j < nr; j++) {
        __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[j][0], acc[j][1]),
                                   _mm512_add_ps(acc[j][2], acc[j][3]));
        y[j * y_stride] = scale * _mm512_reduce_add_ps(sum);
    }
}

/* int8_linear's arguments, one code row at a time (see int8_row): a single stream of codes, at
 * the price of loading each activation once per code row rather than once per 4. */
void int8_row_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                     long rows, long in, long out, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o++) {
        const int8_t *w = codes + o * in;
        float scale = bf16_to_float(scales[o]);
        long r = 0;
        for (; r + 4 <= rows; r += 4) int8_row(x + r * in, w, scale, y + r * out + o, in, out, 4);
        float *yr = y + r * out + o;
        if (rows - r == 3) int8_row(x + r * in, w, scale, yr, in, out, 3);
        if (rows - r == 2) int8_row(x + r * in, w, scale, yr, in, out, 2);
        if (rows - r == 1) int8_row(x + r * in, w, scale, yr, in, out, 1);
    }
}

/* W ~ (q - 8) * s + z per group of `group` inputs (a multiple of 32); packed [out, in / 2] as
 * quant.pack_int4 writes it; scale_zero [in / group, out, 2] bf16. As in kernels_avx2.c, a group
 * adds s * sum(q x) + (z - 8 s) * sum(x). Two running totals (even and odd groups) so that one
 * group's multiply-add need not wait for the previous one's. Returns 0, or -1 if out of memory. */
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
            __m512 totals[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
            float offsets = 0.0f;
            for (long g = 0; g < groups; g++) {
                __m512 q_dot = _mm512_setzero_ps();
                for (long i = g * group; i < (g + 1) * group; i += 32) {
                    __m128i bytes = _mm_loadu_si128((const __m128i *)(w + i / 2));
                    __m128i even = _mm_and_si128(bytes, low_nibble);
                    __m128i odd = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble);
                    q_dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(even)),
                                            _mm512_loadu_ps(xr + i), q_dot);
                    q_dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(odd)),
                                            _mm512_loadu_ps(xr + i + 16), q_dot);
                }
                const uint16_t *sz = scale_zero + (g * out + o) * 2;
                float scale = bf16_to_float(sz[0]), zero = bf16_to_float(sz[1]);
                totals[g & 1] = _mm512_fmadd_ps(_mm512_set1_ps(scale), q_dot, totals[g & 1]);
                offsets += (zero - 8 * scale) * x_sums[r * groups + g];
            }
            y[r * out + o] = _mm512_reduce_add_ps(_mm512_add_ps(totals[0], totals[1])) + offsets;
        }
    }
    free(x_split);
    free(x_sums);
    return 0;
}

/* ---- int4 in PyTorch's CPU layout (see common.h): lanes are output rows -------------------- */

/* The bf16 (scale, offset) pairs of 16 consecutive output rows -> two vectors of floats. */
static inline void scale_zero16(const uint16_t *pairs, __m512 *scale, __m512 *zero) {
    __m512i both = _mm512_loadu_si512((const void *)pairs);  /* 16 x (s | z << 16) */
    *scale = _mm512_castsi512_ps(_mm512_slli_epi32(both, 16));
    *zero = _mm512_castsi512_ps(_mm512_and_si512(both, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* The decode case written out: one activation row, blocks of 64, two inputs per iteration into
 * separate sums (the compiler keeps all of it in registers, which the general tile does not). */
static void int4_b64_one_row(const float *x, const float *x_sums, const uint8_t *bytes,
                             const uint16_t *scale_zero, float *y, long in, long out, long o,
                             long group) {
    const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 t0 = _mm512_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
    long groups = in / group;
    for (long g = 0; g < groups; g++) {
        prefetch_next_scales(scale_zero, g, out, o, 64);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (long k = g * group; k < (g + 1) * group; k += 2) {
            const uint8_t *p = bytes + k * 32;
            __m512i r0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
            __m512i r1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16)));
            __m512i r2 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 32)));
            __m512i r3 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 48)));
            __m512 xa = _mm512_set1_ps(x[k]), xb = _mm512_set1_ps(x[k + 1]);
            a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(r0, lut), xa, a0);
            a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(r1, lut), xa, a1);
            a2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(r0, 4), lut), xa, a2);
            a3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(r1, 4), lut), xa, a3);
            b0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(r2, lut), xb, b0);
            b1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(r3, lut), xb, b1);
            b2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(r2, 4), lut), xb, b2);
            b3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(r3, 4), lut), xb, b3);
        }
        const uint16_t *sz = scale_zero + (g * out + o) * 2;
        __m512 sum_x = _mm512_set1_ps(x_sums[g]), eight = _mm512_set1_ps(8.0f), scale, zero;
#define MEMWALL_APPLY(v, a, b, t)                                                        \
        scale_zero16(sz + 32 * v, &scale, &zero);                                        \
        t = _mm512_fmadd_ps(scale, _mm512_add_ps(a, b), t);                              \
        t = _mm512_fmadd_ps(_mm512_fnmadd_ps(eight, scale, zero), sum_x, t);
        MEMWALL_APPLY(0, a0, b0, t0)
        MEMWALL_APPLY(1, a1, b1, t1)
        MEMWALL_APPLY(2, a2, b2, t2)
        MEMWALL_APPLY(3, a3, b3, t3)
#undef MEMWALL_APPLY
    }
    _mm512_storeu_ps(y + o, t0);
    _mm512_storeu_ps(y + o + 16, t1);
    _mm512_storeu_ps(y + o + 32, t2);
    _mm512_storeu_ps(y + o + 48, t3);
}

/* One block of B (32 or 64) output rows from o, for nr (1 or 2) activation rows. Even and odd
 * inputs go to separate sums, so that consecutive multiply-adds do not wait on each other; the
 * order of additions is the same for any nr, so a row gets the same bits alone or batched. */
static inline __attribute__((always_inline)) void int4_blocked_tile(
    const float *x, const float *x_sums, const uint8_t *bytes, const uint16_t *scale_zero, float *y,
    long in, long out, long o, long group, const int B, const int nr) {
    if (B == 64 && nr == 1) {
        int4_b64_one_row(x, x_sums, bytes, scale_zero, y, in, out, o, group);
        return;
    }
    enum { V = 4 };  /* up to 64 rows: 4 vectors of 16 */
    const int nv = B / 16;
    __m512 total[2][V], part[2][2][V];  /* [row][even/odd input][vector] */
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < nv; v++) total[r][v] = _mm512_setzero_ps();
    /* permutexvar reads only an index's low 4 bits: it looks up a nibble's value directly. */
    const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    long groups = in / group;
    for (long g = 0; g < groups; g++) {
        prefetch_next_scales(scale_zero, g, out, o, B);
        for (int r = 0; r < nr; r++)
            for (int v = 0; v < nv; v++) part[r][0][v] = part[r][1][v] = _mm512_setzero_ps();
        for (long k = g * group; k < (g + 1) * group; k += 2) {
            for (int s = 0; s < 2; s++) {
                /* 16 bytes widened to 16 lanes: a lane's low nibble is row j, its high one row
                 * j + B / 2. */
                __m512 w[V];
                for (int h = 0; h < B / 32; h++) {
                    __m512i raw = _mm512_cvtepu8_epi32(
                        _mm_loadu_si128((const __m128i *)(bytes + (k + s) * (B / 2) + 16 * h)));
                    w[h] = _mm512_permutexvar_ps(raw, lut);
                    w[h + B / 32] = _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), lut);
                }
                for (int r = 0; r < nr; r++) {
                    __m512 xk = _mm512_set1_ps(x[r * in + k + s]);
                    for (int v = 0; v < nv; v++)
                        part[r][s][v] = _mm512_fmadd_ps(w[v], xk, part[r][s][v]);
                }
            }
        }
        const uint16_t *sz = scale_zero + (g * out + o) * 2;
        for (int v = 0; v < nv; v++) {
            __m512 scale, zero;
            scale_zero16(sz + 32 * v, &scale, &zero);
            __m512 offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), scale, zero);  /* z - 8 s */
            for (int r = 0; r < nr; r++) {
                __m512 q_dot = _mm512_add_ps(part[r][0][v], part[r][1][v]);
                total[r][v] = _mm512_fmadd_ps(scale, q_dot, total[r][v]);
                total[r][v] = _mm512_fmadd_ps(offset, _mm512_set1_ps(x_sums[r * groups + g]),
                                              total[r][v]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(y + r * out + o + 16 * v, total[r][v]);
}

/* ---- int8 weights and int8 activations with VNNI (see common.h) ------------------------------ */

/* sum4 for int32 lanes: the four totals of a, b, c and d (exact, in any order). */
static inline __m128i sum4_epi32(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i abcd = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

/* 64 bytes (or the first 32, `take`) of 4 code rows against `nr` rows of activation codes. */
__attribute__((target("avx512vnni"))) static inline __attribute__((always_inline)) void w8a8_step(
    __m512i acc[4][4], const int8_t *xq, const int8_t *w, long in, long i, __mmask64 take,
    const int nr) {
    const __m512i top_bit = _mm512_set1_epi8((char)0x80);
    __m512i xv[4];
    for (int j = 0; j < nr; j++) xv[j] = _mm512_maskz_loadu_epi8(take, xq + j * in + i);
    for (int k = 0; k < 4; k++) {
        __m512i u = _mm512_xor_si512(_mm512_maskz_loadu_epi8(take, w + k * in + i), top_bit);
        for (int j = 0; j < nr; j++) acc[k][j] = _mm512_dpbusd_epi32(acc[k][j], u, xv[j]);
    }
}

/* vpdpbusd multiplies 64 unsigned bytes by 64 signed ones and adds each 4 products into one of
 * 16 int32 sums. The codes are signed, so they go in with 128 added (an XOR of the top bit), and
 * 128 times the sum of the row's activation codes comes off at the end. 4 code rows x `nr` (1 to
 * 4) activation rows per tile, as int8_tile. */
__attribute__((target("avx512vnni"))) static inline __attribute__((always_inline)) void w8a8_tile(
    const int8_t *xq, const int32_t *xq_sum, const float *x_scale, const int8_t *w,
    const uint16_t *scales, float *y, long in, long y_stride, const int nr) {
    __m512i acc[4][4];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 4; j++) acc[k][j] = _mm512_setzero_si512();
    const int8_t *ahead = w + 4 * in * tiles_ahead(4 * in);
    long i = 0;
    for (; i + 64 <= in; i += 64) {
        for (int k = 0; k < 4; k++) _mm_prefetch((const char *)(ahead + k * in + i), _MM_HINT_T0);
        w8a8_step(acc, xq, w, in, i, ~(__mmask64)0, nr);
    }
    if (i < in) w8a8_step(acc, xq, w, in, i, ((__mmask64)1 << (in - i)) - 1, nr); /* 32 left */
    __m128 w_scale = _mm_set_ps(bf16_to_float(scales[3]), bf16_to_float(scales[2]),
                                bf16_to_float(scales[1]), bf16_to_float(scales[0]));
    for (int j = 0; j < nr; j++) {
        __m128i dots = _mm_sub_epi32(sum4_epi32(acc[0][j], acc[1][j], acc[2][j], acc[3][j]),
                                     _mm_set1_epi32(128 * xq_sum[j]));
        __m128 scale = _mm_mul_ps(w_scale, _mm_set1_ps(x_scale[j])); /* as w8a8_one's order */
        _mm_storeu_ps(y + j * y_stride, _mm_mul_ps(scale, _mm_cvtepi32_ps(dots)));
    }
}

__attribute__((target("avx512vnni"))) static void w8a8_vnni(const int8_t *xq, const float *x_scale,
                                                             const int32_t *xq_sum,
                                                             const int8_t *codes,
                                                             const uint16_t *scales, float *y,
                                                             long rows, long in, long out,
                                                             int threads) {
    long tiled = out - out % 4;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < tiled; o += 4) {
        const int8_t *w = codes + o * in;
        long r = 0;
        for (; r + 4 <= rows; r += 4)
            w8a8_tile(xq + r * in, xq_sum + r, x_scale + r, w, scales + o, y + r * out + o, in, out, 4);
        const int8_t *xr = xq + r * in;
        float *yr = y + r * out + o;
        if (rows - r == 3) w8a8_tile(xr, xq_sum + r, x_scale + r, w, scales + o, yr, in, out, 3);
        if (rows - r == 2) w8a8_tile(xr, xq_sum + r, x_scale + r, w, scales + o, yr, in, out, 2);
        if (rows - r == 1) w8a8_tile(xr, xq_sum + r, x_scale + r, w, scales + o, yr, in, out, 1);
    }
    for (long o = tiled; o < out; o++) /* the last out % 4 rows */
        for (long r = 0; r < rows; r++)
            y[r * out + o] = w8a8_one(codes + o * in, xq + r * in, in, bf16_to_float(scales[o]),
                                      x_scale[r]);
}

int w8a8_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y, long rows,
                long in, long out, int threads) {
    static int features = -1;
    if (features < 0) features = memwall_cpu_features();
    int8_t *xq;
    float *x_scale;
    int32_t *xq_sum;
    if (quantize_activations(x, rows, in, &xq, &x_scale, &xq_sum)) return -1;
    if (features & 4)
        w8a8_vnni(xq, x_scale, xq_sum, codes, scales, y, rows, in, out, threads);
    else
        w8a8_plain(xq, x_scale, codes, scales, y, rows, in, out, threads);
    free(x_scale);
    return 0;
}
