/* hidetc.h -- the C runtime of hidetc artifacts (C11; ABI version HIDETC_ABI_VERSION).
 *
 * An artifact directory (what `hidetc compile` writes) holds this header in include/,
 * the runtime in lib/libhidetc_runtime.so and a command-line runner in bin/hidetc-run.
 * The runtime needs libc, pthreads and libdl; the cpu kernels bring libgomp; a cuda
 * artifact loads the CUDA driver library (libcuda.so.1) when it is loaded, never at
 * link time. No Python.
 *
 * Model and contexts:
 *   hidetc_model_load(dir) reads the artifact's plan (plan.bin: what to launch, in which
 *   order, with which arguments), verifies the sha256 of every file it uses, checks the
 *   machine (cpu: the ISA features the kernels use; cuda: a kernel image for the GPU),
 *   and maps the weights once. A model is immutable: any number of threads may query it
 *   and make contexts on it at once. A context holds what one pass writes (the scratch
 *   arena; on cuda a stream, I/O staging and the captured CUDA graph) and runs one pass
 *   at a time: N threads serving one model use N contexts. A second thread that runs,
 *   sets shapes, threads or the workspace on a context that is running gets
 *   HIDETC_ERR_BUSY, never a race; the queries of a context (output shape and bytes,
 *   workspace bytes) belong to the thread that uses it.
 *
 * Errors: every call returns a hidetc_status; on failure hidetc_last_error() is a
 * one-line message naming the file, input or launch (kept per thread until that
 * thread's next failing call). Nothing here aborts the process.
 *
 * Shapes: a dynamic artifact has symbolic dimensions with ranges (dims[i] == -1 in the
 * tensor info, with dim_min / dim_max). Set every input's shape on a context
 * (hidetc_context_set_input_shape) before a run; the output shapes and the workspace
 * size follow (hidetc_context_output_shape / hidetc_context_workspace_bytes). A static
 * artifact's shapes are fixed and need no call.
 *
 * cuda: GPU 0 of the process (choose with CUDA_VISIBLE_DEVICES), its primary context
 *   made current for each call and the caller's restored after. The driver is
 *   libcuda.so.1, or the library HIDETC_CUDA_DRIVER names; HIDETC_CUDA_SYNC_EACH=1 runs
 *   the launches without a graph and synchronises after each, so a faulting kernel is
 *   named. options.stream must outlive the context. With io_on_device the captured
 *   graphs are keyed by the I/O pointers too (a key is captured at its second use):
 *   reuse your device buffers to replay.
 *
 * Example (see the README's "Deploying without Python"):
 *   hidetc_model *m; hidetc_context *c;
 *   if (hidetc_model_load("out", 0, &m) != HIDETC_OK) { puts(hidetc_last_error()); ... }
 *   hidetc_context_create(m, NULL, &c);
 *   hidetc_context_run(c, inputs, outputs);      // arrays of buffer pointers
 *   hidetc_context_free(c); hidetc_model_free(m);
 */
#ifndef HIDETC_H
#define HIDETC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HIDETC_ABI_VERSION 1
#define HIDETC_MAX_RANK 16

#if defined(__GNUC__)
#define HIDETC_API __attribute__((visibility("default")))
#else
#define HIDETC_API
#endif

typedef enum hidetc_status {
    HIDETC_OK = 0,
    HIDETC_ERR_ARGUMENT = 1,   /* a bad argument: null pointer, index out of range */
    HIDETC_ERR_IO = 2,         /* a file missing or unreadable */
    HIDETC_ERR_FORMAT = 3,     /* plan.bin truncated or malformed; not an artifact */
    HIDETC_ERR_VERSION = 4,    /* the artifact needs a newer ABI or plan format */
    HIDETC_ERR_CHECKSUM = 5,   /* a file differs from what the plan recorded */
    HIDETC_ERR_MACHINE = 6,    /* this machine lacks the ISA, GPU arch or driver */
    HIDETC_ERR_SHAPE = 7,      /* an input shape outside the artifact's ranges */
    HIDETC_ERR_MEMORY = 8,     /* out of memory, or a workspace too small */
    HIDETC_ERR_BUSY = 9,       /* a context already running a pass on another thread */
    HIDETC_ERR_DEVICE = 10,    /* a CUDA driver call failed */
    HIDETC_ERR_INTERNAL = 11
} hidetc_status;

typedef enum hidetc_dtype {
    HIDETC_OTHER = 0, HIDETC_F32 = 1, HIDETC_F16 = 2, HIDETC_BF16 = 3, HIDETC_F64 = 4,
    HIDETC_I8 = 5, HIDETC_U8 = 6, HIDETC_I16 = 7, HIDETC_U16 = 8, HIDETC_I32 = 9,
    HIDETC_U32 = 10, HIDETC_I64 = 11, HIDETC_U64 = 12, HIDETC_BOOL = 13
} hidetc_dtype;

typedef struct hidetc_model hidetc_model;
typedef struct hidetc_context hidetc_context;

/* One input or output. Pointers are owned by the model and live as long as it. */
typedef struct hidetc_tensor_info {
    const char *name;
    hidetc_dtype dtype;
    const char *dtype_name;           /* numpy's name: "float32", "bfloat16", ... */
    size_t elem_bytes;
    int rank;
    int64_t dims[HIDETC_MAX_RANK];    /* -1 where the dimension is dynamic */
    int64_t dim_min[HIDETC_MAX_RANK]; /* its range over the artifact's sizes */
    int64_t dim_max[HIDETC_MAX_RANK]; /* (both == dims[i] where static) */
} hidetc_tensor_info;

/* Context options; zero-initialise and set what you need (NULL options: all defaults). */
typedef struct hidetc_context_options {
    int threads;        /* cpu: intra-op threads of each pass; 0: OMP_NUM_THREADS, else
                           the cores this process may use */
    void *stream;       /* cuda: a CUstream the passes run on; NULL: the context's own */
    int io_on_device;   /* cuda: 1 when run()'s buffers are device pointers */
} hidetc_context_options;

/* Load flags */
#define HIDETC_LOAD_SKIP_CHECKSUMS 1u   /* trust the files (still checks plan.bin's own) */

HIDETC_API int hidetc_abi_version(void);
HIDETC_API const char *hidetc_version(void);
HIDETC_API const char *hidetc_status_name(hidetc_status status);
HIDETC_API const char *hidetc_last_error(void);

HIDETC_API hidetc_status hidetc_model_load(const char *dir, unsigned flags, hidetc_model **out);
HIDETC_API void hidetc_model_free(hidetc_model *model);
HIDETC_API const char *hidetc_model_target(const hidetc_model *model);   /* "cpu" | "cuda" */
HIDETC_API int hidetc_model_num_inputs(const hidetc_model *model);
HIDETC_API int hidetc_model_num_outputs(const hidetc_model *model);
HIDETC_API hidetc_status hidetc_model_input_info(const hidetc_model *model, int index,
                                                 hidetc_tensor_info *info);
HIDETC_API hidetc_status hidetc_model_output_info(const hidetc_model *model, int index,
                                                  hidetc_tensor_info *info);
/* The size a dynamic dimension is (the name it was compiled with: `--dim batch=1..64`
 * gives "batch"), or NULL where the dimension is static, an expression of sizes
 * ("2*seq"), or the index is out of range. Owned by the model. */
HIDETC_API const char *hidetc_model_input_dim_name(const hidetc_model *model, int index,
                                                   int dim);
HIDETC_API const char *hidetc_model_output_dim_name(const hidetc_model *model, int index,
                                                    int dim);
/* The index of the input / output called `name`, or -1. */
HIDETC_API int hidetc_model_find_input(const hidetc_model *model, const char *name);
HIDETC_API int hidetc_model_find_output(const hidetc_model *model, const char *name);
/* Bytes of the weights as mapped (shared by every context). */
HIDETC_API size_t hidetc_model_weight_bytes(const hidetc_model *model);

HIDETC_API hidetc_status hidetc_context_create(hidetc_model *model,
                                               const hidetc_context_options *options,
                                               hidetc_context **out);
HIDETC_API void hidetc_context_free(hidetc_context *context);
/* Set input `index`'s shape for the next runs (dynamic artifacts; a static artifact
   accepts its own shape). HIDETC_ERR_SHAPE names the dimension and range. */
HIDETC_API hidetc_status hidetc_context_set_input_shape(hidetc_context *context, int index,
                                                        int rank, const int64_t *dims);
/* Output `index`'s shape at the shapes set; dims has room for HIDETC_MAX_RANK. */
HIDETC_API hidetc_status hidetc_context_output_shape(const hidetc_context *context, int index,
                                                     int *rank, int64_t *dims);
/* Bytes of output `index` at the shapes set. */
HIDETC_API hidetc_status hidetc_context_output_bytes(const hidetc_context *context, int index,
                                                     size_t *bytes);
/* Scratch bytes one pass needs at the shapes set (what set_workspace must provide). */
HIDETC_API hidetc_status hidetc_context_workspace_bytes(const hidetc_context *context,
                                                        size_t *bytes);
/* Use caller memory as the scratch arena (host memory on the cpu, device memory on
   cuda; 64-byte aligned, at least workspace_bytes for every shape it will run). The
   runtime zeroes it here and the kernels leave their kept-zero region so: do not write
   it between runs. NULL goes back to the context's own. */
HIDETC_API hidetc_status hidetc_context_set_workspace(hidetc_context *context, void *memory,
                                                      size_t bytes);
/* One forward pass: inputs[i] holds input i at the shape set (C-contiguous), outputs[i]
   has room for output_bytes(i). Returns when the outputs are written (cuda: on the
   context's stream, synchronised). */
HIDETC_API hidetc_status hidetc_context_run(hidetc_context *context,
                                            const void *const *inputs, void *const *outputs);
/* Intra-op threads of the next passes (cpu; 0: the default of the options). */
HIDETC_API hidetc_status hidetc_context_set_threads(hidetc_context *context, int threads);
/* Milliseconds of the context's last run (the kernels, without input checks). */
HIDETC_API double hidetc_context_last_latency_ms(const hidetc_context *context);

#ifdef __cplusplus
}
#endif
#endif /* HIDETC_H */
