/* overhead.c -- the C runtime's per-call cost beside calling the kernel library directly.
 *
 * usage: overhead OUT CALLS BLOCKS
 * Loads OUT with the runtime (one context, one intra-op thread) and, beside it, opens the
 * same kernel library by path with the weights mapped, as a caller of `hidetc_forward`
 * would; both run the same zero inputs into the same output buffers. Blocks of CALLS
 * calls alternate between the two; prints the median per-call microseconds of each and
 * their difference: `direct_us=.. runtime_us=.. overhead_us=..`. Static artifacts.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hidetc.h"

typedef void (*forward_fn)(void **, void **, char *, char *, long long *);

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 4)
        return fprintf(stderr, "usage: overhead OUT CALLS BLOCKS\n"), 2;
    const char *out = argv[1];
    int calls = atoi(argv[2]), blocks = atoi(argv[3]);
    hidetc_model *m;
    hidetc_context *c;
    hidetc_context_options opt = {.threads = 1};
    if (hidetc_model_load(out, 0, &m) || hidetc_context_create(m, &opt, &c))
        return fprintf(stderr, "error: %s\n", hidetc_last_error()), 1;
    int nin = hidetc_model_num_inputs(m), nout = hidetc_model_num_outputs(m);
    void *in[64], *outs[64];
    for (int i = 0; i < nin; i++) {
        hidetc_tensor_info info;
        hidetc_model_input_info(m, i, &info);
        size_t n = info.elem_bytes;
        for (int d = 0; d < info.rank; d++)
            n *= (size_t)info.dims[d];
        in[i] = calloc(1, n + 64);
    }
    for (int i = 0; i < nout; i++) {
        size_t n;
        hidetc_context_output_bytes(c, i, &n);
        outs[i] = calloc(1, n + 64);
    }
    size_t arena_bytes;
    hidetc_context_workspace_bytes(c, &arena_bytes);
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels/model.so", out);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    forward_fn forward = lib ? (forward_fn)dlsym(lib, "hidetc_forward") : NULL;
    snprintf(path, sizeof path, "%s/weights.bin", out);
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (!forward || fd < 0 || fstat(fd, &st))
        return fprintf(stderr, "error: cannot open the kernel library or weights\n"), 1;
    char *weights = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)
                               : NULL;
    char *arena = aligned_alloc(64, (arena_bytes + 127) / 64 * 64);
    memset(arena, 0, (arena_bytes + 127) / 64 * 64);
    long long sizes[1] = {0};
    double *direct = calloc((size_t)blocks, sizeof *direct);
    double *runtime = calloc((size_t)blocks, sizeof *runtime);
    for (int w = 0; w < 2; w++)      /* warm both (and set the OpenMP team to one) */
        if (hidetc_context_run(c, (const void *const *)in, outs))
            return fprintf(stderr, "error: %s\n", hidetc_last_error()), 1;
    for (int b = 0; b < blocks; b++) {
        double t0 = now_us();
        for (int k = 0; k < calls; k++)
            forward(in, outs, arena, weights, sizes);
        double t1 = now_us();
        for (int k = 0; k < calls; k++)
            hidetc_context_run(c, (const void *const *)in, outs);
        double t2 = now_us();
        direct[b] = (t1 - t0) / calls;
        runtime[b] = (t2 - t1) / calls;
    }
    qsort(direct, (size_t)blocks, sizeof *direct, cmp);
    qsort(runtime, (size_t)blocks, sizeof *runtime, cmp);
    double d = direct[blocks / 2], r = runtime[blocks / 2];
    printf("direct_us=%.3f runtime_us=%.3f overhead_us=%.3f\n", d, r, r - d);
    for (int i = 0; i < nin; i++)
        free(in[i]);
    for (int i = 0; i < nout; i++)
        free(outs[i]);
    free(direct);
    free(runtime);
    free(arena);
    hidetc_context_free(c);
    hidetc_model_free(m);
    return 0;
}
