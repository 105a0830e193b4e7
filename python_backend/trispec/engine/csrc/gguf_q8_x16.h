/* Q4_K and Q6_K repacked 16 columns at a time (the integer path's fast form, gguf_q8.h).
 *
 * Why: with a 256-value block per column, every block ends in per-row work that does not multiply
 * (sub-block scales, mins, a horizontal sum), and a verify pass of 5 rows spent half its time there.
 * Repacked at load so that the 16 lanes of a vector are 16 output columns, a vpdpbusd takes four codes
 * of each column and the same four activations broadcast to every lane, sub-block scales are one
 * multiply per 16 columns and the block's float steps are per lane, never across lanes. The same
 * bytes as the file's blocks (Q4_K 3 % more: its 6-bit scales and mins unpacked).
 *
 * Per group of 16 columns (a last partial group padded with zero codes), per 256-value block:
 *   Q4_K (2368 bytes): d[16], dmin[16] (float16); sc[8][16]; mins in pairs m[2 p][c], m[2 p + 1][c]
 *     (4 x 32 bytes); then for sub-block j, quad pair p: 64 bytes, byte 4 c + i holding the codes of
 *     column c at k = 32 j + 8 p + i (low nibble) and k + 4 (high nibble).
 *   Q6_K (3360 bytes): d[16]; scales in pairs sc[2 p][c], sc[2 p + 1][c] (8 x 32 bytes, int8); then for
 *     sub-block j (16 values): 64 bytes of low nibbles for k = 16 j + i (low) and + 4 (high), 64 for
 *     + 8 and + 12, and 64 bytes whose bits 2 t, 2 t + 1 are the high bits of k = 16 j + 4 t + i.
 * Numbers, per column lane: Q4_K isum = sum_j sc_j (sum_k q x), imin = sum_j m_j bsum32_j; Q6_K
 * isum = sum_j sc_j (sum_k q x) - 32 sum_j sc_j bsum16_j (q unsigned); all exact; then per block
 * f = fma(d * d_x, (float)isum, f), g = fma(dmin * d_x, (float)imin, g), blocks in order; y = f - g. */

#define T_Q4_K_X16 1012 /* plan types of the repacked forms */
#define T_Q6_K_X16 1014
#define X16 16 /* columns per group */
#define X16_Q4K_BYTES 2368
#define X16_Q6K_BYTES 3360
#ifndef X16_PREFETCH
#define X16_PREFETCH 4096 /* bytes ahead in the weights' stream (their groups lie one after another) */
#endif

static int64_t x16_group_bytes(int type, int64_t K) {
    const int64_t blocks = K / 256;
    return type == T_Q4_K_X16 ? blocks * X16_Q4K_BYTES : type == T_Q6_K_X16 ? blocks * X16_Q6K_BYTES : 0;
}

/* the code of value k (0-255) of a Q4_K block / a Q6_K block (unsigned, 0-63) */
static inline int q4k_code(const uint8_t* b, int k) {
    const uint8_t byte = b[16 + 32 * (k / 64) + k % 32];
    return (k / 32) % 2 ? byte >> 4 : byte & 15;
}
static inline int q6k_code(const uint8_t* b, int k) {
    const int n = k / 128, l = k % 128, part = l / 32, l2 = l % 32;
    const uint8_t ql = b[64 * n + l2 + 32 * (part & 1)], qh = b[128 + 32 * n + l2];
    return (part >= 2 ? ql >> 4 : ql & 15) | ((qh >> (2 * part)) & 3) << 4;
}

/* rows [rows, K / 256 blocks] of src -> ceil(rows / 16) groups at dst */
static void x16_repack(int type, const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst) {
    const int64_t nb = K / 256, in_bytes = type == T_Q4_K_X16 ? 144 : 210;
    const int64_t out_bytes = type == T_Q4_K_X16 ? X16_Q4K_BYTES : X16_Q6K_BYTES;
    static const uint8_t zero[210];
    for (int64_t g = 0; g * X16 < rows; g++) {
        for (int64_t s = 0; s < nb; s++) {
            uint8_t* o = dst + (g * nb + s) * out_bytes;
            memset(o, 0, (size_t)out_bytes);
            for (int c = 0; c < X16; c++) {
                const int64_t row = g * X16 + c;
                const uint8_t* b = row < rows ? src + row * nb * in_bytes + s * in_bytes : zero;
                if (type == T_Q4_K_X16) {
                    uint64_t sc, mn;
                    k_codes(b, &sc, &mn);
                    memcpy(o + 2 * c, b, 2);
                    memcpy(o + 32 + 2 * c, b + 2, 2);
                    for (int j = 0; j < 8; j++) {
                        o[64 + 16 * j + c] = (uint8_t)(sc >> (8 * j));
                        o[192 + 32 * (j / 2) + 2 * c + j % 2] = (uint8_t)(mn >> (8 * j));
                    }
                    for (int j = 0; j < 8; j++)
                        for (int p = 0; p < 4; p++)
                            for (int i = 0; i < 4; i++) {
                                const int k = 32 * j + 8 * p + i;
                                o[320 + 256 * j + 64 * p + 4 * c + i] = (uint8_t)(q4k_code(b, k) | q4k_code(b, k + 4) << 4);
                            }
                } else {
                    memcpy(o + 2 * c, b + 208, 2);
                    for (int j = 0; j < 16; j++) o[32 + 32 * (j / 2) + 2 * c + j % 2] = b[192 + j];
                    for (int j = 0; j < 16; j++) {
                        uint8_t* q = o + 288 + 192 * j;
                        for (int i = 0; i < 4; i++) {
                            int v[4];
                            for (int t = 0; t < 4; t++) v[t] = q6k_code(b, 16 * j + 4 * t + i);
                            q[4 * c + i] = (uint8_t)((v[0] & 15) | (v[1] & 15) << 4);
                            q[64 + 4 * c + i] = (uint8_t)((v[2] & 15) | (v[3] & 15) << 4);
                            q[128 + 4 * c + i] = (uint8_t)((v[0] >> 4) | (v[1] >> 4) << 2 | (v[2] >> 4) << 4 | (v[3] >> 4) << 6);
                        }
                    }
                }
            }
        }
    }
}

/* repack(type, src, rows, K, dst): dst must hold packed_bytes(type, rows, K) */
static PyObject* repack(PyObject* self, PyObject* args) {
    (void)self;
    int type;
    unsigned long long src, dst;
    long long rows, K;
    if (!PyArg_ParseTuple(args, "iKLLK", &type, &src, &rows, &K, &dst)) return NULL;
    if ((type != T_Q4_K_X16 && type != T_Q6_K_X16) || K < 256 || K % 256 != 0 || rows < 1) {
        PyErr_SetString(PyExc_ValueError, "gguf repack: types 1012 (Q4_K) or 1014 (Q6_K), K a multiple of 256");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    x16_repack(type, (const uint8_t*)(uintptr_t)src, rows, K, (uint8_t*)(uintptr_t)dst);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject* packed_bytes(PyObject* self, PyObject* args) {
    (void)self;
    int type;
    long long rows, K;
    if (!PyArg_ParseTuple(args, "iLL", &type, &rows, &K)) return NULL;
    return PyLong_FromLongLong((rows + X16 - 1) / X16 * x16_group_bytes(type, K));
}
