/* One row of activations -> Q8Blocks (included by each ISA copy, Q8() naming it). Plain C that the
 * compiler vectorises for the copy's ISA: every step is either exact (max, integer sums) or one IEEE
 * operation per value (mul, div, sqrt, round to nearest even, an explicit fmaf), and the sum of
 * squares of the fused RMSNorm keeps 16 lanes each added by fma in increasing k then summed by
 * lane_sum, so every copy gives the same blocks. A block depends on its own values (and the row's
 * norm factor) only, so the layer stack (gguf_stack.h) shares a row's blocks out among threads. */

/* the RMSNorm factor of a row: 1 / sqrt(mean(x * x) + eps) */
Q8_IN float Q8(row_inv)(const float* x, int64_t K, float eps) {
    float s[16] = {0};
    for (int64_t k = 0; k + 16 <= K; k += 16)
        for (int l = 0; l < 16; l++) s[l] = fmaf(x[k + l], x[k + l], s[l]);
    return 1.0f / sqrtf(lane_sum(s) / (float)K + eps);
}

/* n (<= 256) values h -> one block, zero-padded */
Q8_IN void Q8(quantize)(const float* h, int64_t n, Q8Block* b) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(h[i]));
    b->d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float r = nearbyintf(h[i] * id);
        b->q[i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
    }
    for (int64_t i = n; i < Q8_BLOCK; i++) b->q[i] = 0;
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += b->q[16 * j + i];
        b->bsum16[j] = (int16_t)s;
    }
    for (int j = 0; j < 8; j++) b->bsum32[j] = (int16_t)(b->bsum16[2 * j] + b->bsum16[2 * j + 1]);
}

/* block g of a row of K values: x, or with norm x * inv * norm (inv: row_inv's) */
Q8_IN void Q8(prep_block)(const float* x, const float* norm, float inv, int64_t K, int64_t g, Q8Block* b) {
    const int64_t k0 = g * Q8_BLOCK, n = K - k0 < Q8_BLOCK ? K - k0 : Q8_BLOCK;
    float h[Q8_BLOCK];
    for (int64_t i = 0; i < n; i++) h[i] = norm != NULL ? (x[k0 + i] * inv) * norm[k0 + i] : x[k0 + i];
    Q8(quantize)(h, n, b);
}

/* x (K values) -> blocks; with norm: x * (1 / sqrt(mean(x * x) + eps)) * norm first */
Q8_TARGET static void Q8(prep_row)(const float* x, const float* norm, float eps, int64_t K, Q8Block* out) {
    const float inv = norm != NULL ? Q8(row_inv)(x, K, eps) : 1.0f;
    for (int64_t g = 0; g * Q8_BLOCK < K; g++) Q8(prep_block)(x, norm, inv, K, g, out + g);
}

/* e^x for x in [-87, 88] (clamped): the range reduction and polynomial of the paged attention kernel's
 * exp (Cephes expf), every multiply-add an explicit fmaf so that no copy contracts differently */
Q8_IN float Q8(exp)(float x) {
    x = fminf(fmaxf(x, -87.0f), 88.0f);
    const float n = fmaf(x, 1.44269504088896341f, 12582912.0f) - 12582912.0f; /* round(x log2 e) */
    const float r = fmaf(n, 2.12194440e-4f, fmaf(n, -0.693359375f, x));
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r) + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* block g of silu(gate) * up (K values each): the MLP's activation on its way into the down layer */
Q8_IN void Q8(prep_block_silu)(const float* gate, const float* up, int64_t K, int64_t g, Q8Block* b) {
    const int64_t k0 = g * Q8_BLOCK, n = K - k0 < Q8_BLOCK ? K - k0 : Q8_BLOCK;
    float h[Q8_BLOCK];
    for (int64_t i = 0; i < n; i++) {
        const float v = gate[k0 + i];
        h[i] = (v / (1.0f + Q8(exp)(-v))) * up[k0 + i];
    }
    Q8(quantize)(h, n, b);
}
