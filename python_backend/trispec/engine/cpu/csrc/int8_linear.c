/*
 * int8 weight-only linear layer for the CPU engine (module trispec.engine._int8_linear):
 *   y[m, n] = scale[n] * sum_k x[m, k] * w[n, k]  (+ bias[n])
 * with int8 weights (one scale per output channel) and float32 or bfloat16 activations.
 *
 * Why a kernel of our own: a draft model's single-token step reads every weight once and should run
 * at memory speed. torch's _weight_int8pack_mm was compute-bound there on the 2-core AVX-512 machine
 * (one 0.5B draft step: 14.7 GB/s of int8 weights where oneDNN streams fp32 weights at 24 GB/s), and
 * its cost grows with the row count (16 rows 4x one row, 256 rows 48x), which made a draft model's
 * catch-up on a prompt as slow as the target's own prefill.
 *
 * Batch-invariant by construction, like the attention kernel: every output element is computed by
 * one thread, in one fixed order, whatever the other rows of the call or the thread count:
 *   acc (LANES floats) = 0; for each chunk of LANES along k: acc += x[m, chunk] * float(w[n, chunk])
 *   s = fixed tree over acc's lanes; then the k % LANES tail in order; y = s * scale[n] (+ bias[n])
 * Rows and columns are blocked (ROWS x COLS accumulators, so that a weight vector loaded once serves
 * several rows), but a row's arithmetic is the same in a full block and in a remainder: the blocks
 * only decide which results are computed together, never how. No -ffast-math.
 */
#define PY_SSIZE_T_CLEAN
#pragma GCC diagnostic ignored "-Wpsabi"
#include <Python.h>
#include "kernel_common.h"
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16 /* floats per logical accumulator: one AVX-512 register, two AVX2 ones */
#define PREFETCH_BYTES 8192 /* how far ahead in a weight row (measured best of 0.5-32 KB) */
#define BUFFER_ROWS 16 /* from this many rows, a block of weights is converted once into a buffer */
#define MAX_COLS 4 /* the widest tile (AVX-512) */
#define K_BLOCK 1024 /* k per pass over a column block's rows, from BUFFER_ROWS rows on */
#define X_BLOCK_BYTES (1024 * 1024) /* rows of x per block, from BUFFER_ROWS rows on */

typedef float v16 __attribute__((vector_size(16 * sizeof(float))));
typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
typedef float v4 __attribute__((vector_size(4 * sizeof(float))));

/* int8 -> float, one native vector: with intrinsics (GCC lowers a generic int8 -> int32 vector
 * conversion lane by lane). The conversion is exact, so every level gives the same floats. */
__attribute__((target("arch=x86-64-v4"))) static inline __attribute__((always_inline)) v16 load_w_avx512(const int8_t* p) {
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
    v16 v;
    memcpy(&v, &f, sizeof v);
    return v;
}

__attribute__((target("arch=x86-64-v3"))) static inline __attribute__((always_inline)) v8 load_w_avx2(const int8_t* p) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
    v8 v;
    memcpy(&v, &f, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) v4 load_w_baseline(const int8_t* p) {
    return (v4){(float)p[0], (float)p[1], (float)p[2], (float)p[3]};
}

/* The LANES partial sums of one output, added in a fixed tree: t[i] + t[i + 8], then + 4, + 2, + 1
 * (as vector halves: this runs once per output, and scalar adds cost as much as a short row). */
static inline __attribute__((always_inline)) float lane_sum(const float* t) {
    v8 a, b;
    memcpy(&a, t, sizeof a);
    memcpy(&b, t + 8, sizeof b);
    const v8 s8 = a + b;
    v4 lo, hi;
    memcpy(&lo, &s8, sizeof lo);
    memcpy(&hi, (const char*)&s8 + sizeof lo, sizeof hi);
    const v4 s4 = lo + hi;
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

typedef struct {
    const float* x; /* [M, K] float32 (bf16 inputs are widened first) */
    const int8_t* w; /* [N, K] */
    const float* scale; /* [N] */
    const float* bias; /* [N] or NULL */
    void* out; /* [M, N] float32 or bfloat16 */
    int64_t M, K, N;
    int out_bf16;
} Args;

static inline __attribute__((always_inline)) void store(const Args* a, int64_t m, int64_t n, float s) {
    float y = s * a->scale[n];
    if (a->bias != NULL) y = y + a->bias[n];
    if (a->out_bf16)
        ((uint16_t*)a->out)[m * a->N + n] = f32_to_bf16(y);
    else
        ((float*)a->out)[m * a->N + n] = y;
}

/* One copy of the tiles per ISA level, chosen once per process (the level torch runs at), as in
 * the attention kernel: a machine always runs the same code, and a test can force the AVX2 copy. */
/* tiles keep their accumulators in registers: 16 of AVX-512's 32 (24 in taller tiles), 8 of AVX2's 16 */
#define ISA avx512
#define ISA_ATTR __attribute__((target("arch=x86-64-v4")))
#define NV v16
#define NL 16
#define ISA_COLS 4
#define ISA_ROWS 4
#define ISA_BIG_ROWS 6
#include "int8_linear_tiles.h"
#define ISA avx2
#define ISA_ATTR __attribute__((target("arch=x86-64-v3")))
#define NV v8
#define NL 8
#define ISA_COLS 2
#define ISA_ROWS 2
#define ISA_BIG_ROWS 2
#include "int8_linear_tiles.h"
#define ISA baseline
#define ISA_ATTR
#define NV v4
#define NL 4
#define ISA_COLS 1
#define ISA_ROWS 2
#define ISA_BIG_ROWS 2
#include "int8_linear_tiles.h"

typedef void (*columns_fn)(const Args*, int64_t, int64_t, float*, float*);

static int run(const Args* a, int num_threads, int isa) {
    const columns_fn fn = isa == 512 ? columns_avx512 : isa == 2 ? columns_avx2 : columns_baseline;
    const int64_t blocks = (a->N + MAX_COLS - 1) / MAX_COLS;
    int failed = 0;
    /* a contiguous range of output channels per thread: each output is computed by exactly one,
     * and how the range is tiled never changes how an output is computed */
#pragma omp parallel num_threads(num_threads) reduction(| : failed)
    {
        const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t begin = blocks * t / n * MAX_COLS, end = blocks * (t + 1) / n * MAX_COLS;
        float* buf = (float*)malloc(sizeof(float) * MAX_COLS * (size_t)a->K);
        float* part = a->M >= BUFFER_ROWS ? (float*)malloc(sizeof(float) * MAX_COLS * LANES * (size_t)a->M) : NULL;
        if (buf == NULL || (a->M >= BUFFER_ROWS && part == NULL))
            failed = 1;
        else
            fn(a, begin, end < a->N ? end : a->N, buf, part);
        free(buf);
        free(part);
    }
    return failed;
}

static PyObject* linear(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long x, w, scale, bias, out;
    long long M, K, N;
    int x_bf16, out_bf16, num_threads, isa;
    if (!PyArg_ParseTuple(args, "KKKKKLLLiiii", &x, &w, &scale, &bias, &out, &M, &K, &N, &x_bf16,
                          &out_bf16, &num_threads, &isa))
        return NULL;
    if (M < 0 || K < 1 || N < 1) {
        PyErr_SetString(PyExc_ValueError, "int8 linear: bad shape");
        return NULL;
    }
    float* widened = NULL;
    if (x_bf16 && M > 0) {
        widened = (float*)malloc(sizeof(float) * (size_t)M * (size_t)K);
        if (widened == NULL) return PyErr_NoMemory();
        const uint16_t* src = (const uint16_t*)(uintptr_t)x;
        for (int64_t i = 0; i < M * K; i++) widened[i] = bf16_to_f32(src[i]);
    }
    Args a = {widened != NULL ? widened : (const float*)(uintptr_t)x, (const int8_t*)(uintptr_t)w,
              (const float*)(uintptr_t)scale, (const float*)(uintptr_t)bias, (void*)(uintptr_t)out,
              M, K, N, out_bf16};
    int failed = 0;
    if (M > 0) {
        Py_BEGIN_ALLOW_THREADS
        failed = run(&a, num_threads < 1 ? 1 : num_threads, usable_isa(isa));
        Py_END_ALLOW_THREADS
    }
    free(widened);
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"linear", linear, METH_VARARGS,
     "linear(x, w, scale, bias, out, M, K, N, x_bf16, out_bf16, num_threads, isa): out = x @ w.T * "
     "scale (+ bias) over raw data pointers; x [M, K] float32 or bfloat16 (x_bf16), w [N, K] int8, "
     "scale and bias [N] float32 (bias 0: none), out [M, N] float32 or bfloat16 (out_bf16); isa is "
     "512, 2 or 0 (AVX-512, AVX2, baseline; lowered to what the CPU runs)."},
    {"isa_level", isa_level, METH_VARARGS, "isa_level(wanted): the ISA level linear() runs for `wanted`."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int8_linear", NULL, -1, methods};

PyMODINIT_FUNC PyInit__int8_linear(void) { return PyModule_Create(&module); }
