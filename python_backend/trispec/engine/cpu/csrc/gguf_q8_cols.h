/* The column loop of one ISA copy (included by each, after its k45/k6/legacy kernels and its
 * Q8_ROWS, which names the row counts it has tiles for; Q8_RT: rows per tile). Rows pass in blocks that stay in L2; within one, each column of the thread's range runs over
 * tiles of up to Q8_RT rows, so a column's codes are decoded once per tile. Only which results are
 * computed together changes with the tiling, never how. */
#define Q8_COL(name, call)                                                                                    \
    Q8_TARGET static void Q8(name)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, int R,     \
                                   float* res) {                                                          \
        Q8_ROWS(call)                                                                                     \
    }
#define Q8_CALL_Q4K(n) Q8(k45)(w, x, nblk, K, res, 0, n)
#define Q8_CALL_Q5K(n) Q8(k45)(w, x, nblk, K, res, 1, n)
#define Q8_CALL_Q6K(n) Q8(k6)(w, x, nblk, K, res, n)
#define Q8_CALL_Q40(n) Q8(legacy)(w, x, nblk, K, res, T_Q4_0, n)
#define Q8_CALL_Q50(n) Q8(legacy)(w, x, nblk, K, res, T_Q5_0, n)
#define Q8_CALL_Q80(n) Q8(legacy)(w, x, nblk, K, res, T_Q8_0, n)
Q8_COL(col_q4_k, Q8_CALL_Q4K)
Q8_COL(col_q5_k, Q8_CALL_Q5K)
Q8_COL(col_q6_k, Q8_CALL_Q6K)
Q8_COL(col_q4_0, Q8_CALL_Q40)
Q8_COL(col_q5_0, Q8_CALL_Q50)
Q8_COL(col_q8_0, Q8_CALL_Q80)

Q8_TARGET static void Q8(column)(int type, const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, int R,
                                 float* res) {
    switch (type) {
        case T_Q4_K: Q8(col_q4_k)(w, x, nblk, K, R, res); break;
        case T_Q5_K: Q8(col_q5_k)(w, x, nblk, K, R, res); break;
        case T_Q6_K: Q8(col_q6_k)(w, x, nblk, K, R, res); break;
        case T_Q4_0: Q8(col_q4_0)(w, x, nblk, K, R, res); break;
        case T_Q5_0: Q8(col_q5_0)(w, x, nblk, K, R, res); break;
        default: Q8(col_q8_0)(w, x, nblk, K, R, res); break;
    }
}

/* a repacked part: groups of 16 columns; a group that straddles two threads' ranges is computed by
 * both, each storing its own columns */
Q8_TARGET static void Q8(groups)(const QArgs* a, const QPart* p, int64_t lo, int64_t hi, int64_t m0, int64_t m1) {
    float res[16 * Q8_XR];
    for (int64_t g = (lo - p->first) / X16; g * X16 < hi - p->first; g++) {
        const uint8_t* w = p->w + g * p->row_bytes;
        const int64_t c0 = p->first + g * X16;
        for (int64_t m = m0; m < m1; m += Q8_XR) {
            const int R = m1 - m < Q8_XR ? (int)(m1 - m) : Q8_XR;
            Q8(group)(p->type, w, a->xq + m * a->nblk, a->nblk, a->K, R, res);
            for (int c = 0; c < X16; c++)
                if (c0 + c >= lo && c0 + c < hi)
                    for (int r = 0; r < R; r++) {
                        float one = res[16 * r + c];
                        q8_store(a, p, c0 + c, m + r, 1, &one);
                    }
        }
    }
}

Q8_TARGET static void Q8(columns)(const QArgs* a, int64_t begin, int64_t end) {
    const int64_t pass = q8_rows_per_pass(a->nblk);
    float res[Q8_RT];
    for (int64_t m0 = 0; m0 < a->M; m0 += pass) {
        const int64_t m1 = m0 + pass < a->M ? m0 + pass : a->M;
        for (int i = 0; i < a->nparts; i++) {
            const QPart* p = &a->parts[i];
            const int64_t lo = begin > p->first ? begin : p->first;
            const int64_t hi = end < p->first + p->rows ? end : p->first + p->rows;
            if (lo < hi && x16_group_bytes(p->type, Q8_BLOCK) > 0) {
                Q8(groups)(a, p, lo, hi, m0, m1);
                continue;
            }
            for (int64_t n = lo; n < hi; n++) {
                const uint8_t* w = p->w + (n - p->first) * p->row_bytes;
                for (int64_t m = m0; m < m1; m += Q8_RT) {
                    const int R = m1 - m < Q8_RT ? (int)(m1 - m) : Q8_RT;
                    Q8(column)(p->type, w, a->xq + m * a->nblk, a->nblk, a->K, R, res);
                    q8_store(a, p, n, m, R, res);
                }
            }
        }
    }
}

#undef Q8_COL
#undef Q8_CALL_Q4K
#undef Q8_CALL_Q5K
#undef Q8_CALL_Q6K
#undef Q8_CALL_Q40
#undef Q8_CALL_Q50
#undef Q8_CALL_Q80
