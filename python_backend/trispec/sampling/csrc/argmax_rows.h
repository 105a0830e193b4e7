/* argmax(scores, n, V, row_stride, num_threads, isa) -> list of n ints: each float32 row's index of
 * its largest value, the lowest index on ties, and a row's first NaN if it has one (what numpy's and
 * torch's argmax give). Comparisons only, so every ISA copy returns the same ids.
 *
 * Why in C: a greedy step's argmax runs right after the LM head kernel has streamed its weights
 * through every cache; numpy's took ~0.13 ms there (cold code, and half of the 151,936-value row in the
 * other core's cache). One row is split between the threads, each scanning the part its core wrote
 * (the LM head's columns are split the same way: halves in order). */
#ifndef TRISPEC_ARGMAX_ROWS_H
#define TRISPEC_ARGMAX_ROWS_H

#define ARGMAX_LANES 16
typedef float amf __attribute__((vector_size(ARGMAX_LANES * sizeof(float))));
typedef float amf_u __attribute__((vector_size(ARGMAX_LANES * sizeof(float)), aligned(4), may_alias));
typedef int32_t ami __attribute__((vector_size(ARGMAX_LANES * sizeof(int32_t))));

typedef struct {
    float value;
    int64_t index; /* -1: nothing scanned */
    int64_t nan;   /* the first NaN's index, -1 if none */
} ArgmaxPart;

/* the better of two parts of one row, a before b in the row */
static ArgmaxPart argmax_join(ArgmaxPart a, ArgmaxPart b) {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    if (a.nan >= 0) return a; /* a's first NaN comes before anything of b's */
    if (b.nan >= 0) return b;
    return a.value >= b.value ? a : b; /* equal: a, the lower index */
}

/* values [lo, hi) of one row */
static inline __attribute__((always_inline)) ArgmaxPart argmax_scan(const float* row, int64_t lo, int64_t hi) {
    ArgmaxPart part = {0.0f, -1, -1};
    int64_t i = lo;
    if (hi - lo >= ARGMAX_LANES) {
        const ami lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        amf best = *(const amf_u*)(row + lo);
        ami at = lane, unordered = best != best;
        ami step = lane;
        for (i = lo + ARGMAX_LANES; i + ARGMAX_LANES <= hi; i += ARGMAX_LANES) {
            step += ARGMAX_LANES;
            const amf v = *(const amf_u*)(row + i);
            const ami greater = v > best;
            best = (amf)(((ami)v & greater) | ((ami)best & ~greater));
            at = (step & greater) | (at & ~greater);
            unordered |= v != v;
        }
        int any_nan = 0;
        for (int l = 0; l < ARGMAX_LANES; l++) any_nan |= unordered[l] != 0;
        if (any_nan) {
            for (int64_t j = lo; j < hi; j++)
                if (row[j] != row[j]) {
                    part.nan = part.index = j;
                    return part;
                }
        }
        part.value = best[0], part.index = lo + at[0];
        for (int l = 1; l < ARGMAX_LANES; l++) {
            const int64_t index = lo + at[l];
            if (best[l] > part.value || (best[l] == part.value && index < part.index)) part.value = best[l], part.index = index;
        }
    }
    for (; i < hi; i++) {
        const float v = row[i];
        if (v != v) {
            /* a NaN in the tail: the first NaN of [lo, hi) (the vector part had none) */
            part.nan = part.index = i;
            return part;
        }
        if (part.index < 0 || v > part.value) part.value = v, part.index = i;
    }
    return part;
}

__attribute__((target("arch=x86-64-v4"))) static ArgmaxPart argmax_scan_avx512(const float* row, int64_t lo, int64_t hi) {
    return argmax_scan(row, lo, hi);
}
__attribute__((target("arch=x86-64-v3"))) static ArgmaxPart argmax_scan_avx2(const float* row, int64_t lo, int64_t hi) {
    return argmax_scan(row, lo, hi);
}
static ArgmaxPart argmax_scan_baseline(const float* row, int64_t lo, int64_t hi) { return argmax_scan(row, lo, hi); }

#define ARGMAX_MAX_PARTS 64

static PyObject* argmax_rows(PyObject* self, PyObject* args) {
    (void)self;
    unsigned long long scores;
    long long n, V, row_stride;
    int num_threads, isa;
    if (!PyArg_ParseTuple(args, "KLLLii", &scores, &n, &V, &row_stride, &num_threads, &isa)) return NULL;
    if (n < 0 || V < 1 || row_stride < V) {
        PyErr_SetString(PyExc_ValueError, "argmax: bad shape");
        return NULL;
    }
    const float* s = (const float*)(uintptr_t)scores;
    const int level = usable_isa(isa);
    ArgmaxPart (*scan)(const float*, int64_t, int64_t) =
        level == 512 ? argmax_scan_avx512 : level == 2 ? argmax_scan_avx2 : argmax_scan_baseline;
    const int threads = num_threads < 1 ? 1 : num_threads > ARGMAX_MAX_PARTS ? ARGMAX_MAX_PARTS : num_threads;
    /* one row: split in `threads` parts in order; several: a row a thread */
    const int parts = n == 1 && V >= 4096 ? threads : 1;
    int64_t* ids = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (ids == NULL) return PyErr_NoMemory();
    Py_BEGIN_ALLOW_THREADS
    if (parts > 1) {
        ArgmaxPart found[ARGMAX_MAX_PARTS];
#pragma omp parallel for schedule(static, 1) num_threads(parts)
        for (int p = 0; p < parts; p++) found[p] = scan(s, V * p / parts, V * (p + 1) / parts);
        ArgmaxPart best = found[0];
        for (int p = 1; p < parts; p++) best = argmax_join(best, found[p]);
        ids[0] = best.index;
    } else {
#pragma omp parallel for schedule(static) num_threads(threads) if (n > 1)
        for (long long i = 0; i < n; i++) ids[i] = scan(s + i * row_stride, 0, V).index;
    }
    Py_END_ALLOW_THREADS
    PyObject* out = PyList_New((Py_ssize_t)n);
    for (long long i = 0; out != NULL && i < n; i++) {
        PyObject* id = PyLong_FromLongLong(ids[i]);
        if (id == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, id);
    }
    free(ids);
    return out;
}

#endif
