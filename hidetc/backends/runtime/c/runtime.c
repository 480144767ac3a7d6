/* runtime.c -- the public API of hidetc.h: errors, loading a model, contexts, and the
 * cpu path (the kernel library's launchers, `hidetc_forward` and one per dispatch
 * variant, as the Python runtime calls them: inputs, outputs, arena, weights, sizes).
 *
 * Load: plan.bin read and checked (plan.c); every file it lists checked for size and
 * sha256 (unless HIDETC_LOAD_SKIP_CHECKSUMS); the weights mapped read-only once; on the
 * cpu the machine's flags checked against the kernels' and the library opened from the
 * very bytes that were hashed (a memfd: a file changed after the check, or an artifact
 * rebuilt at the same path in the same process, cannot slip in; kept open for the
 * process, one copy per content), libgomp's wait policy
 * set as the Python runtime sets it (`wait_policy`) where the user set none and libgomp
 * has not started. Nothing of the model changes after load.
 *
 * Contexts: an arena each (64-byte aligned, zeroed once; or the caller's, zeroed when
 * set), the input shapes and the pass they bind (plan.c), the intra-op thread count.
 * Kept-zero scratch: every dispatch variant lays out its own arena, so when a context's
 * pass changes variant the new variant's kept-zero region is zeroed first.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#ifndef HX_VERSION
#define HX_VERSION "0.1.0"
#endif

static _Thread_local char last_error[1024];
static _Thread_local int omp_threads_set;   /* the OpenMP team size this thread last set */

hidetc_status hx_fail(hidetc_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    for (char *p = last_error; *p; p++)      /* one line, whatever a name holds */
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    return status;
}

/* A failing call's message kept across the cleanup that follows it (which may fail
   on its own and overwrite the thread's message). */
typedef struct { char text[sizeof last_error]; } saved_error;

static void save_error(saved_error *saved) { memcpy(saved->text, last_error, sizeof saved->text); }

static hidetc_status restore_error(const saved_error *saved, hidetc_status status) {
    memcpy(last_error, saved->text, sizeof saved->text);
    return status;
}

int hidetc_abi_version(void) { return HIDETC_ABI_VERSION; }
const char *hidetc_version(void) { return HX_VERSION; }
const char *hidetc_last_error(void) { return last_error; }

const char *hidetc_status_name(hidetc_status status) {
    static const char *names[] = {"ok", "argument", "io", "format", "version", "checksum",
                                  "machine", "shape", "memory", "busy", "device", "internal"};
    return (unsigned)status < sizeof names / sizeof names[0] ? names[status] : "unknown";
}

/* ------------------------------------------------------------------ files */

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void hex(const uint8_t *h, char *out) {
    for (int i = 0; i < HX_HASH_BYTES; i++)
        sprintf(out + 2 * i, "%02x", h[i]);
}

/* The file's bytes mapped read-only (*size: its length), checked against the plan. */
static hidetc_status map_file(const hidetc_model *m, const hx_file *f, int verify,
                              void **data, size_t *size) {
    char *path = join(m->dir, f->path);
    if (!path)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    hidetc_status status = HIDETC_OK;
    *data = NULL;
    *size = 0;
    if (fd < 0 || fstat(fd, &st)) {
        status = hx_fail(HIDETC_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    } else if ((uint64_t)st.st_size != f->size) {
        status = hx_fail(HIDETC_ERR_CHECKSUM, "%s: %lld bytes, the plan recorded %llu (the "
                         "file was changed, or belongs to another compile)", path,
                         (long long)st.st_size, (unsigned long long)f->size);
    } else if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            status = hx_fail(HIDETC_ERR_IO, "%s: cannot map (%s)", path, strerror(errno));
        } else {
            *data = p;
            *size = (size_t)st.st_size;
        }
    }
    if (status == HIDETC_OK && verify) {
        uint8_t digest[HX_HASH_BYTES];
        hx_sha256(*data ? *data : "", *size, digest);
        if (memcmp(digest, f->sha256, HX_HASH_BYTES)) {
            char want[2 * HX_HASH_BYTES + 1], got[2 * HX_HASH_BYTES + 1];
            hex(f->sha256, want);
            hex(digest, got);
            status = hx_fail(HIDETC_ERR_CHECKSUM, "%s: sha256 %.12s..., the plan recorded "
                             "%.12s... (the file was changed, or belongs to another compile)",
                             path, got, want);
        }
    }
    if (status != HIDETC_OK && *data) {
        munmap(*data, *size);
        *data = NULL;
    }
    if (fd >= 0)
        close(fd);
    free(path);
    return status;
}

/* ------------------------------------------------------------------ machine */

static hidetc_status check_cpu_flags(const hx_plan *plan) {
    if (!plan->nflags)
        return HIDETC_OK;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return HIDETC_OK;          /* as the Python runtime: assume the flags where unknown */
    char *line = NULL;
    size_t cap = 0;
    hidetc_status status = HIDETC_OK;
    while (getline(&line, &cap, f) > 0) {
        if (strncmp(line, "flags", 5))
            continue;
        for (uint32_t i = 0; i < plan->nflags && status == HIDETC_OK; i++) {
            const char *want = plan->cpu_flags[i];
            size_t n = strlen(want);
            const char *p = line;
            int found = 0;
            while ((p = strstr(p, want)) != NULL) {
                if ((p == line || p[-1] == ' ' || p[-1] == '\t' || p[-1] == ':') &&
                    (p[n] == ' ' || p[n] == '\n' || p[n] == '\0')) {
                    found = 1;
                    break;
                }
                p += n;
            }
            if (!found)
                status = hx_fail(HIDETC_ERR_MACHINE, "the artifact's kernels use %s, which "
                                 "this CPU lacks: compile it for this machine", want);
        }
        break;
    }
    free(line);
    fclose(f);
    return status;
}

static int usable_cores(void) {
    const char *env = getenv("OMP_NUM_THREADS");   /* its first value, as libgomp reads it */
    if (env) {
        char *end;
        while (*env == ' ')
            env++;
        long n = strtol(env, &end, 10);
        while (*end == ' ')
            end++;
        if (end != env && n > 0 && n < 1 << 20 && (*end == '\0' || *end == ','))
            return (int)n;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void openmp_wait_policy(const hx_plan *plan) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || !plan->spin_count)
        return;
    void *gomp = dlopen("libgomp.so.1", RTLD_NOLOAD | RTLD_LAZY);
    if (gomp) {                     /* started already: its settings are fixed */
        dlclose(gomp);
        return;
    }
    char value[16];
    snprintf(value, sizeof value, "%u", plan->spin_count);
    setenv("GOMP_SPINCOUNT", value, 0);
}

/* Kernel libraries opened in this process, by content. A library is never closed: its
 * kernels register a thread-exit destructor for their per-thread scratch stacks
 * (codegen/c_scratch.py), which must stay callable; loading the same content again
 * reuses the handle, so a process that loads and frees a model over and over holds one
 * copy (and one memfd) of each distinct library. */
typedef struct opened { uint8_t sha256[HX_HASH_BYTES]; void *handle; struct opened *next; } opened;
static opened *libraries;
static pthread_mutex_t libraries_lock = PTHREAD_MUTEX_INITIALIZER;

static int libraries_has(const uint8_t *digest) {
    for (opened *o = libraries; o; o = o->next)
        if (!memcmp(o->sha256, digest, HX_HASH_BYTES))
            return 1;
    return 0;
}

/* dlopen the library from the bytes that were checked (see the file's docstring) */
static void *open_library(const char *path, const void *data, size_t size,
                          const uint8_t digest[HX_HASH_BYTES]) {
    pthread_mutex_lock(&libraries_lock);
    void *handle = NULL;
    for (opened *o = libraries; o && !handle; o = o->next)
        if (!memcmp(o->sha256, digest, HX_HASH_BYTES))
            handle = o->handle;
    int fd = handle ? -1 : memfd_create("hidetc-kernels", MFD_CLOEXEC);
    if (fd >= 0) {
        size_t done = 0;
        while (done < size) {
            ssize_t n = write(fd, (const char *)data + done, size - done);
            if (n <= 0)
                break;
            done += (size_t)n;
        }
        char name[64];
        snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
        handle = done == size ? dlopen(name, RTLD_NOW | RTLD_LOCAL) : NULL;
        if (!handle)      /* else kept open: the loader knows a library by its name, so */
            close(fd);    /* a later library must not get the same /proc/self/fd/N */
    }
    if (!handle && !libraries_has(digest))
        handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle && !libraries_has(digest)) {
        opened *o = malloc(sizeof *o);
        if (o) {
            memcpy(o->sha256, digest, HX_HASH_BYTES);
            o->handle = handle;
            o->next = libraries;
            libraries = o;
        }
    }
    pthread_mutex_unlock(&libraries_lock);
    return handle;
}

static hidetc_status load_cpu(hidetc_model *m, int verify) {
    hx_plan *plan = &m->plan;
    hidetc_status status = check_cpu_flags(plan);
    if (status != HIDETC_OK)
        return status;
    if (plan->library_file < 0)
        return hx_fail(HIDETC_ERR_FORMAT, "%s: a cpu artifact without a kernel library", m->dir);
    const hx_file *lib = &plan->files[plan->library_file];
    void *data;
    size_t size;
    status = map_file(m, lib, verify, &data, &size);
    if (status != HIDETC_OK)
        return status;
    openmp_wait_policy(plan);
    char *path = join(m->dir, lib->path);
    /* the bytes' sha256: checked equal to the plan's by map_file, else computed here */
    uint8_t digest[HX_HASH_BYTES];
    if (verify)
        memcpy(digest, lib->sha256, HX_HASH_BYTES);
    else
        hx_sha256(data, size, digest);
    m->library = path ? open_library(path, data, size, digest) : NULL;
    munmap(data, size);
    if (!m->library) {
        const char *why = dlerror();
        status = hx_fail(HIDETC_ERR_IO, "%s: cannot load (%s)", path ? path : lib->path,
                         why ? why : "out of memory");
        free(path);
        return status;
    }
    free(path);
    m->forwards = calloc(plan->nvariants, sizeof *m->forwards);
    if (!m->forwards)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    for (uint32_t v = 0; v < plan->nvariants; v++) {
        *(void **)&m->forwards[v] = dlsym(m->library, plan->variants[v].forward);
        if (!m->forwards[v])
            return hx_fail(HIDETC_ERR_FORMAT, "%s/%s: no launcher %s", m->dir, lib->path,
                           plan->variants[v].forward);
    }
    *(void **)&m->set_threads = dlsym(m->library, "hidetc_set_threads");
    m->default_threads = usable_cores();
    return HIDETC_OK;
}

/* ------------------------------------------------------------------ model */

hidetc_status hidetc_model_load(const char *dir, unsigned flags, hidetc_model **out) {
    if (!dir || !out)
        return hx_fail(HIDETC_ERR_ARGUMENT, "hidetc_model_load: null argument");
    *out = NULL;
    hidetc_model *m = calloc(1, sizeof *m);
    char *plan_path = join(dir, "plan.bin");
    m = m && (m->dir = strdup(dir)) ? m : (free(m), NULL);
    if (!m || !plan_path) {
        free(plan_path);
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    }
    hidetc_status status = hx_plan_read(plan_path, &m->plan);
    free(plan_path);
    int verify = !(flags & HIDETC_LOAD_SKIP_CHECKSUMS);
    if (status == HIDETC_OK)
        status = map_file(m, &m->plan.files[m->plan.weights_file], verify, &m->weights,
                          &m->weight_bytes);
    if (status == HIDETC_OK) {
        if (!strcmp(m->plan.target, "cpu"))
            status = load_cpu(m, verify);
        else if (!strcmp(m->plan.target, "cuda"))
            status = hx_cuda_model_init(m);
        else
            status = hx_fail(HIDETC_ERR_FORMAT, "%s: unknown target '%s'", dir, m->plan.target);
    }
    if (status != HIDETC_OK) {
        saved_error saved;
        save_error(&saved);
        hidetc_model_free(m);
        return restore_error(&saved, status);
    }
    *out = m;
    return HIDETC_OK;
}

void hidetc_model_free(hidetc_model *m) {
    if (!m)
        return;
    if (m->cuda)
        hx_cuda_model_free(m);
    /* (the kernel library stays open: see `libraries`) */
    free(m->forwards);
    if (m->weights)
        munmap(m->weights, m->weight_bytes);
    hx_plan_free(&m->plan);
    free(m->dir);
    free(m);
}

const char *hidetc_model_target(const hidetc_model *m) { return m ? m->plan.target : ""; }
int hidetc_model_num_inputs(const hidetc_model *m) { return m ? (int)m->plan.ninputs : 0; }
int hidetc_model_num_outputs(const hidetc_model *m) { return m ? (int)m->plan.noutputs : 0; }
size_t hidetc_model_weight_bytes(const hidetc_model *m) { return m ? m->weight_bytes : 0; }

static hidetc_status info(const hx_tensor *t, hidetc_tensor_info *out) {
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->dtype_name = t->dtype_name;
    out->elem_bytes = t->elem_bytes;
    out->rank = (int)t->rank;
    for (uint32_t d = 0; d < t->rank; d++) {
        int fixed = t->dims[d].n == 2 && t->dims[d].words[0] == HX_OP_CONST;
        out->dims[d] = fixed ? t->dims[d].words[1] : -1;
        out->dim_min[d] = t->dim_min[d];
        out->dim_max[d] = t->dim_max[d];
    }
    return HIDETC_OK;
}

hidetc_status hidetc_model_input_info(const hidetc_model *m, int i, hidetc_tensor_info *out) {
    if (!m || !out || i < 0 || (uint32_t)i >= m->plan.ninputs)
        return hx_fail(HIDETC_ERR_ARGUMENT, "input index %d out of range (%u inputs)", i,
                       m ? m->plan.ninputs : 0);
    return info(&m->plan.inputs[i], out);
}

hidetc_status hidetc_model_output_info(const hidetc_model *m, int i, hidetc_tensor_info *out) {
    if (!m || !out || i < 0 || (uint32_t)i >= m->plan.noutputs)
        return hx_fail(HIDETC_ERR_ARGUMENT, "output index %d out of range (%u outputs)", i,
                       m ? m->plan.noutputs : 0);
    return info(&m->plan.outputs[i], out);
}

static const char *dim_name(const hidetc_model *m, const hx_tensor *ts, uint32_t n, int i,
                            int d) {
    if (!m || i < 0 || (uint32_t)i >= n || d < 0 || (uint32_t)d >= ts[i].rank)
        return NULL;
    int32_t symbol = ts[i].symbol[d];
    return symbol >= 0 && (uint32_t)symbol < m->plan.nsymbols ? m->plan.symbols[symbol] : NULL;
}

const char *hidetc_model_input_dim_name(const hidetc_model *m, int i, int d) {
    return m ? dim_name(m, m->plan.inputs, m->plan.ninputs, i, d) : NULL;
}

const char *hidetc_model_output_dim_name(const hidetc_model *m, int i, int d) {
    return m ? dim_name(m, m->plan.outputs, m->plan.noutputs, i, d) : NULL;
}

static int find(const hx_tensor *ts, uint32_t n, const char *name) {
    for (uint32_t i = 0; name && i < n; i++)
        if (!strcmp(ts[i].name, name))
            return (int)i;
    return -1;
}

int hidetc_model_find_input(const hidetc_model *m, const char *name) {
    return m ? find(m->plan.inputs, m->plan.ninputs, name) : -1;
}

int hidetc_model_find_output(const hidetc_model *m, const char *name) {
    return m ? find(m->plan.outputs, m->plan.noutputs, name) : -1;
}

/* ------------------------------------------------------------------ contexts */

static hidetc_status rebind(hidetc_context *c) {
    const hx_plan *plan = &c->model->plan;
    for (uint32_t i = 0; i < plan->ninputs; i++)
        if (c->set_rank[i] < 0) {
            c->pass.ready = 0;
            return HIDETC_OK;          /* not every shape set yet */
        }
    return hx_pass_bind(plan, c->set_rank, (const int64_t(*)[HIDETC_MAX_RANK])c->set_dims,
                        &c->pass);
}

hidetc_status hidetc_context_create(hidetc_model *m, const hidetc_context_options *options,
                                    hidetc_context **out) {
    if (!m || !out)
        return hx_fail(HIDETC_ERR_ARGUMENT, "hidetc_context_create: null argument");
    *out = NULL;
    hidetc_context *c = calloc(1, sizeof *c);
    if (!c)
        return hx_fail(HIDETC_ERR_MEMORY, "out of memory");
    c->model = m;
    if (options)
        c->options = *options;
    if (c->options.threads < 0) {
        free(c);
        return hx_fail(HIDETC_ERR_ARGUMENT, "threads must be >= 0, got %d", options->threads);
    }
    c->last_variant = -1;
    const hx_plan *plan = &m->plan;
    for (uint32_t i = 0; i < plan->ninputs; i++) {   /* a static input's shape is set */
        const hx_tensor *t = &plan->inputs[i];
        int fixed = 1;
        for (uint32_t d = 0; d < t->rank; d++)
            fixed &= t->dim_min[d] == t->dim_max[d];
        c->set_rank[i] = fixed ? (int)t->rank : -1;
        for (uint32_t d = 0; fixed && d < t->rank; d++)
            c->set_dims[i][d] = t->dim_min[d];
    }
    hidetc_status status = rebind(c);
    if (status == HIDETC_OK && !strcmp(plan->target, "cpu")) {
        c->arena_bytes = (size_t)plan->arena_bytes;
        c->own_arena = aligned_alloc(64, (c->arena_bytes + 63) / 64 * 64);
        if (!c->own_arena)
            status = hx_fail(HIDETC_ERR_MEMORY, "cannot allocate the %zu-byte arena",
                             c->arena_bytes);
        else
            memset(c->own_arena, 0, c->arena_bytes);
        c->arena = c->own_arena;
    } else if (status == HIDETC_OK) {
        status = hx_cuda_context_init(c);
    }
    if (status != HIDETC_OK) {
        saved_error saved;
        save_error(&saved);
        hidetc_context_free(c);
        return restore_error(&saved, status);
    }
    *out = c;
    return HIDETC_OK;
}

void hidetc_context_free(hidetc_context *c) {
    if (!c)
        return;
    if (c->cuda)
        hx_cuda_context_free(c);
    free(c->own_arena);
    free(c);
}

hidetc_status hidetc_context_set_input_shape(hidetc_context *c, int i, int rank,
                                             const int64_t *dims) {
    if (!c || i < 0 || (uint32_t)i >= c->model->plan.ninputs || (rank > 0 && !dims))
        return hx_fail(HIDETC_ERR_ARGUMENT, "set_input_shape: input index %d out of range "
                       "or null dims", i);
    const hx_tensor *t = &c->model->plan.inputs[i];
    if (rank < 0 || (uint32_t)rank != t->rank)
        return hx_fail(HIDETC_ERR_SHAPE, "input '%s': expected %u dimensions, got %d", t->name,
                       t->rank, rank);
    for (int d = 0; d < rank; d++)
        if (dims[d] < t->dim_min[d] || dims[d] > t->dim_max[d])
            return hx_fail(HIDETC_ERR_SHAPE, "input '%s' dim %d is %lld, outside %lld..%lld",
                           t->name, d, (long long)dims[d], (long long)t->dim_min[d],
                           (long long)t->dim_max[d]);
    if (atomic_exchange(&c->busy, 1))
        return hx_fail(HIDETC_ERR_BUSY, "this context is running a pass on another thread");
    int64_t saved[HIDETC_MAX_RANK];
    int saved_rank = c->set_rank[i];
    memcpy(saved, c->set_dims[i], sizeof saved);
    memcpy(c->set_dims[i], dims, (size_t)rank * sizeof *dims);
    c->set_rank[i] = rank;
    hidetc_status status = rebind(c);
    if (status != HIDETC_OK) {        /* keep the shapes that were set before */
        memcpy(c->set_dims[i], saved, sizeof saved);
        c->set_rank[i] = saved_rank;
        saved_error saved;
        save_error(&saved);
        rebind(c);
        restore_error(&saved, status);
    }
    atomic_store(&c->busy, 0);
    return status;
}

static hidetc_status need_pass(const hidetc_context *c) {
    if (c->pass.ready)
        return HIDETC_OK;
    const hx_plan *plan = &c->model->plan;
    for (uint32_t i = 0; i < plan->ninputs; i++)
        if (c->set_rank[i] < 0)
            return hx_fail(HIDETC_ERR_SHAPE, "input '%s' has dynamic dimensions: set its shape "
                           "first (hidetc_context_set_input_shape)", plan->inputs[i].name);
    return hx_fail(HIDETC_ERR_SHAPE, "the input shapes set do not make a pass");
}

hidetc_status hidetc_context_output_shape(const hidetc_context *c, int i, int *rank,
                                          int64_t *dims) {
    if (!c || !rank || !dims || i < 0 || (uint32_t)i >= c->model->plan.noutputs)
        return hx_fail(HIDETC_ERR_ARGUMENT, "output_shape: output index %d out of range or "
                       "null argument", i);
    hidetc_status status = need_pass(c);
    if (status != HIDETC_OK)
        return status;
    *rank = (int)c->model->plan.outputs[i].rank;
    memcpy(dims, c->pass.out_dims[i], (size_t)*rank * sizeof *dims);
    return HIDETC_OK;
}

hidetc_status hidetc_context_output_bytes(const hidetc_context *c, int i, size_t *bytes) {
    if (!c || !bytes || i < 0 || (uint32_t)i >= c->model->plan.noutputs)
        return hx_fail(HIDETC_ERR_ARGUMENT, "output_bytes: output index %d out of range or "
                       "null argument", i);
    hidetc_status status = need_pass(c);
    if (status == HIDETC_OK)
        *bytes = c->pass.out_bytes[i];
    return status;
}

hidetc_status hidetc_context_workspace_bytes(const hidetc_context *c, size_t *bytes) {
    if (!c || !bytes)
        return hx_fail(HIDETC_ERR_ARGUMENT, "workspace_bytes: null argument");
    hidetc_status status = need_pass(c);
    if (status == HIDETC_OK)
        *bytes = (size_t)c->model->plan.variants[c->pass.variant].arena_bytes;
    return status;
}

hidetc_status hidetc_context_set_workspace(hidetc_context *c, void *memory, size_t bytes) {
    if (!c)
        return hx_fail(HIDETC_ERR_ARGUMENT, "set_workspace: null context");
    if (memory && ((uintptr_t)memory % 64))
        return hx_fail(HIDETC_ERR_ARGUMENT, "set_workspace: the memory must be 64-byte "
                       "aligned");
    if (atomic_exchange(&c->busy, 1))
        return hx_fail(HIDETC_ERR_BUSY, "this context is running a pass on another thread");
    hidetc_status status = HIDETC_OK;
    if (c->cuda) {
        status = hx_cuda_set_workspace(c, memory, bytes);
    } else if (memory) {
        memset(memory, 0, bytes);
        c->arena = memory;
        c->arena_bytes = bytes;
    } else {
        c->arena = c->own_arena;
        c->arena_bytes = (size_t)c->model->plan.arena_bytes;
        /* the own arena may hold another variant's values where this one keeps zeros */
        c->last_variant = -1;
    }
    if (status == HIDETC_OK && memory)
        c->last_variant = -2;         /* zeroed: no variant's region is dirty */
    atomic_store(&c->busy, 0);
    return status;
}

hidetc_status hidetc_context_set_threads(hidetc_context *c, int threads) {
    if (!c || threads < 0)
        return hx_fail(HIDETC_ERR_ARGUMENT, "set_threads: threads must be >= 0, got %d",
                       threads);
    if (atomic_exchange(&c->busy, 1))
        return hx_fail(HIDETC_ERR_BUSY, "this context is running a pass on another thread");
    c->options.threads = threads;      /* read by the next pass on this context */
    atomic_store(&c->busy, 0);
    return HIDETC_OK;
}

double hidetc_context_last_latency_ms(const hidetc_context *c) { return c ? c->last_ms : 0; }

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static hidetc_status run_cpu(hidetc_context *c, const void *const *inputs,
                             void *const *outputs) {
    hidetc_model *m = c->model;
    const hx_plan *plan = &m->plan;
    const hx_variant *v = &plan->variants[c->pass.variant];
    if (c->arena_bytes < v->arena_bytes)
        return hx_fail(HIDETC_ERR_MEMORY, "the workspace holds %zu bytes, this pass needs "
                       "%llu", c->arena_bytes, (unsigned long long)v->arena_bytes);
    if (c->last_variant != (int)c->pass.variant && c->last_variant != -2 &&
        v->zeroed_offset >= 0)
        memset(c->arena + v->zeroed_offset, 0, (size_t)v->zeroed_bytes);
    int threads = c->options.threads > 0 ? c->options.threads : m->default_threads;
    if (m->set_threads && omp_threads_set != threads) {
        m->set_threads(threads);
        omp_threads_set = threads;
    }
    long long sizes[HX_MAX_SYMBOLS + 1] = {0};
    for (uint32_t s = 0; s < plan->nsymbols; s++)
        sizes[s] = (long long)c->pass.sizes[s];
    double start = now_ms();
    m->forwards[c->pass.variant]((void **)inputs, (void **)outputs, (char *)c->arena,
                                 (char *)m->weights, sizes);
    c->last_ms = now_ms() - start;
    c->last_variant = (int)c->pass.variant;
    for (uint32_t k = 0; k < v->nsources; k++) {
        const hx_source *s = &v->sources[k];
        size_t n = c->pass.out_bytes[k];
        if (s->kind == HX_SRC_INPUT)
            memcpy(outputs[k], inputs[s->index], n);
        else if (s->kind == HX_SRC_OUTPUT)
            memcpy(outputs[k], outputs[s->index], n);
        else if (s->kind == HX_SRC_CONSTANT) {
            if (s->nbytes > m->weight_bytes || s->nbytes < n ||
                s->index > m->weight_bytes - s->nbytes)
                return hx_fail(HIDETC_ERR_FORMAT, "output '%s': its constant lies outside "
                               "the weights", plan->outputs[k].name);
            memcpy(outputs[k], (const char *)m->weights + s->index, n);
        }
    }
    return HIDETC_OK;
}

hidetc_status hidetc_context_run(hidetc_context *c, const void *const *inputs,
                                 void *const *outputs) {
    if (!c || (c->model->plan.ninputs && !inputs) || (c->model->plan.noutputs && !outputs))
        return hx_fail(HIDETC_ERR_ARGUMENT, "run: null argument");
    const hx_plan *plan = &c->model->plan;
    if (atomic_exchange(&c->busy, 1))
        return hx_fail(HIDETC_ERR_BUSY, "this context is running a pass on another thread");
    hidetc_status status = need_pass(c);
    for (uint32_t i = 0; status == HIDETC_OK && i < plan->ninputs; i++)
        if (!inputs[i] && c->pass.in_bytes[i])
            status = hx_fail(HIDETC_ERR_ARGUMENT, "run: input '%s' is a null pointer",
                             plan->inputs[i].name);
    for (uint32_t i = 0; status == HIDETC_OK && i < plan->noutputs; i++)
        if (!outputs[i] && c->pass.out_bytes[i])
            status = hx_fail(HIDETC_ERR_ARGUMENT, "run: output '%s' is a null pointer",
                             plan->outputs[i].name);
    if (status == HIDETC_OK)
        status = c->cuda ? hx_cuda_run(c, inputs, outputs) : run_cpu(c, inputs, outputs);
    atomic_store(&c->busy, 0);
    return status;
}
