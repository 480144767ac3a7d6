"""The emulator's execution model and failure reports: barriers with exited threads,
deadlock, divergent barriers and collectives, misaligned copies, bad launches and
arguments, the order of blocks (forward or reversed), compile errors (ToolchainError
with the reproduce command), the build cache,
the ucontext fallback, big local arrays on fiber stacks, and the switch rate."""
import time

import numpy as np
import pytest

from hidetc.backends.runtime.emulator import EmulatedModule, EmulatorError, build_emulated
from hidetc.backends.toolchain.cache import BuildCache
from hidetc.errors import ToolchainError

SOURCE = r"""
#include "hidetc_cuda.h"

extern "C" __global__ void early_exit(const float *in, float *out, int n) {
  __shared__ float s[256];
  int t = threadIdx.x;
  if (t >= n) return;                      /* exited threads count as arrived */
  s[t] = in[t] * 2.0f;
  __syncthreads();
  out[t] = s[(t + 1) % n];
}

extern "C" __global__ void arrival(unsigned *counter, unsigned *order) {
  if (threadIdx.x == 0)
    order[(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x] = atomicAdd(counter, 1u);
}

extern "C" __global__ void thread_arrival(unsigned *counter, unsigned *order) {
  order[threadIdx.x] = atomicAdd(counter, 1u);
  __syncthreads();
  order[blockDim.x + threadIdx.x] = atomicAdd(counter, 1u);   /* after the barrier */
}

/* cp.async: groups of one 16-byte copy each; what a thread sees of them */
extern "C" __global__ void cp_groups(const float *in, float *out, int wait) {
  __shared__ __align__(16) float s[3][128];
  for (int g = 0; g < 3; g++) {
    hidetc_cp_async16(&s[g][threadIdx.x * 4], in + (g * 32 + threadIdx.x) * 4, true);
    hidetc_cp_async_commit();
  }
  if (wait >= 0) hidetc_cp_async_wait_group(wait);
  for (int g = 0; g < 3; g++) out[g * 32 + threadIdx.x] = HIDETC_SLD(s[g], threadIdx.x * 4);
}

extern "C" __global__ void cp_neighbour(const float *in, float *out, int barrier) {
  __shared__ __align__(16) float s[128];
  hidetc_cp_async16(&s[threadIdx.x * 4], in + threadIdx.x * 4, true);
  hidetc_cp_async_wait_all();
  if (barrier) __syncthreads();
  out[threadIdx.x] = s[((threadIdx.x + 1) % 32) * 4];   /* another thread's copy */
}

/* thread t stores its slot, then loads another warp's. mode 0: nothing stored before
 * (uninitialized); 1: stored before a barrier, stored again, no barrier (a race); 2: a
 * barrier after the second store too (clean) */
extern "C" __global__ void other_warp(const float *in, float *out, int mode) {
  __shared__ float s[64];
  if (mode > 0) {
    HIDETC_SST(s, threadIdx.x, 0.0f);
    __syncthreads();
  }
  HIDETC_SST(s, threadIdx.x, in[threadIdx.x]);
  if (mode == 2) __syncthreads();
  out[threadIdx.x] = HIDETC_SLD(s, (threadIdx.x + 32) % 64);
}

extern "C" __global__ void shared_overrun(float *out, int extra) {
  __shared__ float s[32];
  HIDETC_SST(s, threadIdx.x + extra, 1.0f);   /* extra = 1: the last thread writes s[32] */
  __syncthreads();
  out[threadIdx.x] = HIDETC_SLD(s, threadIdx.x);
}

/* slices of a dynamic shared array are bounds-checked like static arrays */
extern "C" __global__ void slice_overrun(float *out, int extra) {
  HIDETC_DYNAMIC_SHARED(smem, 256);
  HIDETC_SHARED_SLICE(float, a, 16, smem, 0);
  HIDETC_SHARED_SLICE(float, b, 32, smem, 64);
  if (threadIdx.x < 16) HIDETC_SST(a, threadIdx.x, 1.0f);
  HIDETC_SST(b, threadIdx.x + extra, 2.0f);   /* extra = 1: b[32] is past b (in smem) */
  __syncthreads();
  out[threadIdx.x] = HIDETC_SLD(a, threadIdx.x % 16) + HIDETC_SLD(b, threadIdx.x);
}

/* lane t stores its slot, then loads lane t+1's: mode 0 with nothing between (a race
 * within the warp), 1 with __syncwarp between, 2 with a shuffle between (clean) */
extern "C" __global__ void same_warp(const float *in, float *out, int mode) {
  __shared__ float s[32];
  HIDETC_SST(s, threadIdx.x, 0.0f);
  __syncthreads();
  HIDETC_SST(s, threadIdx.x, in[threadIdx.x]);
  if (mode == 1) __syncwarp();
  float v = 0.0f;
  if (mode == 2) v = __shfl_sync(0xffffffffu, v, 0);
  out[threadIdx.x] = v + HIDETC_SLD(s, (threadIdx.x + 1) % 32);
}

/* an accumulator zeroed (zero = 1) or not: a local array starts as poison */
extern "C" __global__ void accumulate(const float *in, float *out, int zero) {
  float acc[4];
  HIDETC_LOCAL_POISON(acc);
  if (zero)
    for (int i = 0; i < 4; i++) acc[i] = 0.0f;
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  for (int i = 0; i < 4; i++) acc[i] += in[t * 4 + i];
  out[t] = acc[0] + acc[1] + acc[2] + acc[3];
}

extern "C" __global__ void deadlock(float *out) {
  float v = 1.0f;
  if (threadIdx.x < 16) __syncthreads();   /* the shuffle needs lanes 0..15 */
  else v = __shfl_sync(0xffffffffu, v, 0);
  out[threadIdx.x] = v;
}

extern "C" __global__ void divergent_barrier(float *out) {
  if (threadIdx.x < 32) { __syncthreads(); out[threadIdx.x] = 1.0f; }
  else { __syncthreads(); out[threadIdx.x] = 2.0f; }
}

extern "C" __global__ void divergent_collective(unsigned *out) {
  unsigned v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_sync(0xffffffffu, v, 0);
  else v = __ballot_sync(0xffffffffu, 1);
  out[threadIdx.x] = v;
}

extern "C" __global__ void mask_without_me(unsigned *out) {
  out[threadIdx.x] = __ballot_sync(0x1u, 1);
}

extern "C" __global__ void misaligned(const float *in, float *out) {
  __shared__ __align__(16) float s[8];
  hidetc_cp_async16(&s[0], in + 1, true);
  hidetc_cp_async_wait_all();
  out[0] = s[0];
}

extern "C" __global__ void ldmatrix_half_warp(unsigned *out) {
  __shared__ __align__(16) unsigned short s[8][8];
  unsigned r[1];
  hidetc_ldmatrix_x1(r, &s[threadIdx.x % 8][0]);
  out[threadIdx.x] = r[0];
}

extern "C" __global__ void trap(float *out) {
  if (threadIdx.x == 5) __trap();
  out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void big_locals(const float *in, float *out) {
  float local[20000];                      /* 80 KB on the fiber's stack */
  for (int i = 0; i < 20000; i++) local[i] = in[i % 64] + (float)threadIdx.x;
  float s = 0.0f;
  for (int i = 0; i < 20000; i += 997) s += local[i];
  out[threadIdx.x] = s;
}

extern "C" __global__ void barrier_loop(int *count, int iters) {
  __shared__ int s[256];
  for (int k = 0; k < iters; k++) {
    s[threadIdx.x] = k;
    __syncthreads();
  }
  if (threadIdx.x == 0) count[0] = s[255] + 1;
}

#ifdef HIDETC_EMULATE
extern "C" void early_exit_emu_entry(void **a) {
  early_exit((const float *)a[0], (float *)a[1], *(int *)a[2]);
}
extern "C" void arrival_emu_entry(void **a) { arrival((unsigned *)a[0], (unsigned *)a[1]); }
extern "C" void thread_arrival_emu_entry(void **a) {
  thread_arrival((unsigned *)a[0], (unsigned *)a[1]);
}
extern "C" void cp_groups_emu_entry(void **a) {
  cp_groups((const float *)a[0], (float *)a[1], *(int *)a[2]);
}
extern "C" void cp_neighbour_emu_entry(void **a) {
  cp_neighbour((const float *)a[0], (float *)a[1], *(int *)a[2]);
}
extern "C" void other_warp_emu_entry(void **a) {
  other_warp((const float *)a[0], (float *)a[1], *(int *)a[2]);
}
extern "C" void shared_overrun_emu_entry(void **a) {
  shared_overrun((float *)a[0], *(int *)a[1]);
}
extern "C" void deadlock_emu_entry(void **a) { deadlock((float *)a[0]); }
extern "C" void slice_overrun_emu_entry(void **a) { slice_overrun((float *)a[0], *(int *)a[1]); }
extern "C" void same_warp_emu_entry(void **a) {
  same_warp((const float *)a[0], (float *)a[1], *(int *)a[2]);
}
extern "C" void accumulate_emu_entry(void **a) {
  accumulate((const float *)a[0], (float *)a[1], *(int *)a[2]);
}
extern "C" void divergent_barrier_emu_entry(void **a) { divergent_barrier((float *)a[0]); }
extern "C" void divergent_collective_emu_entry(void **a) { divergent_collective((unsigned *)a[0]); }
extern "C" void mask_without_me_emu_entry(void **a) { mask_without_me((unsigned *)a[0]); }
extern "C" void misaligned_emu_entry(void **a) { misaligned((const float *)a[0], (float *)a[1]); }
extern "C" void ldmatrix_half_warp_emu_entry(void **a) { ldmatrix_half_warp((unsigned *)a[0]); }
extern "C" void trap_emu_entry(void **a) { trap((float *)a[0]); }
extern "C" void big_locals_emu_entry(void **a) { big_locals((const float *)a[0], (float *)a[1]); }
extern "C" void barrier_loop_emu_entry(void **a) { barrier_loop((int *)a[0], *(int *)a[1]); }
#endif
"""


@pytest.fixture(scope="module")
def module():
    return EmulatedModule(build_emulated({"emu_runtime": SOURCE}))


def test_cp_async_lands_only_when_its_thread_waits(module):
    """Copies are queued per thread in commit groups: wait_group(n) lands all but the n
    newest groups; until a copy lands its destination reads as poison (NaN), so a
    missing or too-weak wait shows up as NaN in what the kernel computed."""
    src = np.arange(3 * 32 * 4, dtype=np.float32)
    want = src.reshape(3, 32, 4)[:, :, 0]
    for wait, landed in ((-1, 0), (2, 1), (1, 2), (0, 3)):
        out = np.zeros(96, np.float32)
        module.launch("cp_groups", 1, 32, [src, out, np.int32(wait)])
        got = out.reshape(3, 32)
        assert (got[:landed] == want[:landed]).all(), (wait, got)
        assert np.isnan(got[landed:]).all(), (wait, got)


def test_a_missing_barrier_after_the_wait_reads_a_neighbour_s_copy_too_early(module):
    """A thread's wait covers its own copies: reading another thread's copy needs the
    barrier after the wait (the planted bug of issue 26). Without it, in either thread
    order, some thread reads its neighbour's destination before that copy landed."""
    src = np.arange(128, dtype=np.float32)
    want = np.roll(src.reshape(32, 4)[:, 0], -1)
    for reverse in (False, True):
        out = np.zeros(32, np.float32)
        module.launch("cp_neighbour", 1, 32, [src, out, np.int32(1)], reverse=reverse)
        assert (out == want).all()
        out = np.zeros(32, np.float32)
        module.launch("cp_neighbour", 1, 32, [src, out, np.int32(0)], reverse=reverse)
        assert not (out == want).all(), reverse


def test_races_on_shared_memory_are_reported(module):
    """With race checks, a load of bytes another warp stored in the same barrier
    interval (or a store to bytes another warp loaded) fails the launch naming both
    threads and lines, in either thread order; a load of bytes no thread of the block
    stored fails as uninitialized. After a barrier it is fine, and without the checks
    the race runs."""
    src, out = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    module.launch("other_warp", 1, 64, [src, out, np.int32(2)], races=True)
    assert (out == np.roll(src, -32)).all()
    with pytest.raises(EmulatorError, match=r"thread 0 loads s \(line \d+\) at shared byte "
                                            r"\d+, which no thread of this block has stored"):
        module.launch("other_warp", 1, 64, [src, out, np.int32(0)], races=True)
    for reverse in (False, True):
        with pytest.raises(EmulatorError, match=r"race on shared memory \(byte \d+\): "
                                                r"thread \d+ stores s \(line \d+\) where "
                                                r"thread \d+ loaded s"):
            module.launch("other_warp", 1, 64, [src, out, np.int32(1)], races=True,
                          reverse=reverse)
    module.launch("other_warp", 1, 64, [src, out, np.int32(1)])      # unchecked: runs


def test_reads_of_copies_in_flight_are_reported(module):
    """With the checks on, loading a cp.async destination before a wait covers its
    group fails the launch (without them it reads as NaN: the other test)."""
    src, out = np.arange(3 * 32 * 4, dtype=np.float32), np.zeros(96, np.float32)
    module.launch("cp_groups", 1, 32, [src, out, np.int32(0)], races=True)   # all waited
    with pytest.raises(EmulatorError, match=r"while a cp.async to it is still in flight"):
        module.launch("cp_groups", 1, 32, [src, out, np.int32(1)], races=True)


def test_static_shared_arrays_are_bounds_checked(module):
    """An index past a static shared array fails the launch (every launch: the check
    costs a comparison), naming the array, its extent, the index and the line."""
    out = np.zeros(32, np.float32)
    module.launch("shared_overrun", 1, 32, [out, np.int32(0)])
    assert (out == 1).all()
    with pytest.raises(EmulatorError, match=r"shared array s\[32\] indexed at 32 \(line \d+\)"):
        module.launch("shared_overrun", 1, 32, [out, np.int32(1)])


def test_dynamic_shared_slices_are_bounds_checked(module):
    """A slice of the dynamic shared array (HIDETC_SHARED_SLICE, what the printer emits
    past 48 KiB) has its extent in its type in the emulator: an index past it fails the
    launch even though the byte is inside the dynamic array."""
    out = np.zeros(32, np.float32)
    module.launch("slice_overrun", 1, 32, [out, np.int32(0)], races=True)
    assert (out == 3).all()
    with pytest.raises(EmulatorError, match=r"shared array b\[32\] indexed at 32"):
        module.launch("slice_overrun", 1, 32, [out, np.int32(1)])


def test_races_within_a_warp_need_a_warp_synchronization(module):
    """Lanes of a warp run independently (Volta on): a load of what another lane stored
    with no __syncwarp or full-warp collective between is a race; either one orders
    them."""
    src, out = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
    for mode in (1, 2):
        module.launch("same_warp", 1, 32, [src, out, np.int32(mode)], races=True)
        assert (out == np.roll(src, -1)).all()
    for reverse in (False, True):
        with pytest.raises(EmulatorError, match=r"race on shared memory .*same warp, no "
                                                r"__syncwarp between"):
            module.launch("same_warp", 1, 32, [src, out, np.int32(0)], races=True,
                          reverse=reverse)


def test_local_arrays_start_as_poison(module):
    """An accumulator never zeroed reads poison (NaN), in the first block as in later
    ones (a fresh fiber stack would read zeros and pass)."""
    src = np.arange(64 * 4, dtype=np.float32)
    want = src.reshape(64, 4).sum(axis=1)
    for zero, ok in ((1, True), (0, False)):
        out = np.zeros(64, np.float32)
        module.launch("accumulate", 2, 32, [src, out, np.int32(zero)])
        assert (out == want).all() if ok else np.isnan(out).all()


def test_blocks_and_threads_run_in_order_or_reversed(module):
    """Blocks x fastest, then y, then z, and threads in order (from the start and out of
    each barrier); `reverse=True` runs both last to first."""
    for reverse in (False, True):
        counter, order = np.zeros(1, np.uint32), np.zeros(2 * 3 * 4, np.uint32)
        module.launch("arrival", (4, 3, 2), 32, [counter, order], reverse=reverse)
        forward = np.arange(24, dtype=np.uint32)
        assert (order == (forward[::-1] if reverse else forward)).all(), (reverse, order)
        counter, order = np.zeros(1, np.uint32), np.zeros(128, np.uint32)
        module.launch("thread_arrival", 1, 64, [counter, order], reverse=reverse)
        first, second = np.arange(64, dtype=np.uint32), np.arange(64, 128, dtype=np.uint32)
        want = np.concatenate([first[::-1], second[::-1]]) if reverse else np.arange(128)
        assert (order == want).all(), (reverse, order)
    counter, order = np.zeros(1, np.uint32), np.zeros(24, np.uint32)
    module.launch("arrival", (4, 3, 2), 32, [counter, order])     # back to forward
    assert (order == np.arange(24)).all()


def test_exited_threads_count_as_arrived(module):
    x = np.arange(256, dtype=np.float32)
    out = np.full(256, -1.0, np.float32)
    module.launch("early_exit", 1, 256, [x, out, np.int32(100)])
    np.testing.assert_array_equal(out[:100], np.roll(x[:100] * 2, -1))
    assert (out[100:] == -1).all()


@pytest.mark.parametrize("kernel,block,words", [
    ("deadlock", 64, ["deadlock", "threads 0..15 wait at __syncthreads",
                      "threads 16..31 wait at __shfl_sync", "threads 32..63 exited"]),
    ("divergent_barrier", 64, ["different __syncthreads", "threads 0..31", "threads 32..63"]),
    ("divergent_collective", 32, ["divergent warp collectives", "__shfl_sync", "__ballot_sync"]),
    ("mask_without_me", 32, ["does not include the calling lane"]),
    ("ldmatrix_half_warp", 16, ["needs all 32 lanes"]),
    ("trap", 32, ["__trap", "thread (5, 0, 0)"]),
])
def test_kernel_bugs_are_reported(module, kernel, block, words):
    out = np.zeros(64, np.float32)
    with pytest.raises(EmulatorError) as info:
        module.launch(kernel, 1, block, [out])
    for w in words:
        assert w in str(info.value)
    assert "block (0, 0, 0)" in str(info.value)


def test_misaligned_async_copy_is_reported(module):
    with pytest.raises(EmulatorError, match="cp.async source.*not 16-byte aligned"):
        module.launch("misaligned", 1, 1, [np.zeros(16, np.float32), np.zeros(1, np.float32)])


def test_module_recovers_after_an_error(module):
    with pytest.raises(EmulatorError):
        module.launch("deadlock", 1, 64, [np.zeros(64, np.float32)])
    test_exited_threads_count_as_arrived(module)


def test_bad_launches_and_arguments(module):
    out = np.zeros(64, np.float32)
    with pytest.raises(EmulatorError, match="1..1024 threads"):
        module.launch("trap", 1, (64, 32), [out])
    with pytest.raises(ValueError, match="grid"):
        module.launch("trap", 0, 32, [out])
    with pytest.raises(TypeError, match="np.int32"):
        module.launch("early_exit", 1, 32, [out, out, 5])
    with pytest.raises(ValueError, match="C-contiguous"):
        module.launch("trap", 1, 32, [np.zeros((8, 8), np.float32).T])
    with pytest.raises(KeyError, match="nope"):
        module.launch("nope", 1, 32, [out])


def test_big_local_arrays_fit_the_fiber_stack(module):
    x = np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    module.launch("big_locals", 2, 64, [x, out])
    idx = np.arange(0, 20000, 997)
    np.testing.assert_allclose(out, [(x[idx % 64] + t).sum() for t in range(64)], rtol=1e-6)


def test_switch_rate(module):
    count = np.zeros(1, np.int32)
    before, start = module.switch_count, time.perf_counter()
    module.launch("barrier_loop", 4, 256, [count, np.int32(200)])
    rate = (module.switch_count - before) / (time.perf_counter() - start)
    assert count[0] == 200
    assert module.switch_count - before >= 4 * 256 * 2 * 200
    print(f"emulator: {rate / 1e6:.1f} M fiber switches/s")
    assert rate > 1e6


def test_ucontext_backend_agrees(tmp_path):
    path = build_emulated({"emu_runtime": SOURCE}, tmp_path / "uc.so",
                          extra_flags=["-DHIDETC_EMU_UCONTEXT"])
    test_exited_threads_count_as_arrived(EmulatedModule(path))
    with pytest.raises(EmulatorError, match="deadlock"):
        EmulatedModule(path).launch("deadlock", 1, 64, [np.zeros(64, np.float32)])


def test_compile_error_names_the_command(tmp_path):
    with pytest.raises(ToolchainError) as info:
        build_emulated({"broken": SOURCE + "\nint oops = ;\n"}, cache=BuildCache(tmp_path))
    text = str(info.value)
    assert "reproduce:" in text and "g++" in text and "-DHIDETC_EMULATE" in text


def test_builds_are_cached(tmp_path):
    cache = BuildCache(tmp_path)
    first = build_emulated({"k": SOURCE}, cache=cache)
    start = time.perf_counter()
    assert build_emulated({"k": SOURCE}, cache=cache) == first
    assert time.perf_counter() - start < 0.5
    assert build_emulated({"k": SOURCE + "\n"}, cache=cache) != first
