/* cuda.c -- the cuda path's contexts and passes, as the Python cuda runtime
 * (hidetc/backends/runtime/cuda/: executor.py, context.py) does them. The model they run
 * is loaded by cuda_model.c; the driver is reached through cuda_driver.c.
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
 * Assumes: a context is used by one thread at a time (runtime.c's busy flag); the model
 * is immutable. Guarantees: every pass ends with its stream synchronised, failed or not,
 * so nothing of it is in flight when the caller regains control; errors as
 * cuda_driver.h says.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_model.h"

static const int64_t HX_MAX_GRID[3] = {2147483647LL, 65535, 65535};

/* ------------------------------------------------------------------ state */

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

/* ------------------------------------------------------------------ arguments */

/* Pack a launch's arguments into buf (8-byte aligned); its size. */
static size_t pack(const hidetc_context *c, const hx_launch *launch, const CUdeviceptr *ins,
                   const CUdeviceptr *outs, uint8_t *buf) {
    const struct hx_cuda_model *cm = c->model->cuda;
    const struct hx_cuda_context *cc = c->cuda;
    size_t off = 0;
    for (uint32_t a = 0; a < launch->nargs; a++) {
        const hx_arg *arg = &launch->args[a];
        size_t size = hx_cuda_arg_size(arg->kind);
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
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, call, "zeroing the %s (%zu bytes)",
                          what, bytes);
    return HIDETC_OK;
}

static hidetc_status own_arena(hidetc_context *c) {
    const struct hx_cuda_model *cm = c->model->cuda;
    struct hx_cuda_context *cc = c->cuda;
    size_t bytes = (size_t)c->model->plan.arena_bytes;
    hidetc_status st = hx_cu_alloc(&cm->cu, &cc->own_arena, bytes, "activation arena");
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
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuStreamCreate",
                          "%s: a context's stream", m->dir);
    }
    cc->stream = c->options.stream ? (CUstream)c->options.stream : cc->own;
    rc = cm->cu.EventCreate(&cc->start, CU_EVENT_DEFAULT);
    if (rc == CUDA_SUCCESS)
        rc = cm->cu.EventCreate(&cc->end, CU_EVENT_DEFAULT);
    if (rc != CUDA_SUCCESS)
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuEventCreate",
                          "%s: a context's events", m->dir);
    hidetc_status st = own_arena(c);
    if (st != HIDETC_OK)
        return st;
    if (!cc->io_on_device) {
        st = hx_cu_alloc(&cm->cu, &cc->io, cm->io_bytes, "input and output buffers");
        if (st == HIDETC_OK)
            st = zero(c, cc->io, cm->io_bytes < HX_ALIGN ? HX_ALIGN : cm->io_bytes,
                      "input and output buffers");
        if (st != HIDETC_OK)
            return st;
        size_t off = 0;
        for (uint32_t i = 0; i < plan->ninputs; i++) {
            cc->in_dev[i] = cc->io + off;
            off += hx_cuda_round_up(cm->in_max[i]);
        }
        for (uint32_t i = 0; i < plan->noutputs; i++) {
            cc->out_dev[i] = cc->io + off;
            off += hx_cuda_round_up(cm->out_max[i]);
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
    hx_cu_current cur;
    hidetc_status st = hx_cu_enter(&cm->cu, &cur);
    if (st != HIDETC_OK)
        return st;
    st = context_setup(c);     /* on failure hidetc_context_free -> hx_cuda_context_free */
    hx_cu_leave(&cm->cu, &cur);
    return st;
}

void hx_cuda_context_free(hidetc_context *c) {
    struct hx_cuda_context *cc = c->cuda;
    const struct hx_cuda_model *cm = c->model->cuda;
    if (!cc)
        return;
    if (cm && cm->cu.ctx) {
        hx_cu_current cur;
        int entered = hx_cu_enter(&cm->cu, &cur) == HIDETC_OK;
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
            hx_cu_leave(&cm->cu, &cur);
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
    hx_cu_current cur;
    hidetc_status st = hx_cu_enter(&cm->cu, &cur);
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
    hx_cu_leave(&cm->cu, &cur);
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
            return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, call, "launch %u (%s, grid [%u, "
                              "%u, %u], block [%u, %u, %u], %u B dynamic shared memory)", l,
                              launch->kernel, grid[0], grid[1], grid[2], launch->block[0],
                              launch->block[1], launch->block[2], launch->shared_bytes);
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
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuGraphLaunch", "%s: replaying the "
                          "forward pass", c->model->dir);
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
            return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuMemcpyHtoDAsync", "input '%s' "
                              "(%zu bytes)", plan->inputs[i].name, pass->in_bytes[i]);
    }
    if (c->last_variant != (int)pass->variant && c->last_variant != -2 && v->zeroed_offset >= 0 &&
        v->zeroed_bytes) {
        if (v->zeroed_bytes > cc->arena_bytes ||
            (uint64_t)v->zeroed_offset > cc->arena_bytes - v->zeroed_bytes)
            return hx_fail(HIDETC_ERR_FORMAT, "%s: the kept-zero region lies outside the arena",
                           m->dir);
        rc = cm->cu.MemsetD8Async(cc->arena + (uint64_t)v->zeroed_offset, 0,
                                  (size_t)v->zeroed_bytes, cc->stream);
        if (rc != CUDA_SUCCESS)
            return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuMemsetD8Async", "zeroing the "
                              "kept-zero region of variant %u", pass->variant);
    }
    c->last_variant = -1;             /* until this pass completes: state unknown */
    rc = cm->cu.EventRecord(cc->start, cc->stream);
    if (rc != CUDA_SUCCESS)
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuEventRecord", "timing the pass");
    hidetc_status st = forward(c, v, ins, outs);
    if (st != HIDETC_OK)
        return st;
    rc = cm->cu.EventRecord(cc->end, cc->stream);
    if (rc != CUDA_SUCCESS)
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuEventRecord", "timing the pass");
    /* outputs: copied back (host I/O) or filled from their sources (device I/O) */
    for (uint32_t k = 0; k < plan->noutputs; k++) {
        uint32_t kind = k < v->nsources ? v->sources[k].kind : HX_SRC_KERNEL;
        size_t n = pass->out_bytes[k];
        const hx_source *s = k < v->nsources ? &v->sources[k] : NULL;
        if (!n)
            continue;
        if (kind == HX_SRC_CONSTANT && (s->nbytes > m->weight_bytes || s->nbytes < n ||
                                        s->index > m->weight_bytes - s->nbytes))
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
                return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuMemcpyDtoHAsync",
                                  "output '%s' (%zu bytes)", plan->outputs[k].name, n);
            continue;
        }
        CUdeviceptr from = kind == HX_SRC_INPUT ? ins[s->index]
                           : kind == HX_SRC_OUTPUT ? outs[s->index]
                           : kind == HX_SRC_CONSTANT ? cm->weights + s->index : 0;
        if (!from || from == outs[k])
            continue;
        rc = cm->cu.MemcpyDtoDAsync(outs[k], from, n, cc->stream);
        if (rc != CUDA_SUCCESS)
            return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuMemcpyDtoDAsync", "output '%s' "
                              "(%zu bytes)", plan->outputs[k].name, n);
    }
    rc = cm->cu.StreamSynchronize(cc->stream);
    if (rc != CUDA_SUCCESS)
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuStreamSynchronize", "the forward pass "
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
        return hx_cu_fail(&cm->cu, HIDETC_ERR_DEVICE, rc, "cuEventElapsedTime", "timing the pass");
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
    hx_cu_current cur;
    hidetc_status st = hx_cu_enter(&cm->cu, &cur);
    if (st != HIDETC_OK)
        return st;
    st = run(c, inputs, outputs);
    if (st != HIDETC_OK)
        cm->cu.StreamSynchronize(cc->stream);   /* leave nothing of this pass in flight */
    hx_cu_leave(&cm->cu, &cur);
    return st;
}
