/* cuda_model.c -- loading a model on the cuda path (hx_cuda_model_init / _free), as the
 * Python cuda runtime (hidetc/backends/runtime/cuda/: executor.py, manifest.py) does it.
 *
 * Model (immutable after hx_cuda_model_init, shared by every context and thread): GPU 0
 * (CUDA_VISIBLE_DEVICES selects) and its primary context (cuda_driver.c); one image per
 * module chosen for the GPU's compute capability as manifest.select_image does (its exact
 * cubin, else the newest cubin of the same major and no newer minor, else the PTX when
 * its virtual arch is not newer; below sm_80 or with none of these: HIDETC_ERR_MACHINE);
 * the functions of every launch of every variant, each checked against its block size
 * (CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) and given once the largest dynamic shared
 * memory its launches use where that is over 48 KiB; every launch argument checked
 * against the plan (HIDETC_ERR_FORMAT); the weights uploaded once; the sizes of the
 * staged inputs and outputs at their largest shapes (the dims' max).
 *
 * Assumes: the plan was read and checked by plan.c and the weights mapped (runtime.c).
 * Guarantees: on failure the partial state stays in model->cuda for hx_cuda_model_free,
 * which frees whatever was made; errors as cuda_driver.h says.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_model.h"

#define HX_DEFAULT_SHARED (48 * 1024)     /* dynamic shared memory without opting in */

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
    int number = cm->cu.major * 10 + cm->cu.minor;
    char have[256];
    describe_images(plan, mod, have, sizeof have);
    if (number < 80)
        return hx_fail(HIDETC_ERR_MACHINE, "%s: module '%s' has %s but %s is sm_%d, which "
                       "hidetc does not support (the cuda target needs sm_80 or newer); use "
                       "--target cpu", m->dir, mod->name, have, cm->cu.gpu, number);
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
            if (v > 0 && !suffix && v / 10 == cm->cu.major && v <= number && v > best_number) {
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
                   "with --arch sm_%d", m->dir, mod->name, have, cm->cu.gpu, number, number);
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
        size_t size = hx_cuda_arg_size(arg->kind);
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

/* ------------------------------------------------------------------ model */

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
            return hx_cu_fail(&cm->cu, machine ? HIDETC_ERR_MACHINE : HIDETC_ERR_DEVICE, rc,
                              "cuModuleLoadData", "%s/%s: loading the %s of module '%s'",
                              m->dir, plan->files[file].path, how, mod->name);
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
                return hx_cu_fail(&cm->cu, rc == CUDA_ERROR_NOT_FOUND ? HIDETC_ERR_FORMAT
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
                    return hx_cu_fail(&cm->cu, HIDETC_ERR_MACHINE, rc, "cuFuncSetAttribute",
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
                return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuFuncGetAttribute",
                                  "%s: launch %u (%s)", m->dir, l, launch->kernel);
            uint32_t threads = launch->block[0] * launch->block[1] * launch->block[2];
            if (threads > (uint32_t)limit)
                return hx_fail(HIDETC_ERR_MACHINE, "%s: launch %u (%s): a block of %u threads "
                               "but the kernel allows at most %d on %s (registers per "
                               "thread)", m->dir, l, launch->kernel, threads, limit, cm->cu.gpu);
        }
    }
    return HIDETC_OK;
}

static hidetc_status upload_weights(hidetc_model *m, struct hx_cuda_model *cm) {
    cm->weight_bytes = m->weight_bytes;
    hidetc_status st = hx_cu_alloc(&cm->cu, &cm->weights, m->weight_bytes, "weights");
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
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, call, "%s: uploading the weights "
                          "(%zu bytes)", m->dir, m->weight_bytes);
    return HIDETC_OK;
}

static size_t largest_bytes(const hx_tensor *t) {
    size_t n = t->elem_bytes;
    for (uint32_t d = 0; d < t->rank; d++)
        n *= (size_t)(t->dim_max[d] > 0 ? t->dim_max[d] : 0);
    return n;
}

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
        cm->io_bytes += hx_cuda_round_up(cm->in_max[i] = largest_bytes(&plan->inputs[i]));
    for (uint32_t i = 0; i < plan->noutputs; i++)
        cm->io_bytes += hx_cuda_round_up(cm->out_max[i] = largest_bytes(&plan->outputs[i]));
    hidetc_status st = hx_cu_open(&cm->cu, m->dir);
    if (st != HIDETC_OK)
        return st;
    hx_cu_current cur;
    st = hx_cu_enter(&cm->cu, &cur);
    if (st != HIDETC_OK)
        return st;
    st = load_modules(m, cm);
    if (st == HIDETC_OK)
        st = load_functions(m, cm);
    if (st == HIDETC_OK)
        st = upload_weights(m, cm);
    hx_cu_leave(&cm->cu, &cur);
    return st;
}

void hx_cuda_model_free(hidetc_model *m) {
    struct hx_cuda_model *cm = m->cuda;
    if (!cm)
        return;
    if (cm->cu.ctx) {
        hx_cu_current cur;
        int entered = hx_cu_enter(&cm->cu, &cur) == HIDETC_OK;
        if (cm->weights)
            cm->cu.MemFree(cm->weights);
        for (uint32_t k = 0; cm->modules && k < cm->nmodules; k++)
            if (cm->modules[k])
                cm->cu.ModuleUnload(cm->modules[k]);
        if (entered)
            hx_cu_leave(&cm->cu, &cur);
        cm->cu.DevicePrimaryCtxRelease(cm->cu.device);
    }
    for (uint32_t v = 0; cm->functions && v < m->plan.nvariants; v++)
        free(cm->functions[v]);
    free(cm->functions);
    free(cm->modules);
    free(cm);
    m->cuda = NULL;
}
