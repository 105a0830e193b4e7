/* AVX-512 copies of the streaming path (gguf_slices_avx2.h) and of the buffered path
 * (gguf_linear_tiles.h): the same decoded values, added in the same order, so the same bits; only
 * faster.
 *
 * One 16-lane register holds two of the AVX2 path's slices side by side: w[0] = slices 0 | 1 and
 * w[1] = slices 2 | 3 of a group, so lanes 0-7 are the AVX2 path's first accumulator and lanes 8-15
 * its second, and each lane still adds slice p before slice p + 2 (see gguf_linear.c).
 *
 * Codes of up to five bits are looked up rather than converted: a 16- or 32-entry table of a group's
 * values (A * q + B for every q, computed by the same multiply-add the AVX2 path uses, so each entry
 * is the same float) and one permute per 16 values, which only reads the low 4 or 5 bits of each
 * index (higher bits are left as they fall). Q6_K and Q8_0 convert. Building a block's scales in
 * registers and decoding every column of a tile before the multiply-adds keeps the long latency
 * chains of one column from stalling the others: the AVX2 path's layout, written to memory and read
 * back per group, ran at a third of this speed here. */
#define AVX512 __attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline))

/* what a block's groups share: K-quants' scales (a) and offsets (b) in lanes 0-7 (Q6_K: 16 scales in
 * a); the one-group formats' table (a: values of codes 0-15, b: 16-31) */
typedef struct {
    __m512 a, b;
} Prep512;

AVX512 __m512 iota16(int from) {
    const float f = (float)from;
    return _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_ps(f));
}
AVX512 __m512 lane_of(__m512 v, int j) { return _mm512_permutexvar_ps(_mm512_set1_epi32(j), v); }
AVX512 __m512i dup256(const uint8_t* p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)p)); }
AVX512 __m512i dup128(const uint8_t* p) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)p)); }
AVX512 __m512 f16_512(const uint8_t* p) { return _mm512_set1_ps(_cvtsh_ss(u16_at(p))); }

/* per-lane shift for slices (p, p + 1): lanes 0-7 by 8 p + s, lanes 8-15 by 8 (p + 1) + s */
AVX512 __m512i slice_shifts(int p, int s) {
    const int lo = 8 * p + s, hi = lo + 8;
    return _mm512_setr_epi32(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
}
/* the one-group formats' nibbles (16 bytes in every quarter): lanes 0-3 of a slice low nibbles, 4-7 high */
AVX512 __m512i legacy_shifts(int p) {
    const int a = 8 * p, b = a + 4, c = a + 8, d = a + 12;
    return _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d);
}
/* their fifth bit, bit 4 i + t of qh for lane i of slice t, rotated to bit 4 */
AVX512 __m512i legacy_fifth(const uint8_t* qh, int p) {
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    __m512i at = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    at = _mm512_add_epi32(at, _mm512_set1_epi32(p - 4));
    return _mm512_rorv_epi32(_mm512_set1_epi32((int)bits), at);
}
/* low 4 bits of `nibble`, the rest of `high` (a five-bit index, garbage above) */
AVX512 __m512i join5(__m512i nibble, __m512i high) {
    return _mm512_ternarylogic_epi32(nibble, high, _mm512_set1_epi32(0x0f), 0xe4);
}

/* K-quant scales as prep_k computes them (the same operations), kept in registers */
AVX512 Prep512 prep512_k(const uint8_t* b) {
    uint64_t sc, mn;
    k_codes(b, &sc, &mn);
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_set_epi64x((long long)mn, (long long)sc)); /* sc | mn */
    const __m512 d = _mm512_castps256_ps512(_mm256_set1_ps(f16_avx2(b)));
    const __m512 dmin = _mm512_castps256_ps512(_mm256_set1_ps(f16_avx2(b + 2)));
    const __m512 both = _mm512_cvtepi32_ps(codes);
    const __m512 mn8 = _mm512_shuffle_f32x4(both, both, 0xee); /* lanes 8-15 down to 0-7 */
    return (Prep512){_mm512_mul_ps(d, both), _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(dmin, mn8))};
}
AVX512 Prep512 prep512_q4_k(const uint8_t* b) { return prep512_k(b); }
AVX512 Prep512 prep512_q5_k(const uint8_t* b) { return prep512_k(b); }
AVX512 Prep512 prep512_q6_k(const uint8_t* b) {
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 192))));
    return (Prep512){_mm512_mul_ps(f16_512(b + 208), sc), _mm512_setzero_ps()};
}
AVX512 Prep512 prep512_q4_0(const uint8_t* b) { return (Prep512){_mm512_mul_ps(f16_512(b), iota16(-8)), _mm512_setzero_ps()}; }
AVX512 Prep512 prep512_q4_1(const uint8_t* b) {
    return (Prep512){_mm512_fmadd_ps(f16_512(b), iota16(0), f16_512(b + 2)), _mm512_setzero_ps()};
}
AVX512 Prep512 prep512_q5_0(const uint8_t* b) {
    const __m512 d = f16_512(b);
    return (Prep512){_mm512_mul_ps(d, iota16(-16)), _mm512_mul_ps(d, iota16(0))};
}
AVX512 Prep512 prep512_q5_1(const uint8_t* b) {
    const __m512 d = f16_512(b), m = f16_512(b + 2);
    return (Prep512){_mm512_fmadd_ps(d, iota16(0), m), _mm512_fmadd_ps(d, iota16(16), m)};
}
AVX512 Prep512 prep512_q8_0(const uint8_t* b) { return (Prep512){f16_512(b), _mm512_setzero_ps()}; }

/* group j of a block -> w[0] (slices 0 | 1), w[1] (slices 2 | 3); j a compile-time constant */
AVX512 void slices512_q4_k(const uint8_t* b, int j, const Prep512* s, __m512* w) {
    const __m512i v = dup256(b + 16 + 32 * (j / 2));
    const __m512 table = _mm512_fmadd_ps(lane_of(s->a, j), iota16(0), lane_of(s->b, j));
    for (int p = 0; p < 2; p++) w[p] = _mm512_permutexvar_ps(_mm512_srlv_epi32(v, slice_shifts(2 * p, 4 * (j % 2))), table);
}

AVX512 void slices512_q5_k(const uint8_t* b, int j, const Prep512* s, __m512* w) {
    const __m512i v = dup256(b + 48 + 32 * (j / 2)), high = dup256(b + 16);
    const __m512 a = lane_of(s->a, j), off = lane_of(s->b, j);
    const __m512 low16 = _mm512_fmadd_ps(a, iota16(0), off), high16 = _mm512_fmadd_ps(a, iota16(16), off);
    for (int p = 0; p < 2; p++) {
        const __m512i nibble = _mm512_srlv_epi32(v, slice_shifts(2 * p, 4 * (j % 2)));
        const __m512i fifth = _mm512_rorv_epi32(high, slice_shifts(2 * p, j - 4)); /* bit j of the byte -> bit 4 */
        w[p] = _mm512_permutex2var_ps(low16, join5(nibble, fifth), high16);
    }
}

AVX512 void slices512_q6_k(const uint8_t* b, int j, const Prep512* s, __m512* w) {
    const int h = j / 4, u = j % 4;
    const __m512i lo = dup256(b + 64 * h + 32 * (u % 2)), hi = dup256(b + 128 + 32 * h);
    /* lanes i < 4 of each slice hold codes 0-15 of the group: scale 2 j; the others scale 2 j + 1 */
    const int s0 = 2 * j, s1 = 2 * j + 1;
    const __m512 a = _mm512_permutexvar_ps(
        _mm512_setr_epi32(s0, s0, s0, s0, s1, s1, s1, s1, s0, s0, s0, s0, s1, s1, s1, s1), s->a);
    for (int p = 0; p < 2; p++) {
        const __m512i nibble = _mm512_srlv_epi32(lo, slice_shifts(2 * p, 4 * (u / 2)));
        const __m512i top = _mm512_and_si512(_mm512_rorv_epi32(hi, slice_shifts(2 * p, 2 * u - 4)), _mm512_set1_epi32(0x30));
        const __m512i q = _mm512_ternarylogic_epi32(nibble, top, _mm512_set1_epi32(0x0f), 0xe4);
        w[p] = _mm512_mul_ps(a, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(32))));
    }
}

AVX512 void slices512_q8_0(const uint8_t* b, int j, const Prep512* s, __m512* w) {
    (void)j;
    const __m512i v = dup256(b + 2);
    for (int p = 0; p < 2; p++) { /* byte t of each lane to the top, then sign-extended down */
        const int lo = 24 - 16 * p, hi = lo - 8;
        const __m512i up = _mm512_setr_epi32(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
        w[p] = _mm512_mul_ps(s->a, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sllv_epi32(v, up), 24)));
    }
}

/* the one-group formats: codes looked up in the block's table */
#define LEGACY512(NAME, NIBBLES, QH)                                                                   \
    AVX512 void NAME(const uint8_t* b, int j, const Prep512* s, __m512* w) {                            \
        (void)j;                                                                                        \
        const __m512i v = dup128(b + (NIBBLES));                                                        \
        for (int p = 0; p < 2; p++) {                                                                   \
            const __m512i nibble = _mm512_srlv_epi32(v, legacy_shifts(2 * p));                        \
            w[p] = (QH) ? _mm512_permutex2var_ps(s->a, join5(nibble, legacy_fifth(b + (QH), 2 * p)), s->b) \
                        : _mm512_permutexvar_ps(nibble, s->a);                                          \
        }                                                                                               \
    }
LEGACY512(slices512_q4_0, 2, 0)
LEGACY512(slices512_q4_1, 4, 0)
LEGACY512(slices512_q5_0, 6, 2)
LEGACY512(slices512_q5_1, 8, 4)
#undef LEGACY512

/* rows [0, R) x columns [n0, n0 + C), as stream_tile_* in gguf_slices_avx2.h */
#define STREAM_TILE512(FMT, QB, BYTES)                                                                    \
    AVX512 void stream_tile512_##FMT(const Args* a, int R, int64_t n0, int C) {                           \
        __m512 acc[STREAM_ROWS][4];                                                                        \
        for (int r = 0; r < R; r++)                                                                        \
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();                                   \
        for (int64_t k = 0; k < a->K; k += (QB)) {                                                         \
            const uint8_t* b[4];                                                                           \
            Prep512 s[4];                                                                                  \
            for (int c = 0; c < C; c++) {                                                                  \
                b[c] = a->w + (n0 + c) * a->row_bytes + k / (QB) * (BYTES);                                \
                for (int line = 0; line < (BYTES); line += 64) __builtin_prefetch(b[c] + STREAM_PREFETCH + line, 0, 0); \
                s[c] = prep512_##FMT(b[c]);                                                                \
            }                                                                                              \
            _Pragma("GCC unroll 8") for (int j = 0; j < (QB) / GROUP; j++) {                              \
                __m512 w[4][2];                                                                            \
                for (int c = 0; c < C; c++) slices512_##FMT(b[c], j, &s[c], w[c]);                         \
                for (int r = 0; r < R; r++) {                                                              \
                    const float* x = a->x + r * a->K + k + GROUP * j;                                      \
                    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);                   \
                    for (int c = 0; c < C; c++)                                                            \
                        acc[r][c] = _mm512_fmadd_ps(x1, w[c][1], _mm512_fmadd_ps(x0, w[c][0], acc[r][c])); \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        for (int r = 0; r < R; r++) {                                                                      \
            for (int c = 0; c < C; c++) {                                                                  \
                float lanes[16];                                                                           \
                _mm512_storeu_ps(lanes, acc[r][c]);                                                        \
                float y = lane_sum(lanes);                                                                 \
                if (a->bias != NULL) y = y + a->bias[n0 + c];                                              \
                a->out[r * a->ldo + n0 + c] = y;                                                           \
            }                                                                                              \
        }                                                                                                  \
    }                                                                                                      \
    /* every row for columns [n, n_end): 4 columns per tile for one row, 2 from two rows on */            \
    __attribute__((target("arch=x86-64-v4"))) static void stream_columns512_##FMT(const Args* a, int64_t n, int64_t n_end) { \
        switch (a->M) {                                                                                    \
            case 1: for (; n + 4 <= n_end; n += 4) stream_tile512_##FMT(a, 1, n, 4); break;               \
            case 2: for (; n + 2 <= n_end; n += 2) stream_tile512_##FMT(a, 2, n, 2); break;               \
            case 3: for (; n + 2 <= n_end; n += 2) stream_tile512_##FMT(a, 3, n, 2); break;               \
            case 4: for (; n + 2 <= n_end; n += 2) stream_tile512_##FMT(a, 4, n, 2); break;               \
            default: for (; n + 2 <= n_end; n += 2) stream_tile512_##FMT(a, 5, n, 2); break;              \
        }                                                                                                  \
        switch (a->M) { /* the last columns one at a time */                                               \
            case 1: for (; n < n_end; n++) stream_tile512_##FMT(a, 1, n, 1); break;                       \
            case 2: for (; n < n_end; n++) stream_tile512_##FMT(a, 2, n, 1); break;                       \
            case 3: for (; n < n_end; n++) stream_tile512_##FMT(a, 3, n, 1); break;                       \
            case 4: for (; n < n_end; n++) stream_tile512_##FMT(a, 4, n, 1); break;                       \
            default: for (; n < n_end; n++) stream_tile512_##FMT(a, 5, n, 1); break;                      \
        }                                                                                                  \
    }                                                                                                      \
    /* values [k0, k0 + count) of a row in slot order (each group of 32 as x is laid out) */             \
    __attribute__((target("arch=x86-64-v4"))) static void slot_span512_##FMT(const uint8_t* src, int64_t k0, int64_t count, float* out) { \
        for (int64_t k = 0; k < count; k += (QB)) {                                                        \
            const uint8_t* b = src + (k0 + k) / (QB) * (BYTES);                                            \
            const Prep512 s = prep512_##FMT(b);                                                            \
            _Pragma("GCC unroll 8") for (int j = 0; j < (QB) / GROUP; j++) {                              \
                __m512 w[2];                                                                               \
                slices512_##FMT(b, j, &s, w);                                                              \
                _mm512_storeu_ps(out + k + GROUP * j, w[0]);                                               \
                _mm512_storeu_ps(out + k + GROUP * j + 16, w[1]);                                          \
            }                                                                                              \
        }                                                                                                  \
    }
SLICED_FORMATS(STREAM_TILE512)
#undef STREAM_TILE512

/* every row (M <= STREAM_ROWS) for output columns [n_begin, n_end); 0 where the format has no slices */
__attribute__((target("arch=x86-64-v4"))) static int stream_columns512(const Args* a, int64_t n_begin, int64_t n_end) {
    const Format* f = a->format;
#define STREAM(FMT) stream_columns512_##FMT(a, n_begin, n_end)
    BY_FORMAT(STREAM)
#undef STREAM
}

__attribute__((target("arch=x86-64-v4"))) static int slot_span512(const Format* f, const uint8_t* src, int64_t k0, int64_t count, float* out) {
#define SPAN(FMT) slot_span512_##FMT(src, k0, count, out)
    BY_FORMAT(SPAN)
#undef SPAN
}

/* The buffered path (more than STREAM_ROWS rows): a chunk of COLS512 columns decoded once into buf in
 * slot order, then register tiles of up to ROWS512 x COLS512 outputs run over it, one 16-lane
 * accumulator per output; lane L adds slot L of every group's first half, then slot 16 + L of its
 * second, in increasing k: the order of gguf_linear_tiles.h, so the same bits. part carries each
 * output's lanes from chunk to chunk (`first` starts from zero, `last` sums and stores). */
AVX512 void tile512(const Args* a, const float* buf, int64_t kc, int64_t m0, int R, int64_t n0, int C, int64_t k0,
                    float* part, int first, int last) {
    __m512 acc[ROWS512][COLS512];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            acc[r][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + (r * COLS512 + c) * LANES);
    const float* x = a->x + m0 * a->K + k0;
    for (int64_t k = 0; k < kc; k += LANES) {
        __m512 w[COLS512];
        for (int c = 0; c < C; c++) w[c] = _mm512_loadu_ps(buf + c * kc + k);
        for (int r = 0; r < R; r++) {
            const __m512 xv = _mm512_loadu_ps(x + r * a->K + k);
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(xv, w[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++) {
        for (int c = 0; c < C; c++) {
            float* lanes = part + (r * COLS512 + c) * LANES;
            _mm512_storeu_ps(lanes, acc[r][c]);
            if (!last) continue;
            float y = lane_sum(lanes);
            if (a->bias != NULL) y = y + a->bias[n0 + c];
            a->out[(m0 + r) * a->ldo + n0 + c] = y;
        }
    }
}

#define TILE512(R, C) tile512(a, buf, kc, m, R, n0, C, k0, part + (m - mb0) * COLS512 * LANES, first, last)
#define ROWS_OF_BLOCK512(R)      \
    do {                         \
        switch (width) {         \
            case 4: TILE512(R, 4); break; \
            case 3: TILE512(R, 3); break; \
            case 2: TILE512(R, 2); break; \
            default: TILE512(R, 1); break; \
        }                        \
    } while (0)

/* Output columns [n_begin, n_end) over every row. buf: COLS512 x K_CHUNK floats; part: COLS512 x
 * LANES floats per row of a row block. */
__attribute__((target("arch=x86-64-v4"))) static void columns512(const Args* a, int64_t n_begin, int64_t n_end, float* buf, float* part) {
    const int64_t K = a->K, rows = rows_per_block(K);
    for (int64_t mb0 = 0; mb0 < a->M; mb0 += rows) {
        const int64_t mb1 = a->M - mb0 > rows ? mb0 + rows : a->M;
        for (int64_t n0 = n_begin; n0 < n_end; n0 += COLS512) {
            const int width = n_end - n0 >= COLS512 ? COLS512 : (int)(n_end - n0);
            for (int64_t k0 = 0; k0 < K; k0 += K_CHUNK) {
                const int64_t kc = K - k0 > K_CHUNK ? K_CHUNK : K - k0;
                const int first = k0 == 0, last = k0 + kc == K;
                for (int c = 0; c < width; c++) slot_span512(a->format, a->w + (n0 + c) * a->row_bytes, k0, kc, buf + c * kc);
                int64_t m = mb0;
                for (; m + ROWS512 <= mb1; m += ROWS512) ROWS_OF_BLOCK512(ROWS512);
                switch (mb1 - m) {
                    case 3: ROWS_OF_BLOCK512(3); break;
                    case 2: ROWS_OF_BLOCK512(2); break;
                    case 1: ROWS_OF_BLOCK512(1); break;
                    default: break;
                }
            }
        }
    }
}
#undef ROWS_OF_BLOCK512
#undef TILE512

#undef AVX512
