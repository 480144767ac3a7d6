/* hidetc_run.c -- hidetc-run, the command-line runner of a compiled artifact (C11): the
 * command line, the order of the steps, and the error lines every step reports.
 *
 * Uses only the public runtime API (hidetc.h), libc and pthreads; no Python. Built as
 *   gcc -std=c11 -O2 -Wall -Wextra hidetc_run.c run_io.c run_threads.c npy.c -I<include>
 *       -L<lib> -lhidetc_runtime -Wl,-rpath,'$ORIGIN/../lib' -pthread -o OUT/bin/hidetc-run
 *
 * The steps (run): load the model, read its inputs' and outputs' descriptions, match the
 * --input files to the inputs and read them (run_io.c), a context per thread and the
 * passes (run_threads.c), the threads' outputs compared and the timing line printed
 * (run_threads.c), the outputs written (run_io.c) and listed, /proc/self/maps copied.
 * The first step that fails ends the run.
 *
 * Exit status: 0 success; 1 a runtime error (the artifact, a file, a shape, a run);
 * 2 a usage error (bad options, an unknown / repeated / missing input name).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hidetc_run.h"

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

void error_msg(const char *fmt, ...)
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

const char *last_error(void)
{
    const char *e = hidetc_last_error();
    return (e && *e) ? e : "(no message)";
}

/* a failed runtime call: "<context: ><status>: <message>" */
void runtime_error(hidetc_status status, const char *context, const char *message)
{
    char name[64];
    status_text(status, name, sizeof name);
    if (context && *context) error_msg("%s: %s: %s", context, name, message);
    else error_msg("%s: %s", name, message);
}

/* ---- options ----------------------------------------------------------------------- */

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
/* ---- main ------------------------------------------------------------------------------ */

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

/* the steps, in order; the first that fails ends the run (its exit status) */
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
    if (!rc) rc = compare_workers(s);
    if (!rc) rc = print_timing(o, s, wall);
    if (rc) return rc;
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
