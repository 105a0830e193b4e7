/* The repacked Q4_K / Q6_K kernels (gguf_q8_x16.h) of one ISA copy, over a 16-lane vector: one
 * AVX-512 register, or two AVX2 ones (lanes 0-7, 8-15), each lane one output column. Included by each
 * ISA header (Q8_512 set by the AVX-512 one). Exact integer steps and the same float step per lane:
 * the same bits in every copy. */
#if Q8_512
typedef __m512i Q8(vi);
typedef __m512 Q8(vf);
Q8_IN Q8(vi) Q8(v_zero)(void) { return _mm512_setzero_si512(); }
Q8_IN Q8(vi) Q8(v_ld)(const uint8_t* p) { return _mm512_loadu_si512(p); }
Q8_IN Q8(vi) Q8(v_and8)(Q8(vi) a, int m) { return _mm512_and_si512(a, _mm512_set1_epi8((char)m)); }
Q8_IN Q8(vi) Q8(v_or)(Q8(vi) a, Q8(vi) b) { return _mm512_or_si512(a, b); }
Q8_IN Q8(vi) Q8(v_srli16)(Q8(vi) a, int n) { return _mm512_srli_epi16(a, n); }
Q8_IN Q8(vi) Q8(v_slli16)(Q8(vi) a, int n) { return _mm512_slli_epi16(a, n); }
Q8_IN Q8(vi) Q8(v_add)(Q8(vi) a, Q8(vi) b) { return _mm512_add_epi32(a, b); }
Q8_IN Q8(vi) Q8(v_sub)(Q8(vi) a, Q8(vi) b) { return _mm512_sub_epi32(a, b); }
Q8_IN Q8(vi) Q8(v_slli32)(Q8(vi) a, int n) { return _mm512_slli_epi32(a, n); }
Q8_IN Q8(vi) Q8(v_lo16)(Q8(vi) a) { return _mm512_srai_epi32(_mm512_slli_epi32(a, 16), 16); }
Q8_IN Q8(vi) Q8(v_hi16)(Q8(vi) a) { return _mm512_srai_epi32(a, 16); }
Q8_IN Q8(vi) Q8(v_mul)(Q8(vi) a, Q8(vi) b) { return _mm512_mullo_epi32(a, b); }
/* acc + four u8 codes of each lane times the same four int8 activations */
Q8_IN Q8(vi) Q8(v_dpb)(Q8(vi) acc, Q8(vi) w, const int8_t* x4) {
    int32_t x;
    memcpy(&x, x4, 4);
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x));
}
/* acc + two int16 of each lane times the same two int16 */
Q8_IN Q8(vi) Q8(v_dpw)(Q8(vi) acc, Q8(vi) w, const int16_t* p2) {
    int32_t x;
    memcpy(&x, p2, 4);
    return _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(x));
}
/* Q8_0's codes stored as u = w + 128: acc + sum u x (the caller takes 128 sum x off per block) */
#define Q8_U8_OFFSET 1
Q8_IN Q8(vi) Q8(v_dpb8)(Q8(vi) acc, Q8(vi) u, const int8_t* x4) { return Q8(v_dpb)(acc, u, x4); }
Q8_IN Q8(vi) Q8(v_minus)(Q8(vi) a, int32_t k) { return _mm512_sub_epi32(a, _mm512_set1_epi32(k)); }
Q8_IN Q8(vi) Q8(v_u8to32)(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
Q8_IN Q8(vi) Q8(v_u8to16)(const uint8_t* p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)p)); }
Q8_IN Q8(vi) Q8(v_s8to16)(const uint8_t* p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)p)); }
Q8_IN Q8(vf) Q8(f_half)(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
Q8_IN Q8(vf) Q8(f_scale)(Q8(vf) d, float x) { return _mm512_mul_ps(d, _mm512_set1_ps(x)); }
Q8_IN Q8(vf) Q8(f_fold)(Q8(vf) f, Q8(vf) d, Q8(vi) i) { return _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(i), f); }
Q8_IN Q8(vf) Q8(f_zero)(void) { return _mm512_setzero_ps(); }
Q8_IN void Q8(f_store)(float* p, Q8(vf) f) { _mm512_storeu_ps(p, f); }
#else
typedef struct {
    __m256i a, b;
} Q8(vi);
typedef struct {
    __m256 a, b;
} Q8(vf);
#define Q8_BOTH(expr_a, expr_b) ((Q8(vi)){expr_a, expr_b})
Q8_IN Q8(vi) Q8(v_zero)(void) { return Q8_BOTH(_mm256_setzero_si256(), _mm256_setzero_si256()); }
Q8_IN Q8(vi) Q8(v_ld)(const uint8_t* p) {
    return Q8_BOTH(_mm256_loadu_si256((const __m256i*)p), _mm256_loadu_si256((const __m256i*)(p + 32)));
}
Q8_IN Q8(vi) Q8(v_and8)(Q8(vi) v, int m) {
    const __m256i k = _mm256_set1_epi8((char)m);
    return Q8_BOTH(_mm256_and_si256(v.a, k), _mm256_and_si256(v.b, k));
}
Q8_IN Q8(vi) Q8(v_or)(Q8(vi) x, Q8(vi) y) { return Q8_BOTH(_mm256_or_si256(x.a, y.a), _mm256_or_si256(x.b, y.b)); }
Q8_IN Q8(vi) Q8(v_srli16)(Q8(vi) v, int n) { return Q8_BOTH(_mm256_srli_epi16(v.a, n), _mm256_srli_epi16(v.b, n)); }
Q8_IN Q8(vi) Q8(v_slli16)(Q8(vi) v, int n) { return Q8_BOTH(_mm256_slli_epi16(v.a, n), _mm256_slli_epi16(v.b, n)); }
Q8_IN Q8(vi) Q8(v_add)(Q8(vi) x, Q8(vi) y) { return Q8_BOTH(_mm256_add_epi32(x.a, y.a), _mm256_add_epi32(x.b, y.b)); }
Q8_IN Q8(vi) Q8(v_sub)(Q8(vi) x, Q8(vi) y) { return Q8_BOTH(_mm256_sub_epi32(x.a, y.a), _mm256_sub_epi32(x.b, y.b)); }
Q8_IN Q8(vi) Q8(v_slli32)(Q8(vi) v, int n) { return Q8_BOTH(_mm256_slli_epi32(v.a, n), _mm256_slli_epi32(v.b, n)); }
Q8_IN Q8(vi) Q8(v_lo16)(Q8(vi) v) {
    return Q8_BOTH(_mm256_srai_epi32(_mm256_slli_epi32(v.a, 16), 16), _mm256_srai_epi32(_mm256_slli_epi32(v.b, 16), 16));
}
Q8_IN Q8(vi) Q8(v_hi16)(Q8(vi) v) { return Q8_BOTH(_mm256_srai_epi32(v.a, 16), _mm256_srai_epi32(v.b, 16)); }
Q8_IN Q8(vi) Q8(v_mul)(Q8(vi) x, Q8(vi) y) { return Q8_BOTH(_mm256_mullo_epi32(x.a, y.a), _mm256_mullo_epi32(x.b, y.b)); }
Q8_IN Q8(vi) Q8(v_dpb)(Q8(vi) acc, Q8(vi) w, const int8_t* x4) {
    int32_t x;
    memcpy(&x, x4, 4);
    const __m256i xv = _mm256_set1_epi32(x);
    return Q8_BOTH(Q8(dot4)(acc.a, w.a, xv), Q8(dot4)(acc.b, w.b, xv));
}
/* Q8_0's codes stored as u = w + 128. AVX-VNNI: acc + sum u x (the caller takes 128 sum x off per
 * block); AVX2: vpmaddubsw would saturate on u, so acc + sum w x directly (sign trick), nothing to take
 * off: the same integers either way */
#define Q8_U8_OFFSET Q8_VNNI
Q8_IN Q8(vi) Q8(v_dpb8)(Q8(vi) acc, Q8(vi) u, const int8_t* x4) {
#if Q8_VNNI
    return Q8(v_dpb)(acc, u, x4);
#else
    int32_t x;
    memcpy(&x, x4, 4);
    const __m256i xv = _mm256_set1_epi32(x), flip = _mm256_set1_epi8((char)0x80);
    const __m256i wa = _mm256_xor_si256(u.a, flip), wb = _mm256_xor_si256(u.b, flip);
    return Q8_BOTH(Q8(dot4)(acc.a, _mm256_abs_epi8(wa), _mm256_sign_epi8(xv, wa)),
                   Q8(dot4)(acc.b, _mm256_abs_epi8(wb), _mm256_sign_epi8(xv, wb)));
#endif
}
Q8_IN Q8(vi) Q8(v_minus)(Q8(vi) v, int32_t k) {
    const __m256i kv = _mm256_set1_epi32(k);
    return Q8_BOTH(_mm256_sub_epi32(v.a, kv), _mm256_sub_epi32(v.b, kv));
}
Q8_IN Q8(vi) Q8(v_dpw)(Q8(vi) acc, Q8(vi) w, const int16_t* p2) {
    int32_t x;
    memcpy(&x, p2, 4);
    const __m256i xv = _mm256_set1_epi32(x);
#if Q8_VNNI
    return Q8_BOTH(_mm256_dpwssd_avx_epi32(acc.a, w.a, xv), _mm256_dpwssd_avx_epi32(acc.b, w.b, xv));
#else
    return Q8_BOTH(_mm256_add_epi32(acc.a, _mm256_madd_epi16(w.a, xv)), _mm256_add_epi32(acc.b, _mm256_madd_epi16(w.b, xv)));
#endif
}
Q8_IN Q8(vi) Q8(v_u8to32)(const uint8_t* p) {
    return Q8_BOTH(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)),
                   _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8))));
}
Q8_IN Q8(vi) Q8(v_u8to16)(const uint8_t* p) {
    return Q8_BOTH(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)p)),
                   _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(p + 16))));
}
Q8_IN Q8(vi) Q8(v_s8to16)(const uint8_t* p) {
    return Q8_BOTH(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p)),
                   _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p + 16))));
}
Q8_IN Q8(vf) Q8(f_half)(const uint8_t* p) {
    return (Q8(vf)){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 16)))};
}
Q8_IN Q8(vf) Q8(f_scale)(Q8(vf) d, float x) {
    const __m256 xv = _mm256_set1_ps(x);
    return (Q8(vf)){_mm256_mul_ps(d.a, xv), _mm256_mul_ps(d.b, xv)};
}
Q8_IN Q8(vf) Q8(f_fold)(Q8(vf) f, Q8(vf) d, Q8(vi) i) {
    return (Q8(vf)){_mm256_fmadd_ps(d.a, _mm256_cvtepi32_ps(i.a), f.a), _mm256_fmadd_ps(d.b, _mm256_cvtepi32_ps(i.b), f.b)};
}
Q8_IN Q8(vf) Q8(f_zero)(void) { return (Q8(vf)){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
Q8_IN void Q8(f_store)(float* p, Q8(vf) f) {
    _mm256_storeu_ps(p, f.a);
    _mm256_storeu_ps(p + 8, f.b);
}
#undef Q8_BOTH
#endif

/* Q4_K, 16 columns x R rows: res[16 r + c] */
Q8_IN void Q8(x16_q4k)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int R) {
    Q8(vf) f[Q8_XR], g[Q8_XR];
    for (int r = 0; r < R; r++) f[r] = g[r] = Q8(f_zero)();
    for (int64_t sb = 0; sb < K / Q8_BLOCK; sb++) {
        const uint8_t* b = w + sb * X16_Q4K_BYTES;
        for (int line = 0; line < 320; line += 64) _mm_prefetch((const char*)(b + line + X16_PREFETCH), _MM_HINT_T0);
        Q8(vi) isum[Q8_XR], imin[Q8_XR];
        for (int r = 0; r < R; r++) isum[r] = imin[r] = Q8(v_zero)();
        for (int p = 0; p < 4; p++) {
            const Q8(vi) m = Q8(v_u8to16)(b + 192 + 32 * p);
            for (int r = 0; r < R; r++) imin[r] = Q8(v_dpw)(imin[r], m, x[r * nblk + sb].bsum32 + 2 * p);
        }
        for (int j = 0; j < 8; j++) {
            Q8(vi) acc[Q8_XR];
            for (int r = 0; r < R; r++) acc[r] = Q8(v_zero)();
            for (int p = 0; p < 4; p++) {
                _mm_prefetch((const char*)(b + 320 + 256 * j + 64 * p + X16_PREFETCH), _MM_HINT_T0);
                const Q8(vi) q = Q8(v_ld)(b + 320 + 256 * j + 64 * p);
                const Q8(vi) lo = Q8(v_and8)(q, 0x0f), hi = Q8(v_and8)(Q8(v_srli16)(q, 4), 0x0f);
                for (int r = 0; r < R; r++) {
                    const int8_t* xq = x[r * nblk + sb].q + 32 * j + 8 * p;
                    acc[r] = Q8(v_dpb)(Q8(v_dpb)(acc[r], lo, xq), hi, xq + 4);
                }
            }
            const Q8(vi) sc = Q8(v_u8to32)(b + 64 + 16 * j);
            for (int r = 0; r < R; r++) isum[r] = Q8(v_add)(isum[r], Q8(v_mul)(acc[r], sc));
        }
        const Q8(vf) d = Q8(f_half)(b), dmin = Q8(f_half)(b + 32);
        for (int r = 0; r < R; r++) {
            const float dx = x[r * nblk + sb].d;
            f[r] = Q8(f_fold)(f[r], Q8(f_scale)(d, dx), isum[r]);
            g[r] = Q8(f_fold)(g[r], Q8(f_scale)(dmin, dx), imin[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float fs[16], gs[16];
        Q8(f_store)(fs, f[r]);
        Q8(f_store)(gs, g[r]);
        for (int c = 0; c < 16; c++) res[16 * r + c] = fs[c] - gs[c];
    }
}

/* Q6_K, 16 columns x R rows */
Q8_IN void Q8(x16_q6k)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int R) {
    Q8(vf) f[Q8_XR];
    for (int r = 0; r < R; r++) f[r] = Q8(f_zero)();
    for (int64_t sb = 0; sb < K / Q8_BLOCK; sb++) {
        const uint8_t* b = w + sb * X16_Q6K_BYTES;
        for (int line = 0; line < 288; line += 64) _mm_prefetch((const char*)(b + line + X16_PREFETCH), _MM_HINT_T0);
        Q8(vi) isum[Q8_XR], ioff[Q8_XR];
        for (int r = 0; r < R; r++) isum[r] = ioff[r] = Q8(v_zero)();
        for (int p = 0; p < 8; p++) {
            const Q8(vi) sp = Q8(v_s8to16)(b + 32 + 32 * p);
            for (int r = 0; r < R; r++) ioff[r] = Q8(v_dpw)(ioff[r], sp, x[r * nblk + sb].bsum16 + 2 * p);
            for (int t = 0; t < 2; t++) {
                const int j = 2 * p + t;
                const Q8(vi) sc = t ? Q8(v_hi16)(sp) : Q8(v_lo16)(sp);
                const uint8_t* q = b + 288 + 192 * j;
                for (int line = 0; line < 192; line += 64) _mm_prefetch((const char*)(q + line + X16_PREFETCH), _MM_HINT_T0);
                const Q8(vi) l0 = Q8(v_ld)(q), l1 = Q8(v_ld)(q + 64), h = Q8(v_ld)(q + 128);
                const Q8(vi) v0 = Q8(v_or)(Q8(v_and8)(l0, 0x0f), Q8(v_and8)(Q8(v_slli16)(h, 4), 0x30));
                const Q8(vi) v1 = Q8(v_or)(Q8(v_and8)(Q8(v_srli16)(l0, 4), 0x0f), Q8(v_and8)(Q8(v_slli16)(h, 2), 0x30));
                const Q8(vi) v2 = Q8(v_or)(Q8(v_and8)(l1, 0x0f), Q8(v_and8)(h, 0x30));
                const Q8(vi) v3 = Q8(v_or)(Q8(v_and8)(Q8(v_srli16)(l1, 4), 0x0f), Q8(v_and8)(Q8(v_srli16)(h, 2), 0x30));
                for (int r = 0; r < R; r++) {
                    const int8_t* xq = x[r * nblk + sb].q + 16 * j;
                    Q8(vi) acc = Q8(v_dpb)(Q8(v_zero)(), v0, xq);
                    acc = Q8(v_dpb)(Q8(v_dpb)(Q8(v_dpb)(acc, v1, xq + 4), v2, xq + 8), v3, xq + 12);
                    isum[r] = Q8(v_add)(isum[r], Q8(v_mul)(acc, sc));
                }
            }
        }
        const Q8(vf) d = Q8(f_half)(b);
        for (int r = 0; r < R; r++) {
            const Q8(vi) total = Q8(v_sub)(isum[r], Q8(v_slli32)(ioff[r], 5));
            f[r] = Q8(f_fold)(f[r], Q8(f_scale)(d, x[r * nblk + sb].d), total);
        }
    }
    for (int r = 0; r < R; r++) Q8(f_store)(res + 16 * r, f[r]);
}

/* Q4_0 / Q5_0 / Q8_0 (plan types 1002, 1006, 1008), 16 columns x R rows, blocks of 32 */
Q8_IN void Q8(x16_legacy)(const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, float* res, const int type,
                          const int R) {
    const int64_t bytes = x16_group_bytes(type, 32);
    Q8(vf) f[Q8_XR];
    for (int r = 0; r < R; r++) f[r] = Q8(f_zero)();
    for (int64_t blk = 0; blk < K / 32; blk++) {
        const uint8_t* b = w + blk * bytes;
        _mm_prefetch((const char*)(b + X16_PREFETCH), _MM_HINT_T0);
        Q8(vi) acc[Q8_XR];
        for (int r = 0; r < R; r++) acc[r] = Q8(v_zero)();
        const int64_t g = blk / 8, j = blk % 8;
        for (int p = 0; p < 4; p++) {
            _mm_prefetch((const char*)(b + 64 + 64 * p + X16_PREFETCH), _MM_HINT_T0);
            if (type == T_Q8_0_X16) {
                const Q8(vi) u0 = Q8(v_ld)(b + 32 + 128 * p), u1 = Q8(v_ld)(b + 96 + 128 * p);
                for (int r = 0; r < R; r++) {
                    const int8_t* xq = x[r * nblk + g].q + 32 * j + 8 * p;
                    acc[r] = Q8(v_dpb8)(Q8(v_dpb8)(acc[r], u0, xq), u1, xq + 4);
                }
                continue;
            }
            const Q8(vi) q = Q8(v_ld)(b + 32 + 64 * p);
            Q8(vi) lo = Q8(v_and8)(q, 0x0f), hi = Q8(v_and8)(Q8(v_srli16)(q, 4), 0x0f);
            if (type == T_Q5_0_X16) { /* bit t of byte 4 c + i: the fifth bit of quad t */
                const Q8(vi) h = Q8(v_ld)(b + 288);
                lo = Q8(v_or)(lo, Q8(v_and8)(2 * p < 4 ? Q8(v_slli16)(h, 4 - 2 * p) : Q8(v_srli16)(h, 2 * p - 4), 0x10));
                hi = Q8(v_or)(hi, Q8(v_and8)(2 * p + 1 < 4 ? Q8(v_slli16)(h, 3 - 2 * p) : Q8(v_srli16)(h, 2 * p - 3), 0x10));
            }
            for (int r = 0; r < R; r++) {
                const int8_t* xq = x[r * nblk + g].q + 32 * j + 8 * p;
                acc[r] = Q8(v_dpb)(Q8(v_dpb)(acc[r], lo, xq), hi, xq + 4);
            }
        }
        /* the codes' offset: q - 8 (Q4_0), q - 16 (Q5_0), u - 128 (Q8_0, where the dot product used u) */
        const int32_t offset = type == T_Q4_0_X16 ? 8 : type == T_Q5_0_X16 ? 16 : Q8_U8_OFFSET ? 128 : 0;
        const Q8(vf) d = Q8(f_half)(b);
        for (int r = 0; r < R; r++) {
            const Q8Block* xb = &x[r * nblk + g];
            const Q8(vi) total = offset ? Q8(v_minus)(acc[r], offset * xb->bsum32[j]) : acc[r];
            f[r] = Q8(f_fold)(f[r], Q8(f_scale)(d, xb->d), total);
        }
    }
    for (int r = 0; r < R; r++) Q8(f_store)(res + 16 * r, f[r]);
}
#undef Q8_U8_OFFSET

#define Q8_XROWS(call)              \
    switch (R) {                    \
        case 1: call(1); break;     \
        case 2: call(2); break;     \
        case 3: call(3); break;     \
        case 4: call(4); break;     \
        case 5: call(5); break;     \
        default: call(6); break;    \
    }
#define Q8_CALL_X4(n) Q8(x16_q4k)(w, x, nblk, K, res, (n) < Q8_XR ? (n) : Q8_XR)
#define Q8_CALL_X6(n) Q8(x16_q6k)(w, x, nblk, K, res, (n) < Q8_XR ? (n) : Q8_XR)
#define Q8_CALL_X40(n) Q8(x16_legacy)(w, x, nblk, K, res, T_Q4_0_X16, (n) < Q8_XR ? (n) : Q8_XR)
#define Q8_CALL_X50(n) Q8(x16_legacy)(w, x, nblk, K, res, T_Q5_0_X16, (n) < Q8_XR ? (n) : Q8_XR)
#define Q8_CALL_X80(n) Q8(x16_legacy)(w, x, nblk, K, res, T_Q8_0_X16, (n) < Q8_XR ? (n) : Q8_XR)
/* one group of 16 columns for R <= Q8_XR rows */
Q8_TARGET static void Q8(group)(int type, const uint8_t* w, const Q8Block* x, int64_t nblk, int64_t K, int R, float* res) {
    switch (type) {
        case T_Q4_K_X16: Q8_XROWS(Q8_CALL_X4) break;
        case T_Q6_K_X16: Q8_XROWS(Q8_CALL_X6) break;
        case T_Q4_0_X16: Q8_XROWS(Q8_CALL_X40) break;
        case T_Q5_0_X16: Q8_XROWS(Q8_CALL_X50) break;
        default: Q8_XROWS(Q8_CALL_X80) break;
    }
}
#undef Q8_XROWS
#undef Q8_CALL_X4
#undef Q8_CALL_X6
#undef Q8_CALL_X40
#undef Q8_CALL_X50
#undef Q8_CALL_X80
