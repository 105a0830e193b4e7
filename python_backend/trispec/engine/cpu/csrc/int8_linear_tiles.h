/* The tiles of int8_linear.c for one ISA level. Included once per level, with these defined:
 *   ISA        a name suffix;               ISA_ATTR   its target attribute;
 *   NV, NL     its native float vector type and lane count (LANES is a multiple of NL);
 *   ISA_COLS, ISA_ROWS  the block a streaming tile computes (sized to the level's registers);
 *   ISA_BIG_ROWS        rows per tile when the weights come converted from a buffer;
 * and load_w_<ISA>(p) converting NL int8 weights to an NV.
 *
 * A logical accumulator is LANES floats held as LANES / NL native vectors: lane j of it always adds
 * the same products in the same order, whatever the level, and the lanes are summed in one fixed tree
 * (lane_sum), so every level with FMA gives the same numbers.
 *
 * Two ways to the same numbers: a few rows convert each weight vector as they stream it (the
 * single-token step, bound by memory), many rows convert a block of columns once into a float buffer
 * and run taller tiles over it (a prompt or a catch-up, bound by arithmetic). float(w) is exact, so
 * both give every output element the same sequence of operations. */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define PARTS (LANES / NL)
#define TILE_ROWS (ISA_BIG_ROWS > ISA_ROWS ? ISA_BIG_ROWS : ISA_ROWS)

ISA_ATTR static inline __attribute__((always_inline)) NV CAT(load_nv, ISA)(const float* p) {
    NV v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* rows [m0, m0 + R) x columns [n0, n0 + C), over k in [k0, k1) (multiples of LANES). R, C and
 * `buffered` are compile-time constants at every call. buffered: the C columns' weights come as floats
 * from wf ([C][K]); otherwise they are converted while streaming. part (R x C x LANES floats per row
 * block, or NULL): partial sums carried between k ranges, exactly as the registers held them; `first`
 * starts from zero, `last` sums the lanes, adds the k % LANES tail and stores the outputs. */
ISA_ATTR static inline __attribute__((always_inline)) void CAT(tile, ISA)(const Args* a, int buffered,
                                                                          const float* wf, int64_t m0, int R,
                                                                          int64_t n0, int C, int64_t k0,
                                                                          int64_t k1, float* part, int first,
                                                                          int last) {
    const int64_t K = a->K;
    NV acc[TILE_ROWS][ISA_COLS][PARTS];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < PARTS; p++)
                acc[r][c][p] = first ? (NV){0} : CAT(load_nv, ISA)(part + ((r * C + c) * PARTS + p) * NL);
    for (int64_t k = k0; k < k1; k += LANES) {
        NV wv[ISA_COLS][PARTS];
        if (buffered) {
            for (int c = 0; c < C; c++)
                for (int p = 0; p < PARTS; p++) wv[c][p] = CAT(load_nv, ISA)(wf + c * K + k + p * NL);
        } else {
            /* well ahead of the stream: the hardware prefetchers alone left int8 weights at about
             * half the bandwidth fp32 weights get (measured on a 2-core AVX-512 VM) */
            if (k % 64 == 0)
                for (int c = 0; c < C; c++) __builtin_prefetch(a->w + (n0 + c) * K + k + PREFETCH_BYTES, 0, 3);
            for (int c = 0; c < C; c++)
                for (int p = 0; p < PARTS; p++) wv[c][p] = CAT(load_w, ISA)(a->w + (n0 + c) * K + k + p * NL);
        }
        for (int r = 0; r < R; r++) {
            for (int p = 0; p < PARTS; p++) {
                const NV xv = CAT(load_nv, ISA)(a->x + (m0 + r) * K + k + p * NL);
                for (int c = 0; c < C; c++) acc[r][c][p] += xv * wv[c][p];
            }
        }
    }
    if (!last) {
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++)
                for (int p = 0; p < PARTS; p++) memcpy(part + ((r * C + c) * PARTS + p) * NL, &acc[r][c][p], sizeof(NV));
        return;
    }
    const int64_t body = K - K % LANES;
    for (int r = 0; r < R; r++) {
        const float* xr = a->x + (m0 + r) * K;
        for (int c = 0; c < C; c++) {
            float lanes[LANES];
            memcpy(lanes, acc[r][c], sizeof lanes);
            const int8_t* wc = a->w + (n0 + c) * K;
            float s = lane_sum(lanes);
            for (int64_t k = body; k < K; k++) s += xr[k] * (float)wc[k];
            store(a, m0 + r, n0 + c, s);
        }
    }
}

/* C columns from n0 over rows [mb0, mb1), k in [k0, k1): tiles of R rows, then one tile of the
 * remaining rows (R <= 6). part: C x LANES floats per row (buffered), or NULL. */
#define ROW_TILES(buffered, R, n0, C, mb0, mb1, k0, k1, part, first, last)                         \
    do {                                                                                           \
        const int64_t full_ = (mb1) - ((mb1) - (mb0)) % (R);                                       \
        for (int64_t m = (mb0); m < full_; m += (R))                                               \
            CAT(tile, ISA)(a, buffered, buf, m, R, n0, C, k0, k1, PART_AT(part, m, C), first, last); \
        float* const rest_ = PART_AT(part, full_, C);                                              \
        switch (((mb1) - (mb0)) % (R)) {                                                                      \
            case 1: CAT(tile, ISA)(a, buffered, buf, full_, 1, n0, C, k0, k1, rest_, first, last); break; \
            case 2: CAT(tile, ISA)(a, buffered, buf, full_, 2, n0, C, k0, k1, rest_, first, last); break; \
            case 3: CAT(tile, ISA)(a, buffered, buf, full_, 3, n0, C, k0, k1, rest_, first, last); break; \
            case 4: CAT(tile, ISA)(a, buffered, buf, full_, 4, n0, C, k0, k1, rest_, first, last); break; \
            case 5: CAT(tile, ISA)(a, buffered, buf, full_, 5, n0, C, k0, k1, rest_, first, last); break; \
            default: break;                                                                        \
        }                                                                                          \
    } while (0)
#define PART_AT(part, m, C) ((part) == NULL ? NULL : (part) + (m) * (C) * LANES)

/* Output channels [n_begin, n_end) over every row. buf: ISA_COLS x K floats of scratch; part:
 * M x ISA_COLS x LANES floats (used from BUFFER_ROWS rows on). */
ISA_ATTR static void CAT(columns, ISA)(const Args* a, int64_t n_begin, int64_t n_end, float* buf, float* part) {
    const int64_t K = a->K, body = K - K % LANES;
    const int64_t whole = n_end - (n_end - n_begin) % ISA_COLS;
    if (a->M < BUFFER_ROWS) {
        for (int64_t n0 = n_begin; n0 < whole; n0 += ISA_COLS)
            ROW_TILES(0, ISA_ROWS, n0, ISA_COLS, 0, a->M, 0, body, (float*)NULL, 1, 1);
    } else {
        /* rows in blocks whose x stays in L2 while every column block passes over them; a column
         * block's weights converted once per row block; k in ranges, so that a tile's rows of x
         * and its weights stay in L1 */
        int64_t rows = X_BLOCK_BYTES / ((int64_t)sizeof(float) * K);
        rows = rows < ISA_BIG_ROWS ? ISA_BIG_ROWS : rows - rows % ISA_BIG_ROWS;
        for (int64_t mb0 = 0; mb0 < a->M; mb0 += rows) {
            const int64_t mb1 = a->M - mb0 > rows ? mb0 + rows : a->M;
            for (int64_t n0 = n_begin; n0 < whole; n0 += ISA_COLS) {
                const int64_t count = ISA_COLS * K, vectors = count - count % NL;
                for (int64_t i = 0; i < vectors; i += NL) {
                    const NV v = CAT(load_w, ISA)(a->w + n0 * K + i);
                    memcpy(buf + i, &v, sizeof v);
                }
                for (int64_t i = vectors; i < count; i++) buf[i] = (float)a->w[n0 * K + i];
                int64_t k0 = 0;
                do {
                    const int64_t k1 = body - k0 > K_BLOCK ? k0 + K_BLOCK : body;
                    ROW_TILES(1, ISA_BIG_ROWS, n0, ISA_COLS, mb0, mb1, k0, k1, part, k0 == 0, k1 == body);
                    k0 = k1;
                } while (k0 < body);
            }
        }
    }
    for (int64_t n0 = whole; n0 < n_end; n0++) ROW_TILES(0, ISA_ROWS, n0, 1, 0, a->M, 0, body, (float*)NULL, 1, 1);
}

#undef PART_AT
#undef ROW_TILES
#undef TILE_ROWS
#undef PARTS
#undef CAT
#undef CAT_
#undef ISA
#undef ISA_ATTR
#undef NV
#undef NL
#undef ISA_COLS
#undef ISA_ROWS
#undef ISA_BIG_ROWS
