/* The AVX-512 VNNI copy of the integer path (gguf_q8.h): a 64-value chunk in one register, so each
 * lane holds what the AVX2 copies' lo (lanes 0-7) and hi (8-15) registers hold, and the same exact
 * sums and float steps give the same bits. AVX-512 has no vpsignb: the legacy formats' signs are
 * applied to x by a masked negate (where a code is 0 its absolute value zeroes the product anyway). */
#define Q8_TARGET __attribute__((target("arch=x86-64-v4,avx512vnni")))
#define Q8(name) q8_##name##_avx512
#define Q8_IN Q8_TARGET static inline __attribute__((always_inline))
#define Q8_RT 8
#define Q8_512 1

#include "gguf_q8_prep.h"

Q8_IN __m512i Q8(ld)(const void* p) { return _mm512_loadu_si512(p); }
Q8_IN __m512i Q8(dup32)(const uint8_t* p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)p)); }
Q8_IN float Q8(f16)(const uint8_t* p) { return _cvtsh_ss(u16_at(p)); }
Q8_IN __m512i Q8(dot4s)(__m512i acc, __m512i u, __m512i s, __m512i sc) {
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, s), sc);
}
Q8_IN __m512 Q8(fold)(__m512 f, float d, __m512i lanes) {
    return _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(lanes), f);
}
Q8_IN float Q8(total)(__m512 f) {
    float t[16];
    _mm512_storeu_ps(t, f);
    return q8_lanes(t, t + 8);
}
/* a 16-bit word of w for lanes 0-15, another for lanes 16-31 (pshufb controls, per 128-bit lane) */
Q8_IN __m512i Q8(two_words)(int lo, int hi) {
    const __m256i a = _mm256_set1_epi16((short)((2 * lo + 1) << 8 | 2 * lo));
    const __m256i b = _mm256_set1_epi16((short)((2 * hi + 1) << 8 | 2 * hi));
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* Q4_K (five = 0) and Q5_K (five = 1) */
Q8_IN void Q8(k45)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int five,
                   const int R) {
    __m512 f[Q8_RT];
    __m128 g[Q8_RT];
    for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps(), g[r] = _mm_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const int64_t bytes = five ? 176 : 144;
    for (int64_t sb = 0; sb < K / Q8_BLOCK; sb++) {
        const uint8_t* b = w + sb * bytes;
        uint64_t sc, mn;
        k_codes(b, &sc, &mn);
        const __m512i S = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn));
        const uint8_t* qs = b + (five ? 48 : 16);
        const __m512i qh = five ? Q8(dup32)(b + 16) : _mm512_setzero_si512();
        __m512i acc[Q8_RT];
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            __m512i v = _mm512_and_si512(_mm512_srlv_epi64(Q8(dup32)(qs + 32 * c), shift), m4);
            if (five) {
                const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                                       _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
                v = _mm512_mask_add_epi8(v, _mm512_test_epi8_mask(qh, bit), v, _mm512_set1_epi8(16));
            }
            const __m512i s = _mm512_shuffle_epi8(S, Q8(two_words)(2 * c, 2 * c + 1));
            for (int r = 0; r < R; r++) acc[r] = Q8(dot4s)(acc[r], v, Q8(ld)(x[r * nblk + sb].q + Q8_CHUNK * c), s);
        }
        const float d = Q8(f16)(b), dmin = Q8(f16)(b + 2);
        for (int r = 0; r < R; r++) {
            const Q8Block* xb = &x[r * nblk + sb];
            f[r] = Q8(fold)(f[r], d * xb->d, acc[r]);
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

/* Q6_K */
Q8_IN void Q8(k6)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int R) {
    __m512 f[Q8_RT];
    for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i up = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), down = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    for (int64_t sb = 0; sb < K / Q8_BLOCK; sb++) {
        const uint8_t* b = w + sb * 210;
        const __m256i S16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 192)));
        const __m512i Sz = _mm512_inserti64x4(_mm512_setzero_si512(), S16, 0);
        __m512i acc[Q8_RT];
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
        for (int n = 0; n < 2; n++) {
            const __m512i l = Q8(ld)(b + 64 * n), h = Q8(dup32)(b + 128 + 32 * n);
            const __m512i v0 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi64(h, up), m30));
            const __m512i v1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                               _mm512_and_si512(_mm512_srlv_epi64(h, down), m30));
            /* chunk c = 2 n (+ 1): int16 lane p holds values 2 p, 2 p + 1, sub-block 4 c + p / 8 */
            __m512i s[2];
            for (int j = 0; j < 2; j++) {
                const int c = 2 * n + j;
                const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * c)),
                                                     _mm512_srli_epi16(_mm512_setr_epi32(
                                                         0x00010000, 0x00030002, 0x00050004, 0x00070006,
                                                         0x00090008, 0x000b000a, 0x000d000c, 0x000f000e,
                                                         0x00110010, 0x00130012, 0x00150014, 0x00170016,
                                                         0x00190018, 0x001b001a, 0x001d001c, 0x001f001e), 3));
                s[j] = _mm512_permutexvar_epi16(idx, Sz);
            }
            for (int r = 0; r < R; r++) {
                const int8_t* xq = x[r * nblk + sb].q + 128 * n;
                acc[r] = Q8(dot4s)(acc[r], v0, Q8(ld)(xq), s[0]);
                acc[r] = Q8(dot4s)(acc[r], v1, Q8(ld)(xq + 64), s[1]);
            }
        }
        const float d = Q8(f16)(b + 208);
        for (int r = 0; r < R; r++) {
            const Q8Block* xb = &x[r * nblk + sb];
            const __m256i o = _mm256_slli_epi32(_mm256_madd_epi16(S16, _mm256_loadu_si256((const __m256i*)xb->bsum16)), 5);
            f[r] = Q8(fold)(f[r], d * xb->d, _mm512_sub_epi32(acc[r], _mm512_inserti64x4(_mm512_setzero_si512(), o, 0)));
        }
    }
    for (int r = 0; r < R; r++) res[r] = Q8(total)(f[r]);
}

/* two legacy blocks' 32 nibbles each: [low, high] of the first, then of the second */
Q8_IN __m512i Q8(nibbles2)(const uint8_t* qs0, const uint8_t* qs1) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)qs0));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)qs1));
    const __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    return _mm512_and_si512(_mm512_srlv_epi64(t, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0f));
}
/* blocks b0 and b0 + bytes as signed codes */
Q8_IN __m512i Q8(legacy_codes)(const uint8_t* b0, int64_t bytes, const int type) {
    const uint8_t* b1 = b0 + bytes;
    if (type == T_Q8_0)
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i*)(b0 + 2))),
                                  _mm256_loadu_si256((const __m256i*)(b1 + 2)), 1);
    if (type == T_Q4_0) return _mm512_sub_epi8(Q8(nibbles2)(b0 + 2, b1 + 2), _mm512_set1_epi8(8));
    uint32_t h0, h1;
    memcpy(&h0, b0 + 2, sizeof h0);
    memcpy(&h1, b1 + 2, sizeof h1);
    const __mmask64 set = (uint64_t)h1 << 32 | h0;
    const __m512i v = Q8(nibbles2)(b0 + 6, b1 + 6);
    return _mm512_mask_sub_epi8(v, ~set, v, _mm512_set1_epi8(16));
}

Q8_IN void Q8(legacy)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int type,
                      const int R) {
    const int64_t bytes = type == T_Q8_0 ? 34 : type == T_Q4_0 ? 18 : 22;
    __m512 f[Q8_RT];
    for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K / Q8_CHUNK; c++) {
        const uint8_t* b0 = w + 2 * c * bytes;
        _mm_prefetch((const char*)(b0 + X16_PREFETCH), _MM_HINT_T0); /* a chunk is under a line: one a chunk */
        const __m512i v = Q8(legacy_codes)(b0, bytes, type);
        const __m512i a = _mm512_abs_epi8(v);
        const __mmask64 neg = _mm512_movepi8_mask(v);
        const __m512 dw = _mm512_insertf32x8(_mm512_set1_ps(Q8(f16)(b0)), _mm256_set1_ps(Q8(f16)(b0 + bytes)), 1);
        for (int r = 0; r < R; r++) {
            const Q8Block* xb = &x[r * nblk + c / 4];
            const __m512i xv = Q8(ld)(xb->q + Q8_CHUNK * (c % 4));
            const __m512i xs = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
            const __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), a, xs);
            f[r] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), _mm512_cvtepi32_ps(i), f[r]);
        }
    }
    for (int r = 0; r < R; r++) res[r] = Q8(total)(f[r]);
}

#define Q8_ROWS(call)               \
    switch (R) {                    \
        case 1: call(1); break;     \
        case 2: call(2); break;     \
        case 3: call(3); break;     \
        case 4: call(4); break;     \
        case 5: call(5); break;     \
        case 6: call(6); break;     \
        case 7: call(7); break;     \
        default: call(8); break;    \
    }

#define Q8_XR 6 /* rows per tile of the 16-column kernels */
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
