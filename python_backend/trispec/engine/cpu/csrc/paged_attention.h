/* The paged attention kernel as other kernels call it (the GGUF layer stack, gguf_stack.h): its
 * arguments, and the functions its module exports in a PyCapsule (module attribute `api`), so that a
 * layer stack runs the very code attend() runs, inside its own threads. */
#ifndef TRISPEC_PAGED_ATTENTION_H
#define TRISPEC_PAGED_ATTENTION_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const void* q;       /* rows of q_row_stride elements; head h of row t at t*q_row_stride + h*D */
    const void* k;       /* [KV, S, D] one layer of the cache */
    const void* v;
    void* out;           /* [T, H, D] contiguous */
    const int32_t* tables;    /* block tables, concatenated */
    const int64_t* row_table; /* [T] offset of the row's block table in `tables` */
    const int32_t* row_len;   /* [T] number of keys the row attends to (its position + 1) */
    int64_t q_row_stride, S;
    int T, H, KV, D, block_size, is_bf16;
    float scale;
} PagedArgs;

typedef struct {
    /* the bytes of one thread's work buffer for a call (a multiple of 64) */
    size_t (*work_bytes)(const PagedArgs* a);
    /* the work items of a call: chunks of rows (starts: T + 1 ints, filled) times the KV heads;
     * returns the chunk count */
    int (*chunks)(const PagedArgs* a, int* starts);
    /* item w (chunk w / KV, head w % KV) with the ISA copy `isa` (512, 2 or 0, already usable) */
    void (*item)(const PagedArgs* a, int isa, const int* starts, int64_t w, float* work);
} PagedAttentionApi;

#define PAGED_ATTENTION_API "trispec.engine.cpu._paged_attention.api"
#endif
