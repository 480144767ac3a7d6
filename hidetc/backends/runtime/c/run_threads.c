/* run_threads.c -- hidetc-run's passes: a context per thread, the untimed warm-up and the
 * timed passes on one thread or several at once, the threads' outputs compared, and the
 * timing line.
 *
 * Assumes: the inputs are read (run_io.c) and shared read-only by every thread; each
 * thread has its own context and output buffers. Guarantees: with several threads, none
 * starts unless all started (a gate), and every thread's timed passes start together (a
 * barrier); the outputs of every thread must be bit-identical to thread 0's. Decides:
 * each context uses max(1, cores/threads) intra-op threads unless OMP_NUM_THREADS is set;
 * the timing line is the median and minimum over every timed pass of every thread, and
 * with several threads the throughput over the wall time from the first start to the
 * last end.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hidetc_run.h"

#define ALIGN 64

/* ---- buffers, time, cores --------------------------------------------------------------- */

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

/* ---- the passes ---------------------------------------------------------------------- */

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

/* a context per worker, the input shapes set on each, the output buffers */
int make_workers(const options *o, state *s)
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

int run_workers(state *s, double *wall_s)
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

int compare_workers(const state *s)
{
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
    return 0;
}

int print_timing(const options *o, state *s, double wall_s)
{
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
            printf(" throughput=%.2f", wall_s > 0 ? (double)total / wall_s : 0.0);
        printf("\n");
    }
    return 0;
}
