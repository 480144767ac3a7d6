/* run_io.c -- hidetc-run's files: the --input .npy files matched to the model's inputs
 * and read, the outputs written to --output-dir, --maps; the dtypes and shapes as the
 * messages name them.
 *
 * Inputs and outputs are .npy files (npy.c). bfloat16 has no numpy dtype of its own: an
 * array of ml_dtypes.bfloat16 is saved by numpy with descr '<V2' (2-byte void), so that
 * is what a bfloat16 input must hold and what a bfloat16 output is written as; numpy
 * loads it as raw 2-byte values and `np.load(path).view(ml_dtypes.bfloat16)` gives the
 * numbers (the same file np.save writes for the bfloat16 array).
 *
 * Assumes: a little-endian host. Guarantees: an input's file is used only when its dtype,
 * order and shape are the input's (else EXIT_RUNTIME naming both); an output file appears
 * complete or not at all (written to a temporary beside it, then renamed). Decides: an
 * output's file name is its name with characters other than [A-Za-z0-9._-] made '_' (at
 * most 200), and __<output index> appended on a clash.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "hidetc_run.h"

/* ---- dtypes and shapes --------------------------------------------------------------- */

/* the descr an array of this dtype is written with (and must be read with) */
static void dtype_descr(const hidetc_tensor_info *info, char *buf, size_t n)
{
    const char *d = NULL;
    switch (info->dtype) {
    case HIDETC_F32: d = "<f4"; break;
    case HIDETC_F16: d = "<f2"; break;
    case HIDETC_BF16: d = "<V2"; break;
    case HIDETC_F64: d = "<f8"; break;
    case HIDETC_I8: d = "|i1"; break;
    case HIDETC_U8: d = "|u1"; break;
    case HIDETC_I16: d = "<i2"; break;
    case HIDETC_U16: d = "<u2"; break;
    case HIDETC_I32: d = "<i4"; break;
    case HIDETC_U32: d = "<u4"; break;
    case HIDETC_I64: d = "<i8"; break;
    case HIDETC_U64: d = "<u8"; break;
    case HIDETC_BOOL: d = "|b1"; break;
    case HIDETC_OTHER: default: break;
    }
    if (d) snprintf(buf, n, "%s", d);
    else snprintf(buf, n, "|V%zu", info->elem_bytes ? info->elem_bytes : 1);
}

const char *dtype_name(const hidetc_tensor_info *info)
{
    return (info->dtype_name && *info->dtype_name) ? info->dtype_name : "?";
}

/* numpy's name of an npy descr, for messages */
static void npy_dtype_name(const npy_array *a, char *buf, size_t n)
{
    size_t bits = a->itemsize * 8;
    switch (a->kind) {
    case 'f': snprintf(buf, n, "float%zu", bits); break;
    case 'i': snprintf(buf, n, "int%zu", bits); break;
    case 'u': snprintf(buf, n, "uint%zu", bits); break;
    case 'b': snprintf(buf, n, a->itemsize == 1 ? "bool" : "bool%zu", bits); break;
    case 'c': snprintf(buf, n, "complex%zu", bits); break;
    case 'V': snprintf(buf, n, "void%zu", bits); break;
    case 'S': snprintf(buf, n, "bytes%zu", a->itemsize); break;
    case 'U': snprintf(buf, n, "str%zu", a->itemsize / 4); break;
    default: snprintf(buf, n, "'%s'", a->descr); break;
    }
}

static int dtype_matches(const npy_array *a, const hidetc_tensor_info *info)
{
    char want[32], order, kind;
    size_t size;
    dtype_descr(info, want, sizeof want);
    if (npy_parse_descr(want, &order, &kind, &size) != 0) return 0;
    if (a->kind != kind || a->itemsize != size) return 0;
    if (size == 1 || kind == 'V') return 1;          /* byte order does not apply */
    return a->byteorder == '<' || a->byteorder == '=';   /* the host is little-endian */
}

void format_shape(int rank, const int64_t *dims, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < rank && k < n; ++i)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)dims[i]);
    if (k < n) snprintf(buf + k, n - k, rank == 1 ? ",)" : ")");
}

/* "(1, 1..128, 16)" */
static void format_expected(const hidetc_tensor_info *info, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < info->rank && i < HIDETC_MAX_RANK && k < n; ++i) {
        k += (size_t)snprintf(buf + k, n - k, i ? ", " : "");
        if (k >= n) break;
        if (info->dims[i] >= 0)
            k += (size_t)snprintf(buf + k, n - k, "%lld", (long long)info->dims[i]);
        else
            k += (size_t)snprintf(buf + k, n - k, "%lld..%lld", (long long)info->dim_min[i],
                                  (long long)info->dim_max[i]);
    }
    if (k < n) snprintf(buf + k, n - k, info->rank == 1 ? ",)" : ")");
}

/* ---- files ------------------------------------------------------------------------------ */

/* mkdir -p; 0 on success, else -1 with errno */
static int make_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p) return -1;
    size_t len = strlen(p);
    while (len > 1 && p[len - 1] == '/') p[--len] = '\0';
    int rc = 0;
    for (char *s = p + 1;; ++s) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) { rc = -1; break; }
            *s = c;
            if (c == '\0') break;
        }
    }
    if (rc == 0) {
        struct stat st;
        if (stat(p, &st) != 0) rc = -1;
        else if (!S_ISDIR(st.st_mode)) { errno = ENOTDIR; rc = -1; }
    }
    int e = errno;
    free(p);
    errno = e;
    return rc;
}

static char *join_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* an output name as a file name: [A-Za-z0-9._-] kept, the rest '_' (at most 200) */
static void safe_name(const char *name, char *buf, size_t n)
{
    size_t k = 0;
    for (const char *s = name; *s && k + 1 < n && k < 200; ++s) {
        char c = *s;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        buf[k++] = ok ? c : '_';
    }
    if (k == 0) buf[k++] = '_';
    buf[k] = '\0';
}

int copy_maps(const char *to)
{
    FILE *in = fopen("/proc/self/maps", "r");
    if (!in) {
        error_msg("/proc/self/maps: %s", strerror(errno));
        return -1;
    }
    FILE *out = fopen(to, "w");
    if (!out) {
        error_msg("--maps %s: %s", to, strerror(errno));
        fclose(in);
        return -1;
    }
    char buf[8192];
    size_t n;
    int ok = 1;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) { ok = 0; break; }
    if (ferror(in)) ok = 0;
    int e = errno;
    if (fclose(out) != 0) { ok = 0; e = errno; }
    fclose(in);
    if (!ok) {
        error_msg("--maps %s: %s", to, strerror(e));
        return -1;
    }
    return 0;
}

/* ---- inputs and outputs ---------------------------------------------------------------- */

/* match "NAME=FILE" against the model's inputs (names may hold '='); usage errors */
int resolve_inputs(const options *o, state *s)
{
    for (int a = 0; a < o->ninputs; ++a) {
        const char *arg = o->inputs[a];
        int index = -1;
        const char *path = NULL;
        for (const char *eq = strchr(arg, '='); eq; eq = strchr(eq + 1, '=')) {
            size_t n = (size_t)(eq - arg);
            char *name = strndup(arg, n);
            if (!name) {
                error_msg("out of memory");
                return EXIT_RUNTIME;
            }
            index = hidetc_model_find_input(s->model, name);
            free(name);
            if (index >= 0) { path = eq + 1; break; }
        }
        if (index < 0 || index >= s->nin) {
            int n = (int)(strchr(arg, '=') - arg);
            char names[1024];
            size_t k = 0;
            names[0] = '\0';
            for (int i = 0; i < s->nin && k < sizeof names; ++i)
                k += (size_t)snprintf(names + k, sizeof names - k, "%s'%s'", i ? ", " : "",
                                      s->in_info[i].name);
            error_msg("unknown input '%.*s' (the model's inputs: %s)", n, arg,
                      s->nin ? names : "none");
            return EXIT_USAGE;
        }
        if (s->given[index] >= 0) {
            error_msg("input '%s' given twice", s->in_info[index].name);
            return EXIT_USAGE;
        }
        if (!*path) {
            error_msg("--input %s= needs a file", s->in_info[index].name);
            return EXIT_USAGE;
        }
        s->given[index] = a;
        s->paths[index] = path;
    }
    char missing[2048];
    size_t k = 0;
    int nmissing = 0;
    missing[0] = '\0';
    for (int i = 0; i < s->nin; ++i) {
        if (s->given[i] >= 0) continue;
        char shape[512];
        format_expected(&s->in_info[i], shape, sizeof shape);
        if (k < sizeof missing)
            k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%s (%s %s)",
                                  nmissing ? ", " : "", s->in_info[i].name,
                                  dtype_name(&s->in_info[i]), shape);
        ++nmissing;
    }
    if (nmissing) {
        error_msg("missing input%s: %s; pass --input NAME=FILE.npy", nmissing > 1 ? "s" : "",
                  missing);
        return EXIT_USAGE;
    }
    return 0;
}

int read_inputs(state *s)
{
    for (int i = 0; i < s->nin; ++i) {
        const hidetc_tensor_info *info = &s->in_info[i];
        npy_array *a = &s->arrays[i];
        char err[1024];
        if (npy_read(s->paths[i], a, err, sizeof err) != 0) {
            error_msg("input %s: %s", info->name, err);
            return EXIT_RUNTIME;
        }
        if (a->fortran_order) {
            error_msg("input %s: %s is in Fortran order; save a C-order array "
                      "(np.ascontiguousarray)", info->name, s->paths[i]);
            return EXIT_RUNTIME;
        }
        char expected[512], got[512];
        format_expected(info, expected, sizeof expected);
        if (!dtype_matches(a, info)) {
            char have[64], want[32];
            npy_dtype_name(a, have, sizeof have);
            dtype_descr(info, want, sizeof want);
            error_msg("input %s: %s holds %s ('%s'); the model expects %s (descr '%s'%s)",
                      info->name, s->paths[i], have, a->descr, dtype_name(info), want,
                      info->dtype == HIDETC_BF16 ? ", what numpy saves for ml_dtypes.bfloat16"
                                                 : "");
            return EXIT_RUNTIME;
        }
        int ok = a->rank == info->rank && a->rank <= HIDETC_MAX_RANK;
        for (int d = 0; ok && d < a->rank; ++d)
            ok = a->shape[d] >= info->dim_min[d] && a->shape[d] <= info->dim_max[d] &&
                 (info->dims[d] < 0 || a->shape[d] == info->dims[d]);
        if (!ok) {
            format_shape(a->rank < NPY_MAX_RANK ? a->rank : NPY_MAX_RANK, a->shape, got,
                         sizeof got);
            error_msg("input %s: %s has shape %s; the model expects %s %s", info->name,
                      s->paths[i], got, dtype_name(info), expected);
            return EXIT_RUNTIME;
        }
        if (a->itemsize != info->elem_bytes) {
            error_msg("input %s: %zu-byte elements in %s, the runtime says %s has %zu",
                      info->name, a->itemsize, s->paths[i], dtype_name(info),
                      info->elem_bytes);
            return EXIT_RUNTIME;
        }
        s->in_ptrs[i] = a->data;
    }
    return 0;
}

int write_outputs(const options *o, state *s)
{
    if (make_dirs(o->output_dir) != 0) {
        error_msg("--output-dir %s: %s", o->output_dir, strerror(errno));
        return EXIT_RUNTIME;
    }
    char (*names)[232] = calloc((size_t)(s->nout ? s->nout : 1), sizeof *names);
    if (!names) {
        error_msg("out of memory");
        return EXIT_RUNTIME;
    }
    int rc = 0;
    for (int i = 0; i < s->nout && !rc; ++i) {
        char base[210];
        safe_name(s->out_info[i].name, base, sizeof base);
        snprintf(names[i], sizeof names[i], "%s.npy", base);
        for (int attempt = 0;; ++attempt) {
            int clash = 0;
            for (int j = 0; j < i && !clash; ++j) clash = strcmp(names[j], names[i]) == 0;
            if (!clash) break;
            if (attempt > 0) {
                error_msg("output %s: no free file name in %s", s->out_info[i].name,
                          o->output_dir);
                rc = EXIT_RUNTIME;
                break;
            }
            snprintf(names[i], sizeof names[i], "%s__%d.npy", base, i);
        }
    }
    const worker *w = &s->workers[0];
    for (int i = 0; i < s->nout && !rc; ++i) {
        const hidetc_tensor_info *info = &s->out_info[i];
        char descr[32], err[1024], tmpname[300];
        dtype_descr(info, descr, sizeof descr);
        char *final = join_path(o->output_dir, names[i]);
        char *tmp = NULL;
        int wrote = -1;
        for (int attempt = 0; final && attempt < 100; ++attempt) {
            snprintf(tmpname, sizeof tmpname, ".%s.tmp-%ld-%d", names[i], (long)getpid(),
                     attempt);
            free(tmp);
            tmp = join_path(o->output_dir, tmpname);
            if (!tmp) break;
            wrote = npy_write(tmp, descr, s->out_rank[i], s->out_dims[i], w->outputs[i],
                              s->out_bytes[i], err, sizeof err);
            if (wrote != -2) break;   /* -2: a stale temporary of that name */
        }
        if (!final || !tmp) {
            error_msg("out of memory");
            rc = EXIT_RUNTIME;
        } else if (wrote != 0) {
            error_msg("output %s: %s", info->name, err);
            rc = EXIT_RUNTIME;
        } else if (rename(tmp, final) != 0) {
            error_msg("output %s: renaming %s to %s: %s", info->name, tmp, final,
                      strerror(errno));
            remove(tmp);
            rc = EXIT_RUNTIME;
        } else {
            s->out_files[i] = final;
            final = NULL;
        }
        free(final);
        free(tmp);
    }
    free(names);
    return rc;
}
