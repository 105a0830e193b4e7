/*
 * Every decoder layer of a model on the integer path in one call (module function `layers`, included
 * by gguf_linear.c after gguf_q8.h): per layer RMSNorm + q|k|v (+ bias), RoPE, the two cache writes,
 * paged attention, o + residual, RMSNorm + gate|up, silu(gate) * up, down + residual.
 *
 * Why: a decode step of a 1.5B model is ~110 linear layers of 30-400 us each. Called from Python one
 * op at a time, the ~8 ops between them (RoPE, cache writes, the attention call, SiLU, allocations)
 * and a thread team started and joined per call cost 4-6 ms a token, a sixth of it, with the memory
 * idle meanwhile. Here one team of threads runs the whole stack: the phases of a layer are separated
 * by barriers, and each phase's work is split among the threads so that neither waits long:
 *   linear layers: columns split by the bytes they read (a Q6_K column costs 1.5 Q4_K ones);
 *   a layer's input: its Q8 blocks (rows x 256 values) split, each thread norming the rows it touches;
 *   RoPE and the cache writes: rows x heads; attention: the paged kernel's own items (chunks of rows x
 *   KV heads), taken dynamically.
 * The same numbers as layer by layer through the same kernels, whatever the split: each output of a
 * linear layer, each Q8 block, each rotated head and each attention row is computed by one thread with
 * the same code (gguf_stack_isa.h, the paged kernel's attend_item), so rows never depend on the other
 * rows of the call, the thread count or the Q8 copy (batch invariance).
 */

/* one linear layer of the stack: its parts (as qlinear's plan) and sizes */
typedef struct {
    int nparts;
    QPart parts[Q8_MAX_PARTS];
    int64_t N, K;
    int64_t split[65]; /* thread t's columns: [split[t], split[t + 1]) (up to 64 threads) */
} StackLinear;

typedef struct {
    const float* attn_norm;
    const float* mlp_norm;
    StackLinear lin[4]; /* qkv, o, gate_up, down */
} StackLayer;

typedef struct {
    int nlayers, threads, isa, attn_isa;
    int64_t T, hidden, H, KV, D, inter, S, layer_stride;
    float eps;
    float* x; /* [T, hidden]: the residual stream, in place */
    const float *cos, *sin; /* [rope_rows, D]: row p is position p's (a row's position: its row_len - 1) */
    int64_t rope_rows;
    const int64_t* slots; /* [T] */
    float *k_base, *v_base; /* layer l's cache: base + l * layer_stride, [KV, S, D] */
    PagedArgs attn; /* k, v set per layer */
    const PagedAttentionApi* api;
    const int* starts;
    int64_t items;
    size_t work_bytes;
    float *qkv, *att, *gu; /* [T, (H + 2 KV) D], [T, H D], [T, 2 inter] */
    Q8Block* xq; /* [T, blocks of the widest input] */
    uint8_t* work; /* threads x work_bytes: each thread's attention buffer */
    StackLayer* layers;
} Stack;

/* bytes a part's columns [lo, hi) read (its rows' blocks; a repacked part in whole groups) */
static int64_t part_bytes(const QPart* p, int64_t lo, int64_t hi) {
    if (x16_group_bytes(p->type, Q8_BLOCK) > 0) return ((hi + X16 - 1) / X16 - lo / X16) * p->row_bytes;
    return (hi - lo) * p->row_bytes;
}

/* the threads' column ranges of a linear layer: as equal in bytes as whole units allow (a group of 16
 * columns in a repacked part, a column otherwise), so that both threads stream until the end */
static void split_columns(StackLinear* l, int threads) {
    int64_t total = 0;
    for (int i = 0; i < l->nparts; i++) total += part_bytes(&l->parts[i], 0, l->parts[i].rows);
    l->split[0] = 0;
    for (int t = 1; t < threads; t++) {
        const int64_t want = total * t / threads;
        int64_t before = 0, column = l->N;
        for (int i = 0; i < l->nparts; i++) {
            const QPart* p = &l->parts[i];
            const int64_t bytes = part_bytes(p, 0, p->rows);
            if (before + bytes <= want) {
                before += bytes;
                continue;
            }
            const int64_t unit = x16_group_bytes(p->type, Q8_BLOCK) > 0 ? X16 : 1;
            const int64_t units = (want - before + p->row_bytes / 2) / p->row_bytes; /* nearest */
            const int64_t c = units * unit < p->rows ? units * unit : p->rows;
            column = p->first + c;
            break;
        }
        l->split[t] = column < l->split[t - 1] ? l->split[t - 1] : column;
    }
    l->split[threads] = l->N;
}

static void stack_linear_args(const Stack* s, const StackLinear* l, float* out, int64_t ldo, int accumulate,
                              QArgs* a) {
    memset(a, 0, sizeof *a);
    a->out = out;
    a->M = s->T;
    a->K = l->K;
    a->N = l->N;
    a->ldo = ldo;
    a->nblk = (l->K + Q8_BLOCK - 1) / Q8_BLOCK;
    a->accumulate = accumulate;
    a->xq = s->xq;
    a->nparts = l->nparts;
    memcpy(a->parts, l->parts, sizeof(QPart) * (size_t)l->nparts);
}

/* this thread's share of a linear layer (xq already holds its input); a team smaller than asked for
 * (OpenMP may give fewer threads) splits the columns evenly instead */
static void stack_columns(const Stack* s, const StackLinear* l, float* out, int64_t ldo, int accumulate, int t,
                          int n) {
    const int64_t begin = n == s->threads ? l->split[t] : l->N * t / n;
    const int64_t end = n == s->threads ? l->split[t + 1] : l->N * (t + 1) / n;
    if (begin >= end) return;
    QArgs a;
    stack_linear_args(s, l, out, ldo, accumulate, &a);
    if (s->isa == 512)
        q8_columns_avx512(&a, begin, end);
    else if (s->isa == 256)
        q8_columns_avxvnni(&a, begin, end);
    else
        q8_columns_avx2(&a, begin, end);
}

/* the first stack_lead bytes of this thread's share of a linear layer, towards L2 */
static void stack_lead_in(const Stack* s, const StackLinear* l, int t, int n) {
    if (stack_lead <= 0 || n != s->threads || l->split[t] >= l->split[t + 1]) return;
    const int64_t begin = l->split[t];
    for (int i = 0; i < l->nparts; i++) {
        const QPart* p = &l->parts[i];
        if (begin >= p->first + p->rows) continue;
        const int64_t unit = x16_group_bytes(p->type, Q8_BLOCK) > 0 ? X16 : 1;
        const uint8_t* w = p->w + (begin - p->first) / unit * p->row_bytes;
        const int64_t left = (p->rows - (begin - p->first) + unit - 1) / unit * p->row_bytes;
        const int64_t bytes = stack_lead < left ? stack_lead : left;
        for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch((const char*)(w + off), _MM_HINT_T1);
        return;
    }
}

/* this thread's share of the blocks of a linear layer's input (see prep_items) */
static void stack_prep(const Stack* s, const float* x, int64_t ldx, const float* norm, int silu, int64_t K, int t,
                       int n) {
    const int64_t nblk = (K + Q8_BLOCK - 1) / Q8_BLOCK, items = s->T * nblk;
    const int64_t i0 = items * t / n, i1 = items * (t + 1) / n;
    if (s->isa == 512)
        q8_prep_items_avx512(x, ldx, norm, s->eps, silu, K, nblk, i0, i1, s->xq);
    else if (s->isa == 256)
        q8_prep_items_avxvnni(x, ldx, norm, s->eps, silu, K, nblk, i0, i1, s->xq);
    else
        q8_prep_items_avx2(x, ldx, norm, s->eps, silu, K, nblk, i0, i1, s->xq);
}

static void stack_rope(const Stack* s, int layer, int t, int n) {
    const int64_t items = s->T * (s->H + 2 * s->KV), i0 = items * t / n, i1 = items * (t + 1) / n;
    float* kc = s->k_base + layer * s->layer_stride;
    float* vc = s->v_base + layer * s->layer_stride;
    const int64_t ldq = (s->H + 2 * s->KV) * s->D;
    if (s->isa == 512)
        q8_rope_items_avx512(s->qkv, ldq, s->cos, s->sin, s->attn.row_len, s->slots, kc, vc, s->S, s->H, s->KV, s->D, i0, i1);
    else if (s->isa == 256)
        q8_rope_items_avxvnni(s->qkv, ldq, s->cos, s->sin, s->attn.row_len, s->slots, kc, vc, s->S, s->H, s->KV, s->D, i0, i1);
    else
        q8_rope_items_avx2(s->qkv, ldq, s->cos, s->sin, s->attn.row_len, s->slots, kc, vc, s->S, s->H, s->KV, s->D, i0, i1);
}

static void stack_run(Stack* s) {
#pragma omp parallel num_threads(s->threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        float* work = (float*)(s->work + (size_t)t * s->work_bytes);
        const int64_t hidden = s->hidden, nqkv = (s->H + 2 * s->KV) * s->D, hd = s->H * s->D;
        for (int l = 0; l < s->nlayers; l++) {
            const StackLayer* L = &s->layers[l];
            stack_prep(s, s->x, hidden, L->attn_norm, 0, hidden, t, n);
#pragma omp barrier
            stack_columns(s, &L->lin[0], s->qkv, nqkv, 0, t, n);
            stack_lead_in(s, &L->lin[1], t, n);
#pragma omp barrier
            stack_rope(s, l, t, n);
#pragma omp barrier
            PagedArgs pa = s->attn;
            pa.k = s->k_base + l * s->layer_stride;
            pa.v = s->v_base + l * s->layer_stride;
#pragma omp for schedule(dynamic, 1)
            for (int64_t w = 0; w < s->items; w++) s->api->item(&pa, s->attn_isa, s->starts, w, work);
            /* the for's own barrier: the attention rows are complete */
            stack_prep(s, s->att, hd, NULL, 0, hd, t, n);
#pragma omp barrier
            stack_columns(s, &L->lin[1], s->x, hidden, 1, t, n);
            stack_lead_in(s, &L->lin[2], t, n);
#pragma omp barrier
            stack_prep(s, s->x, hidden, L->mlp_norm, 0, hidden, t, n);
#pragma omp barrier
            stack_columns(s, &L->lin[2], s->gu, 2 * s->inter, 0, t, n);
            stack_lead_in(s, &L->lin[3], t, n);
#pragma omp barrier
            stack_prep(s, s->gu, 2 * s->inter, NULL, 1, s->inter, t, n);
#pragma omp barrier
            stack_columns(s, &L->lin[3], s->x, hidden, 1, t, n);
            if (l + 1 < s->nlayers) stack_lead_in(s, &s->layers[l + 1].lin[0], t, n);
#pragma omp barrier
        }
    }
}

static const PagedAttentionApi* stack_attention_api(void) {
    static const PagedAttentionApi* api = NULL;
    if (api == NULL) api = (const PagedAttentionApi*)PyCapsule_Import(PAGED_ATTENTION_API, 0);
    return api;
}

/* one linear layer of a layer record: its parts from the plan, checked against its shape */
static int stack_read_linear(StackLinear* l, const int64_t* spec, int64_t nparts, int64_t K, int64_t N) {
    if (nparts < 1 || nparts > Q8_MAX_PARTS) return 0;
    int64_t first = 0;
    for (int64_t i = 0; i < nparts; i++) {
        const int64_t* p = spec + 5 * i;
        const Format* f = format_of((int)p[0]);
        const int64_t row_bytes = f != NULL ? K / f->elements * f->bytes : x16_group_bytes((int)p[0], K);
        if (!q8_takes((int)p[0], K) || p[2] < 1 || p[3] != row_bytes) return 0;
        l->parts[i] = (QPart){(int)p[0], (const uint8_t*)(uintptr_t)p[1], (const float*)(uintptr_t)p[4], p[2], p[3], first};
        first += p[2];
    }
    l->nparts = (int)nparts;
    l->N = first;
    l->K = K;
    return first == N;
}

/* the workspace's parts, each on a cache line: where they go, and the bytes in all */
typedef struct {
    size_t layers, starts, qkv, att, gu, xq, work, total;
} StackSpace;

static size_t lines(size_t bytes) { return (bytes + 63) / 64 * 64; }

static StackSpace stack_space(const Stack* s, int64_t T, int threads) {
    const int64_t nqkv = (s->H + 2 * s->KV) * s->D, hd = s->H * s->D;
    int64_t widest = s->hidden > hd ? s->hidden : hd;
    widest = s->inter > widest ? s->inter : widest;
    StackSpace p;
    p.layers = 0;
    p.starts = p.layers + lines(sizeof(StackLayer) * (size_t)s->nlayers);
    p.qkv = p.starts + lines(sizeof(int) * (size_t)(T + 1));
    p.att = p.qkv + lines(sizeof(float) * (size_t)(T * nqkv));
    p.gu = p.att + lines(sizeof(float) * (size_t)(T * hd));
    p.xq = p.gu + lines(sizeof(float) * (size_t)(T * 2 * s->inter));
    p.work = p.xq + lines(sizeof(Q8Block) * (size_t)(T * ((widest + Q8_BLOCK - 1) / Q8_BLOCK)));
    p.total = p.work + (size_t)threads * s->work_bytes;
    return p;
}

/* layers(plan, x, T, k_base, v_base, S, cos, sin, rope_rows, slots, tables, row_table, row_len,
 *        block_size, threads, isa, attn_isa, workspace, workspace_bytes) -> 0, or the bytes the
 *        workspace must have (then nothing was computed)
 * cos / sin: the model's whole RoPE tables [rope_rows, D]; a row's position is its row_len - 1 (it
 * attends to the keys up to its own), so no per-step gather of table rows is needed.
 * plan: int64 [layers, hidden, H, KV, D, inter], float64 [eps, scale], then per layer int64
 * [attn_norm, mlp_norm, parts of qkv, o, gate_up, down] and those parts (5 int64 each, qlinear's).
 * The workspace (64-byte aligned) holds every buffer of the call: a step allocates nothing. */
static PyObject* layers(PyObject* self, PyObject* args) {
    (void)self;
    Py_buffer plan;
    unsigned long long x, k_base, v_base, cos, sin, slots, tables, row_table, row_len, workspace;
    long long T, S, rope_rows, workspace_bytes;
    int block_size, threads, isa, attn_isa;
    if (!PyArg_ParseTuple(args, "y*KLKKLKKLKKKKiiiiKL", &plan, &x, &T, &k_base, &v_base, &S, &cos, &sin, &rope_rows,
                          &slots, &tables, &row_table, &row_len, &block_size, &threads, &isa, &attn_isa,
                          &workspace, &workspace_bytes))
        return NULL;
    const PagedAttentionApi* api = stack_attention_api();
    if (api == NULL) {
        PyBuffer_Release(&plan);
        return NULL;
    }
    Stack s;
    memset(&s, 0, sizeof s);
    const int64_t* head = (const int64_t*)plan.buf;
    const int64_t words = plan.len / 8;
    int bad = plan.len % 8 != 0 || words < 8 || workspace % 64 != 0;
    double eps = 0, scale = 0;
    if (!bad) {
        s.nlayers = (int)head[0];
        s.hidden = head[1], s.H = head[2], s.KV = head[3], s.D = head[4], s.inter = head[5];
        memcpy(&eps, head + 6, 8);
        memcpy(&scale, head + 7, 8);
        bad = s.nlayers < 1 || s.hidden < 1 || s.KV < 1 || s.H % s.KV != 0 || s.H / s.KV > 64 || s.D < 2 ||
              s.D % 16 != 0 || s.D > STACK_MAX_HEAD_DIM || s.inter < 1 || T < 1 || S < 1 || block_size < 1;
    }
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    s.attn = (PagedArgs){NULL, NULL, NULL, NULL, (const int32_t*)(uintptr_t)tables, (const int64_t*)(uintptr_t)row_table,
                         (const int32_t*)(uintptr_t)row_len, (s.H + 2 * s.KV) * s.D, S, (int)T, (int)s.H, (int)s.KV,
                         (int)s.D, block_size, 0, (float)scale};
    s.slots = (const int64_t*)(uintptr_t)slots;
    for (int64_t r = 0; !bad && r < T; r++)
        bad = s.attn.row_len[r] < 1 || s.attn.row_len[r] > rope_rows || s.slots[r] < 0 || s.slots[r] >= S;
    StackSpace space = {0};
    if (!bad) {
        s.work_bytes = api->work_bytes(&s.attn);
        space = stack_space(&s, T, threads);
        if (space.total > (size_t)workspace_bytes) {
            PyBuffer_Release(&plan);
            return PyLong_FromSize_t(space.total);
        }
        s.layers = (StackLayer*)(uintptr_t)(workspace + space.layers);
    }
    int64_t at = 8;
    const int64_t ins[4] = {s.hidden, s.H * s.D, s.hidden, s.inter};
    const int64_t outs[4] = {(s.H + 2 * s.KV) * s.D, s.hidden, 2 * s.inter, s.hidden};
    for (int l = 0; !bad && l < s.nlayers; l++) {
        if (at + 6 > words) {
            bad = 1;
            break;
        }
        StackLayer* L = &s.layers[l];
        L->attn_norm = (const float*)(uintptr_t)head[at];
        L->mlp_norm = (const float*)(uintptr_t)head[at + 1];
        const int64_t* counts = head + at + 2;
        at += 6;
        for (int j = 0; !bad && j < 4; j++) {
            bad = counts[j] < 1 || at + 5 * counts[j] > words ||
                  !stack_read_linear(&L->lin[j], head + at, counts[j], ins[j], outs[j]);
            if (!bad) split_columns(&L->lin[j], threads);
            at += 5 * counts[j];
        }
        bad = bad || L->attn_norm == NULL || L->mlp_norm == NULL;
    }
    PyBuffer_Release(&plan);
    if (bad || at != words) {
        PyErr_SetString(PyExc_ValueError, "gguf layers: bad plan, shape or rows (a row attending to no key, a position past the RoPE tables, a slot outside the cache)");
        return NULL;
    }
    const int level = q8_usable(isa);
    if (level == 0) {
        PyErr_SetString(PyExc_RuntimeError, "gguf layers: needs AVX2");
        return NULL;
    }
    uint8_t* ws = (uint8_t*)(uintptr_t)workspace;
    s.threads = threads, s.isa = level, s.attn_isa = usable_isa(attn_isa);
    s.T = T, s.S = S, s.eps = (float)eps, s.layer_stride = s.KV * S * s.D;
    s.x = (float*)(uintptr_t)x;
    s.cos = (const float*)(uintptr_t)cos, s.sin = (const float*)(uintptr_t)sin, s.rope_rows = rope_rows;
    s.k_base = (float*)(uintptr_t)k_base, s.v_base = (float*)(uintptr_t)v_base;
    s.api = api;
    int* starts = (int*)(ws + space.starts);
    s.qkv = (float*)(ws + space.qkv);
    s.att = (float*)(ws + space.att);
    s.gu = (float*)(ws + space.gu);
    s.xq = (Q8Block*)(ws + space.xq);
    s.work = ws + space.work;
    s.attn.q = s.qkv;
    s.attn.out = s.att;
    s.items = (int64_t)api->chunks(&s.attn, starts) * s.KV;
    s.starts = starts;
    Py_BEGIN_ALLOW_THREADS
    stack_run(&s);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(0);
}
