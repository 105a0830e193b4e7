/* One row of activations -> Q8Blocks (included by each ISA copy, Q8() naming it). Plain C that the
 * compiler vectorises for the copy's ISA: every step is either exact (max, integer sums) or one IEEE
 * operation per value (mul, div, sqrt, round to nearest even), and the sum of squares of the fused
 * RMSNorm keeps 16 lanes each added by fma in increasing k then summed by lane_sum, so every copy gives
 * the same blocks. */

/* x (K values) -> blocks; with norm: x * (1 / sqrt(mean(x * x) + eps)) * norm first */
Q8_TARGET static void Q8(prep_row)(const float* x, const float* norm, float eps, int64_t K, Q8Block* out) {
    float inv = 1.0f;
    if (norm != NULL) {
        float s[16] = {0};
        for (int64_t k = 0; k + 16 <= K; k += 16)
            for (int l = 0; l < 16; l++) s[l] = fmaf(x[k + l], x[k + l], s[l]);
        inv = 1.0f / sqrtf(lane_sum(s) / (float)K + eps);
    }
    for (int64_t g = 0; g * Q8_BLOCK < K; g++) {
        const int64_t k0 = g * Q8_BLOCK, n = K - k0 < Q8_BLOCK ? K - k0 : Q8_BLOCK;
        float h[Q8_BLOCK];
        float amax = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            const float v = norm != NULL ? (x[k0 + i] * inv) * norm[k0 + i] : x[k0 + i];
            h[i] = v;
            amax = fmaxf(amax, fabsf(v));
        }
        Q8Block* b = out + g;
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
}
