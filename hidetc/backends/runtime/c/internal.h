/* internal.h -- what the runtime's translation units share (not installed).
 *
 * plan.c reads plan.bin into an hx_plan (every count and offset bounds-checked) and
 * evaluates its size expressions; runtime.c owns the public API, the model and the cpu
 * path; cuda_driver.c, cuda_model.c and cuda.c the cuda path (their own state in
 * cuda_driver.h and cuda_model.h). The plan's layout is written by
 * hidetc/backends/runtime/plan_file.py: change both together (PLAN_FORMAT).
 */
#ifndef HIDETC_INTERNAL_H
#define HIDETC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>

#include "hidetc.h"

#define HX_PLAN_FORMAT 1          /* the newest plan.bin layout this runtime reads */
#define HX_MANIFEST_FORMAT 1      /* the newest manifest format_version it reads */
#define HX_HASH_BYTES 32

/* size-expression opcodes (a program of int64 words, evaluated on a stack) */
enum { HX_OP_CONST = 1, HX_OP_SYM = 2, HX_OP_ADD = 3, HX_OP_SUB = 4, HX_OP_MUL = 5,
       HX_OP_FLOORDIV = 6, HX_OP_NEG = 7 };
/* guard comparisons: EXPR OP 0 */
enum { HX_LT = 0, HX_LE = 1, HX_GT = 2, HX_GE = 3 };
/* output sources (outputs no kernel writes) */
enum { HX_SRC_KERNEL = 0, HX_SRC_INPUT = 1, HX_SRC_OUTPUT = 2, HX_SRC_CONSTANT = 3 };
/* launch argument kinds (cuda) */
enum { HX_ARG_INPUT = 0, HX_ARG_OUTPUT = 1, HX_ARG_ARENA = 2, HX_ARG_WEIGHTS = 3,
       HX_ARG_SIZE = 4, HX_ARG_I32 = 10, HX_ARG_U32 = 11, HX_ARG_I64 = 12, HX_ARG_U64 = 13,
       HX_ARG_F32 = 14, HX_ARG_F64 = 15 };

typedef struct { uint32_t n; const int64_t *words; } hx_expr;   /* words: in the plan */

typedef struct {
    const char *name;
    const char *dtype_name;
    hidetc_dtype dtype;
    uint32_t elem_bytes;
    uint32_t rank;
    hx_expr dims[HIDETC_MAX_RANK];
    int64_t dim_min[HIDETC_MAX_RANK], dim_max[HIDETC_MAX_RANK];   /* over the ranges */
    int32_t symbol[HIDETC_MAX_RANK];   /* the symbol this dim is exactly, else -1 */
} hx_tensor;

typedef struct { hx_expr expr; uint32_t op; } hx_guard;
typedef struct { uint32_t kind; uint64_t index; uint64_t nbytes; } hx_source;
typedef struct { uint32_t kind; int64_t value; } hx_arg;   /* f32/f64: bits in value */

typedef struct {
    const char *kernel;
    uint32_t module;
    hx_expr grid[3];
    uint32_t block[3];
    uint32_t shared_bytes;
    uint32_t nargs;
    hx_arg *args;
} hx_launch;

typedef struct {
    uint32_t nguards;
    hx_guard *guards;
    const char *forward;          /* cpu: the launcher symbol in the kernel library */
    uint64_t arena_bytes;         /* what this variant's pass uses of the arena */
    int64_t zeroed_offset;        /* its kept-zero region (-1: none) */
    uint64_t zeroed_bytes;
    uint32_t nsources;            /* one per output */
    hx_source *sources;
    uint32_t nlaunches;           /* cuda */
    hx_launch *launches;
} hx_variant;

typedef struct { const char *path; uint8_t sha256[HX_HASH_BYTES]; uint64_t size; } hx_file;

typedef struct {
    const char *name;
    uint32_t ncubins;
    const char **cubin_arch;      /* "sm_90" */
    uint32_t *cubin_file;         /* index into files */
    const char *ptx_arch;         /* "compute_90" or "" */
    int32_t ptx_file;             /* -1: none */
} hx_module;

typedef struct {
    uint8_t *blob;                /* the whole plan.bin (strings point into it) */
    void **allocs;                /* every array the reader allocated (freed together) */
    size_t nallocs, cap_allocs;
    size_t blob_bytes;
    uint32_t format, abi, manifest_format;
    const char *target, *hidetc_version;
    uint32_t nflags;
    const char **cpu_flags;       /* /proc/cpuinfo flags the kernels need */
    uint32_t cores;               /* the core count compiled for (information) */
    uint32_t spin_count;          /* GOMP_SPINCOUNT where the user set no wait policy */
    uint32_t nfiles;
    hx_file *files;
    int32_t weights_file, library_file;   /* indices into files (-1: none) */
    uint32_t nsymbols;
    const char **symbols;
    int64_t *sym_min, *sym_max;
    uint32_t ninputs, noutputs;
    hx_tensor *inputs, *outputs;
    uint64_t arena_bytes;         /* the context's arena: the largest variant's */
    uint32_t nvariants;
    hx_variant *variants;
    uint32_t nmodules;
    hx_module *modules;
    uint32_t graph_cache;
} hx_plan;

/* Everything about one pass that follows from the input shapes. */
typedef struct {
    int ready;                    /* every input shape set (static: always) */
    int64_t sizes[64];            /* the symbols' values, plan order */
    uint32_t variant;
    int64_t in_dims[64][HIDETC_MAX_RANK];
    int64_t out_dims[64][HIDETC_MAX_RANK];
    size_t in_bytes[64], out_bytes[64];
} hx_pass;

#define HX_MAX_IO 64
#define HX_MAX_SYMBOLS 64

struct hx_cuda_model;
struct hx_cuda_context;

struct hidetc_model {
    char *dir;
    hx_plan plan;
    void *weights;                /* read-only map of the weights file */
    size_t weight_bytes;
    void *library;                /* cpu: dlopen handle of the kernel library */
    void (**forwards)(void **, void **, char *, char *, long long *);   /* per variant */
    void (*set_threads)(int);
    int default_threads;
    struct hx_cuda_model *cuda;
};

struct hidetc_context {
    hidetc_model *model;
    hidetc_context_options options;
    atomic_int busy;
    hx_pass pass;
    int64_t set_dims[HX_MAX_IO][HIDETC_MAX_RANK];
    int set_rank[HX_MAX_IO];
    uint8_t *own_arena;           /* cpu: 64-byte aligned, zeroed once */
    uint8_t *arena;               /* own or the caller's */
    size_t arena_bytes;
    int last_variant;             /* the variant of the last pass (-1: none yet) */
    double last_ms;
    struct hx_cuda_context *cuda;
};

/* errors (runtime.c): set the calling thread's message, return the status */
hidetc_status hx_fail(hidetc_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* sha256.c */
void hx_sha256(const void *data, size_t n, uint8_t out[HX_HASH_BYTES]);
typedef struct { uint32_t h[8]; uint64_t bytes; uint8_t buf[64]; size_t used; } hx_sha256_ctx;
void hx_sha256_init(hx_sha256_ctx *c);
void hx_sha256_update(hx_sha256_ctx *c, const void *data, size_t n);
void hx_sha256_final(hx_sha256_ctx *c, uint8_t out[HX_HASH_BYTES]);

/* plan.c */
hidetc_status hx_plan_read(const char *path, hx_plan *plan);
void hx_plan_free(hx_plan *plan);
int hx_expr_eval(const hx_expr *e, const int64_t *sizes, int64_t *out);   /* 0: ok */
/* The pass at the dims set (ranks/dims per input); fills pass or fails with a message. */
hidetc_status hx_pass_bind(const hx_plan *plan, const int *ranks,
                           const int64_t (*dims)[HIDETC_MAX_RANK], hx_pass *pass);

/* the cuda path, cuda_model.c (the model) and cuda.c (contexts, passes): all return a
   status with hx_fail's message on failure */
hidetc_status hx_cuda_model_init(hidetc_model *model);
void hx_cuda_model_free(hidetc_model *model);
hidetc_status hx_cuda_context_init(hidetc_context *context);
void hx_cuda_context_free(hidetc_context *context);
hidetc_status hx_cuda_set_workspace(hidetc_context *context, void *memory, size_t bytes);
hidetc_status hx_cuda_run(hidetc_context *context, const void *const *inputs,
                          void *const *outputs);

#endif
