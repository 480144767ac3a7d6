/* cuda_driver.c -- the CUDA driver loaded at run time, GPU 0 opened, and the helpers every
 * driver call of the cuda path goes through (cuda_driver.h).
 *
 * Decides: the driver is loaded at model load with dlopen -- the library named by the
 * environment variable HIDETC_CUDA_DRIVER if set (the tests' fake driver), else
 * libcuda.so.1 -- and every entry point found with dlsym (the _v2 names the driver exports
 * for the current ABI). Each model holds its own table (so a process may load models
 * against different drivers, as the tests do); the handle is never dlclose'd (unloading
 * libcuda under a live process is not something its users do). The device is GPU 0
 * (CUDA_VISIBLE_DEVICES selects) and its primary context, retained.
 *
 * Assumes: the caller zeroed the hx_cu it opens, and holds it for as long as anything made
 * with it lives. Guarantees: every failure is one line via hx_fail (cuda_driver.h's
 * Errors); the current context is changed only between hx_cu_enter and hx_cu_leave.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"

/* ------------------------------------------------------------------ entry points */

/* symbol, older symbol with the same signature (NULL: none), slot */
static const struct { const char *name, *fallback; size_t slot; } CU_SYMBOLS[] = {
    {"cuInit", NULL, offsetof(hx_cu, Init)},
    {"cuDeviceGetCount", NULL, offsetof(hx_cu, DeviceGetCount)},
    {"cuDeviceGet", NULL, offsetof(hx_cu, DeviceGet)},
    {"cuDeviceGetAttribute", NULL, offsetof(hx_cu, DeviceGetAttribute)},
    {"cuDeviceGetName", NULL, offsetof(hx_cu, DeviceGetName)},
    {"cuDevicePrimaryCtxRetain", NULL, offsetof(hx_cu, DevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease_v2", NULL, offsetof(hx_cu, DevicePrimaryCtxRelease)},
    {"cuCtxGetCurrent", NULL, offsetof(hx_cu, CtxGetCurrent)},
    {"cuCtxSetCurrent", NULL, offsetof(hx_cu, CtxSetCurrent)},
    {"cuModuleLoadData", NULL, offsetof(hx_cu, ModuleLoadData)},
    {"cuModuleUnload", NULL, offsetof(hx_cu, ModuleUnload)},
    {"cuModuleGetFunction", NULL, offsetof(hx_cu, ModuleGetFunction)},
    {"cuFuncGetAttribute", NULL, offsetof(hx_cu, FuncGetAttribute)},
    {"cuFuncSetAttribute", NULL, offsetof(hx_cu, FuncSetAttribute)},
    {"cuMemAlloc_v2", NULL, offsetof(hx_cu, MemAlloc)},
    {"cuMemFree_v2", NULL, offsetof(hx_cu, MemFree)},
    {"cuMemGetInfo_v2", NULL, offsetof(hx_cu, MemGetInfo)},
    {"cuMemcpyHtoDAsync_v2", NULL, offsetof(hx_cu, MemcpyHtoDAsync)},
    {"cuMemcpyDtoHAsync_v2", NULL, offsetof(hx_cu, MemcpyDtoHAsync)},
    {"cuMemcpyDtoDAsync_v2", NULL, offsetof(hx_cu, MemcpyDtoDAsync)},
    {"cuMemsetD8Async", NULL, offsetof(hx_cu, MemsetD8Async)},
    {"cuStreamCreate", NULL, offsetof(hx_cu, StreamCreate)},
    {"cuStreamDestroy_v2", NULL, offsetof(hx_cu, StreamDestroy)},
    {"cuStreamSynchronize", NULL, offsetof(hx_cu, StreamSynchronize)},
    {"cuStreamBeginCapture_v2", NULL, offsetof(hx_cu, StreamBeginCapture)},
    {"cuStreamEndCapture", NULL, offsetof(hx_cu, StreamEndCapture)},
    {"cuGraphInstantiateWithFlags", NULL, offsetof(hx_cu, GraphInstantiateWithFlags)},
    {"cuGraphLaunch", NULL, offsetof(hx_cu, GraphLaunch)},
    {"cuGraphExecDestroy", NULL, offsetof(hx_cu, GraphExecDestroy)},
    {"cuGraphDestroy", NULL, offsetof(hx_cu, GraphDestroy)},
    {"cuEventCreate", NULL, offsetof(hx_cu, EventCreate)},
    {"cuEventRecord", NULL, offsetof(hx_cu, EventRecord)},
    /* _v2 since CUDA 12.8 (cuda.h maps the name to it); older drivers export the first */
    {"cuEventElapsedTime_v2", "cuEventElapsedTime", offsetof(hx_cu, EventElapsedTime)},
    {"cuEventDestroy_v2", NULL, offsetof(hx_cu, EventDestroy)},
    {"cuLaunchKernel", NULL, offsetof(hx_cu, LaunchKernel)},
    {"cuGetErrorName", NULL, offsetof(hx_cu, GetErrorName)},
};

/* ------------------------------------------------------------------ errors */

static const char *cu_error_name(const hx_cu *cu, CUresult rc, char *buf, size_t n) {
    const char *s = NULL;
    if (cu && cu->GetErrorName && cu->GetErrorName(rc, &s) == CUDA_SUCCESS && s)
        return s;
    snprintf(buf, n, "CUDA error %d", rc);
    return buf;
}

static int sticky(CUresult rc) {
    return rc == CUDA_ERROR_ILLEGAL_ADDRESS || rc == CUDA_ERROR_ASSERT ||
           (rc >= CUDA_ERROR_HARDWARE_STACK_ERROR && rc <= CUDA_ERROR_LAUNCH_FAILED);
}

hidetc_status hx_cu_fail(const hx_cu *cu, hidetc_status st, CUresult rc, const char *call,
                         const char *fmt, ...) {
    char what[640], buf[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return hx_fail(st, "%s: %s failed on %s: %s%s", what, call, cu->gpu[0] ? cu->gpu : "the GPU",
                   cu_error_name(cu, rc, buf, sizeof buf),
                   sticky(rc) ? " (a kernel fault: CUDA is unusable in this process until it "
                                "restarts; HIDETC_CUDA_SYNC_EACH=1 names the kernel)" : "");
}

hidetc_status hx_cu_alloc(const hx_cu *cu, CUdeviceptr *p, size_t bytes, const char *what) {
    size_t n = bytes < HX_ALIGN ? HX_ALIGN : bytes;
    CUresult rc = cu->MemAlloc(p, n);
    if (rc == CUDA_SUCCESS)
        return HIDETC_OK;
    *p = 0;
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
        size_t free_b = 0, total = 0;
        cu->MemGetInfo(&free_b, &total);
        return hx_fail(HIDETC_ERR_MEMORY, "out of GPU memory: %zu bytes for the %s but only "
                       "%zu of %zu bytes are free on %s", n, what, free_b, total, cu->gpu);
    }
    return hx_cu_fail(cu, HIDETC_ERR_DEVICE, rc, "cuMemAlloc", "allocating the %s (%zu bytes)",
                      what, n);
}

/* ------------------------------------------------------------------ current context */

hidetc_status hx_cu_enter(const hx_cu *cu, hx_cu_current *cur) {
    cur->prev = NULL;
    cur->changed = 0;
    if (cu->CtxGetCurrent(&cur->prev) != CUDA_SUCCESS)
        cur->prev = NULL;
    if (cur->prev == cu->ctx)
        return HIDETC_OK;
    CUresult rc = cu->CtxSetCurrent(cu->ctx);
    if (rc != CUDA_SUCCESS)
        return hx_cu_fail(cu, HIDETC_ERR_DEVICE, rc, "cuCtxSetCurrent",
                          "making the GPU's primary context current");
    cur->changed = 1;
    return HIDETC_OK;
}

void hx_cu_leave(const hx_cu *cu, const hx_cu_current *cur) {
    if (cur->changed)
        cu->CtxSetCurrent(cur->prev);
}

/* ------------------------------------------------------------------ opening */

static hidetc_status load_driver(hx_cu *cu, const char *dir) {
    const char *env = getenv("HIDETC_CUDA_DRIVER");
    const char *name = env && *env ? env : "libcuda.so.1";
    dlerror();
    cu->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!cu->lib) {
        const char *why = dlerror();
        return hx_fail(HIDETC_ERR_MACHINE, "%s: this artifact targets cuda but the CUDA driver "
                       "cannot be loaded (%s): it needs an NVIDIA GPU and its driver", dir,
                       why ? why : name);
    }
    for (size_t k = 0; k < sizeof CU_SYMBOLS / sizeof CU_SYMBOLS[0]; k++) {
        void *p = dlsym(cu->lib, CU_SYMBOLS[k].name);
        if (!p && CU_SYMBOLS[k].fallback)
            p = dlsym(cu->lib, CU_SYMBOLS[k].fallback);
        if (!p)
            return hx_fail(HIDETC_ERR_MACHINE, "%s: the CUDA driver %s has no %s: it is older "
                           "than this runtime needs (CUDA 11.4 or newer)", dir, name,
                           CU_SYMBOLS[k].name);
        memcpy((char *)cu + CU_SYMBOLS[k].slot, &p, sizeof p);
    }
    return HIDETC_OK;
}

static hidetc_status open_device(hx_cu *cu, const char *dir) {
    char buf[32];
    CUresult rc = cu->Init(0);
    int count = 0;
    if (rc == CUDA_SUCCESS)
        rc = cu->DeviceGetCount(&count);
    if (rc != CUDA_SUCCESS || count < 1)
        return hx_fail(HIDETC_ERR_MACHINE, "%s: this artifact targets cuda but no CUDA GPU is "
                       "visible (%s)", dir, rc != CUDA_SUCCESS ?
                       cu_error_name(cu, rc, buf, sizeof buf) : "no CUDA device found");
    rc = cu->DeviceGet(&cu->device, 0);
    if (rc == CUDA_SUCCESS)
        rc = cu->DeviceGetAttribute(&cu->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                    cu->device);
    if (rc == CUDA_SUCCESS)
        rc = cu->DeviceGetAttribute(&cu->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                    cu->device);
    if (rc != CUDA_SUCCESS)
        return hx_cu_fail(cu, HIDETC_ERR_MACHINE, rc, "cuDeviceGetAttribute",
                          "%s: reading GPU 0's compute capability", dir);
    char name[128] = "GPU 0";
    if (cu->DeviceGetName(name, (int)sizeof name - 1, cu->device) != CUDA_SUCCESS)
        snprintf(name, sizeof name, "GPU 0");
    name[sizeof name - 1] = 0;
    snprintf(cu->gpu, sizeof cu->gpu, "%s (sm_%d)", name, cu->major * 10 + cu->minor);
    rc = cu->DevicePrimaryCtxRetain(&cu->ctx, cu->device);
    if (rc != CUDA_SUCCESS) {
        cu->ctx = NULL;
        return hx_cu_fail(cu, HIDETC_ERR_DEVICE, rc, "cuDevicePrimaryCtxRetain",
                          "%s: opening GPU 0's primary context", dir);
    }
    return HIDETC_OK;
}

hidetc_status hx_cu_open(hx_cu *cu, const char *dir) {
    hidetc_status st = load_driver(cu, dir);
    if (st == HIDETC_OK)
        st = open_device(cu, dir);
    return st;
}
