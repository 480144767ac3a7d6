/* cuda_model.h -- the cuda path's model state, shared by cuda_model.c (which fills it at
 * load) and cuda.c (whose contexts and passes read it); not installed.
 *
 * Guarantees: immutable after hx_cuda_model_init, so shared by every context and thread
 * without a lock. Decides: every staged device buffer starts at an HX_ALIGN offset; a
 * launch's arguments are packed like a C struct (natural alignment, 4 or 8 bytes each).
 */
#ifndef HIDETC_CUDA_MODEL_H
#define HIDETC_CUDA_MODEL_H

#include "cuda_driver.h"

struct hx_cuda_model {
    hx_cu cu;                         /* the driver, GPU 0 and its primary context */
    uint32_t nmodules;
    CUmodule *modules;
    CUfunction **functions;           /* [variant][launch] */
    CUdeviceptr weights;              /* 0: none allocated */
    size_t weight_bytes;
    size_t in_max[HX_MAX_IO], out_max[HX_MAX_IO];   /* bytes at the largest shapes */
    size_t io_bytes;                  /* one staging allocation: inputs, then outputs */
    size_t max_args;                  /* the largest packed argument buffer */
};

/* A packed launch argument's size in bytes (0: an unknown kind). */
static inline size_t hx_cuda_arg_size(uint32_t kind) {
    switch (kind) {
    case HX_ARG_I32: case HX_ARG_U32: case HX_ARG_F32: return 4;
    case HX_ARG_INPUT: case HX_ARG_OUTPUT: case HX_ARG_ARENA: case HX_ARG_WEIGHTS:
    case HX_ARG_SIZE: case HX_ARG_I64: case HX_ARG_U64: case HX_ARG_F64: return 8;
    default: return 0;
    }
}

static inline size_t hx_cuda_round_up(size_t n) {
    return (n + HX_ALIGN - 1) / HX_ALIGN * HX_ALIGN;
}

#endif
