/* plan.c -- plan.bin read into an hx_plan, size expressions, and binding a pass.
 *
 * The layout is hidetc/backends/runtime/plan_file.py's. The whole file is read, its
 * trailing sha256 checked before anything is parsed (a truncated or altered plan is
 * HIDETC_ERR_FORMAT / HIDETC_ERR_CHECKSUM), then every count and length is checked
 * against what is left, so no plan makes the reader step outside its buffer. Strings
 * and arrays are copied out (NUL-terminated, aligned) and freed by hx_plan_free.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
    const uint8_t *p, *end;
    hx_plan *plan;
    int bad;
} reader;

static void *keep(hx_plan *plan, void *ptr) {
    if (!ptr)
        return NULL;
    if (plan->nallocs == plan->cap_allocs) {
        size_t cap = plan->cap_allocs ? 2 * plan->cap_allocs : 64;
        void **grown = realloc(plan->allocs, cap * sizeof *grown);
        if (!grown) {
            free(ptr);
            return NULL;
        }
        plan->allocs = grown;
        plan->cap_allocs = cap;
    }
    plan->allocs[plan->nallocs++] = ptr;
    return ptr;
}

static void *alloc(reader *r, size_t count, size_t size) {
    if (r->bad)
        return NULL;
    void *ptr = keep(r->plan, calloc(count ? count : 1, size));
    if (!ptr)
        r->bad = 2;
    return ptr;
}

static int take(reader *r, void *out, size_t n) {
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = r->bad ? r->bad : 1;
        memset(out, 0, n);
        return -1;
    }
    memcpy(out, r->p, n);
    r->p += n;
    return 0;
}

static uint32_t u32(reader *r) { uint32_t v; take(r, &v, 4); return v; }
static int32_t i32(reader *r) { int32_t v; take(r, &v, 4); return v; }
static uint64_t u64(reader *r) { uint64_t v; take(r, &v, 8); return v; }
static int64_t i64(reader *r) { int64_t v; take(r, &v, 8); return v; }

/* a count of items of at least `min_bytes` each: never more than the bytes left */
static uint32_t count(reader *r, size_t min_bytes) {
    uint32_t n = u32(r);
    if (!r->bad && (uint64_t)n * min_bytes > (uint64_t)(r->end - r->p))
        r->bad = 1;
    return r->bad ? 0 : n;
}

static const char *str(reader *r) {
    uint32_t n = count(r, 1);
    char *s = alloc(r, (size_t)n + 1, 1);
    if (!s)
        return "";
    take(r, s, n);
    return s;
}

static hx_expr expr(reader *r) {
    hx_expr e = {0, NULL};
    e.n = count(r, 8);
    int64_t *words = alloc(r, e.n, 8);
    for (uint32_t i = 0; words && i < e.n; i++)
        words[i] = i64(r);
    e.words = words;
    return e;
}

int hx_expr_eval(const hx_expr *e, const int64_t *sizes, int64_t *out) {
    int64_t stack[64];
    int top = 0;
    for (uint32_t i = 0; i < e->n; i++) {
        int64_t op = e->words[i];
        if (op == HX_OP_CONST || op == HX_OP_SYM) {
            if (i + 1 >= e->n || top == 64)
                return -1;
            int64_t v = e->words[++i];
            if (op == HX_OP_SYM && (v < 0 || v >= HX_MAX_SYMBOLS))
                return -1;
            stack[top++] = op == HX_OP_CONST ? v : sizes[v];
        } else if (op == HX_OP_NEG) {
            if (top < 1)
                return -1;
            stack[top - 1] = -stack[top - 1];
        } else if (op == HX_OP_FLOORDIV) {
            if (i + 1 >= e->n || top < 1 || e->words[i + 1] <= 0)
                return -1;
            int64_t d = e->words[++i], a = stack[top - 1];
            stack[top - 1] = a / d - ((a % d != 0) && (a < 0));   /* floor, as Python */
        } else if (op == HX_OP_ADD || op == HX_OP_SUB || op == HX_OP_MUL) {
            if (top < 2)
                return -1;
            int64_t b = stack[--top], a = stack[top - 1];
            stack[top - 1] = op == HX_OP_ADD ? a + b : op == HX_OP_SUB ? a - b : a * b;
        } else {
            return -1;
        }
    }
    if (top != 1)
        return -1;
    *out = stack[0];
    return 0;
}

static hidetc_dtype dtype_of(const char *name) {
    static const struct { const char *name; hidetc_dtype dtype; } table[] = {
        {"float32", HIDETC_F32}, {"float16", HIDETC_F16}, {"bfloat16", HIDETC_BF16},
        {"float64", HIDETC_F64}, {"int8", HIDETC_I8}, {"uint8", HIDETC_U8},
        {"int16", HIDETC_I16}, {"uint16", HIDETC_U16}, {"int32", HIDETC_I32},
        {"uint32", HIDETC_U32}, {"int64", HIDETC_I64}, {"uint64", HIDETC_U64},
        {"bool", HIDETC_BOOL}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(name, table[i].name))
            return table[i].dtype;
    return HIDETC_OTHER;
}

static void tensors(reader *r, uint32_t *n, hx_tensor **out) {
    *n = count(r, 12);
    if (*n > HX_MAX_IO)
        r->bad = 1;
    hx_tensor *t = alloc(r, *n, sizeof *t);
    *out = t;
    for (uint32_t i = 0; t && i < *n && !r->bad; i++) {
        t[i].name = str(r);
        t[i].dtype_name = str(r);
        t[i].dtype = dtype_of(t[i].dtype_name);
        t[i].elem_bytes = u32(r);
        t[i].rank = count(r, 4);
        if (t[i].rank > HIDETC_MAX_RANK) {
            r->bad = 1;
            return;
        }
        for (uint32_t d = 0; d < t[i].rank; d++) {
            t[i].dims[d] = expr(r);
            const hx_expr *e = &t[i].dims[d];
            t[i].symbol[d] = e->n == 2 && e->words[0] == HX_OP_SYM ? (int32_t)e->words[1] : -1;
        }
    }
}

static void launch(reader *r, hx_launch *l) {
    l->kernel = str(r);
    l->module = u32(r);
    for (int d = 0; d < 3; d++)
        l->grid[d] = expr(r);
    for (int d = 0; d < 3; d++)
        l->block[d] = u32(r);
    l->shared_bytes = u32(r);
    l->nargs = count(r, 12);
    l->args = alloc(r, l->nargs, sizeof *l->args);
    for (uint32_t a = 0; l->args && a < l->nargs; a++) {
        l->args[a].kind = u32(r);
        l->args[a].value = i64(r);
    }
}

static void variants(reader *r, hx_plan *plan) {
    plan->nvariants = count(r, 32);
    hx_variant *vs = alloc(r, plan->nvariants, sizeof *vs);
    plan->variants = vs;
    for (uint32_t k = 0; vs && k < plan->nvariants && !r->bad; k++) {
        hx_variant *v = &vs[k];
        v->nguards = count(r, 8);
        v->guards = alloc(r, v->nguards, sizeof *v->guards);
        for (uint32_t g = 0; v->guards && g < v->nguards; g++) {
            v->guards[g].expr = expr(r);
            v->guards[g].op = u32(r);
        }
        v->forward = str(r);
        v->arena_bytes = u64(r);
        v->zeroed_offset = i64(r);
        v->zeroed_bytes = u64(r);
        v->nsources = count(r, 20);
        v->sources = alloc(r, v->nsources, sizeof *v->sources);
        for (uint32_t s = 0; v->sources && s < v->nsources; s++) {
            v->sources[s].kind = u32(r);
            v->sources[s].index = u64(r);
            v->sources[s].nbytes = u64(r);
        }
        v->nlaunches = count(r, 40);
        v->launches = alloc(r, v->nlaunches, sizeof *v->launches);
        for (uint32_t l = 0; v->launches && l < v->nlaunches && !r->bad; l++)
            launch(r, &v->launches[l]);
    }
}

static void modules(reader *r, hx_plan *plan) {
    plan->nmodules = count(r, 12);
    hx_module *ms = alloc(r, plan->nmodules, sizeof *ms);
    plan->modules = ms;
    for (uint32_t k = 0; ms && k < plan->nmodules && !r->bad; k++) {
        ms[k].name = str(r);
        ms[k].ncubins = count(r, 8);
        ms[k].cubin_arch = alloc(r, ms[k].ncubins, sizeof(char *));
        ms[k].cubin_file = alloc(r, ms[k].ncubins, sizeof(uint32_t));
        for (uint32_t c = 0; ms[k].cubin_file && c < ms[k].ncubins; c++) {
            ms[k].cubin_arch[c] = str(r);
            ms[k].cubin_file[c] = u32(r);
        }
        ms[k].ptx_arch = str(r);
        ms[k].ptx_file = i32(r);
    }
}

/* Indices, ranges and sources that the rest of the runtime trusts. */
static const char *consistent(const hx_plan *p) {
    if (p->weights_file < 0 || (uint32_t)p->weights_file >= p->nfiles)
        return "weights file index out of range";
    if (p->library_file >= 0 && (uint32_t)p->library_file >= p->nfiles)
        return "library index out of range";
    if (p->nsymbols > HX_MAX_SYMBOLS || p->nvariants == 0)
        return "bad symbol or variant count";
    for (uint32_t s = 0; s < p->nsymbols; s++)
        if (p->sym_min[s] < 0 || p->sym_min[s] > p->sym_max[s])
            return "bad symbol range";
    for (uint32_t i = 0; i < p->ninputs + p->noutputs; i++) {
        const hx_tensor *t = i < p->ninputs ? &p->inputs[i] : &p->outputs[i - p->ninputs];
        if (t->elem_bytes == 0 || t->elem_bytes > 16)
            return "bad element size";
        for (uint32_t d = 0; d < t->rank; d++)
            if (t->symbol[d] >= (int32_t)p->nsymbols)
                return "dimension names an unknown size";
    }
    for (uint32_t k = 0; k < p->nvariants; k++) {
        const hx_variant *v = &p->variants[k];
        if (v->nsources != p->noutputs)
            return "output sources do not match the outputs";
        if (v->arena_bytes > p->arena_bytes)
            return "a variant's arena is larger than the context's";
        if (v->zeroed_offset >= 0 &&
            ((uint64_t)v->zeroed_offset > p->arena_bytes ||
             v->zeroed_bytes > p->arena_bytes - (uint64_t)v->zeroed_offset))
            return "kept-zero region outside the arena";
        for (uint32_t s = 0; s < v->nsources; s++) {
            const hx_source *src = &v->sources[s];
            uint64_t limit = src->kind == HX_SRC_INPUT ? p->ninputs :
                             src->kind == HX_SRC_OUTPUT ? p->noutputs : UINT64_MAX;
            if (src->kind > HX_SRC_CONSTANT || src->index >= limit)
                return "bad output source";
        }
        for (uint32_t l = 0; l < v->nlaunches; l++)
            if (v->launches[l].module >= p->nmodules)
                return "launch names an unknown module";
    }
    for (uint32_t m = 0; m < p->nmodules; m++) {
        for (uint32_t c = 0; c < p->modules[m].ncubins; c++)
            if (p->modules[m].cubin_file[c] >= p->nfiles)
                return "module file index out of range";
        if (p->modules[m].ptx_file >= (int32_t)p->nfiles)
            return "module file index out of range";
    }
    return NULL;
}

static void body(reader *r, hx_plan *p) {
    p->manifest_format = u32(r);
    p->target = str(r);
    p->hidetc_version = str(r);
    p->nflags = count(r, 4);
    p->cpu_flags = alloc(r, p->nflags, sizeof(char *));
    for (uint32_t i = 0; p->cpu_flags && i < p->nflags; i++)
        p->cpu_flags[i] = str(r);
    p->cores = u32(r);
    p->spin_count = u32(r);
    p->nfiles = count(r, 4 + HX_HASH_BYTES + 8);
    p->files = alloc(r, p->nfiles, sizeof *p->files);
    for (uint32_t i = 0; p->files && i < p->nfiles; i++) {
        p->files[i].path = str(r);
        take(r, p->files[i].sha256, HX_HASH_BYTES);
        p->files[i].size = u64(r);
    }
    p->weights_file = i32(r);
    p->library_file = i32(r);
    p->nsymbols = count(r, 20);
    p->symbols = alloc(r, p->nsymbols, sizeof(char *));
    p->sym_min = alloc(r, p->nsymbols, 8);
    p->sym_max = alloc(r, p->nsymbols, 8);
    for (uint32_t s = 0; p->sym_max && s < p->nsymbols; s++) {
        p->symbols[s] = str(r);
        p->sym_min[s] = i64(r);
        p->sym_max[s] = i64(r);
    }
    tensors(r, &p->ninputs, &p->inputs);
    tensors(r, &p->noutputs, &p->outputs);
    p->arena_bytes = u64(r);
    variants(r, p);
    modules(r, p);
    p->graph_cache = u32(r);
}

/* every tensor's dims at the ranges' least and greatest sizes (the info's ranges) */
static void dim_ranges(hx_plan *p) {
    int64_t lo[HX_MAX_SYMBOLS] = {0}, hi[HX_MAX_SYMBOLS] = {0};
    for (uint32_t s = 0; s < p->nsymbols; s++) {
        lo[s] = p->sym_min[s];
        hi[s] = p->sym_max[s];
    }
    for (uint32_t i = 0; i < p->ninputs + p->noutputs; i++) {
        hx_tensor *t = i < p->ninputs ? &p->inputs[i] : &p->outputs[i - p->ninputs];
        for (uint32_t d = 0; d < t->rank; d++) {
            int64_t a = -1, b = -1;
            hx_expr_eval(&t->dims[d], lo, &a);
            hx_expr_eval(&t->dims[d], hi, &b);
            t->dim_min[d] = a < b ? a : b;
            t->dim_max[d] = a < b ? b : a;
        }
    }
}

hidetc_status hx_plan_read(const char *path, hx_plan *plan) {
    memset(plan, 0, sizeof *plan);
    FILE *f = fopen(path, "rb");
    if (!f)
        return hx_fail(HIDETC_ERR_IO, "%s: cannot open (%s): not a hidetc artifact, or one "
                       "compiled before the C runtime", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    const size_t head = 8 + 4 + 4 + 8;
    if (size < (long)(head + HX_HASH_BYTES)) {
        fclose(f);
        return hx_fail(HIDETC_ERR_FORMAT, "%s: truncated (%ld bytes)", path, size);
    }
    plan->blob = malloc((size_t)size);
    plan->blob_bytes = (size_t)size;
    if (!plan->blob || fread(plan->blob, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        hx_plan_free(plan);
        return hx_fail(HIDETC_ERR_IO, "%s: cannot read", path);
    }
    fclose(f);
    if (memcmp(plan->blob, "HIDETCPL", 8)) {
        hx_plan_free(plan);
        return hx_fail(HIDETC_ERR_FORMAT, "%s: not a hidetc plan", path);
    }
    uint64_t body_bytes;
    memcpy(&plan->format, plan->blob + 8, 4);
    memcpy(&plan->abi, plan->blob + 12, 4);
    memcpy(&body_bytes, plan->blob + 16, 8);
    if (plan->format > HX_PLAN_FORMAT || plan->abi > HIDETC_ABI_VERSION) {
        hidetc_status st = hx_fail(HIDETC_ERR_VERSION, "%s: needs plan format %u and ABI %u; "
                                   "this runtime reads format %d, ABI %d (use the runtime "
                                   "the artifact carries, or a newer one)", path, plan->format,
                                   plan->abi, HX_PLAN_FORMAT, HIDETC_ABI_VERSION);
        hx_plan_free(plan);
        return st;
    }
    if (body_bytes != (uint64_t)size - head - HX_HASH_BYTES) {
        hidetc_status st = hx_fail(HIDETC_ERR_FORMAT, "%s: truncated or padded (%ld bytes, "
                                   "the header says %llu)", path, size,
                                   (unsigned long long)(body_bytes + head + HX_HASH_BYTES));
        hx_plan_free(plan);
        return st;
    }
    uint8_t digest[HX_HASH_BYTES];
    hx_sha256(plan->blob, head + body_bytes, digest);
    if (memcmp(digest, plan->blob + head + body_bytes, HX_HASH_BYTES)) {
        hx_plan_free(plan);
        return hx_fail(HIDETC_ERR_CHECKSUM, "%s: its checksum does not match (the file was "
                       "changed)", path);
    }
    reader r = {plan->blob + head, plan->blob + head + body_bytes, plan, 0};
    body(&r, plan);
    const char *why = r.bad == 2 ? "out of memory" : r.bad ? "malformed (a length runs past "
                      "the end)" : r.p != r.end ? "malformed (bytes left over)" : NULL;
    if (!why && plan->manifest_format > HX_MANIFEST_FORMAT) {
        hidetc_status st = hx_fail(HIDETC_ERR_VERSION, "%s: written for manifest format %u, "
                                   "newer than this runtime reads (%d)", path,
                                   plan->manifest_format, HX_MANIFEST_FORMAT);
        hx_plan_free(plan);
        return st;
    }
    why = why ? why : consistent(plan);
    if (why) {
        hidetc_status st = hx_fail(r.bad == 2 ? HIDETC_ERR_MEMORY : HIDETC_ERR_FORMAT, "%s: %s",
                                   path, why);
        hx_plan_free(plan);
        return st;
    }
    dim_ranges(plan);
    return HIDETC_OK;
}

void hx_plan_free(hx_plan *plan) {
    for (size_t i = 0; i < plan->nallocs; i++)
        free(plan->allocs[i]);
    free(plan->allocs);
    free(plan->blob);
    memset(plan, 0, sizeof *plan);
}

static int holds(const hx_guard *g, const int64_t *sizes) {
    int64_t v;
    if (hx_expr_eval(&g->expr, sizes, &v))
        return 0;
    switch (g->op) {
    case HX_LT: return v < 0;
    case HX_LE: return v <= 0;
    case HX_GT: return v > 0;
    case HX_GE: return v >= 0;
    default: return 0;
    }
}

static size_t nbytes(const hx_tensor *t, const int64_t *dims) {
    size_t n = t->elem_bytes;
    for (uint32_t d = 0; d < t->rank; d++)
        n *= (size_t)dims[d];
    return n;
}

hidetc_status hx_pass_bind(const hx_plan *plan, const int *ranks,
                           const int64_t (*dims)[HIDETC_MAX_RANK], hx_pass *pass) {
    int bound[HX_MAX_SYMBOLS] = {0};
    int at_input[HX_MAX_SYMBOLS], at_dim[HX_MAX_SYMBOLS];
    pass->ready = 0;
    for (uint32_t i = 0; i < plan->ninputs; i++) {
        const hx_tensor *t = &plan->inputs[i];
        if (ranks[i] < 0)
            return hx_fail(HIDETC_ERR_SHAPE, "input '%s': its shape is not set", t->name);
        if ((uint32_t)ranks[i] != t->rank)
            return hx_fail(HIDETC_ERR_SHAPE, "input '%s': expected %u dimensions, got %d",
                           t->name, t->rank, ranks[i]);
        for (uint32_t d = 0; d < t->rank; d++) {
            int s = t->symbol[d];
            int64_t got = dims[i][d];
            if (s < 0)
                continue;
            if (bound[s] && pass->sizes[s] != got)
                return hx_fail(HIDETC_ERR_SHAPE, "input '%s' dim %u is %lld, but '%s' is %lld "
                               "(input '%s' dim %d)", t->name, d, (long long)got,
                               plan->symbols[s], (long long)pass->sizes[s],
                               plan->inputs[at_input[s]].name, at_dim[s]);
            if (!bound[s] && (got < plan->sym_min[s] || got > plan->sym_max[s]))
                return hx_fail(HIDETC_ERR_SHAPE, "input '%s' dim %u ('%s') is %lld, outside "
                               "its range %lld..%lld", t->name, d, plan->symbols[s],
                               (long long)got, (long long)plan->sym_min[s],
                               (long long)plan->sym_max[s]);
            bound[s] = 1;
            pass->sizes[s] = got;
            at_input[s] = (int)i;
            at_dim[s] = (int)d;
        }
    }
    for (uint32_t s = 0; s < plan->nsymbols; s++)
        if (!bound[s])
            return hx_fail(HIDETC_ERR_FORMAT, "no input gives the size '%s'", plan->symbols[s]);
    for (uint32_t i = 0; i < plan->ninputs + plan->noutputs; i++) {
        int out = i >= plan->ninputs;
        uint32_t k = out ? i - plan->ninputs : i;
        const hx_tensor *t = out ? &plan->outputs[k] : &plan->inputs[k];
        int64_t *at = out ? pass->out_dims[k] : pass->in_dims[k];
        for (uint32_t d = 0; d < t->rank; d++) {
            if (hx_expr_eval(&t->dims[d], pass->sizes, &at[d]) || at[d] < 0)
                return hx_fail(HIDETC_ERR_FORMAT, "%s '%s' dim %u: bad size expression",
                               out ? "output" : "input", t->name, d);
            if (!out && at[d] != dims[k][d])
                return hx_fail(HIDETC_ERR_SHAPE, "input '%s' dim %u: expected %lld, got %lld",
                               t->name, d, (long long)at[d], (long long)dims[k][d]);
        }
        if (out)
            pass->out_bytes[k] = nbytes(t, at);
        else
            pass->in_bytes[k] = nbytes(t, at);
    }
    for (uint32_t v = 0; v < plan->nvariants; v++) {
        const hx_variant *var = &plan->variants[v];
        uint32_t g = 0;
        while (g < var->nguards && holds(&var->guards[g], pass->sizes))
            g++;
        if (g == var->nguards) {
            pass->variant = v;
            pass->ready = 1;
            return HIDETC_OK;
        }
    }
    return hx_fail(HIDETC_ERR_FORMAT, "no dispatch variant of this artifact covers these sizes "
                   "(the compile checked every size of the ranges: the artifact was changed)");
}
