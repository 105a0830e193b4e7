/* The elementwise phases of the layer stack (gguf_stack.h) in one ISA copy (included by each, after
 * gguf_q8_prep.h): a linear layer's input into Q8Blocks, and RoPE with the cache writes. Items are
 * independent and computed whole by one thread, each by the same code in every copy (explicit fmaf,
 * no sums across items): the split among threads and the ISA never change a bit. */
#ifndef STACK_MAX_HEAD_DIM
#define STACK_MAX_HEAD_DIM 512 /* the widest head the stack rotates */
#endif

/* items [i0, i1) of rows x blocks (item m * nblk + g: block g of row m) of a linear layer's input:
 * x (row stride ldx) with the RMSNorm `norm` (or none), or with silu: silu(x[:K]) * x[K:2K] */
Q8_TARGET static void Q8(prep_items)(const float* x, int64_t ldx, const float* norm, float eps, int silu,
                                     int64_t K, int64_t nblk, int64_t i0, int64_t i1, Q8Block* xq) {
    int64_t row = -1;
    float inv = 1.0f;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t m = i / nblk, g = i % nblk;
        const float* xr = x + m * ldx;
        if (silu) {
            Q8(prep_block_silu)(xr, xr + K, K, g, xq + i);
            continue;
        }
        if (norm != NULL && m != row) inv = Q8(row_inv)(xr, K, eps), row = m;
        Q8(prep_block)(xr, norm, inv, K, g, xq + i);
    }
}

/* one head of D values rotated in place: x[d] cos[d] + x[(d + D / 2) % D] sin[d] (sin signed as
 * model.rope_tables gives it), as fmaf(x[rot], sin, x cos) */
Q8_IN void Q8(rope_head)(float* x, const float* cos, const float* sin, int64_t D, float* tmp) {
    const int64_t half = D / 2;
    memcpy(tmp, x, sizeof(float) * (size_t)D);
    for (int64_t d = 0; d < half; d++) x[d] = fmaf(tmp[d + half], sin[d], tmp[d] * cos[d]);
    for (int64_t d = half; d < D; d++) x[d] = fmaf(tmp[d - half], sin[d], tmp[d] * cos[d]);
}

/* items [i0, i1) of rows x (H + 2 KV) heads of the fused q|k|v output (row stride ldq): q heads rotated
 * in place; k heads rotated and written to their cache slot, v heads copied to theirs (caches
 * [KV, S, D]). cos / sin: the tables [positions, D]; row m's position is row_len[m] - 1. */
Q8_TARGET static void Q8(rope_items)(float* qkv, int64_t ldq, const float* cos, const float* sin,
                                     const int32_t* row_len, const int64_t* slots, float* kc, float* vc,
                                     int64_t S, int64_t H, int64_t KV, int64_t D, int64_t i0, int64_t i1) {
    float tmp[STACK_MAX_HEAD_DIM];
    const int64_t heads = H + 2 * KV;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t m = i / heads, h = i % heads;
        float* x = qkv + m * ldq + h * D;
        const int64_t at = ((int64_t)row_len[m] - 1) * D;
        if (h < H + KV) Q8(rope_head)(x, cos + at, sin + at, D, tmp);
        if (h >= H) {
            const int64_t kvh = h < H + KV ? h - H : h - H - KV;
            float* cache = (h < H + KV ? kc : vc) + (kvh * S + slots[m]) * D;
            memcpy(cache, x, sizeof(float) * (size_t)D);
        }
    }
}
