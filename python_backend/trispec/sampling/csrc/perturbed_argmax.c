/*
 * The CPU side of sampling (module trispec.sampling._perturbed_argmax): the coupled rule's inner loop,
 * and the top-k selection the kept set starts from (top_values, below).
 *
 * The coupled rule:
 * for each row, the kept token x with the largest  s[x] + G(seed, position, x), where s is the row's
 * temperature-scaled logits and G a Gumbel variate that is a pure function of (seed, position, x)
 * (sampling/noise.py says how; this file must give the same bits, and the tests check it does).
 *
 *   bits(seed, position, x) = word (x & 3) of Philox4x32-10(counter = (x >> 2, position lo, position hi,
 *                             STREAM), key = (seed lo, seed hi))   (Salmon et al., SC'11; Random123)
 *   u = (bits + 0.5) / 2^32,   G = -log(-log(u))   in double precision
 *
 * Kept: s[x] > threshold, and the first `ties` tokens (lowest ids) with s[x] == threshold
 * (sampling/kept_set.py). Equal scores go to the lowest id.
 *
 * Most tokens cannot win, so most are never hashed or logged: the best kept value's own score is a
 * lower bound on the winner's; a token whose value plus the largest possible G (22.87: u just below
 * 1) is below it is skipped without Philox, and one whose value plus an upper bound of G read from
 * its top 12 bits (a table of G at each bucket's top) is below it is skipped without a log. Both
 * bounds only skip tokens that lose, so the result is the plain argmax's.
 *
 * Each row is one thread's, in one order: the token does not depend on the batch or thread count.
 * Integer hashing is exact and the float work is scalar libm, so every ISA gives the same bits.
 */
#define PY_SSIZE_T_CLEAN
#pragma GCC diagnostic ignored "-Wpsabi"
#include <Python.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* usable_isa() and isa_level(): which ISA copy runs (shared with the engine's kernels) */
#include "kernel_common.h"
#include "argmax_rows.h"

#define STREAM 0x53504543u /* "SPEC": this use of a request's seed, apart from any other */
#define BUCKET_SHIFT 20 /* 4096 buckets of the 32-bit words */
#define NUM_BUCKETS (1u << (32 - BUCKET_SHIFT))
#define BOUND_MARGIN 1e-9 /* a table bound stays above any G of its bucket, whatever libm rounds */

static double bucket_top_gumbel[NUM_BUCKETS];
static float bucket_top_gumbel_f[NUM_BUCKETS]; /* the same, rounded up to float */
static double largest_gumbel;

static inline void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c[0];
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * c[2];
        const uint32_t c0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0;
        const uint32_t c2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[1] = (uint32_t)p1;
        c[3] = (uint32_t)p0;
        c[0] = c0;
        c[2] = c2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

static inline void group_words(uint32_t out[4], uint64_t seed, int64_t position, int64_t group) {
    out[0] = (uint32_t)group;
    out[1] = (uint32_t)((uint64_t)position & 0xffffffffu);
    out[2] = (uint32_t)((uint64_t)position >> 32);
    out[3] = STREAM;
    philox4x32_10(out, (uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32));
}

static inline double gumbel_of(uint32_t bits) {
    const double u = ((double)bits + 0.5) * 0x1p-32;
    return -log(-log(u));
}

static void init_tables(void) {
    for (uint32_t b = 0; b < NUM_BUCKETS; b++) {
        const uint32_t top = (b << BUCKET_SHIFT) | ((1u << BUCKET_SHIFT) - 1u);
        bucket_top_gumbel[b] = gumbel_of(top) + BOUND_MARGIN;
        bucket_top_gumbel_f[b] = nextafterf((float)bucket_top_gumbel[b], INFINITY);
    }
    largest_gumbel = bucket_top_gumbel[NUM_BUCKETS - 1];
}

#define BLOCK 64 /* tokens hashed together: 16 Philox counters, one vectorised pass */

/* The words of tokens first .. first + BLOCK - 1 (first a multiple of 4): 16 Philox counters at
 * once. One copy per ISA level; integer arithmetic only, so every copy gives the same bits. The
 * vector copies multiply with 32x32->64 products of the even and the odd lanes (vpmuludq), the high
 * halves blended back into place; the low halves are a plain 32-bit multiply. */
__attribute__((target("arch=x86-64-v4"))) static inline __m512i mulhi_avx512(__m512i a, __m512i m) {
    const __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(a, m), 32);
    const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    return _mm512_mask_blend_epi32((__mmask16)0xAAAA, even, odd);
}

__attribute__((target("arch=x86-64-v4"))) static void block_words_avx512(
    uint32_t out[BLOCK], uint64_t seed, int64_t position, int64_t first) {
    const __m512i m0 = _mm512_set1_epi32((int)0xD2511F53u), m1 = _mm512_set1_epi32((int)0xCD9E8D57u);
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)(first >> 2)),
                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __m512i c1 = _mm512_set1_epi32((int)(uint32_t)((uint64_t)position & 0xffffffffu));
    __m512i c2 = _mm512_set1_epi32((int)(uint32_t)((uint64_t)position >> 32));
    __m512i c3 = _mm512_set1_epi32((int)STREAM);
    uint32_t k0 = (uint32_t)(seed & 0xffffffffu), k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        const __m512i hi0 = mulhi_avx512(c0, m0), lo0 = _mm512_mullo_epi32(c0, m0);
        const __m512i hi1 = mulhi_avx512(c2, m1), lo1 = _mm512_mullo_epi32(c2, m1);
        c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
        c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
        c1 = lo1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    /* counter j's four words go to out[4j .. 4j + 3]: a 4x4 transpose of each group of 4 counters */
    uint32_t w[4][16];
    _mm512_storeu_si512(w[0], c0);
    _mm512_storeu_si512(w[1], c1);
    _mm512_storeu_si512(w[2], c2);
    _mm512_storeu_si512(w[3], c3);
    for (int j = 0; j < 16; j++)
        for (int i = 0; i < 4; i++) out[4 * j + i] = w[i][j];
}

__attribute__((target("arch=x86-64-v3"))) static inline __m256i mulhi_avx2(__m256i a, __m256i m) {
    const __m256i even = _mm256_srli_epi64(_mm256_mul_epu32(a, m), 32);
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    return _mm256_blend_epi32(even, odd, 0xAA);
}

__attribute__((target("arch=x86-64-v3"))) static void block_words_avx2(
    uint32_t out[BLOCK], uint64_t seed, int64_t position, int64_t first) {
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u), m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    uint32_t w[4][16];
    for (int half = 0; half < 2; half++) {
        __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)((first >> 2) + 8 * half)),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256i c1 = _mm256_set1_epi32((int)(uint32_t)((uint64_t)position & 0xffffffffu));
        __m256i c2 = _mm256_set1_epi32((int)(uint32_t)((uint64_t)position >> 32));
        __m256i c3 = _mm256_set1_epi32((int)STREAM);
        uint32_t k0 = (uint32_t)(seed & 0xffffffffu), k1 = (uint32_t)(seed >> 32);
        for (int round = 0; round < 10; round++) {
            const __m256i hi0 = mulhi_avx2(c0, m0), lo0 = _mm256_mullo_epi32(c0, m0);
            const __m256i hi1 = mulhi_avx2(c2, m1), lo1 = _mm256_mullo_epi32(c2, m1);
            c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
            c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
            c1 = lo1;
            c3 = lo0;
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        _mm256_storeu_si256((__m256i*)&w[0][8 * half], c0);
        _mm256_storeu_si256((__m256i*)&w[1][8 * half], c1);
        _mm256_storeu_si256((__m256i*)&w[2][8 * half], c2);
        _mm256_storeu_si256((__m256i*)&w[3][8 * half], c3);
    }
    for (int j = 0; j < 16; j++)
        for (int i = 0; i < 4; i++) out[4 * j + i] = w[i][j];
}

static void block_words_baseline(uint32_t out[BLOCK], uint64_t seed, int64_t position, int64_t first) {
    for (int j = 0; j < 16; j++) group_words(out + 4 * j, seed, position, (first >> 2) + j);
}

/* Which tokens of a block of n (<= BLOCK) could win, and which sit at the threshold: bit j of
 * *could_win is set when v[j] >= floor and v[j] plus its bucket's largest G reaches `reach` (a value a
 * little below the best score: float sums round, and a token is only skipped when it surely loses;
 * which tokens are looked at never changes the winner). One copy per ISA level. */
typedef struct {
    float floor, threshold, reach;
} Bounds;

__attribute__((target("arch=x86-64-v4"))) static void block_candidates_avx512(
    const float* v, const uint32_t* words, int n, Bounds b, uint64_t* could_win, uint64_t* at_threshold) {
    uint64_t win = 0, at = 0;
    for (int j = 0; j < n; j += 16) {
        const __mmask16 live = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1u);
        const __m512 x = _mm512_maskz_loadu_ps(live, v + j);
        const __m512i bucket = _mm512_srli_epi32(_mm512_maskz_loadu_epi32(live, words + j), BUCKET_SHIFT);
        const __m512 g = _mm512_i32gather_ps(bucket, bucket_top_gumbel_f, 4);
        const __mmask16 high = _mm512_mask_cmp_ps_mask(live, x, _mm512_set1_ps(b.floor), _CMP_GE_OQ);
        const __mmask16 reaches =
            _mm512_cmp_ps_mask(_mm512_add_ps(x, g), _mm512_set1_ps(b.reach), _CMP_GE_OQ);
        win |= (uint64_t)(high & reaches) << j;
        at |= (uint64_t)_mm512_mask_cmp_ps_mask(live, x, _mm512_set1_ps(b.threshold), _CMP_EQ_OQ) << j;
    }
    *could_win = win;
    *at_threshold = at;
}

__attribute__((target("arch=x86-64-v3"))) static void block_candidates_avx2(
    const float* v, const uint32_t* words, int n, Bounds b, uint64_t* could_win, uint64_t* at_threshold) {
    uint64_t win = 0, at = 0;
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 x = _mm256_loadu_ps(v + j);
        const __m256i bucket = _mm256_srli_epi32(_mm256_loadu_si256((const __m256i*)(words + j)), BUCKET_SHIFT);
        const __m256 g = _mm256_i32gather_ps(bucket_top_gumbel_f, bucket, 4);
        const __m256 high = _mm256_cmp_ps(x, _mm256_set1_ps(b.floor), _CMP_GE_OQ);
        const __m256 reaches = _mm256_cmp_ps(_mm256_add_ps(x, g), _mm256_set1_ps(b.reach), _CMP_GE_OQ);
        win |= (uint64_t)_mm256_movemask_ps(_mm256_and_ps(high, reaches)) << j;
        at |= (uint64_t)_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(b.threshold), _CMP_EQ_OQ)) << j;
    }
    for (; j < n; j++) {
        win |= (uint64_t)((v[j] >= b.floor) & (v[j] + bucket_top_gumbel_f[words[j] >> BUCKET_SHIFT] >= b.reach)) << j;
        at |= (uint64_t)(v[j] == b.threshold) << j;
    }
    *could_win = win;
    *at_threshold = at;
}

static void block_candidates_baseline(
    const float* v, const uint32_t* words, int n, Bounds b, uint64_t* could_win, uint64_t* at_threshold) {
    uint64_t win = 0, at = 0;
    for (int j = 0; j < n; j++) {
        win |= (uint64_t)((v[j] >= b.floor) & (v[j] + bucket_top_gumbel_f[words[j] >> BUCKET_SHIFT] >= b.reach)) << j;
        at |= (uint64_t)(v[j] == b.threshold) << j;
    }
    *could_win = win;
    *at_threshold = at;
}

typedef void (*BlockCandidates)(const float*, const uint32_t*, int, Bounds, uint64_t*, uint64_t*);

typedef struct {
    void (*words)(uint32_t*, uint64_t, int64_t, int64_t);
    BlockCandidates candidates;
} Copy;


/* The first index of the row's largest value (NaN ignored); -1 if there is none. The kept set always
 * holds it: it is a prefix of the stable descending order, which starts there. */
static int64_t first_max(const float* s, int64_t V) {
    float lanes[16];
    for (int j = 0; j < 16; j++) lanes[j] = -INFINITY;
    int64_t x = 0;
    for (; x + 16 <= V; x += 16)
        for (int j = 0; j < 16; j++) lanes[j] = s[x + j] > lanes[j] ? s[x + j] : lanes[j];
    float top = -INFINITY;
    for (int j = 0; j < 16; j++) top = lanes[j] > top ? lanes[j] : top;
    for (; x < V; x++) top = s[x] > top ? s[x] : top;
    for (x = 0; x < V; x++)
        if (s[x] == top) return x;
    return -1; /* every value NaN */
}

static int64_t row_argmax(const float* s, int64_t V, float threshold, int64_t ties, uint64_t seed,
                          int64_t position, Copy copy) {
    const int64_t top = first_max(s, V);
    if (top < 0 || !(s[top] >= threshold)) return -1;
    uint32_t words[BLOCK];
    group_words(words, seed, position, top >> 2);
    double best = (double)s[top] + gumbel_of(words[top & 3]);
    int64_t best_id = top;
    /* below `lowest` no token can win (rounded down, so that none that could is skipped) */
    const float lowest = nextafterf((float)(best - largest_gumbel), -INFINITY);
    /* kept tokens are those >= `floor`, but for the ties at the threshold past the first `ties` */
    const float floor = threshold > lowest ? threshold : lowest;
    int64_t seen_ties = 0;
    for (int64_t first = 0; first < V; first += BLOCK) {
        const int n = first + BLOCK < V ? BLOCK : (int)(V - first);
        const float* v = s + first;
        int any = 0;
        for (int j = 0; j < n; j++) any |= v[j] >= floor;
        if (!any) continue;
        copy.words(words, seed, position, first);
        /* a little below the best score: the float sums above round (a relative 2^-20 and an
         * absolute 2^-10 cover them many times over) */
        const float reach = (float)(best - fabs(best) * 0x1p-20 - 0x1p-10);
        uint64_t could_win, at_threshold;
        copy.candidates(v, words, n, (Bounds){floor, threshold, reach}, &could_win, &at_threshold);
        for (uint64_t left = could_win; left; left &= left - 1) {
            const int j = __builtin_ctzll(left);
            const int64_t x = first + j;
            if (x == top) continue;
            if (v[j] == threshold) {
                const int64_t rank = seen_ties + __builtin_popcountll(at_threshold & ((1ull << j) - 1));
                if (rank >= ties) continue;
            }
            const double score = (double)v[j] + gumbel_of(words[j]);
            if (score > best || (score == best && x < best_id)) {
                best = score;
                best_id = x;
            }
        }
        seen_ties += __builtin_popcountll(at_threshold);
    }
    return best_id;
}

/* The same choice when the caller knows every token at or above the threshold: `ids` (m of them,
 * ascending, -1 for none) are the only ones looked at, ties counted among them in id order. */
static int64_t candidates_argmax(const float* s, const int64_t* ids, int64_t m, float threshold,
                                 int64_t ties, uint64_t seed, int64_t position) {
    double best = -INFINITY;
    int64_t best_id = -1, cached_group = -1, seen_ties = 0;
    uint32_t words[4];
    for (int64_t j = 0; j < m; j++) {
        const int64_t x = ids[j];
        if (x < 0) continue;
        const float v = s[x];
        if (!(v >= threshold)) continue;
        if (v == threshold && seen_ties++ >= ties) continue;
        if ((x >> 2) != cached_group) {
            cached_group = x >> 2;
            group_words(words, seed, position, cached_group);
        }
        const double score = (double)v + gumbel_of(words[x & 3]);
        if (best_id < 0 || score > best || (score == best && x < best_id)) {
            best = score;
            best_id = x;
        }
    }
    return best_id;
}

static PyObject* perturbed_argmax(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long scores, thresholds, ties, seeds, positions, out, candidates;
    long long n, V, row_stride, m;
    int num_threads, isa;
    if (!PyArg_ParseTuple(args, "KLLLKKKKKiiKL", &scores, &n, &V, &row_stride, &thresholds, &ties, &seeds,
                          &positions, &out, &num_threads, &isa, &candidates, &m))
        return NULL;
    const int64_t* candidate_ids = (const int64_t*)(uintptr_t)candidates;
    if (n < 0 || V < 1 || row_stride < V) {
        PyErr_SetString(PyExc_ValueError, "perturbed_argmax: bad shape");
        return NULL;
    }
    const float* s = (const float*)(uintptr_t)scores;
    const float* th = (const float*)(uintptr_t)thresholds;
    const int64_t* tie = (const int64_t*)(uintptr_t)ties;
    const uint64_t* seed = (const uint64_t*)(uintptr_t)seeds;
    const int64_t* pos = (const int64_t*)(uintptr_t)positions;
    int64_t* result = (int64_t*)(uintptr_t)out;
    const int level = usable_isa(isa);
    const Copy copy = level == 512 ? (Copy){block_words_avx512, block_candidates_avx512}
                      : level == 2 ? (Copy){block_words_avx2, block_candidates_avx2}
                                   : (Copy){block_words_baseline, block_candidates_baseline};
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel for schedule(static, 1) num_threads(num_threads < 1 ? 1 : num_threads) if (n > 1)
    for (long long i = 0; i < n; i++)
        result[i] = candidate_ids != NULL
                        ? candidates_argmax(s + i * row_stride, candidate_ids + i * m, m, th[i], tie[i], seed[i], pos[i])
                        : row_argmax(s + i * row_stride, V, th[i], tie[i], seed[i], pos[i], copy);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* The k largest values of a row (k <= V), descending, with their ids: a min-heap of k, and a block of
 * 16 values is skipped without a look at each when its largest is not above the heap's smallest (the
 * common case once the heap holds large values). NaN values are never taken. Which of equal values'
 * ids come out is unspecified, as for torch.topk: the kept set uses the values only. */
typedef struct {
    float value;
    int64_t id;
} Entry;

static void sift_down(Entry* heap, int64_t k, int64_t i) {
    for (;;) {
        int64_t smallest = i;
        const int64_t left = 2 * i + 1, right = 2 * i + 2;
        if (left < k && heap[left].value < heap[smallest].value) smallest = left;
        if (right < k && heap[right].value < heap[smallest].value) smallest = right;
        if (smallest == i) return;
        const Entry t = heap[i];
        heap[i] = heap[smallest];
        heap[smallest] = t;
        i = smallest;
    }
}

static int descending(const void* a, const void* b) {
    const float x = ((const Entry*)a)->value, y = ((const Entry*)b)->value;
    return (x < y) - (x > y);
}

static void row_top(const float* s, int64_t V, int64_t k, Entry* heap) {
    int64_t filled = 0, x = 0;
    for (; x < V && filled < k; x++) {
        if (s[x] != s[x]) continue; /* NaN */
        heap[filled++] = (Entry){s[x], x};
    }
    for (int64_t i = filled / 2 - 1; i >= 0; i--) sift_down(heap, filled, i);
    for (; x < V; x++) {
        if ((x & 15) == 0 && x + 16 <= V) {
            float top = s[x];
            for (int j = 1; j < 16; j++) top = s[x + j] > top ? s[x + j] : top;
            if (!(top > heap[0].value)) {
                x += 15;
                continue;
            }
        }
        if (s[x] > heap[0].value) {
            heap[0] = (Entry){s[x], x};
            sift_down(heap, filled, 0);
        }
    }
    for (int64_t i = filled; i < k; i++) heap[i] = (Entry){-INFINITY, -1}; /* only NaN rows */
    qsort(heap, (size_t)k, sizeof(Entry), descending);
}

static PyObject* top_values(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long scores, values_out, ids_out;
    long long n, V, row_stride, k;
    int num_threads;
    if (!PyArg_ParseTuple(args, "KLLLLKKi", &scores, &n, &V, &row_stride, &k, &values_out, &ids_out,
                          &num_threads))
        return NULL;
    if (n < 0 || V < 1 || row_stride < V || k < 1 || k > V) {
        PyErr_SetString(PyExc_ValueError, "top_values: bad shape");
        return NULL;
    }
    const float* s = (const float*)(uintptr_t)scores;
    float* values = (float*)(uintptr_t)values_out;
    int64_t* ids = (int64_t*)(uintptr_t)ids_out;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(num_threads < 1 ? 1 : num_threads) if (n > 1) reduction(| : failed)
    {
        Entry* heap = (Entry*)malloc(sizeof(Entry) * (size_t)k);
        if (heap == NULL) failed = 1;
#pragma omp for schedule(static, 1)
        for (long long i = 0; i < n; i++) {
            if (heap == NULL) continue;
            row_top(s + i * row_stride, V, k, heap);
            for (long long j = 0; j < k; j++) {
                values[i * k + j] = heap[j].value;
                ids[i * k + j] = heap[j].id;
            }
        }
        free(heap);
    }
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject* noise_bits(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long seed, out;
    long long position, first, count;
    if (!PyArg_ParseTuple(args, "KLLLK", &seed, &position, &first, &count, &out)) return NULL;
    uint32_t* bits = (uint32_t*)(uintptr_t)out;
    uint32_t words[4];
    for (long long i = 0; i < count; i++) {
        const int64_t x = first + i;
        group_words(words, seed, position, x >> 2);
        bits[i] = words[x & 3];
    }
    Py_RETURN_NONE;
}

static PyObject* philox(PyObject* self, PyObject* args) {
    (void)self;
    unsigned int c0, c1, c2, c3, k0, k1;
    if (!PyArg_ParseTuple(args, "IIIIII", &c0, &c1, &c2, &c3, &k0, &k1)) return NULL;
    uint32_t c[4] = {c0, c1, c2, c3};
    philox4x32_10(c, k0, k1);
    return Py_BuildValue("(IIII)", c[0], c[1], c[2], c[3]);
}

static PyMethodDef methods[] = {
    {"perturbed_argmax", perturbed_argmax, METH_VARARGS,
     "perturbed_argmax(scores, n, V, row_stride, thresholds, ties, seeds, positions, out, num_threads, isa, "
     "candidates, m): out[i] = the kept x with the largest scores[i, x] + G(seeds[i], positions[i], x), "
     "over raw data pointers: scores float32 [n, row_stride], thresholds float32 [n], ties int64 [n], "
     "seeds uint64 [n], positions int64 [n], out int64 [n] (-1: nothing kept); isa 512, 2 or 0; "
     "candidates int64 [n, m] ascending ids holding every token at or above the threshold (-1: none), "
     "or 0 to look at the whole row."},
    {"top_values", top_values, METH_VARARGS,
     "top_values(scores, n, V, row_stride, k, values, ids, num_threads): each row's k largest values, "
     "descending, into values float32 [n, k], their ids into ids int64 [n, k]."},
    {"noise_bits", noise_bits, METH_VARARGS,
     "noise_bits(seed, position, first, count, out): the 32-bit words of tokens first..first+count-1 "
     "into out (uint32 [count])."},
    {"philox", philox, METH_VARARGS, "philox(c0, c1, c2, c3, k0, k1): Philox4x32-10 of one counter."},
    {"argmax", argmax_rows, METH_VARARGS,
     "argmax(scores, n, V, row_stride, num_threads, isa): each float32 row's argmax (lowest index on ties, "
     "the first NaN if any) as a list of ints; scores: a raw data pointer to [n, row_stride]."},
    {"isa_level", isa_level, METH_VARARGS, "isa_level(wanted): the ISA level the hashing runs for `wanted`."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_perturbed_argmax", NULL, -1, methods};

PyMODINIT_FUNC PyInit__perturbed_argmax(void) {
    init_tables();
    return PyModule_Create(&module);
}
