/*
 * Linear layer over a GGUF file's own quantised blocks (module trispec.engine._gguf_linear):
 *   y[m, n] = sum_k x[m, k] * w[n, k]  (+ bias[n])
 * with w kept as the file stores it (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16
 * rows) and float32 activations.
 *
 * Why: a decode step reads every weight once, so its time is the weights' bytes over the memory's
 * speed. Dequantised to float32 at load, the Qwen2.5-Coder 1.5B's Q4_K/Q6_K blocks grow from 1.1 GB
 * to 6.2 GB, and a step reads all of it; here it reads the blocks.
 *
 * The same model, not a cheaper one: every value is decoded to the float32 gguf-py's dequantize gives
 * (what the dense path loads): each format's value is A * q + B where A * q is exact in float32 or B
 * is 0, so a fused multiply-add or a multiply then an add round alike. The products are summed in
 * float32 like any float32 matmul; only the summation order is ours.
 *
 * The summation order, fixed, so that an output never depends on the other rows of the call, the
 * thread count or the ISA (batch invariance, which exact speculative decoding rests on):
 *   16 lanes L = 8 p + i (p in 0..1, i in 0..7); lane L adds x[k] * w[k] by fused multiply-add, in
 *   increasing k, for the k whose position in their group of 32 is 4 i + p or 4 i + p + 2; then the
 *   lanes are summed in a fixed tree (lane_sum), and the bias added.
 * Why that lane map: read as eight 32-bit lanes, 32 code bytes give the values at positions 4 i + b
 * of a group with a shift and a mask (b = the byte within the lane); widening bytes lane by lane
 * (vpmovsxbd) ran at under one a cycle here, and made decoding, not memory, the limit. x is laid out
 * the same way once per call (slot 8 b + i of a group holds position 4 i + b); every path then adds
 * slot by slot: lane L takes slots 16 h + L.
 *
 * Two paths, the same numbers: up to STREAM_ROWS rows (a decode step, a verify pass) decode each
 * group of 32 straight into registers (gguf_slices_avx2.h, and gguf_slices_avx512.h on AVX-512
 * machines: the same lanes, two slices per register); more rows decode a chunk of a few columns
 * once into a buffer and run register tiles over it (gguf_linear_tiles.h), the AVX2 copy on AVX2
 * and AVX-512 machines alike. The baseline copy uses fmaf, so it gives the same bits, slower. No
 * -ffast-math.
 */
#define PY_SSIZE_T_CLEAN
#pragma GCC diagnostic ignored "-Wpsabi"
#include <Python.h>
#include "kernel_common.h"
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16 /* floats per logical accumulator */
#define GROUP 32 /* values per group: the lane map repeats every group */
#define K_CHUNK 512 /* k decoded per pass of the buffered path (a multiple of every block size) */
#define COLS 3 /* output columns decoded together by the buffered path */
#define MAX_ROWS 4 /* rows per buffered tile: 4 rows x 3 columns of 8-lane accumulators in 12 registers */
#define X_BLOCK_BYTES (512 * 1024) /* rows of x per block: they stay in L2 while the columns pass */
#define STREAM_ROWS 5 /* up to this many rows, values go from codes to the multiply-adds in registers */
#define COLS512 4 /* the AVX-512 buffered path's columns per tile... */
#define ROWS512 4 /* ...and rows: 16 accumulators of 16 lanes */

/* ggml's type ids (ggml.h, gguf-py GGMLQuantizationType) */
enum { T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13,
       T_Q6_K = 14, T_BF16 = 30 };

/* elements and bytes of one block; F16 and BF16 rows are read 32 values at a time */
typedef struct {
    int type, elements, bytes;
} Format;

static const Format FORMATS[] = {
    {T_F16, 32, 64},   {T_BF16, 32, 64},  {T_Q4_0, 32, 18},   {T_Q4_1, 32, 20},   {T_Q5_0, 32, 22},
    {T_Q5_1, 32, 24},  {T_Q8_0, 32, 34},  {T_Q4_K, 256, 144}, {T_Q5_K, 256, 176}, {T_Q6_K, 256, 210},
};
#define NUM_FORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

static const Format* format_of(int type) {
    for (int i = 0; i < NUM_FORMATS; i++)
        if (FORMATS[i].type == type) return &FORMATS[i];
    return NULL;
}

/* IEEE half -> float, exactly (subnormals, infinities and NaN included) */
static inline __attribute__((always_inline)) float f16_to_f32_portable(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        const float f = (float)man * 0x1p-24f; /* exact: a 10-bit integer times a power of two */
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline __attribute__((always_inline)) uint16_t u16_at(const uint8_t* p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (gguf-py Q4_K.get_scale_min) */
static inline __attribute__((always_inline)) void k_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
typedef float v4 __attribute__((vector_size(4 * sizeof(float))));

/* The 16 lanes of one output in a fixed tree: t[i] + t[i + 8], then + 4, then pairs. */
static inline __attribute__((always_inline)) float lane_sum(const float* t) {
    float a[8], b[4];
    for (int i = 0; i < 8; i++) a[i] = t[i] + t[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* a group of 32 values in natural order -> slot order (slot 8 b + i holds position 4 i + b) */
static inline __attribute__((always_inline)) void to_slots(const float* natural, float* slots) {
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < 8; i++) slots[8 * b + i] = natural[4 * i + b];
}

/* The buffered path's layout of a chunk of kc values (kc a multiple of 32): the slots of lanes 0-7
 * first, then those of lanes 8-15, each half in increasing k, so that a tile runs over one half at a
 * time with one register per output. Position 4 i + b of group g goes to half b % 2, at
 * 16 g + 8 (b / 2) + i. */
static inline __attribute__((always_inline)) int64_t half_index(int64_t kc, int64_t g, int b, int i) {
    return (b % 2) * (kc / 2) + 16 * g + 8 * (b / 2) + i;
}

/* a chunk of kc values in natural order -> the buffered layout */
static inline __attribute__((always_inline)) void to_halves(const float* natural, int64_t kc, float* out) {
    for (int64_t g = 0; g < kc / GROUP; g++)
        for (int b = 0; b < 4; b++)
            for (int i = 0; i < 8; i++) out[half_index(kc, g, b, i)] = natural[GROUP * g + 4 * i + b];
}

/* rows of x per block: as many as fit X_BLOCK_BYTES, a whole number of tiles, at least one tile */
static inline int64_t rows_per_block(int64_t K) {
    const int64_t rows = X_BLOCK_BYTES / ((int64_t)sizeof(float) * K);
    return rows < MAX_ROWS ? MAX_ROWS : rows - rows % MAX_ROWS;
}

typedef struct {
    const float* x; /* [M, K]: each group of 32 in slot order (streaming) or each chunk in halves (buffered) */
    const uint8_t* w; /* [N, row_bytes] */
    const float* bias; /* [N] or NULL */
    float* out; /* [M, ldo]: columns [0, N) are written */
    int64_t M, K, N, row_bytes, ldo;
    const Format* format;
} Args;

static inline __attribute__((always_inline)) v4 fma_v4(v4 a, v4 b, v4 c) {
    return (v4){fmaf(a[0], b[0], c[0]), fmaf(a[1], b[1], c[1]), fmaf(a[2], b[2], c[2]), fmaf(a[3], b[3], c[3])};
}
__attribute__((target("arch=x86-64-v3"))) static inline __attribute__((always_inline)) v8 fma_v8(v8 a, v8 b, v8 c) {
    return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
__attribute__((target("arch=x86-64-v3"))) static inline __attribute__((always_inline)) float f16_avx2(const uint8_t* p) {
    return _cvtsh_ss(u16_at(p));
}
static inline __attribute__((always_inline)) float f16_baseline(const uint8_t* p) {
    return f16_to_f32_portable(u16_at(p));
}

/* the formats decoded straight into slot order (name, values and bytes per block), for X(...) */
#define SLICED_FORMATS(X) \
    X(q4_0, 32, 18) X(q4_1, 32, 20) X(q5_0, 32, 22) X(q5_1, 32, 24) X(q8_0, 32, 34) X(q4_k, 256, 144) X(q5_k, 256, 176) X(q6_k, 256, 210)
/* CALL(name) for such a format, then return 1; return 0 for the others (F16, BF16: natural order) */
#define BY_FORMAT(CALL)                    \
    switch (f->type) {                     \
        case T_Q4_0: CALL(q4_0); return 1; \
        case T_Q4_1: CALL(q4_1); return 1; \
        case T_Q5_0: CALL(q5_0); return 1; \
        case T_Q5_1: CALL(q5_1); return 1; \
        case T_Q8_0: CALL(q8_0); return 1; \
        case T_Q4_K: CALL(q4_k); return 1; \
        case T_Q5_K: CALL(q5_k); return 1; \
        case T_Q6_K: CALL(q6_k); return 1; \
        default: return 0;                 \
    }

/* one copy of the decoders and tiles per ISA level, as in the other kernels */
#include "gguf_slices_avx2.h"
#include "gguf_slices_avx512.h"
#undef BY_FORMAT
#undef SLICED_FORMATS
#define HAS_SLICES
#define ISA avx2
#define ISA_ATTR __attribute__((target("arch=x86-64-v3")))
#define NV v8
#define NL 8
#define VFMA fma_v8
#include "gguf_linear_tiles.h"
#undef HAS_SLICES
#define ISA baseline
#define ISA_ATTR
#define NV v4
#define NL 4
#define VFMA fma_v4
#include "gguf_linear_tiles.h"

/* the integer path (int8 activations, integer dot products) */
#include "gguf_q8.h"
/* every decoder layer in one call (the integer path, RoPE, the cache writes, paged attention) */
#include "paged_attention.h"
#include "gguf_stack.h"

static int run(const Args* given, int num_threads, int isa) {
    const Args* a = given;
    const int avx2 = isa >= 2;
    const int wide = isa >= 512 && has_slices(a->format); /* the AVX-512 copies */
    const int stream = avx2 && a->M <= STREAM_ROWS && has_slices(a->format);
    const int64_t cols = wide && !stream ? COLS512 : COLS; /* columns a thread's range is a multiple of */
    const int64_t blocks = (a->N + cols - 1) / cols;
    const int64_t rows = a->M < rows_per_block(a->K) ? a->M : rows_per_block(a->K);
    float* laid = (float*)alloc_lines(sizeof(float) * (size_t)(a->M * a->K));
    if (laid == NULL) return 1;
    Args in_layout = *a;
    in_layout.x = laid;
    int failed = 0;
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        /* x into the path's layout, rows shared out among the threads */
#pragma omp for schedule(static)
        for (int64_t m = 0; m < a->M; m++) {
            const float* row = a->x + m * a->K;
            float* dst = laid + m * a->K;
            for (int64_t k0 = 0; k0 < a->K; k0 += stream || wide ? GROUP : K_CHUNK) {
                const int64_t kc = a->K - k0 > K_CHUNK ? K_CHUNK : a->K - k0;
                if (stream || wide)
                    to_slots(row + k0, dst + k0);
                else
                    to_halves(row + k0, kc, dst + k0);
            }
        }
        /* then a contiguous range of output columns per thread: each output is computed by one */
        const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t begin = blocks * t / n * cols, end_ = blocks * (t + 1) / n * cols;
        const int64_t end = end_ < a->N ? end_ : a->N;
        if (begin < end && stream && wide) {
            stream_columns512(&in_layout, begin, end);
        } else if (begin < end && stream) {
            stream_columns(&in_layout, begin, end);
        } else if (begin < end && wide) {
            float* buf = (float*)alloc_lines(sizeof(float) * COLS512 * K_CHUNK);
            float* part = (float*)alloc_lines(sizeof(float) * COLS512 * LANES * (size_t)rows);
            if (buf == NULL || part == NULL)
                failed = 1;
            else
                columns512(&in_layout, begin, end, buf, part);
            free(buf);
            free(part);
        } else if (begin < end) {
            float* buf = (float*)alloc_lines(sizeof(float) * COLS * K_CHUNK);
            float* part = (float*)alloc_lines(sizeof(float) * COLS * LANES * (size_t)rows);
            if (buf == NULL || part == NULL)
                failed = 1;
            else if (avx2)
                columns_avx2(&in_layout, begin, end, buf, part);
            else
                columns_baseline(&in_layout, begin, end, buf, part);
            free(buf);
            free(part);
        }
    }
    free(laid);
    return failed;
}

/* A checked Format for (type, K, row_bytes), or NULL with a Python error set. */
static const Format* checked_format(int type, long long K, long long row_bytes) {
    const Format* f = format_of(type);
    if (f == NULL) {
        PyErr_Format(PyExc_ValueError, "gguf linear: unsupported ggml type %d", type);
        return NULL;
    }
    if (K < 1 || K % f->elements != 0 || K % GROUP != 0 || row_bytes != K / f->elements * f->bytes) {
        PyErr_Format(PyExc_ValueError, "gguf linear: K %lld and row bytes %lld do not fit type %d", K,
                     row_bytes, type);
        return NULL;
    }
    return f;
}

static PyObject* linear(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long x, w, bias, out;
    long long M, K, N, row_bytes, ldo;
    int type, num_threads, isa;
    if (!PyArg_ParseTuple(args, "KKiKKLLLLLii", &x, &w, &type, &bias, &out, &M, &K, &N, &row_bytes, &ldo,
                          &num_threads, &isa))
        return NULL;
    const Format* f = checked_format(type, K, row_bytes);
    if (f == NULL) return NULL;
    if (M < 0 || N < 1 || ldo < N) {
        PyErr_SetString(PyExc_ValueError, "gguf linear: bad shape");
        return NULL;
    }
    Args a = {(const float*)(uintptr_t)x, (const uint8_t*)(uintptr_t)w, (const float*)(uintptr_t)bias,
              (float*)(uintptr_t)out, M, K, N, row_bytes, ldo, f};
    int failed = 0;
    if (M > 0) {
        Py_BEGIN_ALLOW_THREADS
        failed = run(&a, num_threads < 1 ? 1 : num_threads, usable_isa(isa));
        Py_END_ALLOW_THREADS
    }
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject* dequantize(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long w, ids, out;
    long long rows, K, row_bytes;
    int type, isa;
    if (!PyArg_ParseTuple(args, "KiKLLKLi", &w, &type, &ids, &rows, &K, &out, &row_bytes, &isa)) return NULL;
    const Format* f = checked_format(type, K, row_bytes);
    if (f == NULL) return NULL;
    const int64_t* row_ids = (const int64_t*)(uintptr_t)ids;
    const int level = usable_isa(isa);
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < rows; i++) {
        const uint8_t* src = (const uint8_t*)(uintptr_t)w + (row_ids != NULL ? row_ids[i] : i) * row_bytes;
        float* dst = (float*)(uintptr_t)out + i * K;
        if (level >= 2)
            decode_span_avx2(f, src, 0, K, dst);
        else
            decode_span_baseline(f, src, 0, K, dst);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject* formats(PyObject* self, PyObject* noargs) {
    (void)self;
    (void)noargs;
    PyObject* d = PyDict_New();
    if (d == NULL) return NULL;
    for (int i = 0; i < NUM_FORMATS; i++) {
        PyObject* key = PyLong_FromLong(FORMATS[i].type);
        PyObject* value = Py_BuildValue("(ii)", FORMATS[i].elements, FORMATS[i].bytes);
        if (key == NULL || value == NULL || PyDict_SetItem(d, key, value) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(key);
        Py_DECREF(value);
    }
    return d;
}

static PyMethodDef methods[] = {
    {"linear", linear, METH_VARARGS,
     "linear(x, w, type, bias, out, M, K, N, row_bytes, ldo, num_threads, isa): out[:, :N] = x @ W.T "
     "(+ bias) over raw data pointers; x [M, K] float32, w [N, row_bytes] GGUF blocks of ggml type "
     "`type`, bias [N] float32 (0: none), out float32 rows of ldo floats; isa 512, 2 or 0 (the "
     "AVX2 copy runs from 2 on; lowered to what the CPU runs)."},
    {"dequantize", dequantize, METH_VARARGS,
     "dequantize(w, type, ids, rows, K, out, row_bytes, isa): out[i] = row ids[i] of w (ids 0: row i) as "
     "float32, the values gguf-py's dequantize gives."},
    {"formats", formats, METH_NOARGS, "formats(): {ggml type: (elements per block, bytes per block)}."},
    {"qlinear", qlinear, METH_VARARGS,
     "qlinear(x, M, K, plan, out, ldo, threads, isa, norm, eps, accumulate): out[:, :N] (+)= "
     "rmsnorm?(x) @ W.T + bias with x quantised to int8 blocks; plan: int64 (type, w, rows, row_bytes, "
     "bias) per part; isa 512 (AVX-512 VNNI), 256 (AVX-VNNI) or 2 (AVX2), lowered to what the CPU runs."},
    {"layers", layers, METH_VARARGS,
     "layers(plan, x, T, k_base, v_base, S, cos, sin, slots, tables, row_table, row_len, block_size, threads, "
     "isa, attn_isa, workspace, workspace_bytes): every decoder layer over the rows x [T, hidden] in place "
     "(gguf_stack.h), writing their keys and values at slots; attention through the paged kernel's plan "
     "(tables, row_table, row_len). Returns 0, or the bytes the workspace must hold (nothing computed)."},
    {"repack", repack, METH_VARARGS,
     "repack(type, src, rows, K, dst): Q4_K (type 1012) or Q6_K (1014) rows into the integer path's 16-column "
     "groups (gguf_q8_x16.h); dst holds packed_bytes(type, rows, K)."},
    {"prefetch", prefetch, METH_VARARGS,
     "prefetch(distance, lead): how far ahead in the weights the integer path prefetches, and how many bytes "
     "of a thread's next share the layer stack prefetches as it ends one (< 0: unchanged); returns the "
     "previous pair. For tuning by measurement; it changes no number."},
    {"packed_bytes", packed_bytes, METH_VARARGS, "packed_bytes(type, rows, K): bytes of repack's output."},
    {"q8_level", q8_level, METH_VARARGS, "q8_level(wanted): the integer path's ISA level for `wanted` (0: none)."},
    {"isa_level", isa_level, METH_VARARGS, "isa_level(wanted): the ISA level linear() runs for `wanted`."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gguf_linear", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__gguf_linear(void) { return PyModule_Create(&module); }
