/*
 * The integer path of the GGUF kernel (included by gguf_linear.c): activations quantised per row to
 * int8 blocks, multiplied with the file's Q4_0/Q5_0/Q8_0/Q4_K/Q5_K/Q6_K codes by integer dot products.
 *
 * Why: on a CPU a decode step reads every weight once; decoding the codes to float32 and multiplying
 * in float32 (the float path) made decoding, not memory, the limit (a 1.5B Q4_K_M step ran at 15 GB/s).
 * Integer dot products (vpdpbusd / vpmaddubsw) do 64 multiply-adds per instruction on the codes as they
 * are, with the block scales applied once per block.
 *
 * The numbers are no longer the float32 model's: each row of x is quantised, 256 values at a time, to
 * q = round(x * 127 / amax) (a float scale d = amax / 127 per block, Q8Block), and the weights' codes
 * multiply q exactly in int32. Exact integer sums are the same whatever order an ISA adds them in, so
 * only the float steps fix the bits, and every copy (AVX-512 VNNI, AVX-VNNI, AVX2) does them alike:
 *
 *   A chunk of 64 values gives 16 int32 lanes, lane i holding the products of values 4 i .. 4 i + 3
 *   (one 512-bit vpdpbusd; the AVX2 copies hold lanes 0-7 and 8-15 in two registers).
 *   K-quants: the lanes add the four chunks of a 256-value block, each product times its sub-block's
 *   scale; Q6_K's code offset (-32) enters as lanes 0-7 -= 32 (sc[2 i] bs[2 i] + sc[2 i + 1] bs[2 i + 1])
 *   (bs: sums of 16 q). Then per block, in increasing order: f[lane] = fma(d_w * d_x, (float)lane,
 *   f[lane]). Q4_K / Q5_K's mins: four lanes of m[2 i] bs[2 i] + m[2 i + 1] bs[2 i + 1] (bs: sums of
 *   32 q), g = fma(dmin_w * d_x, (float)lanes, g) per block.
 *   Q4_0 / Q5_0 / Q8_0 (blocks of 32): per chunk, lanes 0-7 are the first block's signed codes times q,
 *   lanes 8-15 the second's, and f[lane] = fma(d_w * d_x, (float)lane, f[lane]), chunks in order.
 *   y = (lane_sum(f) - ((g0 + g1) + (g2 + g3))) + bias; y = out + y when accumulating.
 * Each output is computed by one thread, from its own row's blocks only: the same bits whatever the
 * row count, the tiling, the thread count or the ISA (batch invariance). The types it does not take
 * (Q4_1, Q5_1, F16, BF16), or any part on a CPU without AVX2, stay on the float path.
 */
#include <math.h>

#define Q8_BLOCK 256 /* values per activation block */
#define Q8_CHUNK 64 /* values per 16-lane chunk */
#define Q8_MAX_PARTS 8 /* tensors one call multiplies side by side (q, k, v) */
#define Q8_X_BYTES (512 * 1024) /* activation rows per pass over the columns: they stay in L2 */

typedef struct {
    float d; /* the block's scale: value = d * q */
    int16_t bsum16[16]; /* sums of 16 consecutive q (Q6_K's offsets) */
    int16_t bsum32[8]; /* sums of 32 (Q4_K / Q5_K mins) */
    int8_t pad[12];
    int8_t q[Q8_BLOCK]; /* 64-byte aligned: the header is 64 bytes */
} Q8Block;

typedef struct {
    int type;
    const uint8_t* w; /* [rows, row_bytes] */
    const float* bias; /* [rows] or NULL */
    int64_t rows, row_bytes, first; /* first: its first column in the output */
} QPart;

typedef struct {
    const float* x; /* [M, K] */
    const float* norm; /* [K] or NULL: x is RMS-normalised and times norm first */
    float eps;
    float* out; /* [M, ldo] */
    int64_t M, K, N, ldo, nblk; /* nblk: Q8Blocks per row */
    int accumulate;
    Q8Block* xq; /* [M, nblk] */
    int nparts;
    QPart parts[Q8_MAX_PARTS];
} QArgs;

#include "gguf_q8_x16.h"

/* whether the integer path takes this type at this width */
static int q8_takes(int type, int64_t K) {
    switch (type) {
        case T_Q4_K_X16: case T_Q6_K_X16: return K % Q8_BLOCK == 0;
        case T_Q4_0_X16: case T_Q5_0_X16: case T_Q8_0_X16: return K % Q8_CHUNK == 0;
        case T_Q4_0: case T_Q5_0: case T_Q8_0: return K % Q8_CHUNK == 0;
        case T_Q4_K: case T_Q5_K: case T_Q6_K: return K % Q8_BLOCK == 0;
        default: return 0;
    }
}

/* the 16 float lanes (two halves of 8) -> one float, lane_sum's tree */
static inline __attribute__((always_inline)) float q8_lanes(const float* lo, const float* hi) {
    float t[16];
    memcpy(t, lo, 8 * sizeof(float));
    memcpy(t + 8, hi, 8 * sizeof(float));
    return lane_sum(t);
}
static inline __attribute__((always_inline)) float q8_mins(const float* g) { return (g[0] + g[1]) + (g[2] + g[3]); }

/* one output column's dot products for R rows (res[r], no bias) lives in the ISA copies */
static inline void q8_store(const QArgs* a, const QPart* p, int64_t n, int64_t m0, int R, const float* res) {
    const float b = p->bias != NULL ? p->bias[n - p->first] : 0.0f;
    for (int r = 0; r < R; r++) {
        float* o = a->out + (m0 + r) * a->ldo + n;
        const float y = p->bias != NULL ? res[r] + b : res[r];
        *o = a->accumulate ? *o + y : y;
    }
}

/* rows of x per pass: as many as fit Q8_X_BYTES, at least 8 */
static inline int64_t q8_rows_per_pass(int64_t nblk) {
    const int64_t rows = Q8_X_BYTES / ((int64_t)sizeof(Q8Block) * nblk);
    return rows < 8 ? 8 : rows;
}

#define Q8_VNNI 0
#include "gguf_q8_avx2.h"
#undef Q8_VNNI
#define Q8_VNNI 1
#include "gguf_q8_avx2.h"
#undef Q8_VNNI
#include "gguf_q8_avx512.h"

/* 512: AVX-512 VNNI; 256: AVX-VNNI; 2: AVX2; 0: none (the float path) — the highest <= wanted */
static int q8_usable(int wanted) {
    __builtin_cpu_init();
    if (wanted >= 512 && __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512vnni")) return 512;
    if (wanted >= 256 && __builtin_cpu_supports("x86-64-v3") && __builtin_cpu_supports("avxvnni")) return 256;
    if (wanted >= 2 && __builtin_cpu_supports("x86-64-v3")) return 2;
    return 0;
}

static int q8_run(QArgs* a, int num_threads, int isa) {
    a->xq = (Q8Block*)alloc_lines(sizeof(Q8Block) * (size_t)(a->M * a->nblk));
    if (a->xq == NULL) return 1;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < a->M; m++) {
            const float* x = a->x + m * a->K;
            Q8Block* xq = a->xq + m * a->nblk;
            if (isa == 512)
                q8_prep_row_avx512(x, a->norm, a->eps, a->K, xq);
            else if (isa == 256)
                q8_prep_row_avxvnni(x, a->norm, a->eps, a->K, xq);
            else
                q8_prep_row_avx2(x, a->norm, a->eps, a->K, xq);
        }
        /* a contiguous range of output columns (across parts) per thread */
        const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t begin = a->N * t / n, end = a->N * (t + 1) / n;
        if (begin < end) {
            if (isa == 512)
                q8_columns_avx512(a, begin, end);
            else if (isa == 256)
                q8_columns_avxvnni(a, begin, end);
            else
                q8_columns_avx2(a, begin, end);
        }
    }
    free(a->xq);
    return 0;
}

/* qlinear(x, M, K, plan, out, ldo, threads, isa, norm, eps, accumulate) */
static PyObject* qlinear(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long x, out, norm;
    long long M, K, ldo;
    Py_buffer plan;
    int threads, isa, accumulate;
    double eps;
    if (!PyArg_ParseTuple(args, "KLLy*KLiiKdi", &x, &M, &K, &plan, &out, &ldo, &threads, &isa, &norm, &eps,
                          &accumulate))
        return NULL;
    QArgs a;
    memset(&a, 0, sizeof a);
    const int64_t* spec = (const int64_t*)plan.buf;
    const Py_ssize_t nparts = plan.len / (Py_ssize_t)(5 * sizeof(int64_t));
    int bad = nparts < 1 || nparts > Q8_MAX_PARTS || plan.len % (Py_ssize_t)(5 * sizeof(int64_t)) != 0 || M < 0 ||
              K < 1;
    int64_t N = 0;
    for (Py_ssize_t i = 0; !bad && i < nparts; i++) {
        const int64_t* s = spec + 5 * i;
        const Format* f = format_of((int)s[0]);
        const int64_t row_bytes = f != NULL ? K / f->elements * f->bytes : x16_group_bytes((int)s[0], K);
        bad = !q8_takes((int)s[0], K) || s[2] < 1 || s[3] != row_bytes;
        a.parts[i] = (QPart){(int)s[0], (const uint8_t*)(uintptr_t)s[1], (const float*)(uintptr_t)s[4], s[2], s[3], N};
        N += s[2];
    }
    PyBuffer_Release(&plan);
    if (bad || ldo < N) {
        PyErr_SetString(PyExc_ValueError, "gguf qlinear: bad plan or shape (types Q4_0 Q5_0 Q8_0 Q4_K Q5_K Q6_K)");
        return NULL;
    }
    const int level = q8_usable(isa);
    if (level == 0) {
        PyErr_SetString(PyExc_RuntimeError, "gguf qlinear: needs AVX2");
        return NULL;
    }
    a.x = (const float*)(uintptr_t)x;
    a.norm = (const float*)(uintptr_t)norm;
    a.eps = (float)eps;
    a.out = (float*)(uintptr_t)out;
    a.M = M;
    a.K = K;
    a.N = N;
    a.ldo = ldo;
    a.nblk = (K + Q8_BLOCK - 1) / Q8_BLOCK;
    a.accumulate = accumulate;
    a.nparts = (int)nparts;
    int failed = 0;
    if (M > 0) {
        Py_BEGIN_ALLOW_THREADS
        failed = q8_run(&a, threads < 1 ? 1 : threads, level);
        Py_END_ALLOW_THREADS
    }
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject* q8_level(PyObject* self, PyObject* args) {
    (void)self;
    int wanted;
    if (!PyArg_ParseTuple(args, "i", &wanted)) return NULL;
    return PyLong_FromLong(q8_usable(wanted));
}
