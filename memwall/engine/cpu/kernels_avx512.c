/* memwall's CPU kernels for x86 CPUs with AVX-512 (F, BW, VL, DQ): the AVX2 kernels of
 * ../cpu_kernels.c with 16 floats per register, twice the registers, and masked loads for
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
#include "common.h"

/* 4 output rows x `nr` (1 to 4) activation rows: 16 sums in registers. */
static inline __attribute__((always_inline)) void fp32_tile(const float *x, const float *w, float *y,
                                                            long in, long y_stride, const int nr) {
    __m512 acc[4][4];
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 4; j++) acc[k][j] = _mm512_setzero_ps();
    long i = 0;
    for (; i + 16 <= in; i += 16) {
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
        for (int k = 0; k < 4; k++) y[j * y_stride + k] = _mm512_reduce_add_ps(acc[k][j]);
}

static void fp32_block(const float *x, const float *w, float *y, long rows, long in, long y_stride,
                       long n_out) {
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

static inline __m512 int8x16_to_float(const int8_t *codes) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)codes)));
}

/* codes [out, in] int8, one bf16 scale per output row; `in` a multiple of 32. */
void int8_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                 long rows, long in, long out, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o++) {
        const int8_t *w = codes + o * in;
        float scale = bf16_to_float(scales[o]);
        for (long r = 0; r < rows; r++) {
            const float *xr = x + r * in;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            long i = 0;
            for (; i + 64 <= in; i += 64) {
                a0 = _mm512_fmadd_ps(int8x16_to_float(w + i), _mm512_loadu_ps(xr + i), a0);
                a1 = _mm512_fmadd_ps(int8x16_to_float(w + i + 16), _mm512_loadu_ps(xr + i + 16), a1);
                a2 = _mm512_fmadd_ps(int8x16_to_float(w + i + 32), _mm512_loadu_ps(xr + i + 32), a2);
                a3 = _mm512_fmadd_ps(int8x16_to_float(w + i + 48), _mm512_loadu_ps(xr + i + 48), a3);
            }
            if (i < in) {  /* the last 32 */
                a0 = _mm512_fmadd_ps(int8x16_to_float(w + i), _mm512_loadu_ps(xr + i), a0);
                a1 = _mm512_fmadd_ps(int8x16_to_float(w + i + 16), _mm512_loadu_ps(xr + i + 16), a1);
            }
            y[r * out + o] = scale * _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1),
                                                                        _mm512_add_ps(a2, a3)));
        }
    }
}

/* W ~ (q - 8) * s + z per group of `group` inputs (a multiple of 32); packed [out, in / 2] as
 * quant.pack_int4 writes it; scale_zero [in / group, out, 2] bf16. As in ../cpu_kernels.c, a group
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
