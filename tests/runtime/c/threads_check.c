/* threads_check.c -- one loaded model, N threads with a context each, R passes each:
 * every output bit-identical to a single thread's, the weights mapped once, and the
 * heap in use after freeing everything what it was before (a second load/run/free cycle
 * measured after a first that warms libc, the loader and libgomp).
 *
 * The heap count (mallinfo2) holds malloc's thread caches as memory in use: run it with
 * GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1 (no thread caches,
 * one arena) for an exact count.
 *
 * usage: threads_check OUT THREADS RUNS   (inputs: every byte 0x3c; dynamic dims at
 * their smallest). Prints "ok passes=N" or one "error: ..." line and exits 1.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hidetc.h"

typedef struct {
    hidetc_model *model;
    void **inputs;
    void **expected;
    size_t *out_bytes;
    int nin, nout, runs, failed;
    const int64_t (*dims)[HIDETC_MAX_RANK];
    const int *ranks;
} job;

static int set_shapes(hidetc_context *c, const job *j) {
    for (int i = 0; i < j->nin; i++)
        if (hidetc_context_set_input_shape(c, i, j->ranks[i], j->dims[i]) != HIDETC_OK)
            return -1;
    return 0;
}

static void *worker(void *arg) {
    job *j = arg;
    hidetc_context_options opt = {.threads = 1};
    hidetc_context *c;
    if (hidetc_context_create(j->model, &opt, &c) != HIDETC_OK || set_shapes(c, j)) {
        fprintf(stderr, "error: %s\n", hidetc_last_error());
        j->failed = 1;
        return NULL;
    }
    void *outs[64];
    for (int k = 0; k < j->nout; k++)
        outs[k] = malloc(j->out_bytes[k] ? j->out_bytes[k] : 1);
    for (int r = 0; r < j->runs && !j->failed; r++) {
        if (hidetc_context_run(c, (const void *const *)j->inputs, outs) != HIDETC_OK) {
            fprintf(stderr, "error: %s\n", hidetc_last_error());
            j->failed = 1;
        }
        for (int k = 0; k < j->nout && !j->failed; k++)
            if (memcmp(outs[k], j->expected[k], j->out_bytes[k])) {
                fprintf(stderr, "error: output %d of pass %d differs from a single thread's\n",
                        k, r);
                j->failed = 1;
            }
    }
    for (int k = 0; k < j->nout; k++)
        free(outs[k]);
    hidetc_context_free(c);
    return NULL;
}

static int weight_maps(const char *dir) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int n = 0;
    size_t len = strlen(dir);
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, dir) && strstr(line, "weights.bin") && len)
            n++;
    if (f)
        fclose(f);
    return n;
}

static int cycle(const char *dir, int threads, int runs, int *maps) {
    hidetc_model *m;
    if (hidetc_model_load(dir, 0, &m) != HIDETC_OK) {
        fprintf(stderr, "error: %s\n", hidetc_last_error());
        return 1;
    }
    job base = {.model = m, .nin = hidetc_model_num_inputs(m),
                .nout = hidetc_model_num_outputs(m), .runs = runs};
    int64_t dims[64][HIDETC_MAX_RANK];
    int ranks[64];
    void *inputs[64], *expected[64];
    size_t out_bytes[64];
    for (int i = 0; i < base.nin; i++) {
        hidetc_tensor_info info;
        hidetc_model_input_info(m, i, &info);
        size_t n = info.elem_bytes;
        ranks[i] = info.rank;
        for (int d = 0; d < info.rank; d++)
            n *= (size_t)(dims[i][d] = info.dim_min[d]);
        inputs[i] = malloc(n ? n : 1);
        memset(inputs[i], 0x3c, n);
    }
    base.dims = (const int64_t(*)[HIDETC_MAX_RANK])dims;
    base.ranks = ranks;
    hidetc_context *single;
    hidetc_context_options opt = {.threads = 1};
    int status = hidetc_context_create(m, &opt, &single) || set_shapes(single, &base);
    for (int k = 0; !status && k < base.nout; k++) {
        hidetc_context_output_bytes(single, k, &out_bytes[k]);
        expected[k] = malloc(out_bytes[k] ? out_bytes[k] : 1);
    }
    status = status || hidetc_context_run(single, (const void *const *)inputs, expected);
    if (status)
        fprintf(stderr, "error: %s\n", hidetc_last_error());
    hidetc_context_free(single);
    base.inputs = inputs;
    base.expected = expected;
    base.out_bytes = out_bytes;
    pthread_t tid[64];
    job jobs[64];
    for (int t = 0; !status && t < threads; t++) {
        jobs[t] = base;
        pthread_create(&tid[t], NULL, worker, &jobs[t]);
    }
    *maps = weight_maps(dir);
    for (int t = 0; !status && t < threads; t++) {
        pthread_join(tid[t], NULL);
        status |= jobs[t].failed;
    }
    for (int i = 0; i < base.nin; i++)
        free(inputs[i]);
    for (int k = 0; k < base.nout; k++)
        free(expected[k]);
    hidetc_model_free(m);
    return status;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: threads_check OUT THREADS RUNS\n");
        return 2;
    }
    int threads = atoi(argv[2]), runs = atoi(argv[3]), maps = 0;
    if (threads < 1 || threads > 64 || runs < 1)
        return 2;
    if (cycle(argv[1], threads, 1, &maps))
        return 1;
    struct mallinfo2 before = mallinfo2();
    if (cycle(argv[1], threads, runs, &maps))
        return 1;
    struct mallinfo2 after = mallinfo2();
    if (maps != 1) {
        fprintf(stderr, "error: the weights are mapped %d times, expected once\n", maps);
        return 1;
    }
    /* The count moves by a few bytes either way with the threads' timing (glibc's own
       per-thread structures: seen +-32); a leak of one byte per pass would add
       threads x runs. */
    if (after.uordblks > before.uordblks + 256) {
        fprintf(stderr, "error: heap in use %zu bytes after, %zu before\n", after.uordblks,
                before.uordblks);
        return 1;
    }
    printf("ok passes=%d\n", threads * runs);
    return 0;
}
