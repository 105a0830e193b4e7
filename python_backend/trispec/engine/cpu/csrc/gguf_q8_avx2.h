/* The AVX2 copies of the integer path (gguf_q8.h), included twice: Q8_VNNI 1 builds the AVX-VNNI one
 * (vpdpbusd / vpdpwssd on 256-bit registers), 0 the plain AVX2 one (vpmaddubsw, then vpmaddwd and an
 * add). The sums are exact either way: vpmaddubsw's 16-bit pairs stay under 2 * 128 * 127 with the
 * codes used here, so it never saturates. A 16-lane chunk is two registers: lo = lanes 0-7 (values
 * 0-31 of the chunk), hi = lanes 8-15 (values 32-63). */
#if Q8_VNNI
#define Q8_TARGET __attribute__((target("arch=x86-64-v3,avxvnni")))
#define Q8(name) q8_##name##_avxvnni
#else
#define Q8_TARGET __attribute__((target("arch=x86-64-v3")))
#define Q8(name) q8_##name##_avx2
#endif
#define Q8_IN Q8_TARGET static inline __attribute__((always_inline))
#define Q8_RT 4
#define Q8_512 0

#include "gguf_q8_prep.h"

/* acc + per-lane sums of four u8 * s8 products */
Q8_IN __m256i Q8(dot4)(__m256i acc, __m256i u, __m256i s) {
#if Q8_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}
/* acc + per-lane sums of two (u8 * s8 pair) * sc products: a sub-block scale applied in the same pass */
Q8_IN __m256i Q8(dot4s)(__m256i acc, __m256i u, __m256i s, __m256i sc) {
    const __m256i p = _mm256_maddubs_epi16(u, s);
#if Q8_VNNI
    return _mm256_dpwssd_avx_epi32(acc, p, sc);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
#endif
}
Q8_IN __m256i Q8(ld)(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
Q8_IN float Q8(f16)(const uint8_t* p) { return _cvtsh_ss(u16_at(p)); }
/* f + d * (float)lanes, both halves */
Q8_IN void Q8(fold)(__m256* f, float d, __m256i lo, __m256i hi) {
    const __m256 dv = _mm256_set1_ps(d);
    f[0] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(lo), f[0]);
    f[1] = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(hi), f[1]);
}
Q8_IN float Q8(total)(const __m256* f) {
    float t[16];
    _mm256_storeu_ps(t, f[0]);
    _mm256_storeu_ps(t + 8, f[1]);
    return q8_lanes(t, t + 8);
}
/* bit `bit` of every byte of h, moved to bit 4 */
Q8_IN __m256i Q8(bit4)(__m256i h, int bit) {
    const __m256i moved = bit >= 4 ? _mm256_srli_epi16(h, bit - 4) : _mm256_slli_epi16(h, 4 - bit);
    return _mm256_and_si256(moved, _mm256_set1_epi8(0x10));
}

/* Q4_K (five = 0) and Q5_K (five = 1): 256 values per block, 8 sub-blocks with 6-bit scales and mins */
Q8_IN void Q8(k45)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int five,
                   const int R) {
    __m256 f[Q8_RT][2];
    __m128 g[Q8_RT];
    for (int r = 0; r < R; r++) f[r][0] = f[r][1] = _mm256_setzero_ps(), g[r] = _mm_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const int64_t bytes = five ? 176 : 144;
    for (int64_t sb = 0; sb < K / Q8_BLOCK; sb++) {
        const uint8_t* b = w + sb * bytes;
        uint64_t sc, mn;
        k_codes(b, &sc, &mn);
        const __m256i S = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn));
        const uint8_t* qs = b + (five ? 48 : 16);
        const __m256i qh = five ? Q8(ld)(b + 16) : _mm256_setzero_si256();
        __m256i acc[Q8_RT][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q = Q8(ld)(qs + 32 * c);
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                lo = _mm256_or_si256(lo, Q8(bit4)(qh, 2 * c));
                hi = _mm256_or_si256(hi, Q8(bit4)(qh, 2 * c + 1));
            }
            /* the sub-blocks' scales as 16-bit words: 2 c for lo, 2 c + 1 for hi */
            const __m256i sl = _mm256_shuffle_epi8(S, _mm256_set1_epi16((short)((4 * c + 1) << 8 | 4 * c)));
            const __m256i sh = _mm256_shuffle_epi8(S, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
            for (int r = 0; r < R; r++) {
                const int8_t* xq = x[r * nblk + sb].q + Q8_CHUNK * c;
                acc[r][0] = Q8(dot4s)(acc[r][0], lo, Q8(ld)(xq), sl);
                acc[r][1] = Q8(dot4s)(acc[r][1], hi, Q8(ld)(xq + 32), sh);
            }
        }
        const float d = Q8(f16)(b), dmin = Q8(f16)(b + 2);
        for (int r = 0; r < R; r++) {
            const Q8Block* xb = &x[r * nblk + sb];
            Q8(fold)(f[r], d * xb->d, acc[r][0], acc[r][1]);
            const __m128i m = _mm_madd_epi16(mins, _mm_loadu_si128((const __m128i*)xb->bsum32));
            g[r] = _mm_fmadd_ps(_mm_set1_ps(dmin * xb->d), _mm_cvtepi32_ps(m), g[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float gs[4];
        _mm_storeu_ps(gs, g[r]);
        res[r] = Q8(total)(f[r]) - q8_mins(gs);
    }
}

/* Q6_K: 256 values, 16 sub-blocks of 16 with int8 scales, codes 0-63 standing for -32..31 */
Q8_IN void Q8(k6)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int R) {
    __m256 f[Q8_RT][2];
    for (int r = 0; r < R; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    for (int64_t sb = 0; sb < K / Q8_BLOCK; sb++) {
        const uint8_t* b = w + sb * 210;
        const __m128i S8 = _mm_loadu_si128((const __m128i*)(b + 192));
        __m256i acc[Q8_RT][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            const __m256i l0 = Q8(ld)(b + 64 * n), l1 = Q8(ld)(b + 64 * n + 32), h = Q8(ld)(b + 128 + 32 * n);
            __m256i v[4], s[4];
            v[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            v[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m30));
            v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
            for (int j = 0; j < 4; j++) { /* values 32 j .. 32 j + 31 of the half: sub-blocks 8 n + 2 j, + 1 */
                const long long a = 8 * n + 2 * j;
                const __m128i pick = _mm_set_epi64x((a + 1) * 0x0101010101010101LL, a * 0x0101010101010101LL);
                s[j] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(S8, pick));
            }
            for (int r = 0; r < R; r++) {
                const int8_t* xq = x[r * nblk + sb].q + 128 * n;
                acc[r][0] = Q8(dot4s)(acc[r][0], v[0], Q8(ld)(xq), s[0]);
                acc[r][1] = Q8(dot4s)(acc[r][1], v[1], Q8(ld)(xq + 32), s[1]);
                acc[r][0] = Q8(dot4s)(acc[r][0], v[2], Q8(ld)(xq + 64), s[2]);
                acc[r][1] = Q8(dot4s)(acc[r][1], v[3], Q8(ld)(xq + 96), s[3]);
            }
        }
        const __m256i S16 = _mm256_cvtepi8_epi16(S8);
        const float d = Q8(f16)(b + 208);
        for (int r = 0; r < R; r++) {
            const Q8Block* xb = &x[r * nblk + sb];
            const __m256i o = _mm256_madd_epi16(S16, Q8(ld)(xb->bsum16));
            Q8(fold)(f[r], d * xb->d, _mm256_sub_epi32(acc[r][0], _mm256_slli_epi32(o, 5)), acc[r][1]);
        }
    }
    for (int r = 0; r < R; r++) res[r] = Q8(total)(f[r]);
}

/* the 32 nibbles of a legacy block: low ones (values 0-15), then high ones (16-31) */
Q8_IN __m256i Q8(nibbles)(const uint8_t* qs) {
    const __m128i q = _mm_loadu_si128((const __m128i*)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}
/* a block of 32 as signed codes: Q4_0 (type 2), Q5_0 (6), Q8_0 (8) */
Q8_IN __m256i Q8(legacy_codes)(const uint8_t* b, const int type) {
    if (type == T_Q8_0) return Q8(ld)(b + 2);
    if (type == T_Q4_0) return _mm256_sub_epi8(Q8(nibbles)(b + 2), _mm256_set1_epi8(8));
    uint32_t h;
    memcpy(&h, b + 2, sizeof h);
    /* byte i: 0xff where bit i of h is set */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h), _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                     0x0101010101010101LL, 0));
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
    return _mm256_sub_epi8(Q8(nibbles)(b + 6), _mm256_andnot_si256(set, _mm256_set1_epi8(16)));
}

/* Q4_0 / Q5_0 / Q8_0: blocks of 32, one float16 scale each; a chunk is two blocks */
Q8_IN void Q8(legacy)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int type,
                      const int R) {
    const int64_t bytes = type == T_Q8_0 ? 34 : type == T_Q4_0 ? 18 : 22;
    __m256 f[Q8_RT][2];
    for (int r = 0; r < R; r++) f[r][0] = f[r][1] = _mm256_setzero_ps();
    for (int64_t c = 0; c < K / Q8_CHUNK; c++) {
        const uint8_t* b0 = w + 2 * c * bytes;
        _mm_prefetch((const char*)(b0 + X16_PREFETCH), _MM_HINT_T0); /* a chunk is under a line: one a chunk */
        const __m256i w0 = Q8(legacy_codes)(b0, type), w1 = Q8(legacy_codes)(b0 + bytes, type);
        const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
        const float d0 = Q8(f16)(b0), d1 = Q8(f16)(b0 + bytes);
        for (int r = 0; r < R; r++) {
            const Q8Block* xb = &x[r * nblk + c / 4];
            const int8_t* xq = xb->q + Q8_CHUNK * (c % 4);
            const __m256i i0 = Q8(dot4)(_mm256_setzero_si256(), a0, _mm256_sign_epi8(Q8(ld)(xq), w0));
            const __m256i i1 = Q8(dot4)(_mm256_setzero_si256(), a1, _mm256_sign_epi8(Q8(ld)(xq + 32), w1));
            f[r][0] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xb->d), _mm256_cvtepi32_ps(i0), f[r][0]);
            f[r][1] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * xb->d), _mm256_cvtepi32_ps(i1), f[r][1]);
        }
    }
    for (int r = 0; r < R; r++) res[r] = Q8(total)(f[r]);
}

/* each format for R rows, R a constant in the body (the tiles' registers) */
#define Q8_ROWS(call)                       \
    switch (R) {                            \
        case 1: call(1); break;             \
        case 2: call(2); break;             \
        case 3: call(3); break;             \
        default: call(4); break;            \
    }

#define Q8_XR 2 /* rows per tile of the 16-column kernels */
#include "gguf_q8_x16_isa.h"
#include "gguf_q8_cols.h"
#include "gguf_stack_isa.h"
#undef Q8_XR

#undef Q8_ROWS
#undef Q8_TARGET
#undef Q8
#undef Q8_IN
#undef Q8_RT
#undef Q8_512
