/* Included once by common.h, after decode_ops.h, so every kernel variant exports these. */
/* ---- a whole decode step's layers in one call (engine/cpu/fast_decode.py) ----------------------
 * Called layer by layer from Python, a step of SmolLM2-135M made 270 calls through ctypes, about
 * 1.5 us each: half a millisecond a step in which the memory stream stood still. Here the loop
 * over the layers runs in C; a matmul that its layer runs on another path (PyTorch's) calls back
 * into Python. The order of operations is engine/layers.py's, as in decode_ops.h. */

/* The variant defines these after including common.h. */
void int8_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y, long rows,
                 long in, long out, int threads);
void int8_row_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y,
                     long rows, long in, long out, int threads);
int w8a8_linear(const float *x, const int8_t *codes, const uint16_t *scales, float *y, long rows,
                long in, long out, int threads);
int int4_linear(const float *x, const uint8_t *packed, const uint16_t *scale_zero, float *y,
                long rows, long in, long out, long group, int threads);
int int4_blocked_linear(const float *x, const uint8_t *packed, const uint16_t *scale_zero, float *y,
                        long rows, long in, long out, long group, long block, int threads);

/* How one matmul of the step runs; `id` names it to the Python callback for MATMUL_ELSEWHERE. */
enum {
    MATMUL_FP32,
    MATMUL_FP32_PACKED,
    MATMUL_INT8,
    MATMUL_INT8_ROW,
    MATMUL_INT8_MANY,
    MATMUL_W8A8,
    MATMUL_INT4,
    MATMUL_INT4_MANY,
    MATMUL_INT4_BLOCKED,
    MATMUL_INT4_BLOCKED_MANY,
    MATMUL_ELSEWHERE,
};

struct matmul_spec {
    int kind, id;
    const void *weight; /* fp32 weights (or their panels), int8 codes or packed int4 */
    const void *scales; /* int8 scales or int4 (scale, zero) pairs; NULL for fp32 */
    const float *bias;  /* or NULL */
    long in, out, group, block;
};

struct layer_spec {
    const float *norm1, *norm2;
    float eps1, eps2;
    struct matmul_spec qkv, out, gate_up, down;
};

typedef void (*matmul_elsewhere)(int id);

/* y [rows, out] = x [rows, in] @ W^T (+ bias). Returns 0, or -1 if a kernel could not allocate its
 * scratch buffers. */
int run_matmul(const struct matmul_spec *m, const float *x, float *y, long rows, int threads,
               matmul_elsewhere elsewhere) {
    int status = 0;
    switch (m->kind) {
    case MATMUL_FP32: fp32_linear(x, m->weight, y, rows, m->in, m->out, threads); break;
    case MATMUL_FP32_PACKED:
        fp32_packed_linear(x, m->weight, y, rows, m->in, m->out, threads);
        break;
    case MATMUL_INT8: int8_linear(x, m->weight, m->scales, y, rows, m->in, m->out, threads); break;
    case MATMUL_INT8_ROW:
        int8_row_linear(x, m->weight, m->scales, y, rows, m->in, m->out, threads);
        break;
    case MATMUL_W8A8:
        status = w8a8_linear(x, m->weight, m->scales, y, rows, m->in, m->out, threads);
        break;
    case MATMUL_INT8_MANY:
        status = int8_linear_many(x, m->weight, m->scales, y, rows, m->in, m->out, threads);
        break;
    case MATMUL_INT4:
        status = int4_linear(x, m->weight, m->scales, y, rows, m->in, m->out, m->group, threads);
        break;
    case MATMUL_INT4_MANY:
        status = int4_linear_many(x, m->weight, m->scales, y, rows, m->in, m->out, m->group, threads);
        break;
    case MATMUL_INT4_BLOCKED:
        status = int4_blocked_linear(x, m->weight, m->scales, y, rows, m->in, m->out, m->group,
                                     m->block, threads);
        break;
    case MATMUL_INT4_BLOCKED_MANY:
        status = int4_blocked_linear_many(x, m->weight, m->scales, y, rows, m->in, m->out,
                                          m->group, m->block, threads);
        break;
    default: elsewhere(m->id); return 0; /* the callback writes y, bias included */
    }
    if (m->bias != NULL) add_into(y, m->bias, m->out, rows);
    return status;
}

/* Every layer of a one-token step for `rows` sequences, row r at positions[r], then the final
 * norm, on the fast path's buffers (x [rows, d] is the residual stream; h, qkv, attn, delta,
 * gate_up and act as their names say). cos and sin are the rotary tables [positions, head_dim].
 * The caches hold `layer_stride` floats per layer, in blocks through `tables` [rows,
 * table_width] (decode_attention.h's layout). Leaves the output head's input in h. Returns 0, or
 * -1 as run_matmul. */
int decode_layers(const struct layer_spec *layers, long n_layers, const float *final_norm,
                  float final_eps, float *x, float *h, float *qkv, float *attn, float *delta,
                  float *gate_up, float *act, const float *cos, const float *sin, float *k_cache,
                  float *v_cache, long layer_stride, const long *positions, const long *tables,
                  long table_width, long block_size, long heads, long kv_heads, long head_dim,
                  long d, long d_ff, float *scratch, long rows, int threads,
                  matmul_elsewhere elsewhere) {
    const float *residual = NULL; /* the first norm has nothing to add */
    for (long i = 0; i < n_layers; i++) {
        const struct layer_spec *layer = layers + i;
        float *k_layer = k_cache + i * layer_stride, *v_layer = v_cache + i * layer_stride;
        add_rmsnorm(x, residual, layer->norm1, h, rows, d, layer->eps1, threads);
        if (run_matmul(&layer->qkv, h, qkv, rows, threads, elsewhere)) return -1;
        rope_and_store(qkv, cos, sin, heads, kv_heads, head_dim, k_layer, v_layer, positions,
                       tables, table_width, block_size, rows, threads);
        attend_one(qkv, k_layer, v_layer, attn, heads, kv_heads, head_dim, positions, tables,
                   table_width, block_size, scratch, threads, rows);
        if (run_matmul(&layer->out, attn, delta, rows, threads, elsewhere)) return -1;
        add_rmsnorm(x, delta, layer->norm2, h, rows, d, layer->eps2, threads);
        if (run_matmul(&layer->gate_up, h, gate_up, rows, threads, elsewhere)) return -1;
        silu_mul(gate_up, act, d_ff, rows, threads);
        if (run_matmul(&layer->down, act, delta, rows, threads, elsewhere)) return -1;
        residual = delta;
    }
    add_rmsnorm(x, residual, final_norm, h, rows, d, final_eps, threads);
    return 0;
}
