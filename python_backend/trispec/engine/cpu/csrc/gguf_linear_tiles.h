/* The decoders and buffered tiles of gguf_linear.c for one ISA level. Included once per level, with
 * these defined: ISA (a name suffix), ISA_ATTR (its target attribute), NV / NL (its float vector type
 * and lane count; LANES is a multiple of NL), VFMA (a fused multiply-add of two NVs onto a third), and
 * HAS_SLICES where gguf_slices_avx2.h decodes straight into slot order.
 *
 * The decoders are plain loops that the compiler vectorises for the level; their results are exact
 * (see gguf_linear.c), so every level decodes the same floats. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define PARTS (LANES / NL)
#define F16 CAT(f16, ISA)

/* one block of each format -> its float32 values in natural order, as gguf-py's dequantize_blocks */
ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_q4_0, ISA)(const uint8_t* b, float* out) {
    const float d = F16(b);
    const uint8_t* q = b + 2;
    for (int l = 0; l < 16; l++) {
        out[l] = d * (float)((q[l] & 15) - 8);
        out[l + 16] = d * (float)((q[l] >> 4) - 8);
    }
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_q4_1, ISA)(const uint8_t* b, float* out) {
    const float d = F16(b), m = F16(b + 2);
    const uint8_t* q = b + 4;
    for (int l = 0; l < 16; l++) {
        out[l] = d * (float)(q[l] & 15) + m;
        out[l + 16] = d * (float)(q[l] >> 4) + m;
    }
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_q5_0, ISA)(const uint8_t* b, float* out) {
    const float d = F16(b);
    uint32_t qh;
    memcpy(&qh, b + 2, sizeof qh);
    const uint8_t* q = b + 6;
    for (int l = 0; l < 16; l++) {
        out[l] = d * (float)((int)((q[l] & 15) | (((qh >> l) & 1) << 4)) - 16);
        out[l + 16] = d * (float)((int)((q[l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) - 16);
    }
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_q5_1, ISA)(const uint8_t* b, float* out) {
    const float d = F16(b), m = F16(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, sizeof qh);
    const uint8_t* q = b + 8;
    for (int l = 0; l < 16; l++) {
        out[l] = d * (float)((q[l] & 15) | (((qh >> l) & 1) << 4)) + m;
        out[l + 16] = d * (float)((q[l] >> 4) | (((qh >> (l + 16)) & 1) << 4)) + m;
    }
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_q8_0, ISA)(const uint8_t* b, float* out) {
    const float d = F16(b);
    const int8_t* q = (const int8_t*)(b + 2);
    for (int l = 0; l < 32; l++) out[l] = (float)q[l] * d;
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_q4_k, ISA)(const uint8_t* b, float* out) {
    const float d = F16(b), dmin = F16(b + 2);
    const uint8_t *s = b + 4, *q = b + 16;
    for (int j = 0; j < 4; j++) {
        int sc0, m0, sc1, m1;
        k_scale_min(s, 2 * j, &sc0, &m0);
        k_scale_min(s, 2 * j + 1, &sc1, &m1);
        const float a0 = d * (float)sc0, b0 = dmin * (float)m0, a1 = d * (float)sc1, b1 = dmin * (float)m1;
        const uint8_t* qj = q + 32 * j;
        float* o = out + 64 * j;
        for (int l = 0; l < 32; l++) {
            o[l] = a0 * (float)(qj[l] & 15) - b0;
            o[l + 32] = a1 * (float)(qj[l] >> 4) - b1;
        }
    }
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_q5_k, ISA)(const uint8_t* b, float* out) {
    const float d = F16(b), dmin = F16(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *q = b + 48;
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        k_scale_min(s, j, &sc, &mn);
        const float a = d * (float)sc, m = dmin * (float)mn;
        const uint8_t* qj = q + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        float* o = out + 32 * j;
        for (int l = 0; l < 32; l++) o[l] = a * (float)(((qj[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4)) - m;
    }
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_q6_k, ISA)(const uint8_t* b, float* out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = (const int8_t*)(b + 192);
    const float d = F16(b + 208);
    for (int h = 0; h < 2; h++) {
        for (int s = 0; s < 4; s++) { /* elements [128 h + 32 s, + 32) */
            const uint8_t *lo = ql + 64 * h + 32 * (s % 2), *hi = qh + 32 * h;
            const int nib = 4 * (s / 2);
            const float a0 = d * (float)sc[8 * h + 2 * s], a1 = d * (float)sc[8 * h + 2 * s + 1];
            float* o = out + 128 * h + 32 * s;
            for (int l = 0; l < 16; l++) o[l] = a0 * (float)((int)(((lo[l] >> nib) & 15) | (((hi[l] >> (2 * s)) & 3) << 4)) - 32);
            for (int l = 16; l < 32; l++) o[l] = a1 * (float)((int)(((lo[l] >> nib) & 15) | (((hi[l] >> (2 * s)) & 3) << 4)) - 32);
        }
    }
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_f16, ISA)(const uint8_t* b, float* out) {
    for (int l = 0; l < 32; l++) out[l] = F16(b + 2 * l);
}

ISA_ATTR static inline __attribute__((always_inline)) void CAT(decode_bf16, ISA)(const uint8_t* b, float* out) {
    for (int l = 0; l < 32; l++) out[l] = bf16_to_f32(u16_at(b + 2 * l));
}

/* values [k0, k0 + count) of one row (k0 and count whole blocks) -> out, natural order */
#define DECODE_BLOCKS(fn)                                                                                    \
    for (int64_t i = 0; i < blocks; i++) CAT(fn, ISA)(src + (first + i) * f->bytes, out + i * f->elements); \
    break
ISA_ATTR static void CAT(decode_span, ISA)(const Format* f, const uint8_t* src, int64_t k0, int64_t count, float* out) {
    const int64_t first = k0 / f->elements, blocks = count / f->elements;
    switch (f->type) {
        case T_Q4_0: DECODE_BLOCKS(decode_q4_0);
        case T_Q4_1: DECODE_BLOCKS(decode_q4_1);
        case T_Q5_0: DECODE_BLOCKS(decode_q5_0);
        case T_Q5_1: DECODE_BLOCKS(decode_q5_1);
        case T_Q8_0: DECODE_BLOCKS(decode_q8_0);
        case T_Q4_K: DECODE_BLOCKS(decode_q4_k);
        case T_Q5_K: DECODE_BLOCKS(decode_q5_k);
        case T_Q6_K: DECODE_BLOCKS(decode_q6_k);
        case T_F16: DECODE_BLOCKS(decode_f16);
        case T_BF16: DECODE_BLOCKS(decode_bf16);
        default: break;
    }
}
#undef DECODE_BLOCKS

/* the same values in the buffered layout (halves, see gguf_linear.c): straight from the codes where
 * this level can, else decoded in natural order and rearranged. count <= K_CHUNK. */
ISA_ATTR static void CAT(half_span, ISA)(const Format* f, const uint8_t* src, int64_t k0, int64_t count, float* out) {
#ifdef HAS_SLICES
    if (slices_span(f, src, k0, count, out)) return;
#endif
    float natural[K_CHUNK];
    CAT(decode_span, ISA)(f, src, k0, count, natural);
    to_halves(natural, count, out);
}

ISA_ATTR static inline __attribute__((always_inline)) NV CAT(load, ISA)(const float* p) {
    NV v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* rows [m0, m0 + R) x columns [n0, n0 + C) over the chunk [k0, k0 + kc), the columns' weights
 * decoded in buf (kc floats per column, the first at buf), x and buf both in halves: lanes 0-7 run over
 * the first half, then lanes 8-15 over the second, one register per output at a time. R and C are
 * compile-time constants at every call. part: the 16 lanes of each output (rows COLS columns apart),
 * carried between chunks exactly as the registers held them; `first` starts from zero, `last` sums
 * the lanes and stores the outputs. */
#define HV (8 / NL) /* native vectors per half */
ISA_ATTR static inline __attribute__((always_inline)) void CAT(tile, ISA)(const Args* a, const float* buf, int64_t kc,
                                                                          int64_t m0, int R, int64_t n0, int C,
                                                                          int64_t k0, float* part, int first, int last) {
    const int64_t K = a->K, half = kc / 2;
    for (int p = 0; p < 2; p++) {
        NV acc[MAX_ROWS][COLS][HV];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                for (int v = 0; v < HV; v++)
                    acc[r][c][v] = first ? (NV){0} : CAT(load, ISA)(part + (r * COLS + c) * LANES + 8 * p + v * NL);
        const float* w = buf + p * half;
        const float* x = a->x + m0 * K + k0 + p * half;
        for (int64_t k = 0; k < half; k += 8) {
            for (int v = 0; v < HV; v++) {
                NV wv[COLS];
                for (int c = 0; c < C; c++) wv[c] = CAT(load, ISA)(w + c * kc + k + v * NL);
                for (int r = 0; r < R; r++) {
                    const NV xv = CAT(load, ISA)(x + r * K + k + v * NL);
                    for (int c = 0; c < C; c++) acc[r][c][v] = VFMA(xv, wv[c], acc[r][c][v]);
                }
            }
        }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                for (int v = 0; v < HV; v++) memcpy(part + (r * COLS + c) * LANES + 8 * p + v * NL, &acc[r][c][v], sizeof(NV));
    }
    if (!last) return;
    for (int r = 0; r < R; r++) {
        for (int c = 0; c < C; c++) {
            float y = lane_sum(part + (r * COLS + c) * LANES);
            if (a->bias != NULL) y = y + a->bias[n0 + c];
            a->out[(m0 + r) * a->ldo + n0 + c] = y;
        }
    }
}
#undef HV

/* rows [m, m + R) of the column block at n0 (width 1..COLS) */
#define TILE(R, C) CAT(tile, ISA)(a, buf, kc, m, R, n0, C, k0, part + (m - mb0) * COLS * LANES, first, last)
#define ROWS_OF_BLOCK(R)                 \
    do {                                 \
        if (width == 3)                  \
            TILE(R, 3);                  \
        else if (width == 2)             \
            TILE(R, 2);                  \
        else                             \
            TILE(R, 1);                  \
    } while (0)

/* Output columns [n_begin, n_end) over every row. buf: COLS x K_CHUNK floats; part: COLS x LANES
 * floats per row of a row block. */
ISA_ATTR static void CAT(columns, ISA)(const Args* a, int64_t n_begin, int64_t n_end, float* buf, float* part) {
    const int64_t K = a->K, rows = rows_per_block(K);
    for (int64_t mb0 = 0; mb0 < a->M; mb0 += rows) {
        const int64_t mb1 = a->M - mb0 > rows ? mb0 + rows : a->M;
        for (int64_t n0 = n_begin; n0 < n_end; n0 += COLS) {
            const int width = n_end - n0 >= COLS ? COLS : (int)(n_end - n0);
            for (int64_t k0 = 0; k0 < K; k0 += K_CHUNK) {
                const int64_t kc = K - k0 > K_CHUNK ? K_CHUNK : K - k0;
                const int first = k0 == 0, last = k0 + kc == K;
                for (int c = 0; c < width; c++) CAT(half_span, ISA)(a->format, a->w + (n0 + c) * a->row_bytes, k0, kc, buf + c * kc);
                int64_t m = mb0;
                for (; m + MAX_ROWS <= mb1; m += MAX_ROWS) ROWS_OF_BLOCK(MAX_ROWS);
                if (mb1 - m == 1) ROWS_OF_BLOCK(1);
                if (mb1 - m == 2) ROWS_OF_BLOCK(2);
                if (mb1 - m == 3) ROWS_OF_BLOCK(3);
            }
        }
    }
}

#undef ROWS_OF_BLOCK
#undef TILE
#undef F16
#undef PARTS
#undef CAT
#undef CAT_
#undef ISA
#undef ISA_ATTR
#undef NV
#undef NL
#undef VFMA
