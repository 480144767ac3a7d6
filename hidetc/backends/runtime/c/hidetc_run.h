/* hidetc_run.h -- what the files of hidetc-run share (not installed): hidetc_run.c (the
 * command line, loading, the order of the steps, errors), run_io.c (input and output
 * files, dtypes and shapes) and run_threads.c (the contexts, the timed passes on one
 * thread or several, their comparison and the timing line).
 *
 * Assumes: the including file defines _GNU_SOURCE before any include (pthread_barrier_t
 * is POSIX, not C11); one thread (main's) uses these, but for the workers' own fields,
 * which each worker thread alone writes between run_workers' start and join.
 * Decides: every step returns 0 or the exit status it chose (EXIT_RUNTIME / EXIT_USAGE)
 * after reporting one line on stderr (error_msg); what a step allocates hangs off
 * `state` and free_state releases it, whichever step failed.
 */
#ifndef HIDETC_RUN_H
#define HIDETC_RUN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "hidetc.h"
#include "npy.h"

#define EXIT_RUNTIME 1
#define EXIT_USAGE 2

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

/* hidetc_run.c: errors, one line on stderr ("hidetc-run: error: ...") */
void error_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *last_error(void);    /* the runtime's message, or "(no message)" */
/* a failed runtime call: "<context: ><status>: <message>" */
void runtime_error(hidetc_status status, const char *context, const char *message);

/* run_io.c */
const char *dtype_name(const hidetc_tensor_info *info);
void format_shape(int rank, const int64_t *dims, char *buf, size_t n);   /* "(2, 3)" */
/* match "NAME=FILE" against the model's inputs (names may hold '='); usage errors */
int resolve_inputs(const options *o, state *s);
int read_inputs(state *s);       /* the files, checked against the inputs' dtypes, shapes */
int write_outputs(const options *o, state *s);   /* thread 0's outputs to --output-dir */
int copy_maps(const char *to);   /* /proc/self/maps to `to`; 0, else -1 (reported) */

/* run_threads.c */
/* a context per worker, the input shapes set on each, the output buffers */
int make_workers(const options *o, state *s);
int run_workers(state *s, double *wall_s);   /* the passes; *wall_s: first start to last end */
int compare_workers(const state *s);     /* a worker's failure, or outputs that differ */
int print_timing(const options *o, state *s, double wall_s);   /* the timing line */

#endif
