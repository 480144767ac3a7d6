/* hidetc_run.c -- hidetc-run, the command-line runner of a compiled artifact (C11).
 *
 * Uses only the public runtime API (hidetc.h), libc and pthreads; no Python. Built as
 *   gcc -std=c11 -O2 -Wall -Wextra hidetc_run.c npy.c -I<include> -L<lib>
 *       -lhidetc_runtime -Wl,-rpath,'$ORIGIN/../lib' -pthread -o OUT/bin/hidetc-run
 *
 * Inputs and outputs are .npy files (npy.c). bfloat16 has no numpy dtype of its own: an
 * array of ml_dtypes.bfloat16 is saved by numpy with descr '<V2' (2-byte void), so that
 * is what a bfloat16 input must hold and what a bfloat16 output is written as; numpy
 * loads it as raw 2-byte values and `np.load(path).view(ml_dtypes.bfloat16)` gives the
 * numbers (the same file np.save writes for the bfloat16 array).
 *
 * Exit status: 0 success; 1 a runtime error (the artifact, a file, a shape, a run);
 * 2 a usage error (bad options, an unknown / repeated / missing input name).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "hidetc.h"
#include "npy.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2
#define ALIGN 64
#define MAX_THREADS 1024

static const char USAGE[] =
    "usage: hidetc-run OUT [--input NAME=x.npy ...] [--output-dir DIR] [--repeat N]\n"
    "                  [--warmup N] [--threads N] [--maps FILE] [--quiet]\n"
    "\n"
    "Runs the compiled hidetc artifact in directory OUT with the C runtime (no Python).\n"
    "\n"
    "  --input NAME=FILE  input NAME from a .npy file (C order, the input's dtype; every\n"
    "                     input once). bfloat16: the file numpy writes for an array of\n"
    "                     ml_dtypes.bfloat16 (descr '<V2'). A dynamic artifact runs at the\n"
    "                     shapes of the files.\n"
    "  --output-dir DIR   write each output to DIR/NAME.npy (DIR created if missing;\n"
    "                     characters other than letters, digits, '.', '_', '-' in NAME\n"
    "                     become '_'; a name clash appends __<output index>). bfloat16\n"
    "                     outputs are written with descr '<V2':\n"
    "                     np.load(f).view(ml_dtypes.bfloat16) gives the values.\n"
    "  --repeat N         time N passes (after the warm-up) and print\n"
    "                     'median_ms=.. min_ms=.. runs=N threads=T'\n"
    "  --warmup N         untimed passes first (default 1 when --repeat > 1, else 0)\n"
    "  --threads N        N threads, each with its own context running the passes on the\n"
    "                     same inputs; their outputs must be bit-identical. Each context\n"
    "                     uses max(1, cores/N) intra-op threads unless OMP_NUM_THREADS is\n"
    "                     set. Prints the timing line and 'throughput=<passes/s>'.\n"
    "  --maps FILE        copy /proc/self/maps to FILE after the runs\n"
    "  --quiet            print nothing but the timing line and errors\n"
    "  --help             this text\n"
    "\n"
    "Exit status: 0 success, 1 runtime error, 2 usage error; errors are one line on stderr.\n";

/* ---- errors ------------------------------------------------------------------------ */

static void error_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void error_msg(const char *fmt, ...)
{
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (char *p = buf; *p; ++p)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "hidetc-run: error: %s\n", buf);
}

/* "checksum" for HIDETC_ERR_CHECKSUM, whichever spelling hidetc_status_name uses */
static void status_text(hidetc_status status, char *buf, size_t n)
{
    const char *name = hidetc_status_name(status);
    if (!name || !*name) name = "error";
    if (strncmp(name, "HIDETC_ERR_", 11) == 0) name += 11;
    else if (strncmp(name, "HIDETC_", 7) == 0) name += 7;
    size_t i = 0;
    for (; name[i] && i + 1 < n; ++i)
        buf[i] = (name[i] >= 'A' && name[i] <= 'Z') ? (char)(name[i] - 'A' + 'a') : name[i];
    buf[i] = '\0';
}

static const char *last_error(void)
{
    const char *e = hidetc_last_error();
    return (e && *e) ? e : "(no message)";
}

/* a failed runtime call: "<context: ><status>: <message>" */
static void runtime_error(hidetc_status status, const char *context, const char *message)
{
    char name[64];
    status_text(status, name, sizeof name);
    if (context && *context) error_msg("%s: %s: %s", context, name, message);
    else error_msg("%s: %s", name, message);
}

/* ---- options ----------------------------------------------------------------------- */

typedef struct options {
    const char *artifact;
    const char **inputs;    /* "NAME=FILE" as given */
    int ninputs;
    const char *output_dir;
    long repeat, warmup, threads;
    int repeat_set, warmup_set;
    const char *maps;
    int quiet, help;
} options;

static int parse_count(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        error_msg("%s expects an integer from %ld to %ld, got '%s'", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* 0: run; 1: --help; -1: usage error (reported) */
static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->repeat = 1;
    o->threads = 1;
    o->inputs = calloc((size_t)(argc > 0 ? argc : 1), sizeof *o->inputs);
    if (!o->inputs) {
        error_msg("out of memory");
        return -1;
    }
    int only_positional = 0;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        if (only_positional || a[0] != '-' || a[1] == '\0') {
            if (o->artifact) {
                error_msg("unexpected argument '%s' (one artifact directory; see --help)", a);
                return -1;
            }
            o->artifact = a;
            continue;
        }
        if (strcmp(a, "--") == 0) { only_positional = 1; continue; }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { o->help = 1; return 1; }
        if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) { o->quiet = 1; continue; }
        static const char *const valued[] = {"--input", "--output-dir", "--repeat", "--warmup",
                                             "--threads", "--maps"};
        int which = -1;
        const char *value = NULL;
        for (int k = 0; k < (int)(sizeof valued / sizeof *valued); ++k) {
            size_t n = strlen(valued[k]);
            if (strncmp(a, valued[k], n) == 0 && (a[n] == '\0' || a[n] == '=')) {
                which = k;
                if (a[n] == '=') value = a + n + 1;
                break;
            }
        }
        if (which < 0) {
            error_msg("unknown option '%s' (see --help)", a);
            return -1;
        }
        if (!value) {
            if (i + 1 >= argc) {
                error_msg("%s needs a value", valued[which]);
                return -1;
            }
            value = argv[++i];
        }
        switch (which) {
        case 0:
            if (!strchr(value, '=') || value[0] == '=') {
                error_msg("--input expects NAME=FILE, got '%s'", value);
                return -1;
            }
            o->inputs[o->ninputs++] = value;
            break;
        case 1:
            if (!*value) {
                error_msg("--output-dir needs a directory");
                return -1;
            }
            o->output_dir = value;
            break;
        case 2:
            if (parse_count("--repeat", value, 1, 100000000L, &o->repeat)) return -1;
            o->repeat_set = 1;
            break;
        case 3:
            if (parse_count("--warmup", value, 0, 100000000L, &o->warmup)) return -1;
            o->warmup_set = 1;
            break;
        case 4:
            if (parse_count("--threads", value, 1, MAX_THREADS, &o->threads)) return -1;
            break;
        case 5:
            if (!*value) {
                error_msg("--maps needs a file");
                return -1;
            }
            o->maps = value;
            break;
        }
    }
    if (!o->artifact) {
        error_msg("no artifact directory given (usage: hidetc-run OUT [--input NAME=x.npy ...]; "
                  "see --help)");
        return -1;
    }
    if (!o->warmup_set) o->warmup = o->repeat > 1 ? 1 : 0;
    return 0;
}

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

static const char *dtype_name(const hidetc_tensor_info *info)
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

static void format_shape(int rank, const int64_t *dims, char *buf, size_t n)
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

/* ---- buffers, time, files -------------------------------------------------------------- */

static void *alloc_aligned(size_t bytes)
{
    size_t n = (bytes + ALIGN - 1) / ALIGN * ALIGN;
    if (n < bytes) return NULL;
    if (n == 0) n = ALIGN;
    void *p = aligned_alloc(ALIGN, n);
    if (p) memset(p, 0, n);
    return p;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int available_cores(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

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

static int copy_maps(const char *to)
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

/* ---- the passes ---------------------------------------------------------------------- */

typedef struct gate {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int state;                 /* 0 wait, 1 go, -1 abort */
} gate;

typedef struct worker {
    int index;
    hidetc_context *ctx;
    const void **inputs;       /* shared, read-only */
    void **outputs;            /* this worker's */
    long warmup, repeat;
    double *times;             /* ms of each timed pass */
    double t_start, t_end;
    int failed;
    hidetc_status status;
    char err[1024];
    gate *gate;
    pthread_barrier_t *barrier;
} worker;

static int run_once(worker *w)
{
    hidetc_status s = hidetc_context_run(w->ctx, (const void *const *)w->inputs,
                                         (void *const *)w->outputs);
    if (s != HIDETC_OK) {
        w->failed = 1;
        w->status = s;
        snprintf(w->err, sizeof w->err, "%s", last_error());
        return -1;
    }
    return 0;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    if (w->gate) {
        pthread_mutex_lock(&w->gate->mutex);
        while (w->gate->state == 0) pthread_cond_wait(&w->gate->cond, &w->gate->mutex);
        int state = w->gate->state;
        pthread_mutex_unlock(&w->gate->mutex);
        if (state < 0) return NULL;
    }
    for (long i = 0; i < w->warmup && !w->failed; ++i) run_once(w);
    if (w->barrier) pthread_barrier_wait(w->barrier);   /* every thread times together */
    w->t_start = now_s();
    for (long i = 0; i < w->repeat && !w->failed; ++i) {
        double t0 = now_s();
        if (run_once(w) != 0) break;
        w->times[i] = (now_s() - t0) * 1e3;
    }
    w->t_end = now_s();
    return NULL;
}

/* ---- main ------------------------------------------------------------------------------ */

typedef struct state {
    hidetc_model *model;
    int nin, nout;
    hidetc_tensor_info *in_info, *out_info;
    int *given;                /* per input: the index into options.inputs, or -1 */
    const char **paths;        /* per input: its file */
    npy_array *arrays;
    const void **in_ptrs;
    int nworkers;
    worker *workers;
    int *out_rank;
    int64_t (*out_dims)[HIDETC_MAX_RANK];
    size_t *out_bytes;
    char **out_files;
    double *all_times;
} state;

static void free_state(state *s)
{
    if (s->workers) {
        for (int k = 0; k < s->nworkers; ++k) {
            worker *w = &s->workers[k];
            if (w->outputs)
                for (int i = 0; i < s->nout; ++i) free(w->outputs[i]);
            free(w->outputs);
            free(w->times);
            if (w->ctx) hidetc_context_free(w->ctx);
        }
        free(s->workers);
    }
    if (s->arrays)
        for (int i = 0; i < s->nin; ++i) npy_free(&s->arrays[i]);
    free(s->arrays);
    if (s->out_files)
        for (int i = 0; i < s->nout; ++i) free(s->out_files[i]);
    free(s->out_files);
    free(s->in_ptrs);
    free(s->given);
    free(s->paths);
    free(s->in_info);
    free(s->out_info);
    free(s->out_rank);
    free(s->out_dims);
    free(s->out_bytes);
    free(s->all_times);
    if (s->model) hidetc_model_free(s->model);
    memset(s, 0, sizeof *s);
}

/* match "NAME=FILE" against the model's inputs (names may hold '='); usage errors */
static int resolve_inputs(const options *o, state *s)
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

static int read_inputs(state *s)
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

/* a context per worker, the input shapes set on each, the output buffers */
static int make_workers(const options *o, state *s)
{
    int n = (int)o->threads;
    s->workers = calloc((size_t)n, sizeof *s->workers);
    if (!s->workers) {
        error_msg("out of memory");
        return EXIT_RUNTIME;
    }
    s->nworkers = n;
    hidetc_context_options copts;
    memset(&copts, 0, sizeof copts);
    const char *omp = getenv("OMP_NUM_THREADS");
    if (omp && *omp) copts.threads = 0;   /* the runtime follows OMP_NUM_THREADS */
    else {
        int per = available_cores() / n;
        copts.threads = per > 1 ? per : 1;
    }
    for (int k = 0; k < n; ++k) {
        worker *w = &s->workers[k];
        w->index = k;
        w->inputs = s->in_ptrs;
        w->warmup = o->warmup;
        w->repeat = o->repeat;
        w->times = calloc((size_t)o->repeat, sizeof *w->times);
        w->outputs = calloc((size_t)(s->nout ? s->nout : 1), sizeof *w->outputs);
        if (!w->times || !w->outputs) {
            error_msg("out of memory");
            return EXIT_RUNTIME;
        }
        hidetc_status st = hidetc_context_create(s->model, &copts, &w->ctx);
        if (st != HIDETC_OK) {
            w->ctx = NULL;
            runtime_error(st, "creating a context", last_error());
            return EXIT_RUNTIME;
        }
        for (int i = 0; i < s->nin; ++i) {
            int64_t dims[HIDETC_MAX_RANK];
            const npy_array *a = &s->arrays[i];
            for (int d = 0; d < a->rank; ++d) dims[d] = a->shape[d];
            st = hidetc_context_set_input_shape(w->ctx, i, a->rank, dims);
            if (st != HIDETC_OK) {
                char ctx[512];
                snprintf(ctx, sizeof ctx, "input %s", s->in_info[i].name);
                runtime_error(st, ctx, last_error());
                return EXIT_RUNTIME;
            }
        }
        for (int i = 0; i < s->nout; ++i) {
            int rank = 0;
            int64_t dims[HIDETC_MAX_RANK];
            size_t bytes = 0;
            char ctx[512];
            snprintf(ctx, sizeof ctx, "output %s", s->out_info[i].name);
            st = hidetc_context_output_shape(w->ctx, i, &rank, dims);
            if (st == HIDETC_OK) st = hidetc_context_output_bytes(w->ctx, i, &bytes);
            if (st != HIDETC_OK) {
                runtime_error(st, ctx, last_error());
                return EXIT_RUNTIME;
            }
            if (k == 0) {
                if (rank < 0 || rank > HIDETC_MAX_RANK) {
                    error_msg("output %s: the runtime reports rank %d", s->out_info[i].name,
                              rank);
                    return EXIT_RUNTIME;
                }
                size_t count = 1;
                int overflow = 0;
                for (int d = 0; d < rank; ++d) {
                    if (dims[d] < 0) overflow = 1;
                    else if (dims[d] && count > SIZE_MAX / (uint64_t)dims[d]) overflow = 1;
                    else count *= (size_t)dims[d];
                }
                size_t elem = s->out_info[i].elem_bytes;
                if (overflow || (elem && count > SIZE_MAX / elem) || count * elem != bytes) {
                    char shape[512];
                    format_shape(rank, dims, shape, sizeof shape);
                    error_msg("output %s: the runtime reports %zu bytes for shape %s of %s",
                              s->out_info[i].name, bytes, shape, dtype_name(&s->out_info[i]));
                    return EXIT_RUNTIME;
                }
                s->out_rank[i] = rank;
                memcpy(s->out_dims[i], dims, sizeof dims);
                s->out_bytes[i] = bytes;
            } else if (bytes != s->out_bytes[i]) {
                error_msg("output %s: %zu bytes on thread %d's context, %zu on thread 0's",
                          s->out_info[i].name, bytes, k, s->out_bytes[i]);
                return EXIT_RUNTIME;
            }
            w->outputs[i] = alloc_aligned(bytes);
            if (!w->outputs[i]) {
                error_msg("out of memory for output %s (%zu bytes)", s->out_info[i].name,
                          bytes);
                return EXIT_RUNTIME;
            }
        }
    }
    return 0;
}

static int run_workers(state *s, double *wall_s)
{
    int n = s->nworkers;
    if (n == 1) {
        worker_main(&s->workers[0]);
        *wall_s = s->workers[0].t_end - s->workers[0].t_start;
        return 0;
    }
    gate g;
    pthread_barrier_t barrier;
    pthread_t *tids = calloc((size_t)n, sizeof *tids);
    if (!tids) {
        error_msg("out of memory");
        return EXIT_RUNTIME;
    }
    if (pthread_barrier_init(&barrier, NULL, (unsigned)n) != 0) {
        free(tids);
        error_msg("pthread_barrier_init failed");
        return EXIT_RUNTIME;
    }
    pthread_mutex_init(&g.mutex, NULL);
    pthread_cond_init(&g.cond, NULL);
    g.state = 0;
    int created = 0, rc = 0;
    for (; created < n; ++created) {
        s->workers[created].gate = &g;
        s->workers[created].barrier = &barrier;
        int e = pthread_create(&tids[created], NULL, worker_main, &s->workers[created]);
        if (e != 0) {
            error_msg("starting thread %d: %s", created, strerror(e));
            rc = EXIT_RUNTIME;
            break;
        }
    }
    pthread_mutex_lock(&g.mutex);
    g.state = rc ? -1 : 1;   /* the barrier needs every thread: abort unless all started */
    pthread_cond_broadcast(&g.cond);
    pthread_mutex_unlock(&g.mutex);
    for (int k = 0; k < created; ++k) pthread_join(tids[k], NULL);
    pthread_barrier_destroy(&barrier);
    pthread_cond_destroy(&g.cond);
    pthread_mutex_destroy(&g.mutex);
    free(tids);
    double t0 = s->workers[0].t_start, t1 = s->workers[0].t_end;
    for (int k = 1; k < n; ++k) {
        if (s->workers[k].t_start < t0) t0 = s->workers[k].t_start;
        if (s->workers[k].t_end > t1) t1 = s->workers[k].t_end;
    }
    *wall_s = t1 - t0;
    return rc;
}

static int write_outputs(const options *o, state *s)
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

static int run(const options *o, state *s)
{
    hidetc_status st = hidetc_model_load(o->artifact, 0, &s->model);
    if (st != HIDETC_OK) {
        s->model = NULL;
        runtime_error(st, NULL, last_error());
        return EXIT_RUNTIME;
    }
    s->nin = hidetc_model_num_inputs(s->model);
    s->nout = hidetc_model_num_outputs(s->model);
    if (s->nin < 0 || s->nout < 0) {
        error_msg("the runtime reports %d inputs and %d outputs", s->nin, s->nout);
        return EXIT_RUNTIME;
    }
    size_t ni = (size_t)(s->nin ? s->nin : 1), no = (size_t)(s->nout ? s->nout : 1);
    s->in_info = calloc(ni, sizeof *s->in_info);
    s->out_info = calloc(no, sizeof *s->out_info);
    s->given = malloc(ni * sizeof *s->given);
    s->paths = calloc(ni, sizeof *s->paths);
    s->arrays = calloc(ni, sizeof *s->arrays);
    s->in_ptrs = calloc(ni, sizeof *s->in_ptrs);
    s->out_rank = calloc(no, sizeof *s->out_rank);
    s->out_dims = calloc(no, sizeof *s->out_dims);
    s->out_bytes = calloc(no, sizeof *s->out_bytes);
    s->out_files = calloc(no, sizeof *s->out_files);
    if (!s->in_info || !s->out_info || !s->given || !s->paths || !s->arrays || !s->in_ptrs ||
        !s->out_rank || !s->out_dims || !s->out_bytes || !s->out_files) {
        error_msg("out of memory");
        return EXIT_RUNTIME;
    }
    for (int i = 0; i < s->nin; ++i) {
        s->given[i] = -1;
        st = hidetc_model_input_info(s->model, i, &s->in_info[i]);
        if (st == HIDETC_OK && (s->in_info[i].rank < 0 || s->in_info[i].rank > HIDETC_MAX_RANK))
            st = HIDETC_ERR_INTERNAL;
        if (st != HIDETC_OK) {
            runtime_error(st, "input info", last_error());
            return EXIT_RUNTIME;
        }
        if (!s->in_info[i].name) s->in_info[i].name = "?";
    }
    for (int i = 0; i < s->nout; ++i) {
        st = hidetc_model_output_info(s->model, i, &s->out_info[i]);
        if (st != HIDETC_OK) {
            runtime_error(st, "output info", last_error());
            return EXIT_RUNTIME;
        }
        if (!s->out_info[i].name) s->out_info[i].name = "?";
    }
    int rc = resolve_inputs(o, s);
    if (!rc) rc = read_inputs(s);
    if (!rc) rc = make_workers(o, s);
    double wall = 0;
    if (!rc) rc = run_workers(s, &wall);
    if (rc) return rc;

    for (int k = 0; k < s->nworkers; ++k) {
        const worker *w = &s->workers[k];
        if (!w->failed) continue;
        char ctx[64] = "";
        if (s->nworkers > 1) snprintf(ctx, sizeof ctx, "thread %d", k);
        runtime_error(w->status, ctx, w->err);
        return EXIT_RUNTIME;
    }
    for (int k = 1; k < s->nworkers; ++k)
        for (int i = 0; i < s->nout; ++i)
            if (memcmp(s->workers[k].outputs[i], s->workers[0].outputs[i], s->out_bytes[i])) {
                error_msg("thread %d output %s differs from thread 0", k, s->out_info[i].name);
                return EXIT_RUNTIME;
            }

    if (o->repeat_set || s->nworkers > 1) {
        size_t total = (size_t)o->repeat * (size_t)s->nworkers;
        s->all_times = malloc(total * sizeof *s->all_times);
        if (!s->all_times) {
            error_msg("out of memory");
            return EXIT_RUNTIME;
        }
        for (int k = 0; k < s->nworkers; ++k)
            memcpy(s->all_times + (size_t)k * (size_t)o->repeat, s->workers[k].times,
                   (size_t)o->repeat * sizeof *s->all_times);
        qsort(s->all_times, total, sizeof *s->all_times, cmp_double);
        double median = total % 2 ? s->all_times[total / 2]
                                  : 0.5 * (s->all_times[total / 2 - 1] + s->all_times[total / 2]);
        printf("median_ms=%.4f min_ms=%.4f runs=%ld threads=%d", median, s->all_times[0],
               o->repeat, s->nworkers);
        if (s->nworkers > 1)
            printf(" throughput=%.2f", wall > 0 ? (double)total / wall : 0.0);
        printf("\n");
    }
    if (o->output_dir) {
        rc = write_outputs(o, s);
        if (rc) return rc;
    }
    if (!o->quiet) {
        for (int i = 0; i < s->nout; ++i) {
            char shape[512];
            format_shape(s->out_rank[i], s->out_dims[i], shape, sizeof shape);
            if (s->out_files[i])
                printf("output %s: %s %s -> %s\n", s->out_info[i].name,
                       dtype_name(&s->out_info[i]), shape, s->out_files[i]);
            else
                printf("output %s: %s %s\n", s->out_info[i].name, dtype_name(&s->out_info[i]),
                       shape);
        }
    }
    if (o->maps && copy_maps(o->maps) != 0) return EXIT_RUNTIME;
    if (fflush(stdout) != 0) {
        error_msg("writing to stdout: %s", strerror(errno));
        return EXIT_RUNTIME;
    }
    return 0;
}

int main(int argc, char **argv)
{
    options o;
    int p = parse_args(argc, argv, &o);
    if (p != 0) {
        free(o.inputs);
        if (p > 0) {
            fputs(USAGE, stdout);
            return fflush(stdout) == 0 ? 0 : EXIT_RUNTIME;
        }
        return EXIT_USAGE;
    }
    state s;
    memset(&s, 0, sizeof s);
    int rc = run(&o, &s);
    free_state(&s);
    free(o.inputs);
    return rc;
}
