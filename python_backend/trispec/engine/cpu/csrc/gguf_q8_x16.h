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
 * and per 32-value block (the draft's types): d[16]; Q4_0 / Q5_0: 4 x 64 bytes of nibbles, byte 4 c + i
 *   of quad pair p holding k = 8 p + i (low) and + 4 (high); Q5_0 then 64 bytes, bit t of byte 4 c + i
 *   the fifth bit of k = 4 t + i; Q8_0: 8 x 64 bytes, byte 4 c + i of quad t holding w + 128 at
 *   k = 4 t + i (288, 352 and 544 bytes). Their lanes: sum_k q x - z bsum32 (z = 8, 16, 128), then
 *   f = fma(d * d_x, (float)lane, f) per block, in order.
 * Numbers, per column lane: Q4_K isum = sum_j sc_j (sum_k q x), imin = sum_j m_j bsum32_j; Q6_K
 * isum = sum_j sc_j (sum_k q x) - 32 sum_j sc_j bsum16_j (q unsigned); all exact; then per block
 * f = fma(d * d_x, (float)isum, f), g = fma(dmin * d_x, (float)imin, g), blocks in order; y = f - g. */

#define T_Q4_K_X16 1012 /* plan types of the repacked forms: 1000 + the ggml type */
#define T_Q6_K_X16 1014
#define T_Q4_0_X16 1002
#define T_Q5_0_X16 1006
#define T_Q8_0_X16 1008
#define X16 16 /* columns per group */
#define X16_Q4K_BYTES 2368
#define X16_Q6K_BYTES 3360
/* bytes ahead in the weights' stream that the kernels prefetch (a layer's groups lie one after
 * another), and bytes of a thread's next share that the layer stack prefetches when it ends one (the
 * stream's first lines would otherwise wait the memory's latency each): variables, so that a bench
 * can tune them by measurement in one process (prefetch()) */
static int64_t x16_prefetch = 4096;
static int64_t stack_lead = 0;
#define X16_PREFETCH x16_prefetch

/* bytes of one group of 16 columns of width K (0: not a repacked type) */
static int64_t x16_group_bytes(int type, int64_t K) {
    switch (type) {
        case T_Q4_K_X16: return K / 256 * X16_Q4K_BYTES;
        case T_Q6_K_X16: return K / 256 * X16_Q6K_BYTES;
        case T_Q4_0_X16: return K / 32 * 288;
        case T_Q5_0_X16: return K / 32 * 352;
        case T_Q8_0_X16: return K / 32 * 544;
        default: return 0;
    }
}
static int x16_block_values(int type) { return type == T_Q4_K_X16 || type == T_Q6_K_X16 ? 256 : 32; }

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

/* a legacy block's code of value v (0-31): Q4_0 / Q5_0 unsigned (0-15 / 0-31), Q8_0 as w + 128 */
static inline int legacy_code(int type, const uint8_t* b, int v) {
    if (type == T_Q8_0_X16) return (uint8_t)(b[2 + v] ^ 0x80);
    const uint8_t* qs = b + (type == T_Q5_0_X16 ? 6 : 2);
    int code = v < 16 ? qs[v] & 15 : qs[v - 16] >> 4;
    if (type == T_Q5_0_X16) code |= (int)((u16_at(b + 2) | (uint32_t)u16_at(b + 4) << 16) >> v & 1) << 4;
    return code;
}

static void x16_repack_legacy(int type, const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst) {
    const int64_t nb = K / 32, in_bytes = type == T_Q8_0_X16 ? 34 : type == T_Q4_0_X16 ? 18 : 22;
    const int64_t out_bytes = x16_group_bytes(type, 32);
    static const uint8_t zero[34];
    for (int64_t g = 0; g * X16 < rows; g++)
        for (int64_t s = 0; s < nb; s++) {
            uint8_t* o = dst + (g * nb + s) * out_bytes;
            memset(o, 0, (size_t)out_bytes);
            for (int c = 0; c < X16; c++) {
                const int64_t row = g * X16 + c;
                const uint8_t* b = row < rows ? src + row * nb * in_bytes + s * in_bytes : zero;
                memcpy(o + 2 * c, b, 2);
                for (int t = 0; t < 8; t++)
                    for (int i = 0; i < 4; i++) {
                        const int code = legacy_code(type, b, 4 * t + i);
                        if (type == T_Q8_0_X16) {
                            o[32 + 64 * t + 4 * c + i] = (uint8_t)(row < rows ? code : 0x80);
                            continue;
                        }
                        o[32 + 64 * (t / 2) + 4 * c + i] |= (uint8_t)((code & 15) << (4 * (t % 2)));
                        if (type == T_Q5_0_X16) o[288 + 4 * c + i] |= (uint8_t)((code >> 4) << t);
                    }
            }
        }
}

/* rows [rows, K / 256 blocks] of src -> ceil(rows / 16) groups at dst */
static void x16_repack(int type, const uint8_t* src, int64_t rows, int64_t K, uint8_t* dst) {
    if (x16_block_values(type) == 32) {
        x16_repack_legacy(type, src, rows, K, dst);
        return;
    }
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
    if (x16_group_bytes(type, K) == 0 || K % x16_block_values(type) != 0 || K % Q8_CHUNK != 0 || rows < 1) {
        PyErr_SetString(PyExc_ValueError, "gguf repack: type 1000 + Q4_0/Q5_0/Q8_0/Q4_K/Q6_K, K whole blocks and chunks");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    x16_repack(type, (const uint8_t*)(uintptr_t)src, rows, K, (uint8_t*)(uintptr_t)dst);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* prefetch(distance, lead): the prefetch distance and the stack's lead; < 0 leaves one. Returns the
 * previous pair. */
static PyObject* prefetch(PyObject* self, PyObject* args) {
    (void)self;
    long long distance, lead;
    if (!PyArg_ParseTuple(args, "LL", &distance, &lead)) return NULL;
    PyObject* previous = Py_BuildValue("(LL)", (long long)x16_prefetch, (long long)stack_lead);
    if (distance >= 0) x16_prefetch = distance;
    if (lead >= 0) stack_lead = lead;
    return previous;
}

static PyObject* packed_bytes(PyObject* self, PyObject* args) {
    (void)self;
    int type;
    long long rows, K;
    if (!PyArg_ParseTuple(args, "iLL", &type, &rows, &K)) return NULL;
    return PyLong_FromLongLong((rows + X16 - 1) / X16 * x16_group_bytes(type, K));
}
