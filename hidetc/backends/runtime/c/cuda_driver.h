/* cuda_driver.h -- the CUDA driver as the cuda path uses it (cuda_driver.c; not installed):
 * the types and values of cuda.h it needs, its entry points with the device they opened
 * (hx_cu), and the helpers every driver call goes through: errors, device allocation,
 * the current context. cuda_model.c and cuda.c build on it.
 *
 * Assumes: a 64-bit host (CUdeviceptr is 64 bits, as the kernel-parameter ABI's pointers).
 * cuda.h is not included: the few types and values used are copied below from CUDA 13.0's
 * cuda.h (they are part of the driver's stable ABI).
 *
 * Guarantees: an hx_cu is filled once, by hx_cu_open, and only read afterwards, so every
 * context and thread of a model may share it. Every entry point of the cuda path makes
 * the primary context current with hx_cu_enter and restores the thread's previous one
 * with hx_cu_leave, so any thread may use any context.
 *
 * Errors (one line via hx_fail): no driver library, a driver without an entry point, no
 * GPU, no image for the GPU's arch, a kernel whose block or shared memory the GPU cannot
 * run -> HIDETC_ERR_MACHINE; out of device memory -> HIDETC_ERR_MEMORY (bytes asked and
 * free); any other failing driver call -> HIDETC_ERR_DEVICE naming the call and its
 * error (cuGetErrorName), for launches the launch index, kernel, grid and block. A kernel
 * fault is sticky in CUDA (the process's context is unusable afterwards): the message
 * says so.
 */
#ifndef HIDETC_CUDA_DRIVER_H
#define HIDETC_CUDA_DRIVER_H

#include <stddef.h>

#include "internal.h"

/* ------------------------------------------------------------------ from cuda.h (13.0) */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;      /* CUdeviceptr_v2 on 64-bit hosts */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_ASSERT = 710,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_LAUNCH_FAILED = 719,
};
enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
       CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76 };
enum { CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
       CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };
enum { CU_STREAM_NON_BLOCKING = 1 };
enum { CU_EVENT_DEFAULT = 0 };
enum { CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1 };
#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

/* ------------------------------------------------------------------ the driver */

/* The driver's entry points (found by name: cuda_driver.c's CU_SYMBOLS) and the device
   opened with them. */
typedef struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncGetAttribute)(int *, int, CUfunction);
    CUresult (*FuncSetAttribute)(CUfunction, int, int);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamBeginCapture)(CUstream, int);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*GraphDestroy)(CUgraph);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, unsigned int, CUstream,
                             void **, void **);
    CUresult (*GetErrorName)(CUresult, const char **);
    void *lib;                        /* the driver (never closed) */
    CUdevice device;
    CUcontext ctx;                    /* the primary context, retained (NULL: not yet) */
    int major, minor;
    char gpu[192];                    /* "NVIDIA H100 80GB HBM3 (sm_90)" */
} hx_cu;

#define HX_ALIGN 256                      /* bytes: every staged buffer's offset */

/* Load the driver (HIDETC_CUDA_DRIVER, else libcuda.so.1), find every entry point, open
   GPU 0 and retain its primary context into cu (zeroed by the caller). `dir` (the
   artifact) starts the messages. The owner releases the context
   (cu->DevicePrimaryCtxRelease) once it has freed what it made in it. */
hidetc_status hx_cu_open(hx_cu *cu, const char *dir);

/* "<what>: <call> failed on <gpu>: <ERROR NAME>[ (hint)]" with status `st` */
hidetc_status hx_cu_fail(const hx_cu *cu, hidetc_status st, CUresult rc, const char *call,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* cuMemAlloc of at least HX_ALIGN bytes: out of memory is HIDETC_ERR_MEMORY with the
   bytes free; *p is 0 on failure */
hidetc_status hx_cu_alloc(const hx_cu *cu, CUdeviceptr *p, size_t bytes, const char *what);

/* The primary context made current on the calling thread (hx_cu_enter), and the thread's
   previous context restored (hx_cu_leave, only after an hx_cu_enter that succeeded). */
typedef struct { CUcontext prev; int changed; } hx_cu_current;
hidetc_status hx_cu_enter(const hx_cu *cu, hx_cu_current *cur);
void hx_cu_leave(const hx_cu *cu, const hx_cu_current *cur);

#endif
