/* cuda.c -- the cuda path of the C runtime, as the Python cuda runtime
 * (hidetc/backends/runtime/cuda/: executor.py, context.py, manifest.py) does it.
 *
 * The driver: loaded at model load with dlopen -- the library named by the environment
 * variable HIDETC_CUDA_DRIVER if set (the tests' fake driver), else libcuda.so.1 -- and
 * every entry point found with dlsym (the _v2 names the driver exports for the current
 * ABI). Each model holds its own table (so a process may load models against different
 * drivers, as the tests do); the handle is never dlclose'd (unloading libcuda under a
 * live process is not something its users do). cuda.h is not included: the few types and
 * values used are copied below from CUDA 13.0's cuda.h (they are part of the driver's
 * stable ABI).
 *
 * Model (immutable after hx_cuda_model_init, shared by every context and thread): GPU 0
 * (CUDA_VISIBLE_DEVICES selects) and its primary context (retained; made current on the
 * calling thread by every entry point and the thread's previous context restored on
 * return, so any thread may use any context); one image per module chosen for the GPU's
 * compute capability as manifest.select_image does (its exact cubin, else the newest
 * cubin of the same major and no newer minor, else the PTX when its virtual arch is not
 * newer; below sm_80 or with none of these: HIDETC_ERR_MACHINE); the functions of every
 * launch of every variant, each checked against its block size
 * (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) and given once the largest dynamic shared
 * memory its launches use where that is over 48 KiB; every launch argument checked
 * against the plan (HIDETC_ERR_FORMAT); the weights uploaded once.
 *
 * Context: a non-blocking stream of its own (the passes run on options.stream instead
 * when given; setup work always runs on the own stream), two timing events, the arena
 * (plan.arena_bytes of device memory, zeroed once; or the caller's, see
 * hx_cuda_set_workspace) and, when options.io_on_device == 0, one device allocation
 * holding every input and output at its largest shape (the dims' max) at 256-byte
 * aligned offsets, so the addresses baked into a graph never change.
 *
 * A pass (hx_cuda_run; the pass's variant and sizes are in context->pass):
 *   io_on_device == 0: the host inputs copied into the context's device input buffers,
 *     the forward pass, the kernel-written outputs copied back, the stream synchronised,
 *     then the outputs no kernel writes (variant sources) filled on the host.
 *   io_on_device == 1: the caller's device pointers are the kernels' arguments; sourced
 *     outputs are device-to-device copies after the kernels; the stream synchronised.
 *   The forward pass is a CUDA graph replayed, captured (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL:
 *   captures on other threads do not interfere) from the launches at the pass's sizes.
 *   Graphs live in a least-recently-used cache of plan.graph_cache entries per context
 *   keyed by (variant, sizes) -- and, with io_on_device, by the input and output
 *   pointers too, because they are baked into the graph's kernel parameters. With host
 *   I/O a key is captured on its first pass; with io_on_device on its second (the first
 *   launches plainly), so a caller that passes fresh pointers on every run never pays a
 *   capture per run while one that reuses its buffers replays a graph from the second
 *   pass on. Where capture itself fails (cuStreamBeginCapture / EndCapture /
 *   GraphInstantiate) the context launches plainly from then on, as the Python runtime.
 *   Kernel arguments are packed like a C struct (natural alignment, pointers 64-bit: the
 *   kernel-parameter ABI) and passed through cuLaunchKernel's `extra`
 *   (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE), as pycuda's prepared launches do. A launch
 *   whose grid has a 0 dimension at the pass's sizes is skipped. When the pass's variant
 *   differs from the last pass's, its kept-zero region is zeroed first (runtime.c's
 *   rule for the cpu arena: each variant lays its arena out its own way).
 *   HIDETC_CUDA_SYNC_EACH=1 (debugging): no graphs, and a synchronize after every launch,
 *   so a faulting kernel is named (launch index and kernel).
 *
 * Errors (one line via hx_fail): no driver library, a driver without an entry point, no
 * GPU, no image for the GPU's arch, a kernel whose block or shared memory the GPU cannot
 * run -> HIDETC_ERR_MACHINE; out of device memory -> HIDETC_ERR_MEMORY (bytes asked and
 * free); any other failing driver call -> HIDETC_ERR_DEVICE naming the call and its
 * error (cuGetErrorName), for launches the launch index, kernel, grid and block. A kernel
 * fault is sticky in CUDA (the process's context is unusable afterwards): the message
 * says so.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------ from cuda.h (13.0) */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;      /* CUdeviceptr_v2 on 64-bit hosts */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_ASSERT = 710,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_LAUNCH_FAILED = 719,
};
enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
       CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76 };
enum { CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
       CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };
enum { CU_STREAM_NON_BLOCKING = 1 };
enum { CU_EVENT_DEFAULT = 0 };
enum { CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1 };
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

/* ------------------------------------------------------------------ the driver table */

typedef struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncGetAttribute)(int *, int, CUfunction);
    CUresult (*FuncSetAttribute)(CUfunction, int, int);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamBeginCapture)(CUstream, int);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, unsigned int, CUstream,
                             void **, void **);
    CUresult (*GetErrorName)(CUresult, const char **);
} hx_cu;

/* symbol, older symbol with the same signature (NULL: none), slot */
static const struct { const char *name, *fallback; size_t slot; } CU_SYMBOLS[] = {
    {"cuInit", NULL, offsetof(hx_cu, Init)},
    {"cuDeviceGetCount", NULL, offsetof(hx_cu, DeviceGetCount)},
    {"cuDeviceGet", NULL, offsetof(hx_cu, DeviceGet)},
    {"cuDeviceGetAttribute", NULL, offsetof(hx_cu, DeviceGetAttribute)},
    {"cuDeviceGetName", NULL, offsetof(hx_cu, DeviceGetName)},
    {"cuDevicePrimaryCtxRetain", NULL, offsetof(hx_cu, DevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease_v2", NULL, offsetof(hx_cu, DevicePrimaryCtxRelease)},
    {"cuCtxGetCurrent", NULL, offsetof(hx_cu, CtxGetCurrent)},
    {"cuCtxSetCurrent", NULL, offsetof(hx_cu, CtxSetCurrent)},
    {"cuModuleLoadData", NULL, offsetof(hx_cu, ModuleLoadData)},
    {"cuModuleUnload", NULL, offsetof(hx_cu, ModuleUnload)},
    {"cuModuleGetFunction", NULL, offsetof(hx_cu, ModuleGetFunction)},
    {"cuFuncGetAttribute", NULL, offsetof(hx_cu, FuncGetAttribute)},
    {"cuFuncSetAttribute", NULL, offsetof(hx_cu, FuncSetAttribute)},
    {"cuMemAlloc_v2", NULL, offsetof(hx_cu, MemAlloc)},
    {"cuMemFree_v2", NULL, offsetof(hx_cu, MemFree)},
    {"cuMemGetInfo_v2", NULL, offsetof(hx_cu, MemGetInfo)},
    {"cuMemcpyHtoDAsync_v2", NULL, offsetof(hx_cu, MemcpyHtoDAsync)},
    {"cuMemcpyDtoHAsync_v2", NULL, offsetof(hx_cu, MemcpyDtoHAsync)},
    {"cuMemcpyDtoDAsync_v2", NULL, offsetof(hx_cu, MemcpyDtoDAsync)},
    {"cuMemsetD8Async", NULL, offsetof(hx_cu, MemsetD8Async)},
    {"cuStreamCreate", NULL, offsetof(hx_cu, StreamCreate)},
    {"cuStreamDestroy_v2", NULL, offsetof(hx_cu, StreamDestroy)},
    {"cuStreamSynchronize", NULL, offsetof(hx_cu, StreamSynchronize)},
    {"cuStreamBeginCapture_v2", NULL, offsetof(hx_cu, StreamBeginCapture)},
    {"cuStreamEndCapture", NULL, offsetof(hx_cu, StreamEndCapture)},
    {"cuGraphInstantiateWithFlags", NULL, offsetof(hx_cu, GraphInstantiateWithFlags)},
    {"cuGraphLaunch", NULL, offsetof(hx_cu, GraphLaunch)},
    {"cuGraphExecDestroy", NULL, offsetof(hx_cu, GraphExecDestroy)},
    {"cuGraphDestroy", NULL, offsetof(hx_cu, GraphDestroy)},
    {"cuEventCreate", NULL, offsetof(hx_cu, EventCreate)},
    {"cuEventRecord", NULL, offsetof(hx_cu, EventRecord)},
    /* _v2 since CUDA 12.8 (cuda.h maps the name to it); older drivers export the first */
    {"cuEventElapsedTime_v2", "cuEventElapsedTime", offsetof(hx_cu, EventElapsedTime)},
    {"cuEventDestroy_v2", NULL, offsetof(hx_cu, EventDestroy)},
    {"cuLaunchKernel", NULL, offsetof(hx_cu, LaunchKernel)},
    {"cuGetErrorName", NULL, offsetof(hx_cu, GetErrorName)},
};

#define HX_ALIGN 256                      /* bytes: every staged buffer's offset */
#define HX_DEFAULT_SHARED (48 * 1024)     /* dynamic shared memory without opting in */
static const int64_t HX_MAX_GRID[3] = {2147483647LL, 65535, 65535};

/* ------------------------------------------------------------------ state */

struct hx_cuda_model {
    void *lib;                        /* the driver (never closed) */
    hx_cu cu;
    CUdevice device;
    CUcontext ctx;                    /* the primary context, retained (NULL: not yet) */
    int major, minor;
    char gpu[192];                    /* "NVIDIA H100 80GB HBM3 (sm_90)" */
    uint32_t nmodules;
    CUmodule *modules;
    CUfunction **functions;           /* [variant][launch] */
    CUdeviceptr weights;              /* 0: none allocated */
    size_t weight_bytes;
    size_t in_max[HX_MAX_IO], out_max[HX_MAX_IO];   /* bytes at the largest shapes */
    size_t io_bytes;                  /* one staging allocation: inputs, then outputs */
    size_t max_args;                  /* the largest packed argument buffer */
};

typedef struct {
    int used;                         /* a key is stored */
    uint32_t variant;
    int64_t *sizes;                   /* plan.nsymbols */
    CUdeviceptr *ptrs;                /* io_on_device: inputs then outputs */
    CUgraphExec exec;                 /* NULL: not captured (yet) */
    uint64_t stamp;                   /* last use */
} hx_graph;

struct hx_cuda_context {
    CUstream own;                     /* created here: setup work, and passes by default */
    CUstream stream;                  /* where passes run: own or options.stream */
    CUevent start, end;
    CUdeviceptr own_arena;            /* 0 while the caller's workspace is in use */
    CUdeviceptr arena;
    size_t arena_bytes;
    CUdeviceptr io;
    CUdeviceptr in_dev[HX_MAX_IO], out_dev[HX_MAX_IO];
    int io_on_device, sync_each, graphs;
    uint32_t ncache;
    hx_graph *cache;
    int64_t *key_sizes;               /* storage of the cache's keys */
    CUdeviceptr *key_ptrs;
    uint64_t clock;
    uint64_t *args;                   /* the packing buffer (model->max_args bytes) */
};

/* ------------------------------------------------------------------ errors */

static const char *cu_error_name(const struct hx_cuda_model *cm, CUresult rc, char *buf,
                                 size_t n) {
    const char *s = NULL;
    if (cm && cm->cu.GetErrorName && cm->cu.GetErrorName(rc, &s) == CUDA_SUCCESS && s)
        return s;
    snprintf(buf, n, "CUDA error %d", rc);
    return buf;
}

static int sticky(CUresult rc) {
    return rc == CUDA_ERROR_ILLEGAL_ADDRESS || rc == CUDA_ERROR_ASSERT ||
           (rc >= CUDA_ERROR_HARDWARE_STACK_ERROR && rc <= CUDA_ERROR_LAUNCH_FAILED);
}

/* "<what>: <call> failed on <gpu>: <ERROR NAME>[ (hint)]" with status `st` */
static hidetc_status cu_fail(const struct hx_cuda_model *cm, hidetc_status st, CUresult rc,
                             const char *call, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static hidetc_status cu_fail(const struct hx_cuda_model *cm, hidetc_status st, CUresult rc,
                             const char *call, const char *fmt, ...) {
    char what[640], buf[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return hx_fail(st, "%s: %s failed on %s: %s%s", what, call, cm->gpu[0] ? cm->gpu : "the GPU",
                   cu_error_name(cm, rc, buf, sizeof buf),
                   sticky(rc) ? " (a kernel fault: CUDA is unusable in this process until it "
                                "restarts; HIDETC_CUDA_SYNC_EACH=1 names the kernel)" : "");
}

/* cuMemAlloc: out of memory is HIDETC_ERR_MEMORY with the bytes free */
static hidetc_status cu_alloc(const struct hx_cuda_model *cm, CUdeviceptr *p, size_t bytes,
                              const char *what) {
    size_t n = bytes < HX_ALIGN ? HX_ALIGN : bytes;
    CUresult rc = cm->cu.MemAlloc(p, n);
    if (rc == CUDA_SUCCESS)
        return HIDETC_OK;
    *p = 0;
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        size_t free_b = 0, total = 0;
        cm->cu.MemGetInfo(&free_b, &total);
        return hx_fail(HIDETC_ERR_MEMORY, "out of GPU memory: %zu bytes for the %s but only "
                       "%zu of %zu bytes are free on %s", n, what, free_b, total, cm->gpu);
    }
    return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuMemAlloc", "allocating the %s (%zu bytes)",
                   what, n);
}

/* ------------------------------------------------------------------ current context */

typedef struct { CUcontext prev; int changed; } hx_current;

static hidetc_status enter(const struct hx_cuda_model *cm, hx_current *cur) {
    cur->prev = NULL;
    cur->changed = 0;
    if (cm->cu.CtxGetCurrent(&cur->prev) != CUDA_SUCCESS)
        cur->prev = NULL;
    if (cur->prev == cm->ctx)
        return HIDETC_OK;
    CUresult rc = cm->cu.CtxSetCurrent(cm->ctx);
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuCtxSetCurrent",
                       "making the GPU's primary context current");
    cur->changed = 1;
    return HIDETC_OK;
}

static void leave(const struct hx_cuda_model *cm, const hx_current *cur) {
    if (cur->changed)
        cm->cu.CtxSetCurrent(cur->prev);
}

/* ------------------------------------------------------------------ images */

/* "sm_90a" / "compute_90" -> 90 and its suffix ('a', 'f' or 0); -1 if not one */
static int arch_number(const char *s, const char *prefix, char *suffix) {
    size_t n = strlen(prefix);
    if (strncmp(s, prefix, n))
        return -1;
    s += n;
    int v = 0, digits = 0;
    while (*s >= '0' && *s <= '9' && digits < 4) {
        v = v * 10 + (*s++ - '0');
        digits++;
    }
    if (digits < 2 || (*s && ((*s != 'a' && *s != 'f') || s[1])))
        return -1;
    *suffix = *s;
    return v;
}

static void describe_images(const hx_plan *plan, const hx_module *mod, char *out, size_t n) {
    size_t used = 0;
    out[0] = 0;
    for (uint32_t k = 0; k < mod->ncubins && used < n; k++)
        used += (size_t)snprintf(out + used, n - used, "%s%s", k ? ", " : "", mod->cubin_arch[k]);
    if (mod->ptx_file >= 0 && (uint32_t)mod->ptx_file < plan->nfiles && used < n)
        snprintf(out + used, n - used, "%sPTX %s", mod->ncubins ? " and " : "", mod->ptx_arch);
    if (!out[0])
        snprintf(out, n, "nothing");
}

/* The file index of the image to load for the GPU (manifest.select_image's rules). */
static hidetc_status select_image(const hidetc_model *m, const hx_module *mod, int *file,
                                  const char **how) {
    const struct hx_cuda_model *cm = m->cuda;
    const hx_plan *plan = &m->plan;
    int number = cm->major * 10 + cm->minor;
    char have[256];
    describe_images(plan, mod, have, sizeof have);
    if (number < 80)
        return hx_fail(HIDETC_ERR_MACHINE, "%s: module '%s' has %s but %s is sm_%d, which "
                       "hidetc does not support (the cuda target needs sm_80 or newer); use "
                       "--target cpu", m->dir, mod->name, have, cm->gpu, number);
    /* the exact arch (sm_90 before sm_90a) */
    int best = -1, best_number = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++)
        for (uint32_t k = 0; k < mod->ncubins && best < 0; k++) {
            char suffix = 0;
            int v = arch_number(mod->cubin_arch[k], "sm_", &suffix);
            if (v == number && suffix == (pass ? 'a' : 0))
                best = (int)k;
        }
    if (best < 0) {
        for (uint32_t k = 0; k < mod->ncubins; k++) {
            char suffix = 0;
            int v = arch_number(mod->cubin_arch[k], "sm_", &suffix);
            if (v > 0 && !suffix && v / 10 == cm->major && v <= number && v > best_number) {
                best = (int)k;
                best_number = v;
            }
        }
    }
    if (best >= 0) {
        if (mod->cubin_file[best] >= plan->nfiles)
            return hx_fail(HIDETC_ERR_FORMAT, "%s: module '%s': cubin file index out of range",
                           m->dir, mod->name);
        *file = (int)mod->cubin_file[best];
        *how = "cubin";
        return HIDETC_OK;
    }
    if (mod->ptx_file >= 0) {
        char suffix = 0;
        int v = arch_number(mod->ptx_arch, "compute_", &suffix);
        if (v > 0 && v <= number && (!suffix || v == number)) {
            if ((uint32_t)mod->ptx_file >= plan->nfiles)
                return hx_fail(HIDETC_ERR_FORMAT, "%s: module '%s': PTX file index out of "
                               "range", m->dir, mod->name);
            *file = mod->ptx_file;
            *how = "PTX";
            return HIDETC_OK;
        }
    }
    return hx_fail(HIDETC_ERR_MACHINE, "%s: module '%s' has %s but %s is sm_%d; recompile "
                   "with --arch sm_%d", m->dir, mod->name, have, cm->gpu, number, number);
}

/* The whole file, NUL-terminated (cuModuleLoadData reads PTX as a C string). */
static hidetc_status read_image(const hidetc_model *m, const hx_file *f, char **data) {
    size_t n = strlen(m->dir) + strlen(f->path) + 2;
    char *path = malloc(n);
    if (!path)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    snprintf(path, n, "%s/%s", m->dir, f->path);
    FILE *fp = fopen(path, "rb");
    hidetc_status st = HIDETC_OK;
    *data = NULL;
    if (!fp) {
        st = hx_fail(HIDETC_ERR_IO, "%s: cannot open", path);
    } else {
        char *buf = malloc((size_t)f->size + 1);
        if (!buf) {
            st = hx_fail(HIDETC_ERR_MEMORY, "out of memory reading %s", path);
        } else if (fread(buf, 1, (size_t)f->size, fp) != (size_t)f->size) {
            free(buf);
            st = hx_fail(HIDETC_ERR_IO, "%s: cannot read its %llu bytes", path,
                         (unsigned long long)f->size);
        } else {
            buf[f->size] = 0;
            *data = buf;
        }
        fclose(fp);
    }
    free(path);
    return st;
}

/* ------------------------------------------------------------------ arguments */

static size_t arg_size(uint32_t kind) {
    switch (kind) {
    case HX_ARG_I32: case HX_ARG_U32: case HX_ARG_F32: return 4;
    case HX_ARG_INPUT: case HX_ARG_OUTPUT: case HX_ARG_ARENA: case HX_ARG_WEIGHTS:
    case HX_ARG_SIZE: case HX_ARG_I64: case HX_ARG_U64: case HX_ARG_F64: return 8;
    default: return 0;
    }
}

/* Check a launch's arguments against the plan; *bytes: its packed size. */
static hidetc_status check_launch(const hidetc_model *m, uint32_t v, uint32_t l,
                                  const hx_launch *launch, size_t *bytes) {
    const hx_plan *plan = &m->plan;
    size_t off = 0;
    if (launch->module >= plan->nmodules)
        return hx_fail(HIDETC_ERR_FORMAT, "%s: variant %u launch %u (%s): module %u of %u",
                       m->dir, v, l, launch->kernel, launch->module, plan->nmodules);
    uint64_t threads = (uint64_t)launch->block[0] * launch->block[1] * launch->block[2];
    if (!threads || threads > 1024)
        return hx_fail(HIDETC_ERR_FORMAT, "%s: variant %u launch %u (%s): block [%u, %u, %u] "
                       "outside the CUDA limits", m->dir, v, l, launch->kernel,
                       launch->block[0], launch->block[1], launch->block[2]);
    for (uint32_t a = 0; a < launch->nargs; a++) {
        const hx_arg *arg = &launch->args[a];
        size_t size = arg_size(arg->kind);
        const char *bad = NULL;
        int64_t x = arg->value;
        if (!size)
            bad = "an unknown argument kind";
        else if (arg->kind == HX_ARG_INPUT && (x < 0 || (uint64_t)x >= plan->ninputs))
            bad = "an input index out of range";
        else if (arg->kind == HX_ARG_OUTPUT && (x < 0 || (uint64_t)x >= plan->noutputs))
            bad = "an output index out of range";
        else if (arg->kind == HX_ARG_ARENA &&
                 (x < 0 || (uint64_t)x >= (plan->arena_bytes ? plan->arena_bytes : 1)))
            bad = "an offset past the arena";
        else if (arg->kind == HX_ARG_WEIGHTS &&
                 (x < 0 || (uint64_t)x >= (m->weight_bytes ? m->weight_bytes : 1)))
            bad = "an offset past the weights";
        else if (arg->kind == HX_ARG_SIZE && (x < 0 || (uint64_t)x >= plan->nsymbols))
            bad = "a size index out of range";
        if (bad)
            return hx_fail(HIDETC_ERR_FORMAT, "%s: variant %u launch %u (%s): arg %u (kind %u, "
                           "%lld) is %s", m->dir, v, l, launch->kernel, a, arg->kind,
                           (long long)x, bad);
        off = (off + size - 1) / size * size + size;
    }
    *bytes = off;
    return HIDETC_OK;
}

/* Pack a launch's arguments into buf (8-byte aligned); its size. */
static size_t pack(const hidetc_context *c, const hx_launch *launch, const CUdeviceptr *ins,
                   const CUdeviceptr *outs, uint8_t *buf) {
    const struct hx_cuda_model *cm = c->model->cuda;
    const struct hx_cuda_context *cc = c->cuda;
    size_t off = 0;
    for (uint32_t a = 0; a < launch->nargs; a++) {
        const hx_arg *arg = &launch->args[a];
        size_t size = arg_size(arg->kind);
        uint64_t v8 = 0;
        switch (arg->kind) {
        case HX_ARG_INPUT: v8 = ins[arg->value]; break;
        case HX_ARG_OUTPUT: v8 = outs[arg->value]; break;
        case HX_ARG_ARENA: v8 = cc->arena + (uint64_t)arg->value; break;
        case HX_ARG_WEIGHTS: v8 = cm->weights + (uint64_t)arg->value; break;
        case HX_ARG_SIZE: v8 = (uint64_t)c->pass.sizes[arg->value]; break;
        default: v8 = (uint64_t)arg->value; break;   /* scalars: their bits */
        }
        size_t aligned = (off + size - 1) / size * size;
        memset(buf + off, 0, aligned - off);          /* padding: zero, as struct.pack */
        off = aligned;
        if (size == 4) {
            uint32_t v4 = (uint32_t)v8;
            memcpy(buf + off, &v4, 4);
        } else {
            memcpy(buf + off, &v8, 8);
        }
        off += size;
    }
    return off;
}

/* ------------------------------------------------------------------ model */

static hidetc_status load_driver(hidetc_model *m, struct hx_cuda_model *cm) {
    const char *env = getenv("HIDETC_CUDA_DRIVER");
    const char *name = env && *env ? env : "libcuda.so.1";
    dlerror();
    cm->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!cm->lib) {
        const char *why = dlerror();
        return hx_fail(HIDETC_ERR_MACHINE, "%s: this artifact targets cuda but the CUDA driver "
                       "cannot be loaded (%s): it needs an NVIDIA GPU and its driver", m->dir,
                       why ? why : name);
    }
    for (size_t k = 0; k < sizeof CU_SYMBOLS / sizeof CU_SYMBOLS[0]; k++) {
        void *p = dlsym(cm->lib, CU_SYMBOLS[k].name);
        if (!p && CU_SYMBOLS[k].fallback)
            p = dlsym(cm->lib, CU_SYMBOLS[k].fallback);
        if (!p)
            return hx_fail(HIDETC_ERR_MACHINE, "%s: the CUDA driver %s has no %s: it is older "
                           "than this runtime needs (CUDA 11.4 or newer)", m->dir, name,
                           CU_SYMBOLS[k].name);
        memcpy((char *)&cm->cu + CU_SYMBOLS[k].slot, &p, sizeof p);
    }
    return HIDETC_OK;
}

static hidetc_status open_device(hidetc_model *m, struct hx_cuda_model *cm) {
    const hx_cu *cu = &cm->cu;
    char buf[32];
    CUresult rc = cu->Init(0);
    int count = 0;
    if (rc == CUDA_SUCCESS)
        rc = cu->DeviceGetCount(&count);
    if (rc != CUDA_SUCCESS || count < 1)
        return hx_fail(HIDETC_ERR_MACHINE, "%s: this artifact targets cuda but no CUDA GPU is "
                       "visible (%s)", m->dir, rc != CUDA_SUCCESS ?
                       cu_error_name(cm, rc, buf, sizeof buf) : "no CUDA device found");
    rc = cu->DeviceGet(&cm->device, 0);
    if (rc == CUDA_SUCCESS)
        rc = cu->DeviceGetAttribute(&cm->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                    cm->device);
    if (rc == CUDA_SUCCESS)
        rc = cu->DeviceGetAttribute(&cm->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                    cm->device);
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_MACHINE, rc, "cuDeviceGetAttribute",
                       "%s: reading GPU 0's compute capability", m->dir);
    char name[128] = "GPU 0";
    if (cu->DeviceGetName(name, (int)sizeof name - 1, cm->device) != CUDA_SUCCESS)
        snprintf(name, sizeof name, "GPU 0");
    name[sizeof name - 1] = 0;
    snprintf(cm->gpu, sizeof cm->gpu, "%s (sm_%d)", name, cm->major * 10 + cm->minor);
    rc = cu->DevicePrimaryCtxRetain(&cm->ctx, cm->device);
    if (rc != CUDA_SUCCESS) {
        cm->ctx = NULL;
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuDevicePrimaryCtxRetain",
                       "%s: opening GPU 0's primary context", m->dir);
    }
    return HIDETC_OK;
}

static hidetc_status load_modules(hidetc_model *m, struct hx_cuda_model *cm) {
    const hx_plan *plan = &m->plan;
    cm->modules = calloc(plan->nmodules ? plan->nmodules : 1, sizeof *cm->modules);
    if (!cm->modules)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    cm->nmodules = plan->nmodules;
    for (uint32_t k = 0; k < plan->nmodules; k++) {
        const hx_module *mod = &plan->modules[k];
        int file = -1;
        const char *how = NULL;
        hidetc_status st = select_image(m, mod, &file, &how);
        char *image = NULL;
        if (st == HIDETC_OK)
            st = read_image(m, &plan->files[file], &image);
        if (st != HIDETC_OK)
            return st;
        CUresult rc = cm->cu.ModuleLoadData(&cm->modules[k], image);
        free(image);
        if (rc != CUDA_SUCCESS) {
            cm->modules[k] = NULL;
            int machine = rc == CUDA_ERROR_NO_BINARY_FOR_GPU || rc == CUDA_ERROR_INVALID_PTX ||
                          rc == CUDA_ERROR_UNSUPPORTED_PTX_VERSION ||
                          rc == CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
            return cu_fail(cm, machine ? HIDETC_ERR_MACHINE : HIDETC_ERR_DEVICE, rc,
                           "cuModuleLoadData", "%s/%s: loading the %s of module '%s'", m->dir,
                           plan->files[file].path, how, mod->name);
        }
    }
    return HIDETC_OK;
}

/* The largest dynamic shared memory any launch of (module, kernel) asks for. */
static uint32_t max_shared(const hx_plan *plan, uint32_t module, const char *kernel) {
    uint32_t most = 0;
    for (uint32_t v = 0; v < plan->nvariants; v++)
        for (uint32_t l = 0; l < plan->variants[v].nlaunches; l++) {
            const hx_launch *x = &plan->variants[v].launches[l];
            if (x->module == module && x->shared_bytes > most && !strcmp(x->kernel, kernel))
                most = x->shared_bytes;
        }
    return most;
}

/* An earlier launch's function of the same (module, kernel), or NULL. */
static CUfunction known_function(const hidetc_model *m, uint32_t v_end, uint32_t l_end,
                                 const hx_launch *launch) {
    const hx_plan *plan = &m->plan;
    for (uint32_t v = 0; v <= v_end; v++) {
        uint32_t n = v == v_end ? l_end : plan->variants[v].nlaunches;
        for (uint32_t l = 0; l < n; l++) {
            const hx_launch *x = &plan->variants[v].launches[l];
            if (x->module == launch->module && !strcmp(x->kernel, launch->kernel))
                return m->cuda->functions[v][l];
        }
    }
    return NULL;
}

static hidetc_status load_functions(hidetc_model *m, struct hx_cuda_model *cm) {
    const hx_plan *plan = &m->plan;
    cm->functions = calloc(plan->nvariants ? plan->nvariants : 1, sizeof *cm->functions);
    if (!cm->functions)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    for (uint32_t v = 0; v < plan->nvariants; v++) {
        const hx_variant *var = &plan->variants[v];
        cm->functions[v] = calloc(var->nlaunches ? var->nlaunches : 1, sizeof **cm->functions);
        if (!cm->functions[v])
            return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
        for (uint32_t l = 0; l < var->nlaunches; l++) {
            const hx_launch *launch = &var->launches[l];
            size_t bytes = 0;
            hidetc_status st = check_launch(m, v, l, launch, &bytes);
            if (st != HIDETC_OK)
                return st;
            if (bytes > cm->max_args)
                cm->max_args = bytes;
            CUfunction f = known_function(m, v, l, launch);
            if (f) {
                cm->functions[v][l] = f;
                continue;
            }
            CUresult rc = cm->cu.ModuleGetFunction(&f, cm->modules[launch->module],
                                                   launch->kernel);
            if (rc != CUDA_SUCCESS)
                return cu_fail(cm, rc == CUDA_ERROR_NOT_FOUND ? HIDETC_ERR_FORMAT
                               : HIDETC_ERR_DEVICE, rc, "cuModuleGetFunction",
                               "%s: launch %u (%s): kernel '%s' of module '%s'", m->dir, l,
                               launch->kernel, launch->kernel,
                               plan->modules[launch->module].name);
            cm->functions[v][l] = f;
            uint32_t shared = max_shared(plan, launch->module, launch->kernel);
            if (shared > HX_DEFAULT_SHARED) {
                rc = cm->cu.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             (int)shared);
                if (rc != CUDA_SUCCESS)
                    return cu_fail(cm, HIDETC_ERR_MACHINE, rc, "cuFuncSetAttribute",
                                   "%s: launch %u (%s) needs %u bytes of dynamic shared memory, "
                                   "more than this GPU allows", m->dir, l, launch->kernel,
                                   shared);
            }
        }
        /* every launch's block against its function's limit (registers per thread) */
        for (uint32_t l = 0; l < var->nlaunches; l++) {
            const hx_launch *launch = &var->launches[l];
            int limit = 0;
            CUresult rc = cm->cu.FuncGetAttribute(&limit, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                                  cm->functions[v][l]);
            if (rc != CUDA_SUCCESS)
                return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuFuncGetAttribute",
                               "%s: launch %u (%s)", m->dir, l, launch->kernel);
            uint32_t threads = launch->block[0] * launch->block[1] * launch->block[2];
            if (threads > (uint32_t)limit)
                return hx_fail(HIDETC_ERR_MACHINE, "%s: launch %u (%s): a block of %u threads "
                               "but the kernel allows at most %d on %s (registers per "
                               "thread)", m->dir, l, launch->kernel, threads, limit, cm->gpu);
        }
    }
    return HIDETC_OK;
}

static hidetc_status upload_weights(hidetc_model *m, struct hx_cuda_model *cm) {
    cm->weight_bytes = m->weight_bytes;
    hidetc_status st = cu_alloc(cm, &cm->weights, m->weight_bytes, "weights");
    if (st != HIDETC_OK || !m->weight_bytes)
        return st;
    /* on a stream of its own (non-blocking): no implicit sync with anyone's stream */
    CUstream s = NULL;
    CUresult rc = cm->cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING);
    const char *call = "cuStreamCreate";
    if (rc == CUDA_SUCCESS) {
        call = "cuMemcpyHtoDAsync";
        rc = cm->cu.MemcpyHtoDAsync(cm->weights, m->weights, m->weight_bytes, s);
        if (rc == CUDA_SUCCESS) {
            call = "cuStreamSynchronize";
            rc = cm->cu.StreamSynchronize(s);
        }
        cm->cu.StreamDestroy(s);
    }
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, call, "%s: uploading the weights (%zu bytes)",
                       m->dir, m->weight_bytes);
    return HIDETC_OK;
}

static size_t largest_bytes(const hx_tensor *t) {
    size_t n = t->elem_bytes;
    for (uint32_t d = 0; d < t->rank; d++)
        n *= (size_t)(t->dim_max[d] > 0 ? t->dim_max[d] : 0);
    return n;
}

static size_t round_up(size_t n) { return (n + HX_ALIGN - 1) / HX_ALIGN * HX_ALIGN; }

hidetc_status hx_cuda_model_init(hidetc_model *m) {
    struct hx_cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    m->cuda = cm;          /* from here hidetc_model_free -> hx_cuda_model_free cleans up */
    const hx_plan *plan = &m->plan;
    if (plan->ninputs > HX_MAX_IO || plan->noutputs > HX_MAX_IO || plan->nsymbols > HX_MAX_SYMBOLS)
        return hx_fail(HIDETC_ERR_FORMAT, "%s: more inputs, outputs or sizes than the runtime "
                       "holds", m->dir);
    for (uint32_t i = 0; i < plan->ninputs; i++)
        cm->io_bytes += round_up(cm->in_max[i] = largest_bytes(&plan->inputs[i]));
    for (uint32_t i = 0; i < plan->noutputs; i++)
        cm->io_bytes += round_up(cm->out_max[i] = largest_bytes(&plan->outputs[i]));
    hidetc_status st = load_driver(m, cm);
    if (st == HIDETC_OK)
        st = open_device(m, cm);
    if (st != HIDETC_OK)
        return st;
    hx_current cur;
    st = enter(cm, &cur);
    if (st != HIDETC_OK)
        return st;
    st = load_modules(m, cm);
    if (st == HIDETC_OK)
        st = load_functions(m, cm);
    if (st == HIDETC_OK)
        st = upload_weights(m, cm);
    leave(cm, &cur);
    return st;
}

void hx_cuda_model_free(hidetc_model *m) {
    struct hx_cuda_model *cm = m->cuda;
    if (!cm)
        return;
    if (cm->ctx) {
        hx_current cur;
        int entered = enter(cm, &cur) == HIDETC_OK;
        if (cm->weights)
            cm->cu.MemFree(cm->weights);
        for (uint32_t k = 0; cm->modules && k < cm->nmodules; k++)
            if (cm->modules[k])
                cm->cu.ModuleUnload(cm->modules[k]);
        if (entered)
            leave(cm, &cur);
        cm->cu.DevicePrimaryCtxRelease(cm->device);
    }
    for (uint32_t v = 0; cm->functions && v < m->plan.nvariants; v++)
        free(cm->functions[v]);
    free(cm->functions);
    free(cm->modules);
    free(cm);
    m->cuda = NULL;
}

/* ------------------------------------------------------------------ contexts */

static void drop_graphs(hidetc_context *c) {
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    for (uint32_t k = 0; cc->cache && k < cc->ncache; k++) {
        if (cc->cache[k].exec)
            cm->cu.GraphExecDestroy(cc->cache[k].exec);
        cc->cache[k].exec = NULL;
        cc->cache[k].used = 0;
    }
}

/* Zero device memory on the context's own stream and wait. */
static hidetc_status zero(hidetc_context *c, CUdeviceptr p, size_t bytes, const char *what) {
    const struct hx_cuda_model *cm = c->model->cuda;
    CUresult rc = cm->cu.MemsetD8Async(p, 0, bytes, c->cuda->own);
    const char *call = "cuMemsetD8Async";
    if (rc == CUDA_SUCCESS) {
        rc = cm->cu.StreamSynchronize(c->cuda->own);
        call = "cuStreamSynchronize";
    }
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, call, "zeroing the %s (%zu bytes)", what, bytes);
    return HIDETC_OK;
}

static hidetc_status own_arena(hidetc_context *c) {
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    size_t bytes = (size_t)c->model->plan.arena_bytes;
    hidetc_status st = cu_alloc(cm, &cc->own_arena, bytes, "activation arena");
    if (st == HIDETC_OK)
        st = zero(c, cc->own_arena, bytes < HX_ALIGN ? HX_ALIGN : bytes, "activation arena");
    if (st != HIDETC_OK)
        return st;
    cc->arena = cc->own_arena;
    cc->arena_bytes = bytes;
    c->arena_bytes = bytes;
    c->last_variant = -2;      /* zeroed: no variant's kept-zero region is dirty */
    return HIDETC_OK;
}

static hidetc_status context_setup(hidetc_context *c) {
    const hidetc_model *m = c->model;
    const hx_plan *plan = &m->plan;
    const struct hx_cuda_model *cm = m->cuda;
    struct hx_cuda_context *cc = c->cuda;
    const char *env = getenv("HIDETC_CUDA_SYNC_EACH");
    cc->sync_each = env && *env && strcmp(env, "0");
    cc->graphs = !cc->sync_each;
    cc->io_on_device = c->options.io_on_device != 0;
    CUresult rc = cm->cu.StreamCreate(&cc->own, CU_STREAM_NON_BLOCKING);
    if (rc != CUDA_SUCCESS) {
        cc->own = NULL;
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuStreamCreate", "%s: a context's stream",
                       m->dir);
    }
    cc->stream = c->options.stream ? (CUstream)c->options.stream : cc->own;
    rc = cm->cu.EventCreate(&cc->start, CU_EVENT_DEFAULT);
    if (rc == CUDA_SUCCESS)
        rc = cm->cu.EventCreate(&cc->end, CU_EVENT_DEFAULT);
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuEventCreate", "%s: a context's events",
                       m->dir);
    hidetc_status st = own_arena(c);
    if (st != HIDETC_OK)
        return st;
    if (!cc->io_on_device) {
        st = cu_alloc(cm, &cc->io, cm->io_bytes, "input and output buffers");
        if (st == HIDETC_OK)
            st = zero(c, cc->io, cm->io_bytes < HX_ALIGN ? HX_ALIGN : cm->io_bytes,
                      "input and output buffers");
        if (st != HIDETC_OK)
            return st;
        size_t off = 0;
        for (uint32_t i = 0; i < plan->ninputs; i++) {
            cc->in_dev[i] = cc->io + off;
            off += round_up(cm->in_max[i]);
        }
        for (uint32_t i = 0; i < plan->noutputs; i++) {
            cc->out_dev[i] = cc->io + off;
            off += round_up(cm->out_max[i]);
        }
    }
    cc->ncache = plan->graph_cache ? plan->graph_cache : 1;
    uint32_t nptrs = cc->io_on_device ? plan->ninputs + plan->noutputs : 0;
    cc->cache = calloc(cc->ncache, sizeof *cc->cache);
    cc->key_sizes = calloc((size_t)cc->ncache * (plan->nsymbols + 1), sizeof *cc->key_sizes);
    cc->key_ptrs = calloc((size_t)cc->ncache * (nptrs + 1), sizeof *cc->key_ptrs);
    cc->args = calloc(cm->max_args / 8 + 2, 8);
    if (!cc->cache || !cc->key_sizes || !cc->key_ptrs || !cc->args)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    for (uint32_t k = 0; k < cc->ncache; k++) {
        cc->cache[k].sizes = cc->key_sizes + (size_t)k * (plan->nsymbols + 1);
        cc->cache[k].ptrs = cc->key_ptrs + (size_t)k * (nptrs + 1);
    }
    return HIDETC_OK;
}

hidetc_status hx_cuda_context_init(hidetc_context *c) {
    const struct hx_cuda_model *cm = c->model->cuda;
    if (!cm)
        return hx_fail(HIDETC_ERR_INTERNAL, "a cuda context on a model without cuda state");
    c->cuda = calloc(1, sizeof *c->cuda);
    if (!c->cuda)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    hx_current cur;
    hidetc_status st = enter(cm, &cur);
    if (st != HIDETC_OK)
        return st;
    st = context_setup(c);     /* on failure hidetc_context_free -> hx_cuda_context_free */
    leave(cm, &cur);
    return st;
}

void hx_cuda_context_free(hidetc_context *c) {
    struct hx_cuda_context *cc = c->cuda;
    const struct hx_cuda_model *cm = c->model->cuda;
    if (!cc)
        return;
    if (cm && cm->ctx) {
        hx_current cur;
        int entered = enter(cm, &cur) == HIDETC_OK;
        drop_graphs(c);                 /* every pass ended synchronised: none in flight */
        if (cc->io)
            cm->cu.MemFree(cc->io);
        if (cc->own_arena)
            cm->cu.MemFree(cc->own_arena);
        if (cc->start)
            cm->cu.EventDestroy(cc->start);
        if (cc->end)
            cm->cu.EventDestroy(cc->end);
        if (cc->own)
            cm->cu.StreamDestroy(cc->own);
        if (entered)
            leave(cm, &cur);
    }
    free(cc->cache);
    free(cc->key_sizes);
    free(cc->key_ptrs);
    free(cc->args);
    free(cc);
    c->cuda = NULL;
}

hidetc_status hx_cuda_set_workspace(hidetc_context *c, void *memory, size_t bytes) {
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)memory;
    hx_current cur;
    hidetc_status st = enter(cm, &cur);
    if (st != HIDETC_OK)
        return st;
    if (p) {
        if (bytes)
            st = zero(c, p, bytes, "workspace");
        if (st == HIDETC_OK) {
            if (p != cc->arena)
                drop_graphs(c);         /* they hold the old arena's address */
            if (cc->own_arena && cc->own_arena != p) {
                cm->cu.MemFree(cc->own_arena);
                cc->own_arena = 0;
            }
            cc->arena = p;
            cc->arena_bytes = bytes;
            c->arena_bytes = bytes;
            c->last_variant = -2;
        }
    } else if (!cc->own_arena) {
        drop_graphs(c);
        st = own_arena(c);              /* allocated and zeroed again */
    } else {
        c->last_variant = cc->arena == cc->own_arena ? c->last_variant : -1;
        cc->arena = cc->own_arena;
        cc->arena_bytes = c->arena_bytes = (size_t)c->model->plan.arena_bytes;
    }
    leave(cm, &cur);
    return st;
}

/* ------------------------------------------------------------------ passes */

static hidetc_status grid_of(const hidetc_context *c, uint32_t l, const hx_launch *launch,
                             unsigned int grid[3], int *empty) {
    *empty = 0;
    for (int d = 0; d < 3; d++) {
        int64_t g = 0;
        if (hx_expr_eval(&launch->grid[d], c->pass.sizes, &g))
            return hx_fail(HIDETC_ERR_FORMAT, "%s: launch %u (%s): grid dimension %d is not a "
                           "valid size expression", c->model->dir, l, launch->kernel, d);
        if (g < 0 || g > HX_MAX_GRID[d])
            return hx_fail(HIDETC_ERR_SHAPE, "launch %u (%s): grid dimension %d is %lld at the "
                           "shapes set, outside the CUDA limits (0..%lld)", l, launch->kernel, d,
                           (long long)g, (long long)HX_MAX_GRID[d]);
        *empty |= g == 0;
        grid[d] = (unsigned int)g;
    }
    return HIDETC_OK;
}

/* Enqueue the variant's launches on the stream (captured, when a capture is on). */
static hidetc_status launch_all(hidetc_context *c, const hx_variant *v, const CUdeviceptr *ins,
                                const CUdeviceptr *outs, int capturing) {
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    CUfunction *functions = cm->functions[c->pass.variant];
    for (uint32_t l = 0; l < v->nlaunches; l++) {
        const hx_launch *launch = &v->launches[l];
        unsigned int grid[3];
        int empty;
        hidetc_status st = grid_of(c, l, launch, grid, &empty);
        if (st != HIDETC_OK)
            return st;
        if (empty)
            continue;
        size_t size = pack(c, launch, ins, outs, (uint8_t *)cc->args);
        void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, cc->args, CU_LAUNCH_PARAM_BUFFER_SIZE,
                         &size, CU_LAUNCH_PARAM_END};
        CUresult rc = cm->cu.LaunchKernel(functions[l], grid[0], grid[1], grid[2],
                                          launch->block[0], launch->block[1], launch->block[2],
                                          launch->shared_bytes, cc->stream, NULL,
                                          size ? extra : NULL);
        const char *call = "cuLaunchKernel";
        if (rc == CUDA_SUCCESS && cc->sync_each && !capturing) {
            rc = cm->cu.StreamSynchronize(cc->stream);
            call = "cuStreamSynchronize after it";
        }
        if (rc != CUDA_SUCCESS)
            return cu_fail(cm, HIDETC_ERR_DEVICE, rc, call, "launch %u (%s, grid [%u, %u, %u], "
                           "block [%u, %u, %u], %u B dynamic shared memory)", l, launch->kernel,
                           grid[0], grid[1], grid[2], launch->block[0], launch->block[1],
                           launch->block[2], launch->shared_bytes);
    }
    return HIDETC_OK;
}

/* The cache entry of this pass's key (found: most recently used; else the least recently
   used one, emptied and re-keyed). *fresh: the key was not there. */
static hx_graph *cache_entry(hidetc_context *c, const CUdeviceptr *ins, const CUdeviceptr *outs,
                             int *fresh) {
    const hx_plan *plan = &c->model->plan;
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    uint32_t nin = cc->io_on_device ? plan->ninputs : 0;
    uint32_t nout = cc->io_on_device ? plan->noutputs : 0;
    hx_graph *victim = NULL;
    for (uint32_t k = 0; k < cc->ncache; k++) {
        hx_graph *g = &cc->cache[k];
        if (g->used && g->variant == c->pass.variant &&
            !memcmp(g->sizes, c->pass.sizes, plan->nsymbols * sizeof *g->sizes) &&
            (!nin || !memcmp(g->ptrs, ins, nin * sizeof *ins)) &&
            (!nout || !memcmp(g->ptrs + nin, outs, nout * sizeof *outs))) {
            g->stamp = ++cc->clock;
            *fresh = 0;
            return g;
        }
        if (!g->used) {                 /* an empty slot first */
            if (!victim || victim->used)
                victim = g;
        } else if (!victim || (victim->used && g->stamp < victim->stamp)) {
            victim = g;
        }
    }
    if (!victim)                          /* no cache (never: ncache >= 1) */
        return NULL;
    if (victim->exec)
        cm->cu.GraphExecDestroy(victim->exec);
    victim->exec = NULL;
    victim->used = 1;
    victim->variant = c->pass.variant;
    memcpy(victim->sizes, c->pass.sizes, plan->nsymbols * sizeof *victim->sizes);
    if (nin)
        memcpy(victim->ptrs, ins, nin * sizeof *ins);
    if (nout)
        memcpy(victim->ptrs + nin, outs, nout * sizeof *outs);
    victim->stamp = ++cc->clock;
    *fresh = 1;
    return victim;
}

/* Capture the launches into g->exec; 1 if capture is impossible (the context goes on
   without graphs), 0 when captured, -1 on a launch error (hx_fail's message set). */
static int capture(hidetc_context *c, const hx_variant *v, const CUdeviceptr *ins,
                   const CUdeviceptr *outs, hx_graph *g, hidetc_status *st) {
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    if (cm->cu.StreamBeginCapture(cc->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS)
        return 1;
    *st = launch_all(c, v, ins, outs, 1);
    CUgraph graph = NULL;
    CUresult rc = cm->cu.StreamEndCapture(cc->stream, &graph);
    if (*st != HIDETC_OK) {
        if (rc == CUDA_SUCCESS && graph)
            cm->cu.GraphDestroy(graph);
        return -1;
    }
    if (rc != CUDA_SUCCESS || !graph)
        return 1;
    CUgraphExec exec = NULL;
    rc = cm->cu.GraphInstantiateWithFlags(&exec, graph, 0);
    cm->cu.GraphDestroy(graph);
    if (rc != CUDA_SUCCESS || !exec)
        return 1;
    g->exec = exec;
    return 0;
}

/* The forward pass on the stream: a graph replayed (captured first where due), or the
   launches one by one. */
static hidetc_status forward(hidetc_context *c, const hx_variant *v, const CUdeviceptr *ins,
                             const CUdeviceptr *outs) {
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    if (!cc->graphs || !v->nlaunches)
        return launch_all(c, v, ins, outs, 0);
    int fresh = 0;
    hx_graph *g = cache_entry(c, ins, outs, &fresh);
    if (!g)
        return launch_all(c, v, ins, outs, 0);
    if (!g->exec) {
        if (fresh && cc->io_on_device)      /* captured when these pointers come again */
            return launch_all(c, v, ins, outs, 0);
        int any = 0;                        /* nothing to launch at these sizes: no graph */
        for (uint32_t l = 0; l < v->nlaunches && !any; l++) {
            unsigned int grid[3];
            int empty;
            hidetc_status st = grid_of(c, l, &v->launches[l], grid, &empty);
            if (st != HIDETC_OK)
                return st;
            any = !empty;
        }
        if (!any)
            return HIDETC_OK;
        hidetc_status st = HIDETC_OK;
        int got = capture(c, v, ins, outs, g, &st);
        if (got < 0)
            return st;
        if (got > 0) {                      /* no graphs on this context from now on */
            cc->graphs = 0;
            drop_graphs(c);
            return launch_all(c, v, ins, outs, 0);
        }
    }
    CUresult rc = cm->cu.GraphLaunch(g->exec, cc->stream);
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuGraphLaunch", "%s: replaying the forward "
                       "pass", c->model->dir);
    return HIDETC_OK;
}

static hidetc_status run(hidetc_context *c, const void *const *inputs, void *const *outputs) {
    const hidetc_model *m = c->model;
    const hx_plan *plan = &m->plan;
    const struct hx_cuda_model *cm = m->cuda;
    struct hx_cuda_context *cc = c->cuda;
    const hx_pass *pass = &c->pass;
    const hx_variant *v = &plan->variants[pass->variant];
    CUdeviceptr ins[HX_MAX_IO] = {0}, outs[HX_MAX_IO] = {0};
    CUresult rc;
    for (uint32_t i = 0; i < plan->ninputs; i++) {
        ins[i] = cc->io_on_device ? (CUdeviceptr)(uintptr_t)inputs[i] : cc->in_dev[i];
        if (!cc->io_on_device && pass->in_bytes[i] > cm->in_max[i])
            return hx_fail(HIDETC_ERR_INTERNAL, "input '%s': %zu bytes, over its buffer's %zu",
                           plan->inputs[i].name, pass->in_bytes[i], cm->in_max[i]);
    }
    for (uint32_t i = 0; i < plan->noutputs; i++) {
        outs[i] = cc->io_on_device ? (CUdeviceptr)(uintptr_t)outputs[i] : cc->out_dev[i];
        if (!cc->io_on_device && pass->out_bytes[i] > cm->out_max[i])
            return hx_fail(HIDETC_ERR_INTERNAL, "output '%s': %zu bytes, over its buffer's %zu",
                           plan->outputs[i].name, pass->out_bytes[i], cm->out_max[i]);
    }
    for (uint32_t i = 0; !cc->io_on_device && i < plan->ninputs; i++) {
        if (!pass->in_bytes[i])
            continue;
        rc = cm->cu.MemcpyHtoDAsync(ins[i], inputs[i], pass->in_bytes[i], cc->stream);
        if (rc != CUDA_SUCCESS)
            return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuMemcpyHtoDAsync", "input '%s' (%zu "
                           "bytes)", plan->inputs[i].name, pass->in_bytes[i]);
    }
    if (c->last_variant != (int)pass->variant && c->last_variant != -2 && v->zeroed_offset >= 0 &&
        v->zeroed_bytes) {
        if ((uint64_t)v->zeroed_offset + v->zeroed_bytes > cc->arena_bytes)
            return hx_fail(HIDETC_ERR_FORMAT, "%s: the kept-zero region lies outside the arena",
                           m->dir);
        rc = cm->cu.MemsetD8Async(cc->arena + (uint64_t)v->zeroed_offset, 0,
                                  (size_t)v->zeroed_bytes, cc->stream);
        if (rc != CUDA_SUCCESS)
            return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuMemsetD8Async", "zeroing the "
                           "kept-zero region of variant %u", pass->variant);
    }
    c->last_variant = -1;             /* until this pass completes: state unknown */
    rc = cm->cu.EventRecord(cc->start, cc->stream);
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuEventRecord", "timing the pass");
    hidetc_status st = forward(c, v, ins, outs);
    if (st != HIDETC_OK)
        return st;
    rc = cm->cu.EventRecord(cc->end, cc->stream);
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuEventRecord", "timing the pass");
    /* outputs: copied back (host I/O) or filled from their sources (device I/O) */
    for (uint32_t k = 0; k < plan->noutputs; k++) {
        uint32_t kind = k < v->nsources ? v->sources[k].kind : HX_SRC_KERNEL;
        size_t n = pass->out_bytes[k];
        const hx_source *s = k < v->nsources ? &v->sources[k] : NULL;
        if (!n)
            continue;
        if (kind == HX_SRC_CONSTANT && (s->index + s->nbytes > m->weight_bytes || s->nbytes < n))
            return hx_fail(HIDETC_ERR_FORMAT, "output '%s': its constant lies outside the "
                           "weights", plan->outputs[k].name);
        if ((kind == HX_SRC_INPUT && s->index >= plan->ninputs) ||
            (kind == HX_SRC_OUTPUT && s->index >= plan->noutputs))
            return hx_fail(HIDETC_ERR_FORMAT, "output '%s': its source index is out of range",
                           plan->outputs[k].name);
        if (!cc->io_on_device) {
            if (kind != HX_SRC_KERNEL)
                continue;                   /* filled on the host after the sync */
            rc = cm->cu.MemcpyDtoHAsync(outputs[k], outs[k], n, cc->stream);
            if (rc != CUDA_SUCCESS)
                return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuMemcpyDtoHAsync", "output '%s' "
                               "(%zu bytes)", plan->outputs[k].name, n);
            continue;
        }
        CUdeviceptr from = kind == HX_SRC_INPUT ? ins[s->index]
                           : kind == HX_SRC_OUTPUT ? outs[s->index]
                           : kind == HX_SRC_CONSTANT ? cm->weights + s->index : 0;
        if (!from || from == outs[k])
            continue;
        rc = cm->cu.MemcpyDtoDAsync(outs[k], from, n, cc->stream);
        if (rc != CUDA_SUCCESS)
            return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuMemcpyDtoDAsync", "output '%s' (%zu "
                           "bytes)", plan->outputs[k].name, n);
    }
    rc = cm->cu.StreamSynchronize(cc->stream);
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuStreamSynchronize", "the forward pass "
                       "(variant %u, %u launches)", pass->variant, v->nlaunches);
    for (uint32_t k = 0; !cc->io_on_device && k < plan->noutputs && k < v->nsources; k++) {
        const hx_source *s = &v->sources[k];
        size_t n = pass->out_bytes[k];
        if (!n)
            continue;
        if (s->kind == HX_SRC_INPUT)
            memmove(outputs[k], inputs[s->index], n);
        else if (s->kind == HX_SRC_OUTPUT)
            memmove(outputs[k], outputs[s->index], n);
        else if (s->kind == HX_SRC_CONSTANT)
            memcpy(outputs[k], (const char *)m->weights + s->index, n);
    }
    float ms = 0;
    rc = cm->cu.EventElapsedTime(&ms, cc->start, cc->end);
    if (rc != CUDA_SUCCESS)
        return cu_fail(cm, HIDETC_ERR_DEVICE, rc, "cuEventElapsedTime", "timing the pass");
    c->last_ms = ms;
    c->last_variant = (int)pass->variant;
    return HIDETC_OK;
}

hidetc_status hx_cuda_run(hidetc_context *c, const void *const *inputs, void *const *outputs) {
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    const hx_variant *v = &c->model->plan.variants[c->pass.variant];
    if (cc->arena_bytes < v->arena_bytes)
        return hx_fail(HIDETC_ERR_MEMORY, "the workspace holds %zu bytes, this pass needs %llu",
                       cc->arena_bytes, (unsigned long long)v->arena_bytes);
    hx_current cur;
    hidetc_status st = enter(cm, &cur);
    if (st != HIDETC_OK)
        return st;
    st = run(c, inputs, outputs);
    if (st != HIDETC_OK)
        cm->cu.StreamSynchronize(cc->stream);   /* leave nothing of this pass in flight */
    leave(cm, &cur);
    return st;
}
