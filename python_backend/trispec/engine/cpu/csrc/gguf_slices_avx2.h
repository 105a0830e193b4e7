/* AVX2 decoding of gguf_linear.c's formats straight into slot order, and the streaming tiles.
 *
 * A group of 32 values is four slices of eight: slice t holds the values at positions 4 i + t
 * (i = 0..7), which a shift and a mask pull out of 32 code bytes read as eight 32-bit lanes (byte t of
 * lane i is code 4 i + t). The value is A * q (+ B) with one fused multiply-add, which rounds as
 * gguf-py's multiply-then-add does because A * q is exact (see gguf_linear.c); formats without an
 * offset multiply. */
#define AVX2 __attribute__((target("arch=x86-64-v3"))) static inline __attribute__((always_inline))

/* what the groups of a block share: K-quant scales a and offsets b (Q6_K: 16 scales, no offsets) */
typedef struct {
    float a[16], b[8];
} Scales;

/* bits [n, n + width) of every 32-bit lane moved to bit `to`, the rest cleared (n, to constant) */
AVX2 __m256i bits_to(__m256i v, int n, int to, int mask) {
    const __m256i moved = n >= to ? _mm256_srli_epi32(v, n - to) : _mm256_slli_epi32(v, to - n);
    return _mm256_and_si256(moved, _mm256_set1_epi32(mask));
}

AVX2 __m256 floats(__m256i q) { return _mm256_cvtepi32_ps(q); }

/* Q4_K / Q5_K: the eight sub-blocks' scales A = d * sc and offsets B = -(dmin * m). The 6-bit values,
 * byte j of each little-endian word: sc[0..3] = s[0..3] & 63; sc[4..7] = low nibble of s[8..11] | the
 * top two bits of s[0..3] << 4; m[0..3] = s[4..7] & 63; m[4..7] = high nibble of s[8..11] | the top two
 * bits of s[4..7] << 4 (gguf-py's Q4_K.get_scale_min). -(dmin * m) is exact after the rounding of
 * dmin * m, so a * q + off rounds as a * q - dmin * m. */
static inline __attribute__((always_inline)) void k_codes(const uint8_t* b, uint64_t* sc, uint64_t* mn) {
    uint32_t w[3];
    memcpy(w, b + 4, sizeof w);
    *sc = (uint64_t)(w[0] & 0x3f3f3f3fu) | (uint64_t)((w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4)) << 32;
    *mn = (uint64_t)(w[1] & 0x3f3f3f3fu) |
          (uint64_t)(((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4)) << 32;
}
AVX2 void prep_k(const uint8_t* b, Scales* s) {
    uint64_t sc, mn;
    k_codes(b, &sc, &mn);
    const __m256 d = _mm256_set1_ps(f16_avx2(b)), dmin = _mm256_set1_ps(f16_avx2(b + 2));
    const __m256 scf = floats(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 mnf = floats(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mn)));
    _mm256_storeu_ps(s->a, _mm256_mul_ps(d, scf));
    _mm256_storeu_ps(s->b, _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, mnf)));
}
AVX2 void prep_q4_k(const uint8_t* b, Scales* s) { prep_k(b, s); }
AVX2 void prep_q5_k(const uint8_t* b, Scales* s) { prep_k(b, s); }

AVX2 void prep_q6_k(const uint8_t* b, Scales* s) {
    const __m256 d = _mm256_set1_ps(f16_avx2(b + 208));
    for (int i = 0; i < 2; i++) {
        const __m128i sc = _mm_loadl_epi64((const __m128i*)(b + 192 + 8 * i));
        _mm256_storeu_ps(s->a + 8 * i, _mm256_mul_ps(d, floats(_mm256_cvtepi8_epi32(sc))));
    }
}

AVX2 void prep_none(const uint8_t* b, Scales* s) {
    (void)b;
    (void)s;
}
#define prep_q4_0 prep_none
#define prep_q4_1 prep_none
#define prep_q5_0 prep_none
#define prep_q5_1 prep_none
#define prep_q8_0 prep_none

/* group j of a block -> its four slices w[0..3]; j is a compile-time constant where these are used */
AVX2 void slices_q4_k(const uint8_t* b, int j, const Scales* s, __m256* w) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 16 + 32 * (j / 2)));
    const __m256 a = _mm256_broadcast_ss(&s->a[j]), off = _mm256_broadcast_ss(&s->b[j]);
    for (int t = 0; t < 4; t++) w[t] = _mm256_fmadd_ps(a, floats(bits_to(v, 8 * t + 4 * (j % 2), 0, 0x0f)), off);
}

AVX2 void slices_q5_k(const uint8_t* b, int j, const Scales* s, __m256* w) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 48 + 32 * (j / 2)));
    const __m256i high = _mm256_loadu_si256((const __m256i*)(b + 16)); /* bit j of code l's byte */
    const __m256 a = _mm256_broadcast_ss(&s->a[j]), off = _mm256_broadcast_ss(&s->b[j]);
    for (int t = 0; t < 4; t++) {
        const __m256i q = _mm256_or_si256(bits_to(v, 8 * t + 4 * (j % 2), 0, 0x0f), bits_to(high, 8 * t + j, 4, 0x10));
        w[t] = _mm256_fmadd_ps(a, floats(q), off);
    }
}

/* Q6_K group j = 4 h + u: the low nibbles (u < 2) or high nibbles of ql[64 h + 32 (u % 2), + 32), bits
 * 2u, 2u + 1 of qh[32 h, + 32) above them, minus 32; scale 2j for codes 0-15, 2j + 1 for 16-31 */
AVX2 void slices_q6_k(const uint8_t* b, int j, const Scales* s, __m256* w) {
    const int h = j / 4, u = j % 4;
    const __m256i lo = _mm256_loadu_si256((const __m256i*)(b + 64 * h + 32 * (u % 2)));
    const __m256i hi = _mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h));
    /* slot i < 4 holds a code < 16 */
    const __m256 a = _mm256_blend_ps(_mm256_broadcast_ss(&s->a[2 * j]), _mm256_broadcast_ss(&s->a[2 * j + 1]), 0xf0);
    const __m256i bias = _mm256_set1_epi32(32);
    for (int t = 0; t < 4; t++) {
        const __m256i q = _mm256_or_si256(bits_to(lo, 8 * t + 4 * (u / 2), 0, 0x0f), bits_to(hi, 8 * t + 2 * u, 4, 0x30));
        w[t] = _mm256_mul_ps(a, floats(_mm256_sub_epi32(q, bias)));
    }
}

AVX2 void slices_q8_0(const uint8_t* b, int j, const Scales* s, __m256* w) {
    (void)j;
    (void)s;
    const __m256i v = _mm256_loadu_si256((const __m256i*)(b + 2));
    const __m256 d = _mm256_set1_ps(f16_avx2(b));
    for (int t = 0; t < 4; t++) /* byte t of each lane, sign-extended */
        w[t] = _mm256_mul_ps(d, floats(_mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * t), 24)));
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1: 16 bytes of nibbles, low ones codes 0-15, high ones 16-31. With the 16
 * bytes in both halves of the vector, lanes 0-3 take low nibbles and lanes 4-7 high ones: byte t of
 * lane i is then code 4 i + t in both halves. Five-bit formats add bit 4 i + t of their 32-bit qh. */
AVX2 __m256i legacy_codes(const uint8_t* nibbles, const uint8_t* qh, int t) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)nibbles));
    const __m256i shift = _mm256_setr_epi32(8 * t, 8 * t, 8 * t, 8 * t, 8 * t + 4, 8 * t + 4, 8 * t + 4, 8 * t + 4);
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(v, shift), _mm256_set1_epi32(0x0f));
    if (qh == NULL) return q;
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits);
    const __m256i at = _mm256_setr_epi32(t, 4 + t, 8 + t, 12 + t, 16 + t, 20 + t, 24 + t, 28 + t);
    const __m256i fifth = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)bits), at), _mm256_set1_epi32(1));
    return _mm256_or_si256(q, _mm256_slli_epi32(fifth, 4));
}

/* bytes per block, where the nibbles and the fifth bits are, what every code is less, an offset */
#define LEGACY_SLICES(NAME, NIBBLES, QH, SUB, OFFSET)                                                   \
    AVX2 void NAME(const uint8_t* b, int j, const Scales* s, __m256* w) {                             \
        (void)j;                                                                                       \
        (void)s;                                                                                       \
        const __m256 d = _mm256_set1_ps(f16_avx2(b));                                                  \
        for (int t = 0; t < 4; t++) {                                                                  \
            const __m256i q = legacy_codes(b + (NIBBLES), (QH) ? b + (QH) : NULL, t);                  \
            const __m256 v = floats((SUB) ? _mm256_sub_epi32(q, _mm256_set1_epi32(SUB)) : q);         \
            w[t] = (OFFSET) ? _mm256_fmadd_ps(d, v, _mm256_set1_ps(f16_avx2(b + 2))) : _mm256_mul_ps(d, v); \
        }                                                                                              \
    }
LEGACY_SLICES(slices_q4_0, 2, 0, 8, 0)
LEGACY_SLICES(slices_q4_1, 4, 0, 0, 1)
LEGACY_SLICES(slices_q5_0, 6, 2, 16, 0)
LEGACY_SLICES(slices_q5_1, 8, 4, 0, 1)
#undef LEGACY_SLICES

/* how far ahead of a column's stream its bytes are asked for: the hardware prefetchers alone left
 * these streams at a fraction of the memory's speed (as for the int8 kernel) */
#ifndef STREAM_PREFETCH
#define STREAM_PREFETCH 4096
#endif

/* rows [0, R) x columns [n0, n0 + C), all of K, each group decoded into registers and multiplied into
 * every row: lane p of the accumulator pair takes slices p and p + 2 (see gguf_linear.c). R and C are
 * compile-time constants at each call and a block's groups are unrolled, so that nothing in the loop
 * branches and the accumulators stay in registers. */
#define STREAM_TILE(FMT, QB, BYTES)                                                                        \
    AVX2 void stream_tile_##FMT(const Args* a, int R, int64_t n0, int C) {                                 \
        __m256 acc[STREAM_ROWS][4][2];                                                                     \
        for (int r = 0; r < R; r++)                                                                        \
            for (int c = 0; c < C; c++) acc[r][c][0] = acc[r][c][1] = _mm256_setzero_ps();                 \
        for (int64_t k = 0; k < a->K; k += (QB)) {                                                         \
            for (int c = 0; c < C; c++) {                                                                  \
                const uint8_t* b = a->w + (n0 + c) * a->row_bytes + k / (QB) * (BYTES);                    \
                for (int line = 0; line < (BYTES); line += 64) __builtin_prefetch(b + STREAM_PREFETCH + line, 0, 0); \
                Scales s;                                                                                  \
                prep_##FMT(b, &s);                                                                         \
                _Pragma("GCC unroll 8") for (int j = 0; j < (QB) / GROUP; j++) {                          \
                    __m256 w[4];                                                                           \
                    slices_##FMT(b, j, &s, w);                                                             \
                    for (int t = 0; t < 4; t++)                                                            \
                        for (int r = 0; r < R; r++)                                                        \
                            acc[r][c][t % 2] = _mm256_fmadd_ps(                                            \
                                _mm256_loadu_ps(a->x + r * a->K + k + GROUP * j + 8 * t), w[t], acc[r][c][t % 2]); \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        for (int r = 0; r < R; r++) {                                                                      \
            for (int c = 0; c < C; c++) {                                                                  \
                float lanes[16];                                                                           \
                memcpy(lanes, &acc[r][c][0], 32);                                                          \
                memcpy(lanes + 8, &acc[r][c][1], 32);                                                      \
                float y = lane_sum(lanes);                                                                 \
                if (a->bias != NULL) y = y + a->bias[n0 + c];                                              \
                a->out[r * a->ldo + n0 + c] = y;                                                           \
            }                                                                                              \
        }                                                                                                  \
    }                                                                                                      \
    /* every row for columns [n, n_end): 4 columns per tile for one row (8 independent multiply-add    \
     * chains), 2 for two rows, 1 from three rows on: as many accumulators as the registers hold */       \
    __attribute__((target("arch=x86-64-v3"))) static void stream_columns_##FMT(const Args* a, int64_t n, int64_t n_end) { \
        switch (a->M) {                                                                                    \
            case 1:                                                                                        \
                for (; n + 4 <= n_end; n += 4) stream_tile_##FMT(a, 1, n, 4);                              \
                for (; n < n_end; n++) stream_tile_##FMT(a, 1, n, 1);                                      \
                break;                                                                                     \
            case 2:                                                                                        \
                for (; n + 2 <= n_end; n += 2) stream_tile_##FMT(a, 2, n, 2);                              \
                for (; n < n_end; n++) stream_tile_##FMT(a, 2, n, 1);                                      \
                break;                                                                                     \
            case 3: for (; n < n_end; n++) stream_tile_##FMT(a, 3, n, 1); break;                           \
            case 4: for (; n < n_end; n++) stream_tile_##FMT(a, 4, n, 1); break;                           \
            default: for (; n < n_end; n++) stream_tile_##FMT(a, 5, n, 1); break;                          \
        }                                                                                                  \
    }                                                                                                      \
    /* values [k0, k0 + count) of a row in the buffered path's layout (halves: see gguf_linear.c) */    \
    __attribute__((target("arch=x86-64-v3"))) static void half_span_##FMT(const uint8_t* src, int64_t k0, int64_t count, float* out) { \
        for (int64_t k = 0; k < count; k += (QB)) {                                                        \
            const uint8_t* b = src + (k0 + k) / (QB) * (BYTES);                                            \
            Scales s;                                                                                      \
            prep_##FMT(b, &s);                                                                             \
            _Pragma("GCC unroll 8") for (int j = 0; j < (QB) / GROUP; j++) {                              \
                __m256 w[4];                                                                               \
                slices_##FMT(b, j, &s, w);                                                                 \
                for (int t = 0; t < 4; t++) _mm256_storeu_ps(out + half_index(count, k / GROUP + j, t, 0), w[t]); \
            }                                                                                              \
        }                                                                                                  \
    }
SLICED_FORMATS(STREAM_TILE)
#undef STREAM_TILE

/* every row (M <= STREAM_ROWS) for output columns [n_begin, n_end); 0 where the format has no slices */
__attribute__((target("arch=x86-64-v3"))) static int stream_columns(const Args* a, int64_t n_begin, int64_t n_end) {
    const Format* f = a->format;
#define STREAM(FMT) stream_columns_##FMT(a, n_begin, n_end)
    BY_FORMAT(STREAM)
#undef STREAM
}

/* values [k0, k0 + count) of one row in the buffered layout; 0 where the format has no slices */
__attribute__((target("arch=x86-64-v3"))) static int slices_span(const Format* f, const uint8_t* src, int64_t k0, int64_t count, float* out) {
#define SPAN(FMT) half_span_##FMT(src, k0, count, out)
    BY_FORMAT(SPAN)
#undef SPAN
}

/* whether the format decodes straight into slots (else: natural order, rearranged) */
static inline int has_slices(const Format* f) { return f->type != T_F16 && f->type != T_BF16; }

#undef AVX2
