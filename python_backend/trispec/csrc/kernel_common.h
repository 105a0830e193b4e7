/* What every C kernel shares (included once by each, after Python.h): bfloat16 conversions, and
 * which ISA copy of a kernel this CPU runs. */
#include <stdint.h>
#include <stdlib.h>

static inline __attribute__((always_inline)) float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)x) << 16;
    return v.f;
}

/* Round to nearest even, as torch's float -> bfloat16 conversion. */
static inline __attribute__((always_inline)) uint16_t f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    uint32_t u = v.u;
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* A buffer starting on a cache line (free() releases it): 64-byte vector loads from it never straddle
 * two lines, which costs a second load each. */
static inline void* alloc_lines(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* The highest level <= `wanted` (512, 2 or 0: AVX-512, AVX2, baseline) that this CPU runs. */
static int usable_isa(int wanted) {
    __builtin_cpu_init();
    if (wanted >= 512 && __builtin_cpu_supports("x86-64-v4")) return 512;
    if (wanted >= 2 && __builtin_cpu_supports("x86-64-v3")) return 2;
    return 0;
}

/* isa_level(wanted): the module's answer to which copy its kernel runs for `wanted`. */
static PyObject* isa_level(PyObject* self, PyObject* args) {
    (void)self;
    int wanted;
    if (!PyArg_ParseTuple(args, "i", &wanted)) return NULL;
    return PyLong_FromLong(usable_isa(wanted));
}
