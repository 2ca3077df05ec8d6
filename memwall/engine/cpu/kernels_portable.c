/* memwall's CPU kernels in plain C, for any CPU (ARM, Apple Silicon, x86 without AVX2).
 *
 * The same products as kernels_avx2.c without intrinsics. Each sum is kept in LANES separate
 * partial sums, one per position modulo LANES: the compiler can turn those loops into vector
 * instructions (NEON, SSE) without reordering any single sum, so the results stay deterministic.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8

static void fp32_block(const float *x, const float *w, float *y, long rows, long in, long y_stride,
                       long n_out);
#include "common.h"

static inline float lane_total(const float *lanes) {
    float total = 0.0f;
    for (int l = 0; l < LANES; l++) total += lanes[l];
    return total;
}

/* `in` a multiple of 8. */
static void fp32_block(const float *x, const float *w, float *y, long rows, long in, long y_stride,
                       long n_out) {
    for (long k = 0; k < n_out; k++) {
        const float *wk = w + k * in;
        for (long r = 0; r < rows; r++) {
            const float *xr = x + r * in;
            float lanes[LANES] = {0};
            for (long i = 0; i < in; i += LANES)
                for (int l = 0; l < LANES; l++) lanes[l] += wk[i + l] * xr[i + l];
            y[r * y_stride + k] = lane_total(lanes);
        }
    }
}

void int8_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                 long rows, long in, long out, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o++) {
        const int8_t *w = codes + o * in;
        for (long r = 0; r < rows; r++) {
            const float *xr = x + r * in;
            float lanes[LANES] = {0};
            for (long i = 0; i < in; i += LANES)
                for (int l = 0; l < LANES; l++) lanes[l] += (float)w[i + l] * xr[i + l];
            y[r * out + o] = bf16_to_float(scales[o]) * lane_total(lanes);
        }
    }
}

/* The vector variants read one code row at a time here; the loop above already does, and its
 * sums do not depend on the other rows, so it serves both. */
void int8_row_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                     long rows, long in, long out, int threads) {
    int8_linear(x, codes, scales, y, rows, in, out, threads);
}

/* See kernels_avx2.c for the layout and the per-group algebra. x_split puts, per 32 inputs, the
 * 16 even-indexed values first, so the low nibbles of 16 bytes meet 16 consecutive floats. */
int int4_linear(const float *x, const uint8_t *packed, const uint16_t *scale_zero, float *y,
                long rows, long in, long out, long group, int threads) {
    long groups = in / group;
    float *x_split, *x_sums;
    if (int4_prepare(x, rows, in, group, &x_split, &x_sums)) return -1;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long o = 0; o < out; o++) {
        const uint8_t *w = packed + o * (in / 2);
        for (long r = 0; r < rows; r++) {
            const float *xr = x_split + r * in;
            float total = 0.0f;
            for (long g = 0; g < groups; g++) {
                float lanes[LANES] = {0};
                for (long i = g * group; i < (g + 1) * group; i += 32)
                    for (long b = 0; b < 16; b += LANES)
                        for (int l = 0; l < LANES; l++) {
                            uint8_t byte = w[i / 2 + b + l];
                            lanes[l] += (float)(byte & 15) * xr[i + b + l] +
                                        (float)(byte >> 4) * xr[i + 16 + b + l];
                        }
                const uint16_t *sz = scale_zero + (g * out + o) * 2;
                float scale = bf16_to_float(sz[0]), zero = bf16_to_float(sz[1]);
                total += scale * lane_total(lanes) + (zero - 8 * scale) * x_sums[r * groups + g];
            }
            y[r * out + o] = total;
        }
    }
    free(x_split);
    free(x_sums);
    return 0;
}
