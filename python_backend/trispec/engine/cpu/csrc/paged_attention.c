/*
 * Batch-invariant paged attention for the CPU engine (module trispec.engine._paged_attention).
 *
 * Why a kernel of our own: torch's CPU scaled_dot_product_attention is not batch-invariant. In
 * fp32 its result for one query changes with the number of sequences in the call, the number of
 * query rows and the (masked) padding of the keys, because its inner GEMMs pick different blocking
 * by shape; bf16 changes with padding on AVX-512. Speculative decoding needs the target's logits
 * for a token to be bit-identical whether it is verified alone, with k drafts, or in a batch of 32.
 *
 * Here every query row is computed over exactly its own keys (positions [0, len)), read straight
 * from the paged cache through its block table, by one thread, in a fixed order:
 *   score_j = dot(q, k_j) * scale    (d = 0..D-1 in order; LANES keys a vector, transposed in registers)
 *   p_j     = exp(score_j - max)     (our polynomial exp: the same code for every element)
 *   out     = sum_j p_j v_j / sum_j p_j   (j ascending; vectorised across head_dim only)
 * Nothing depends on the other rows of the call, on padding or on the thread count, so a row's
 * output is a function of its query and its keys alone. No -ffast-math: the compiler may vectorise
 * only where the source order allows it.
 */
#define PY_SSIZE_T_CLEAN
/* helpers are always inlined into the per-ISA copies below, so no vector crosses a call */
#pragma GCC diagnostic ignored "-Wpsabi"
#include <Python.h>
#include "kernel_common.h"
#include "paged_attention.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* GCC vector extensions: LANES floats, lowered to whatever width the ISA has. Lane-wise arithmetic
 * is the same whatever the width, so only the order written here decides the result. */
#define LANES 16
typedef float vf __attribute__((vector_size(LANES * sizeof(float))));
typedef float vf_u __attribute__((vector_size(LANES * sizeof(float)), aligned(4), may_alias));
typedef int32_t vi __attribute__((vector_size(LANES * sizeof(int32_t))));

/* Rows of one sequence that share a work item (they share its keys). */
#define ROWS 8
#define MAX_GROUP 64

static inline __attribute__((always_inline)) vf splat(float x) { return (vf){0} + x; }

static inline __attribute__((always_inline)) vf blend(vi mask, vf yes, vf no) { return (vf)(((vi)yes & mask) | ((vi)no & ~mask)); }

/* exp(x) for x in [-87, 0] (scores minus their max; clamped to that range): Cephes expf's range
 * reduction and polynomial, lane-wise. Relative error ~2e-7. */
static inline __attribute__((always_inline)) vf vexp(vf x) {
    x = blend(x < splat(-87.0f), splat(-87.0f), x);
    x = blend(x > splat(0.0f), splat(0.0f), x);
    /* round(x * log2(e)) by the 1.5 * 2^23 trick: exact for |value| < 2^22 */
    vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;
    vf p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    return p * (vf)bits;
}

/* Sum of the lanes in a fixed halving order. */
static inline __attribute__((always_inline)) float lane_sum(vf v) {
    float lanes[LANES];
    memcpy(lanes, &v, sizeof lanes);
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) lanes[l] += lanes[l + width];
    return lanes[0];
}

static inline __attribute__((always_inline)) float lane_max(vf v) {
    float lanes[LANES];
    memcpy(lanes, &v, sizeof lanes);
    float m = lanes[0];
    for (int l = 1; l < LANES; l++) m = lanes[l] > m ? lanes[l] : m;
    return m;
}

/* One key or value row as floats. */
static inline __attribute__((always_inline)) void load_row(const void* base, int64_t index, int D, int is_bf16, float* dst) {
    if (is_bf16) {
        const uint16_t* src = (const uint16_t*)base + index * D;
        for (int d = 0; d < D; d++) dst[d] = bf16_to_f32(src[d]);
    } else {
        memcpy(dst, (const float*)base + index * D, sizeof(float) * (size_t)D);
    }
}

typedef PagedArgs Args;

/* rows[l] (key l's LANES values) -> rows[d] (value d of the LANES keys): a LANES x LANES transpose by
 * swapping off-diagonal blocks of 8, 4, 2 and 1 lanes (two-source shuffles; moves values, no arithmetic) */
static inline __attribute__((always_inline)) void transpose_lanes(vf* rows) {
#define SWAP_BLOCKS(s, lo_mask, hi_mask)                                                  \
    for (int i = 0; i < LANES; i++) {                                                     \
        if (i & (s)) continue;                                                            \
        const vf a = rows[i], b = rows[i + (s)];                                          \
        rows[i] = __builtin_shuffle(a, b, (vi)lo_mask);                                   \
        rows[i + (s)] = __builtin_shuffle(a, b, (vi)hi_mask);                             \
    }
    /* lo[j] = j & s ? b[j - s] : a[j];  hi[j] = j & s ? b[j] : a[j + s]  (b's lanes are 16 + j) */
    SWAP_BLOCKS(8, ((vi){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
                ((vi){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}))
    SWAP_BLOCKS(4, ((vi){0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}),
                ((vi){4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}))
    SWAP_BLOCKS(2, ((vi){0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}),
                ((vi){2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}))
    SWAP_BLOCKS(1, ((vi){0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}),
                ((vi){1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}))
#undef SWAP_BLOCKS
}

/* keys [j0, j0 + LANES) of a float32 cache, transposed into kt[d] (keys past max_len: zeros) */
static inline __attribute__((always_inline)) void transpose_keys_f32(const Args* a, const int32_t* table, int64_t cache_head,
                                                                    int j0, int max_len, vf* kt) {
    const int D = a->D, bs = a->block_size;
    const float* key[LANES];
    for (int l = 0; l < LANES; l++) {
        const int j = j0 + l;
        key[l] = j < max_len ? (const float*)a->k + (cache_head + (int64_t)table[j / bs] * bs + j % bs) * D : NULL;
    }
    for (int d0 = 0; d0 < D; d0 += LANES) {
        vf rows[LANES];
        for (int l = 0; l < LANES; l++) {
            rows[l] = splat(0.0f);
            if (key[l] != NULL) rows[l] = *(const vf_u*)(key[l] + d0);
        }
        transpose_lanes(rows);
        for (int x = 0; x < LANES; x++) kt[d0 + x] = rows[x];
    }
}

/* Rows [r0, r1) of one sequence (at most ROWS) and one KV head, i.e. the g = H / KV query heads
 * that share it. Keys are taken LANES at a time (blocks at absolute positions 0, LANES, ...) and
 * transposed, so that their scores are one vector: score(row, key) = sum over d = 0..D-1 in order of
 * q[d] * k[d], whichever rows happen to share the item. */
static inline __attribute__((always_inline)) void attend_rows(const Args* a, int r0, int r1, int kvh, float* work) {
    const int D = a->D, g = a->H / a->KV, bs = a->block_size, nr = r1 - r0, rh_count = nr * g;
    const int DV = D / LANES; /* full vectors per head dim; the caller guarantees D % LANES == 0 */
    const int32_t* table = a->tables + a->row_table[r0];
    int max_len = 0;
    for (int r = r0; r < r1; r++) max_len = a->row_len[r] > max_len ? a->row_len[r] : max_len;
    const int blocks = (max_len + LANES - 1) / LANES;
    vf* kt = (vf*)work;                         /* [D] LANES keys, transposed */
    vf* acc = kt + D;                           /* [nr * g, DV] output accumulators */
    vf* scores = acc + (size_t)rh_count * DV;   /* [nr * g, blocks] */
    float* q = (float*)(scores + (size_t)rh_count * blocks); /* [nr * g, D] */
    float* row = q + (size_t)rh_count * D;      /* [D] one key or value as floats */
    const int64_t cache_head = (int64_t)kvh * a->S;

    for (int rh = 0; rh < rh_count; rh++) {
        const int r = rh / g, h = rh % g;
        const int64_t offset = (int64_t)(r0 + r) * a->q_row_stride + (int64_t)(kvh * g + h) * D;
        if (a->is_bf16) {
            const uint16_t* src = (const uint16_t*)a->q + offset;
            for (int d = 0; d < D; d++) q[rh * D + d] = bf16_to_f32(src[d]);
        } else {
            memcpy(q + rh * D, (const float*)a->q + offset, sizeof(float) * (size_t)D);
        }
    }
    /* scores: each one sum_d q[d] * k[d], d = 0..D-1 in order, for LANES keys at once */
    for (int b = 0; b < blocks; b++) {
        if (a->is_bf16) {
            float* kt_f = (float*)kt;
            for (int l = 0; l < LANES; l++) {
                const int j = b * LANES + l;
                if (j < max_len) {
                    load_row(a->k, cache_head + (int64_t)table[j / bs] * bs + j % bs, D, 1, row);
                    for (int d = 0; d < D; d++) kt_f[d * LANES + l] = row[d];
                } else {
                    for (int d = 0; d < D; d++) kt_f[d * LANES + l] = 0.0f;
                }
            }
        } else {
            transpose_keys_f32(a, table, cache_head, b * LANES, max_len, kt);
        }
        /* four (row, head) pairs at a time, their sums in registers (a pair past the last repeats
         * it, its sums unused): independent chains, each the same order */
        for (int rh0 = 0; rh0 < rh_count; rh0 += 4) {
            const float* q0 = q + (size_t)rh0 * D;
            const float* q1 = q + (size_t)(rh0 + 1 < rh_count ? rh0 + 1 : rh0) * D;
            const float* q2 = q + (size_t)(rh0 + 2 < rh_count ? rh0 + 2 : rh0) * D;
            const float* q3 = q + (size_t)(rh0 + 3 < rh_count ? rh0 + 3 : rh0) * D;
            vf s0 = splat(0.0f), s1 = s0, s2 = s0, s3 = s0;
            for (int d = 0; d < D; d++) {
                const vf kd = kt[d];
                s0 += q0[d] * kd;
                s1 += q1[d] * kd;
                s2 += q2[d] * kd;
                s3 += q3[d] * kd;
            }
            scores[(size_t)rh0 * blocks + b] = s0;
            if (rh0 + 1 < rh_count) scores[(size_t)(rh0 + 1) * blocks + b] = s1;
            if (rh0 + 2 < rh_count) scores[(size_t)(rh0 + 2) * blocks + b] = s2;
            if (rh0 + 3 < rh_count) scores[(size_t)(rh0 + 3) * blocks + b] = s3;
        }
    }
    /* softmax weights, in place, and their sums */
    float totals[ROWS * MAX_GROUP];
    const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int rh = 0; rh < rh_count; rh++) {
        const int len = a->row_len[r0 + rh / g];
        vf* s = scores + (size_t)rh * blocks;
        const int own_blocks = (len + LANES - 1) / LANES;
        vf m = splat(-3.0e38f);
        for (int b = 0; b < own_blocks; b++) {
            s[b] *= a->scale;
            const vi valid = (lane + b * LANES) < len;
            m = blend(valid & (s[b] > m), s[b], m);
        }
        const vf row_max = splat(lane_max(m));
        vf part = splat(0.0f);
        for (int b = 0; b < own_blocks; b++) {
            const vi valid = (lane + b * LANES) < len;
            s[b] = blend(valid, vexp(s[b] - row_max), splat(0.0f));
            part += s[b];
        }
        totals[rh] = lane_sum(part);
        for (int dv = 0; dv < DV; dv++) acc[(size_t)rh * DV + dv] = splat(0.0f);
    }
    /* weighted values, key by key in ascending order */
    if (!a->is_bf16) {
        for (int rh = 0; rh < rh_count; rh++) {
            const int len = a->row_len[r0 + rh / g];
            const float* p = (const float*)(scores + (size_t)rh * blocks);
            vf* o = acc + (size_t)rh * DV;
            for (int dv0 = 0; dv0 < DV; dv0 += 4) {
                const int nv = DV - dv0 < 4 ? DV - dv0 : 4;
                vf o0 = splat(0.0f), o1 = o0, o2 = o0, o3 = o0;
                for (int j = 0; j < len; j++) {
                    const vf_u* vrow =
                        (const vf_u*)((const float*)a->v + (cache_head + (int64_t)table[j / bs] * bs + j % bs) * D) + dv0;
                    const float pj = p[j];
                    o0 += pj * vrow[0];
                    if (nv > 1) o1 += pj * vrow[1];
                    if (nv > 2) o2 += pj * vrow[2];
                    if (nv > 3) o3 += pj * vrow[3];
                }
                o[dv0] = o0;
                if (nv > 1) o[dv0 + 1] = o1;
                if (nv > 2) o[dv0 + 2] = o2;
                if (nv > 3) o[dv0 + 3] = o3;
            }
        }
    }
    for (int j = 0; a->is_bf16 && j < max_len; j++) {
        load_row(a->v, cache_head + (int64_t)table[j / bs] * bs + j % bs, D, a->is_bf16, row);
        vf vrow[D / LANES];
        memcpy(vrow, row, sizeof(float) * (size_t)D);
        for (int rh = 0; rh < rh_count; rh++) {
            if (j >= a->row_len[r0 + rh / g]) continue;
            const float p = ((const float*)(scores + (size_t)rh * blocks))[j];
            vf* o = acc + (size_t)rh * DV;
            for (int dv = 0; dv < DV; dv++) o[dv] += p * vrow[dv];
        }
    }
    for (int rh = 0; rh < rh_count; rh++) {
        const int r = rh / g, h = rh % g;
        const float inv = 1.0f / totals[rh];
        const int64_t offset = ((int64_t)(r0 + r) * a->H + kvh * g + h) * D;
        const float* o = (const float*)(acc + (size_t)rh * DV);
        if (a->is_bf16) {
            uint16_t* dst = (uint16_t*)a->out + offset;
            for (int d = 0; d < D; d++) dst[d] = f32_to_bf16(o[d] * inv);
        } else {
            float* dst = (float*)a->out + offset;
            for (int d = 0; d < D; d++) dst[d] = o[d] * inv;
        }
    }
}

/* One copy per ISA level. The caller picks one for the whole process (the level torch itself runs
 * at), so a machine always runs the same code; a test can force the AVX2 copy on an AVX-512 machine
 * the way ATEN_CPU_CAPABILITY forces torch's kernels. */
typedef void (*attend_fn)(const Args*, int, int, int, float*);
__attribute__((target("arch=x86-64-v4"))) static void attend_rows_avx512(const Args* a, int r0, int r1, int kvh, float* w) {
    attend_rows(a, r0, r1, kvh, w);
}
__attribute__((target("arch=x86-64-v3"))) static void attend_rows_avx2(const Args* a, int r0, int r1, int kvh, float* w) {
    attend_rows(a, r0, r1, kvh, w);
}
static void attend_rows_baseline(const Args* a, int r0, int r1, int kvh, float* w) { attend_rows(a, r0, r1, kvh, w); }

static attend_fn attend_for(int isa) {
    return isa == 512 ? attend_rows_avx512 : isa == 2 ? attend_rows_avx2 : attend_rows_baseline;
}

/* The bytes of one thread's work buffer for a call (a multiple of a vector). */
static size_t work_bytes(const Args* a) {
    const int g = a->H / a->KV;
    int max_len = 0;
    for (int t = 0; t < a->T; t++) max_len = a->row_len[t] > max_len ? a->row_len[t] : max_len;
    const size_t blocks = (size_t)(max_len + LANES - 1) / LANES;
    const size_t vectors = (size_t)a->D + (size_t)ROWS * g * (a->D / LANES + blocks);
    const size_t floats = (size_t)ROWS * g * a->D + a->D;
    return (sizeof(vf) * vectors + sizeof(float) * floats + sizeof(vf) - 1) / sizeof(vf) * sizeof(vf);
}

/* The work items of a call: consecutive rows of one sequence (same block table), at most ROWS, times
 * the KV heads. starts (T + 1 ints) gets the chunks' first rows; returns their count. */
static int plan_chunks(const Args* a, int* starts) {
    int chunks = 0;
    for (int t = 0; t < a->T; t++)
        if (t == 0 || a->row_table[t] != a->row_table[t - 1] || t - starts[chunks - 1] == ROWS) starts[chunks++] = t;
    starts[chunks] = a->T;
    return chunks;
}

/* item w of a call: chunk w / KV, KV head w % KV; work: plan_chunks' bytes, aligned to a vector */
static void attend_item(const Args* a, int isa, const int* starts, int64_t w, float* work) {
    const int c = (int)(w / a->KV);
    attend_for(isa)(a, starts[c], starts[c + 1], (int)(w % a->KV), work);
}

static int run(const Args* a, int num_threads, int isa) {
    int* starts = (int*)malloc(sizeof(int) * (size_t)(a->T + 1));
    if (starts == NULL) return 1;
    const size_t bytes = work_bytes(a);
    const int64_t items = (int64_t)plan_chunks(a, starts) * a->KV;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        float* work = (float*)aligned_alloc(sizeof(vf), bytes);
        if (work == NULL) {
            failed = 1;
        } else {
            /* each item is computed by one thread: results never depend on the split */
#pragma omp for schedule(dynamic, 1)
            for (int64_t w = 0; w < items; w++) attend_item(a, isa, starts, w, work);
            free(work);
        }
    }
    free(starts);
    return failed;
}

static PyObject* attend(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long q, k, v, out, tables, row_table, row_len;
    long long q_row_stride, S;
    int T, H, KV, D, block_size, is_bf16, num_threads, isa;
    float scale;
    if (!PyArg_ParseTuple(args, "KKKKKKKLLiiiiipfii", &q, &k, &v, &out, &tables, &row_table, &row_len,
                          &q_row_stride, &S, &T, &H, &KV, &D, &block_size, &is_bf16, &scale,
                          &num_threads, &isa))
        return NULL;
    if (T < 0 || KV <= 0 || H % KV != 0 || H / KV > MAX_GROUP || D <= 0 || D % LANES != 0 || block_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "paged attention: bad geometry");
        return NULL;
    }
    Args a = {(const void*)(uintptr_t)q, (const void*)(uintptr_t)k, (const void*)(uintptr_t)v,
              (void*)(uintptr_t)out, (const int32_t*)(uintptr_t)tables,
              (const int64_t*)(uintptr_t)row_table, (const int32_t*)(uintptr_t)row_len,
              q_row_stride, S, T, H, KV, D, block_size, is_bf16, scale};
    for (int t = 0; t < T; t++) {
        if (a.row_len[t] < 1) {
            PyErr_SetString(PyExc_ValueError, "paged attention: a row attends to no key");
            return NULL;
        }
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = run(&a, num_threads < 1 ? 1 : num_threads, usable_isa(isa));
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"attend", attend, METH_VARARGS,
     "attend(q, k, v, out, tables, row_table, row_len, q_row_stride, S, T, H, KV, D, block_size, "
     "is_bf16, scale, num_threads, isa): batch-invariant paged attention over raw data pointers; "
     "isa is 512, 2 or 0 (AVX-512, AVX2, baseline; lowered to what the CPU runs)."},
    {"isa_level", isa_level, METH_VARARGS, "isa_level(wanted): the ISA level attend() runs for `wanted`."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_paged_attention", NULL, -1, methods};

/* what other kernels call (paged_attention.h): the same code, hence the same bits, as attend() */
static const PagedAttentionApi api = {work_bytes, plan_chunks, attend_item};

PyMODINIT_FUNC PyInit__paged_attention(void) {
    PyObject* m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject* capsule = PyCapsule_New((void*)&api, PAGED_ATTENTION_API, NULL);
    if (capsule == NULL || PyModule_AddObject(m, "api", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
