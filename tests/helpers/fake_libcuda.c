/* fake_libcuda.c -- a fake CUDA driver library for the C runtime's tests (no GPU):
 * built by tests/helpers/c_runtime_cuda.py (for tests/runtime/test_c_runtime_cuda*.py)
 * into a .so that the runtime dlopens through HIDETC_CUDA_DRIVER. It exports just the
 * entry points runtime/c/cuda_driver.c looks up.
 *
 * - One device, "Fake GPU", compute capability from env FAKE_CUDA_CC (default 90: 9.0;
 *   86: 8.6; 100: 10.0); FAKE_CUDA_DEVICES=0 shows none.
 * - Device memory is host memory (256-byte aligned), so copies really copy and a test
 *   reads device buffers through their addresses; every copy's device range is checked
 *   against the live allocations (CUDA_ERROR_INVALID_VALUE otherwise).
 * - Calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT unless the primary
 *   context is current on the calling thread (current is per thread, as CUDA's).
 * - Modules "load" from any bytes (their size: the ELF size of an ELF image, else the
 *   C string's length); cuModuleGetFunction succeeds for any name (one handle per name
 *   and module); a launch must pass its parameters through `extra`
 *   (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE) so the packed buffer reaches the trace.
 *   Launches over 48 KiB of dynamic shared memory need the function's
 *   CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES set at least that high first.
 * - Kernels named fake_copy* run: args (void *dst, const void *src, int64 count,
 *   int32 elem_bytes) copy count * elem_bytes bytes; fake_add* run: args (float *dst,
 *   const float *a, const float *b, int64 n), dst = a + b. Others do nothing.
 * - Stream capture: launches on a capturing stream are recorded (a "capture" trace line
 *   each) into the graph EndCapture returns; cuGraphLaunch replays the instantiated
 *   graph's launches (a "launch" line each, with graph=<exec id>). Copies, memsets,
 *   event records and synchronisation on a capturing stream fail with
 *   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (cuda.c never captures them).
 * - Trace: one line per call of interest, appended to the file named by env
 *   FAKE_CUDA_TRACE (read at every line: a test may switch files), e.g.
 *     cuMemAlloc ptr=0x... bytes=N
 *     cuMemcpyHtoD dst=0x... bytes=N stream=S
 *     launch kernel=K grid=X,Y,Z block=X,Y,Z shared=N stream=S graph=E|- args=HEX
 *   (stream 0: the NULL stream; ids count from 1 per kind).
 * - Failures: env FAKE_CUDA_FAIL=NAME makes every call of entry point NAME fail (the
 *   exported name, or it without its _v2 suffix); NAME@K only its K-th call counted
 *   from when the variable took that value; the error is env FAKE_CUDA_FAIL_RC
 *   (default 1, CUDA_ERROR_INVALID_VALUE). FAKE_CUDA_MAX_THREADS sets every function's
 *   CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK (default 1024).
 * - Built with -DFAKE_CUDA_OLD_DRIVER it lacks cuGraphInstantiateWithFlags (CUDA < 11.4).
 * - fake_cuda_live(what): the live "allocations", "modules", "streams", "events",
 *   "graphs", "execs" or the primary context's "ctx_refs", for leak checks.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
    INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_FOUND = 500, ILLEGAL_ADDRESS = 700,
    CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901
};

#define API __attribute__((visibility("default")))

typedef struct fn {
    struct fn *next;
    char name[256];
    int max_shared;
} fn_t;

typedef struct {
    int id;
    size_t bytes;
    fn_t *functions;
} module_t;

typedef struct {
    fn_t *fn;
    unsigned grid[3], block[3], shared;
    unsigned char *args;
    size_t nargs;
} rec_t;

typedef struct {
    int id;
    size_t n, cap;
    rec_t *recs;
} graph_t;                        /* a graph and an executable graph alike */

typedef struct {
    int id;
    int capturing;
    graph_t *graph;               /* being captured */
} stream_t;

typedef struct { int id; } event_t;

typedef struct alloc {
    struct alloc *next;
    unsigned char *p;
    size_t bytes;
} alloc_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int ctx_refs;
static int primary_ctx;           /* its address is the context handle */
static _Thread_local void *current;
static alloc_t *allocs;
static long live_modules, live_streams, live_events, live_graphs, live_execs;
static int next_module = 1, next_stream = 1, next_event = 1, next_graph = 1, next_exec = 1;

/* the fake aborts on host out-of-memory: a test helper, not something to handle */
static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        abort();
    return p;
}

static void *xrealloc(void *old, size_t n) {
    void *p = realloc(old, n ? n : 1);
    if (!p)
        abort();
    return p;
}

/* ------------------------------------------------------------------ trace, failures */

static void trace(const char *fmt, ...) {
    const char *path = getenv("FAKE_CUDA_TRACE");
    if (!path || !*path)
        return;
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}

static char fail_seen[256];
static struct { char name[64]; long calls; } counts[64];

/* The error to return from this call of `name` (0: none). Under the lock. */
static CUresult fail(const char *name) {
    const char *env = getenv("FAKE_CUDA_FAIL");
    if (!env || !*env)
        return OK;
    if (strncmp(env, fail_seen, sizeof fail_seen)) {     /* a new value: counts restart */
        snprintf(fail_seen, sizeof fail_seen, "%s", env);
        memset(counts, 0, sizeof counts);
    }
    char want[128];
    snprintf(want, sizeof want, "%s", env);
    long nth = 0;
    char *at = strchr(want, '@');
    if (at) {
        *at = 0;
        nth = atol(at + 1);
    }
    size_t n = strlen(name);
    int match = !strcmp(want, name) ||
                (n > 3 && !strcmp(name + n - 3, "_v2") && strlen(want) == n - 3 &&
                 !strncmp(want, name, n - 3));
    if (!match)
        return OK;
    int k = 0;
    while (k < 63 && counts[k].name[0] && strcmp(counts[k].name, name))
        k++;
    snprintf(counts[k].name, sizeof counts[k].name, "%s", name);
    long call = ++counts[k].calls;
    if (nth && call != nth)
        return OK;
    const char *rc = getenv("FAKE_CUDA_FAIL_RC");
    CUresult code = rc && *rc ? atoi(rc) : INVALID_VALUE;
    trace("FAIL name=%s call=%ld rc=%d", name, call, code);
    return code;
}

#define ENTER(name)                                  \
    pthread_mutex_lock(&lock);                       \
    CUresult rc_ = fail(name);                       \
    if (rc_) {                                       \
        pthread_mutex_unlock(&lock);                 \
        return rc_;                                  \
    }
#define RETURN(rc)                                   \
    do {                                             \
        CUresult r_ = (rc);                          \
        pthread_mutex_unlock(&lock);                 \
        return r_;                                   \
    } while (0)
#define NEED_CONTEXT()                               \
    do {                                             \
        if (!initialized)                            \
            RETURN(NOT_INITIALIZED);                 \
        if (current != &primary_ctx || ctx_refs < 1) \
            RETURN(INVALID_CONTEXT);                 \
    } while (0)

static int stream_id(void *s) { return s ? ((stream_t *)s)->id : 0; }

static int capturing(void *s) { return s && ((stream_t *)s)->capturing; }

/* Whether [p, p + n) lies in one live allocation. */
static int valid(CUdeviceptr p, size_t n) {
    for (alloc_t *a = allocs; a; a = a->next)
        if (p >= (CUdeviceptr)(uintptr_t)a->p && p + n <= (CUdeviceptr)(uintptr_t)a->p + a->bytes)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ device, context */

API CUresult cuInit(unsigned int flags) {
    ENTER("cuInit");
    trace("cuInit flags=%u", flags);
    initialized = 1;
    RETURN(OK);
}

API CUresult cuDeviceGetCount(int *count) {
    ENTER("cuDeviceGetCount");
    if (!initialized)
        RETURN(NOT_INITIALIZED);
    const char *env = getenv("FAKE_CUDA_DEVICES");
    *count = env && *env ? atoi(env) : 1;
    RETURN(OK);
}

API CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    ENTER("cuDeviceGet");
    const char *env = getenv("FAKE_CUDA_DEVICES");
    int count = env && *env ? atoi(env) : 1;
    if (!initialized)
        RETURN(NOT_INITIALIZED);
    if (ordinal < 0 || ordinal >= count)
        RETURN(INVALID_VALUE);
    *dev = ordinal;
    RETURN(OK);
}

API CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    ENTER("cuDeviceGetAttribute");
    (void)dev;
    const char *env = getenv("FAKE_CUDA_CC");
    int cc = env && *env ? atoi(env) : 90;
    if (attribute == 75)
        *value = cc / 10;
    else if (attribute == 76)
        *value = cc % 10;
    else
        *value = 0;
    RETURN(OK);
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    ENTER("cuDeviceGetName");
    (void)dev;
    snprintf(name, (size_t)len, "Fake GPU");
    RETURN(OK);
}

API CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice dev) {
    ENTER("cuDevicePrimaryCtxRetain");
    (void)dev;
    if (!initialized)
        RETURN(NOT_INITIALIZED);
    *ctx = &primary_ctx;
    ctx_refs++;
    trace("cuDevicePrimaryCtxRetain refs=%d", ctx_refs);
    RETURN(OK);
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    ENTER("cuDevicePrimaryCtxRelease_v2");
    (void)dev;
    if (ctx_refs < 1)
        RETURN(INVALID_CONTEXT);
    ctx_refs--;
    long n = 0;
    for (alloc_t *a = allocs; a; a = a->next)
        n++;
    trace("cuDevicePrimaryCtxRelease refs=%d allocations=%ld modules=%ld streams=%ld events=%ld "
          "graphs=%ld execs=%ld", ctx_refs, n, live_modules, live_streams, live_events,
          live_graphs, live_execs);
    RETURN(OK);
}

API CUresult cuCtxGetCurrent(void **ctx) {
    ENTER("cuCtxGetCurrent");
    *ctx = current;
    RETURN(OK);
}

API CUresult cuCtxSetCurrent(void *ctx) {
    ENTER("cuCtxSetCurrent");
    if (ctx && ctx != &primary_ctx)
        RETURN(INVALID_CONTEXT);
    current = ctx;
    RETURN(OK);
}

/* ------------------------------------------------------------------ modules, functions */

static size_t image_size(const unsigned char *p) {
    if (!memcmp(p, "\x7f" "ELF", 4) && p[4] == 2) {      /* ELF64: its tables end it */
        uint64_t shoff, phoff;
        uint16_t phentsize, phnum, shentsize, shnum;
        memcpy(&phoff, p + 0x20, 8);
        memcpy(&shoff, p + 0x28, 8);
        memcpy(&phentsize, p + 0x36, 2);
        memcpy(&phnum, p + 0x38, 2);
        memcpy(&shentsize, p + 0x3a, 2);
        memcpy(&shnum, p + 0x3c, 2);
        uint64_t sh = shoff + (uint64_t)shentsize * shnum, ph = phoff + (uint64_t)phentsize * phnum;
        return (size_t)(sh > ph ? sh : ph);
    }
    return strlen((const char *)p);
}

API CUresult cuModuleLoadData(void **module, const void *image) {
    ENTER("cuModuleLoadData");
    NEED_CONTEXT();
    if (!image)
        RETURN(INVALID_VALUE);
    module_t *m = xcalloc(1, sizeof *m);
    m->id = next_module++;
    m->bytes = image_size(image);
    char head[40] = {0};
    size_t k = 0;
    for (const unsigned char *p = image; k < 16 && k < m->bytes; k++)
        snprintf(head + 2 * k, 3, "%02x", p[k]);
    live_modules++;
    *module = m;
    trace("cuModuleLoadData module=%d bytes=%zu head=%s", m->id, m->bytes, head);
    RETURN(OK);
}

API CUresult cuModuleUnload(void *module) {
    ENTER("cuModuleUnload");
    NEED_CONTEXT();
    module_t *m = module;
    if (!m)
        RETURN(INVALID_HANDLE);
    for (fn_t *f = m->functions, *next; f; f = next) {
        next = f->next;
        free(f);
    }
    trace("cuModuleUnload module=%d", m->id);
    free(m);
    live_modules--;
    RETURN(OK);
}

API CUresult cuModuleGetFunction(void **function, void *module, const char *name) {
    ENTER("cuModuleGetFunction");
    NEED_CONTEXT();
    module_t *m = module;
    if (!m || !name)
        RETURN(INVALID_VALUE);
    fn_t *f = m->functions;
    while (f && strcmp(f->name, name))
        f = f->next;
    if (!f) {
        f = xcalloc(1, sizeof *f);
        snprintf(f->name, sizeof f->name, "%s", name);
        f->max_shared = 48 * 1024;
        f->next = m->functions;
        m->functions = f;
    }
    *function = f;
    trace("cuModuleGetFunction module=%d name=%s", m->id, name);
    RETURN(OK);
}

API CUresult cuFuncGetAttribute(int *value, int attribute, void *function) {
    ENTER("cuFuncGetAttribute");
    NEED_CONTEXT();
    fn_t *f = function;
    if (!f)
        RETURN(INVALID_HANDLE);
    const char *env = getenv("FAKE_CUDA_MAX_THREADS");
    if (attribute == 0)
        *value = env && *env ? atoi(env) : 1024;
    else if (attribute == 8)
        *value = f->max_shared;
    else
        *value = 0;
    RETURN(OK);
}

API CUresult cuFuncSetAttribute(void *function, int attribute, int value) {
    ENTER("cuFuncSetAttribute");
    NEED_CONTEXT();
    fn_t *f = function;
    if (!f)
        RETURN(INVALID_HANDLE);
    trace("cuFuncSetAttribute name=%s attribute=%d value=%d", f->name, attribute, value);
    if (attribute == 8) {
        if (value < 0 || value > 227 * 1024)
            RETURN(INVALID_VALUE);
        f->max_shared = value;
    }
    RETURN(OK);
}

/* ------------------------------------------------------------------ memory */

API CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes) {
    ENTER("cuMemAlloc_v2");
    NEED_CONTEXT();
    if (!bytes)
        RETURN(INVALID_VALUE);
    alloc_t *a = xcalloc(1, sizeof *a);
    a->bytes = bytes;
    a->p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!a->p)
        abort();
    memset(a->p, 0xA5, bytes);         /* garbage, as fresh device memory */
    a->next = allocs;
    allocs = a;
    *ptr = (CUdeviceptr)(uintptr_t)a->p;
    trace("cuMemAlloc ptr=0x%llx bytes=%zu", *ptr, bytes);
    RETURN(OK);
}

API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    ENTER("cuMemFree_v2");
    NEED_CONTEXT();
    for (alloc_t **pa = &allocs; *pa; pa = &(*pa)->next) {
        if ((CUdeviceptr)(uintptr_t)(*pa)->p == ptr) {
            alloc_t *a = *pa;
            *pa = a->next;
            trace("cuMemFree ptr=0x%llx bytes=%zu", ptr, a->bytes);
            free(a->p);
            free(a);
            RETURN(OK);
        }
    }
    trace("cuMemFree ptr=0x%llx INVALID", ptr);
    RETURN(INVALID_VALUE);
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    ENTER("cuMemGetInfo_v2");
    NEED_CONTEXT();
    *free_bytes = (size_t)1 << 30;
    *total = (size_t)16 << 30;
    RETURN(OK);
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, void *stream) {
    ENTER("cuMemcpyHtoDAsync_v2");
    NEED_CONTEXT();
    if (capturing(stream))
        RETURN(CAPTURE_UNSUPPORTED);
    if (!valid(dst, bytes) || !src)
        RETURN(INVALID_VALUE);
    memcpy((void *)(uintptr_t)dst, src, bytes);
    trace("cuMemcpyHtoD dst=0x%llx bytes=%zu stream=%d", dst, bytes, stream_id(stream));
    RETURN(OK);
}

API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, void *stream) {
    ENTER("cuMemcpyDtoHAsync_v2");
    NEED_CONTEXT();
    if (capturing(stream))
        RETURN(CAPTURE_UNSUPPORTED);
    if (!valid(src, bytes) || !dst)
        RETURN(INVALID_VALUE);
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    trace("cuMemcpyDtoH src=0x%llx bytes=%zu stream=%d", src, bytes, stream_id(stream));
    RETURN(OK);
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void *stream) {
    ENTER("cuMemcpyDtoDAsync_v2");
    NEED_CONTEXT();
    if (capturing(stream))
        RETURN(CAPTURE_UNSUPPORTED);
    if (!valid(dst, bytes) || !valid(src, bytes))
        RETURN(INVALID_VALUE);
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    trace("cuMemcpyDtoD dst=0x%llx src=0x%llx bytes=%zu stream=%d", dst, src, bytes,
          stream_id(stream));
    RETURN(OK);
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, void *stream) {
    ENTER("cuMemsetD8Async");
    NEED_CONTEXT();
    if (capturing(stream))
        RETURN(CAPTURE_UNSUPPORTED);
    if (!valid(dst, bytes))
        RETURN(INVALID_VALUE);
    memset((void *)(uintptr_t)dst, value, bytes);
    trace("cuMemsetD8 dst=0x%llx value=%u bytes=%zu stream=%d", dst, value, bytes,
          stream_id(stream));
    RETURN(OK);
}

/* ------------------------------------------------------------------ streams, events */

API CUresult cuStreamCreate(void **stream, unsigned int flags) {
    ENTER("cuStreamCreate");
    NEED_CONTEXT();
    stream_t *s = xcalloc(1, sizeof *s);
    s->id = next_stream++;
    live_streams++;
    *stream = s;
    trace("cuStreamCreate stream=%d flags=%u", s->id, flags);
    RETURN(OK);
}

API CUresult cuStreamDestroy_v2(void *stream) {
    ENTER("cuStreamDestroy_v2");
    NEED_CONTEXT();
    stream_t *s = stream;
    if (!s)
        RETURN(INVALID_HANDLE);
    trace("cuStreamDestroy stream=%d", s->id);
    free(s);
    live_streams--;
    RETURN(OK);
}

API CUresult cuStreamSynchronize(void *stream) {
    ENTER("cuStreamSynchronize");
    NEED_CONTEXT();
    if (capturing(stream))
        RETURN(CAPTURE_UNSUPPORTED);
    trace("cuStreamSynchronize stream=%d", stream_id(stream));
    RETURN(OK);
}

API CUresult cuEventCreate(void **event, unsigned int flags) {
    ENTER("cuEventCreate");
    NEED_CONTEXT();
    (void)flags;
    event_t *e = xcalloc(1, sizeof *e);
    e->id = next_event++;
    live_events++;
    *event = e;
    RETURN(OK);
}

API CUresult cuEventDestroy_v2(void *event) {
    ENTER("cuEventDestroy_v2");
    NEED_CONTEXT();
    if (!event)
        RETURN(INVALID_HANDLE);
    free(event);
    live_events--;
    RETURN(OK);
}

API CUresult cuEventRecord(void *event, void *stream) {
    ENTER("cuEventRecord");
    NEED_CONTEXT();
    if (!event)
        RETURN(INVALID_HANDLE);
    if (capturing(stream))
        RETURN(CAPTURE_UNSUPPORTED);
    RETURN(OK);
}

API CUresult cuEventElapsedTime_v2(float *ms, void *start, void *end) {
    ENTER("cuEventElapsedTime_v2");
    NEED_CONTEXT();
    if (!start || !end)
        RETURN(INVALID_HANDLE);
    *ms = 0.25f;
    RETURN(OK);
}

/* ------------------------------------------------------------------ launches, graphs */

static void hexdump(const unsigned char *p, size_t n, char *out) {
    for (size_t k = 0; k < n; k++)
        sprintf(out + 2 * k, "%02x", p[k]);
    out[2 * n] = 0;
}

/* Run a launch (the fake kernels); 0 or an error. Under the lock. */
static CUresult execute(const rec_t *r, int stream, int graph) {
    char hex[2 * 1024 + 1];
    hexdump(r->args, r->nargs < 1024 ? r->nargs : 1024, hex);
    char graph_id[16] = "-";
    if (graph)
        snprintf(graph_id, sizeof graph_id, "%d", graph);
    trace("launch kernel=%s grid=%u,%u,%u block=%u,%u,%u shared=%u stream=%d graph=%s args=%s",
          r->fn->name, r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1],
          r->block[2], r->shared, stream, graph_id, hex);
    if (!strncmp(r->fn->name, "fake_copy", 9)) {
        if (r->nargs != 28)
            return INVALID_VALUE;
        CUdeviceptr dst, src;
        int64_t count;
        int32_t elem;
        memcpy(&dst, r->args, 8);
        memcpy(&src, r->args + 8, 8);
        memcpy(&count, r->args + 16, 8);
        memcpy(&elem, r->args + 24, 4);
        size_t n = (size_t)count * (size_t)elem;
        if (count < 0 || elem < 0 || !valid(dst, n) || !valid(src, n))
            return ILLEGAL_ADDRESS;
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    } else if (!strncmp(r->fn->name, "fake_add", 8)) {
        if (r->nargs != 32)
            return INVALID_VALUE;
        CUdeviceptr dst, a, b;
        int64_t n;
        memcpy(&dst, r->args, 8);
        memcpy(&a, r->args + 8, 8);
        memcpy(&b, r->args + 16, 8);
        memcpy(&n, r->args + 24, 8);
        size_t bytes = (size_t)n * 4;
        if (n < 0 || !valid(dst, bytes) || !valid(a, bytes) || !valid(b, bytes))
            return ILLEGAL_ADDRESS;
        float *d = (float *)(uintptr_t)dst;
        const float *x = (const float *)(uintptr_t)a, *y = (const float *)(uintptr_t)b;
        for (int64_t i = 0; i < n; i++)
            d[i] = x[i] + y[i];
    }
    return OK;
}

static void push(graph_t *g, const rec_t *r) {
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 8;
        g->recs = xrealloc(g->recs, g->cap * sizeof *g->recs);
    }
    rec_t *copy = &g->recs[g->n++];
    *copy = *r;
    copy->args = xmalloc(r->nargs ? r->nargs : 1);
    memcpy(copy->args, r->args, r->nargs);
}

static void free_graph(graph_t *g) {
    for (size_t k = 0; k < g->n; k++)
        free(g->recs[k].args);
    free(g->recs);
    free(g);
}

API CUresult cuLaunchKernel(void *function, unsigned int gx, unsigned int gy, unsigned int gz,
                            unsigned int bx, unsigned int by, unsigned int bz,
                            unsigned int shared, void *stream, void **params, void **extra) {
    ENTER("cuLaunchKernel");
    NEED_CONTEXT();
    fn_t *f = function;
    if (!f)
        RETURN(INVALID_HANDLE);
    if (params)                        /* the runtime passes a packed buffer in `extra` */
        RETURN(INVALID_VALUE);
    rec_t r = {f, {gx, gy, gz}, {bx, by, bz}, shared, NULL, 0};
    int pointer = 0, size = 0;
    for (size_t k = 0; extra && extra[k] != (void *)0; k += 2) {
        if (extra[k] == (void *)1) {
            r.args = extra[k + 1];
            pointer = 1;
        } else if (extra[k] == (void *)2) {
            r.nargs = *(size_t *)extra[k + 1];
            size = 1;
        } else {
            RETURN(INVALID_VALUE);
        }
    }
    if (extra && (!pointer || !size))
        RETURN(INVALID_VALUE);
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long)bx * by * bz > 1024 ||
        gy > 65535 || gz > 65535)
        RETURN(INVALID_VALUE);
    if ((int)shared > f->max_shared)
        RETURN(INVALID_VALUE);
    stream_t *s = stream;
    if (capturing(s)) {
        char hex[2 * 1024 + 1];
        hexdump(r.args, r.nargs < 1024 ? r.nargs : 1024, hex);
        trace("capture kernel=%s grid=%u,%u,%u block=%u,%u,%u shared=%u stream=%d args=%s",
              f->name, gx, gy, gz, bx, by, bz, shared, s->id, hex);
        push(s->graph, &r);
        RETURN(OK);
    }
    RETURN(execute(&r, stream_id(s), 0));
}

API CUresult cuStreamBeginCapture_v2(void *stream, int mode) {
    ENTER("cuStreamBeginCapture_v2");
    NEED_CONTEXT();
    stream_t *s = stream;
    if (!s || s->capturing)             /* the legacy NULL stream cannot capture */
        RETURN(CAPTURE_UNSUPPORTED);
    s->capturing = 1;
    s->graph = xcalloc(1, sizeof *s->graph);
    trace("cuStreamBeginCapture stream=%d mode=%d", s->id, mode);
    RETURN(OK);
}

API CUresult cuStreamEndCapture(void *stream, void **graph) {
    ENTER("cuStreamEndCapture");
    NEED_CONTEXT();
    stream_t *s = stream;
    if (!s || !s->capturing)
        RETURN(INVALID_VALUE);
    graph_t *g = s->graph;
    g->id = next_graph++;
    s->capturing = 0;
    s->graph = NULL;
    live_graphs++;
    *graph = g;
    trace("cuStreamEndCapture stream=%d graph=%d launches=%zu", s->id, g->id, g->n);
    RETURN(OK);
}

#ifndef FAKE_CUDA_OLD_DRIVER   /* -DFAKE_CUDA_OLD_DRIVER: a driver older than CUDA 11.4 */
API CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    ENTER("cuGraphInstantiateWithFlags");
    NEED_CONTEXT();
    graph_t *g = graph;
    if (!g || flags)
        RETURN(INVALID_VALUE);
    graph_t *e = xcalloc(1, sizeof *e);
    e->id = next_exec++;
    for (size_t k = 0; k < g->n; k++)
        push(e, &g->recs[k]);
    live_execs++;
    *exec = e;
    trace("cuGraphInstantiate graph=%d exec=%d launches=%zu", g->id, e->id, e->n);
    RETURN(OK);
}
#endif

API CUresult cuGraphLaunch(void *exec, void *stream) {
    ENTER("cuGraphLaunch");
    NEED_CONTEXT();
    graph_t *e = exec;
    if (!e)
        RETURN(INVALID_HANDLE);
    if (capturing(stream))
        RETURN(CAPTURE_UNSUPPORTED);
    trace("cuGraphLaunch exec=%d stream=%d", e->id, stream_id(stream));
    for (size_t k = 0; k < e->n; k++) {
        CUresult rc = execute(&e->recs[k], stream_id(stream), e->id);
        if (rc)
            RETURN(rc);
    }
    RETURN(OK);
}

API CUresult cuGraphExecDestroy(void *exec) {
    ENTER("cuGraphExecDestroy");
    NEED_CONTEXT();
    graph_t *e = exec;
    if (!e)
        RETURN(INVALID_HANDLE);
    trace("cuGraphExecDestroy exec=%d", e->id);
    free_graph(e);
    live_execs--;
    RETURN(OK);
}

API CUresult cuGraphDestroy(void *graph) {
    ENTER("cuGraphDestroy");
    NEED_CONTEXT();
    graph_t *g = graph;
    if (!g)
        RETURN(INVALID_HANDLE);
    trace("cuGraphDestroy graph=%d", g->id);
    free_graph(g);
    live_graphs--;
    RETURN(OK);
}

/* ------------------------------------------------------------------ errors, test hooks */

API CUresult cuGetErrorName(CUresult error, const char **name) {
    static const struct { int code; const char *name; } names[] = {
        {OK, "CUDA_SUCCESS"}, {INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
        {OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
        {NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"}, {NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
        {INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
        {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"}, {218, "CUDA_ERROR_INVALID_PTX"},
        {INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"}, {NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
        {ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"}, {719, "CUDA_ERROR_LAUNCH_FAILED"},
        {CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
        {CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (names[k].code == error) {
            *name = names[k].name;
            return OK;
        }
    *name = NULL;
    return INVALID_VALUE;
}

API long fake_cuda_live(const char *what) {
    pthread_mutex_lock(&lock);
    long n = -1;
    if (!strcmp(what, "allocations")) {
        n = 0;
        for (alloc_t *a = allocs; a; a = a->next)
            n++;
    } else if (!strcmp(what, "modules")) {
        n = live_modules;
    } else if (!strcmp(what, "streams")) {
        n = live_streams;
    } else if (!strcmp(what, "events")) {
        n = live_events;
    } else if (!strcmp(what, "graphs")) {
        n = live_graphs;
    } else if (!strcmp(what, "execs")) {
        n = live_execs;
    } else if (!strcmp(what, "ctx_refs")) {
        n = ctx_refs;
    }
    pthread_mutex_unlock(&lock);
    return n;
}
