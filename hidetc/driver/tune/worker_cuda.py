"""The cuda measuring worker: `python -m hidetc.driver.tune.worker_cuda JOB START [BEST_MS]`.

The protocol is the cpu worker's (`hidetc.driver.tune.worker`: the same JOB pickle, START,
BEST_MS, JSON lines, `serve` loop and early-stopping `timed_runs`); here a candidate is
(module path, kernel name, grid, block, scratch specs: the (shape, dtype) of each
scratch buffer, `hidetc.tir.scratch`, passed zeroed after the task's buffers, dynamic
shared bytes) and JOB["backend"] says how it runs:

- "pycuda": GPU 0's primary context (`hidetc.backends.runtime.cuda.driver.session`), each cubin
  loaded once with `module_from_buffer`, kernels launched with the prepared-call API
  on one stream, with the dynamic shared memory the candidate declares (its kernel's
  limit raised first when that is past 48 KiB).
  A kernel whose block exceeds its MAX_THREADS_PER_BLOCK (registers) is "load: ...".
  Any CUDA error while launching, waiting or copying back is a `Fault`: reported as
  "fault: <CUDA error>", then the process exits (a fault such as
  CUDA_ERROR_ILLEGAL_ADDRESS leaves the context unusable), and the parent restarts a
  worker for the next candidate.
- "emulator": the module is a `build_emulated` library; `EmulatedModule.launch` on
  numpy arrays; an EmulatorError (divergent barrier, misaligned copy, deadlock) is a
  `Fault` too, so the GPU protocol is exercised on the CPU.

Per candidate. Correctness first, on the task's real shapes: the outputs of input set
0 are filled with NaN (ints: a sentinel), one launch, outputs copied back and compared
with the op's numpy reference (`get_op(task.op).reference`, norm-wise, `worker.RTOL`:
1e-4 for f32, 1e-2 for f16, 2e-2 for bf16; a mismatch is "wrong result: ..."; past the
job's `budget_rtol`, "over the numerics budget: ..."). Half inputs are random half
values (standard normal: |x| < ~5, no overflow in the products), and the reference is
computed in float64 from those very values (`worker.wide_reference`).
Then timing (`timed_runs`: warm-up, at most `repeat` timed launches within the time
budget, the median): on a GPU each launch is timed alone by two CUDA events recorded
around it on the stream (device time, no host overhead), then the end event is
waited for. So that the cache does not flatter a kernel, launches rotate among
`rotation_copies` device copies of the inputs and outputs (copies enough to cover
ROTATE_L2_FACTOR x the L2 size, at most ROTATE_MAX and worker.ROTATE_BYTES), and before each
timed launch the GPU writes a scratch buffer of ROTATE_L2_FACTOR x L2 (outside the
events), which evicts what small working sets leave in L2 and keeps the GPU busy while
the host enqueues the events and the launch. The emulator times with the host clock
(`perf_counter_ns`) and rotates the same way against the CPU's L2.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hidetc.driver.tune import worker as cpu_worker
from hidetc.driver.tune.worker import (
    Fault,
    floating,
    make_inputs,
    mismatch,
    serve,
    timed_runs,
    wide_reference,
)
from hidetc.target import KNOWN_GPUS

ROTATE_L2_FACTOR = cpu_worker.ROTATE_CACHE_FACTOR
ROTATE_MAX = 8
# when the driver does not report the L2 size: the largest of the known GPUs', so the
# rotation that keeps inputs out of L2 errs towards rotating too much
FALLBACK_L2_BYTES = max(gpu.l2_bytes for gpu in KNOWN_GPUS.values())
EMULATED_L2_BYTES = 1 << 20        # the emulator has no cache: a size that keeps rotation cheap


class LoadError(Exception):
    """The module does not load or lacks the kernel: the candidate's "load: ..."."""


def rotation_copies(footprint: int, l2_bytes: int) -> int:
    """Input/output copies to rotate among: `worker.rotation_copies` over the L2 (the
    GPU's last-level cache), at most ROTATE_MAX."""
    return cpu_worker.rotation_copies(footprint, l2_bytes, ROTATE_MAX)


def inputs_and_reference(task, seed: int) -> tuple[list, list[np.ndarray]]:
    """The task's inputs (`worker.make_inputs`) and its reference outputs, computed in
    float64 from the (half or float32) inputs (`worker.wide_reference`)."""
    inputs = make_inputs(task, seed)
    return inputs, wide_reference(task, inputs)


def poison(shape, dtype) -> np.ndarray:
    """What an output holds before the checked launch: NaN, the int minimum, False."""
    dtype = np.dtype(dtype)
    if floating(dtype):
        return np.full(shape, np.nan, dtype)
    if dtype == np.bool_:
        return np.zeros(shape, dtype)
    return np.full(shape, np.iinfo(dtype).min, dtype)


# ---------------------------------------------------------------- backends


class EmulatorBackend:
    """Buffers are numpy arrays; kernels run in the CUDA emulator."""

    def __init__(self):
        from hidetc.backends.runtime.emulator import EmulatedModule, EmulatorError
        self._module_type, self._error = EmulatedModule, EmulatorError
        self.l2_bytes = EMULATED_L2_BYTES
        self.modules: dict[str, Any] = {}

    def upload(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True, order="C")

    def write(self, buf: np.ndarray, array: np.ndarray) -> None:
        np.copyto(buf, array)

    def read(self, buf: np.ndarray, like: np.ndarray) -> np.ndarray:
        return buf.copy()

    def load(self, path: str, kernel: str, nargs: int, shared: int = 0) -> tuple[Any, str]:
        """(module, kernel); `shared` is unused: the emulator's dynamic shared array is
        sized by the kernel's own declaration."""
        module = self.modules.get(path)
        if module is None:
            try:
                module = self.modules[path] = self._module_type(path)
            except OSError as exc:
                raise LoadError(f"cannot load {path}: {exc}") from None
        try:
            module.entry(kernel)
        except KeyError as exc:
            raise LoadError(str(exc)) from None
        return module, kernel

    def run(self, fn: tuple[Any, str], grid, block, args: list) -> None:
        module, kernel = fn
        try:
            module.launch(kernel, grid, block, args)
        except self._error as exc:
            raise Fault(f"emulator: {exc}") from None

    def timed(self, fn: tuple[Any, str], grid, block, args: list) -> int:
        t0 = time.perf_counter_ns()
        self.run(fn, grid, block, args)
        return time.perf_counter_ns() - t0


class PyCudaBackend:
    """Buffers are device allocations on GPU 0; CUDA events time each launch."""

    def __init__(self):
        from hidetc.backends.runtime.cuda.driver import session
        self.session = session()
        self.drv = drv = self.session.drv
        self.stream = drv.Stream()
        self.start, self.end = drv.Event(), drv.Event()
        attr = getattr(drv.device_attribute, "L2_CACHE_SIZE", None)
        l2 = int(self.session.device.get_attribute(attr)) if attr is not None else 0
        self.l2_bytes = l2 or FALLBACK_L2_BYTES
        self.scratch_bytes = ROTATE_L2_FACTOR * self.l2_bytes
        self.scratch = drv.mem_alloc(self.scratch_bytes)
        self.modules: dict[str, Any] = {}
        self._keep: list[Any] = [self.scratch]     # allocations live as long as we do

    def upload(self, array: np.ndarray) -> int:
        buf = self.drv.mem_alloc(max(array.nbytes, 1))
        self._keep.append(buf)
        if array.nbytes:
            self.drv.memcpy_htod(buf, np.ascontiguousarray(array))
        return int(buf)

    def write(self, buf: int, array: np.ndarray) -> None:
        try:
            if array.nbytes:
                self.drv.memcpy_htod(buf, np.ascontiguousarray(array))
        except self.drv.Error as exc:
            raise Fault(str(exc)) from None

    def read(self, buf: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        try:
            if out.nbytes:
                self.drv.memcpy_dtoh(out, buf)
        except self.drv.Error as exc:
            raise Fault(str(exc)) from None
        return out

    def load(self, path: str, kernel: str, nargs: int, shared: int = 0
             ) -> tuple[Any, int, int]:
        """(the prepared function, its MAX_THREADS_PER_BLOCK, its dynamic shared bytes:
        the kernel's limit raised to them when they are past 48 KiB)."""
        drv = self.drv
        try:
            module = self.modules.get(path)
            if module is None:
                module = self.modules[path] = drv.module_from_buffer(Path(path).read_bytes())
            fn = module.get_function(kernel)
            fn.prepare("P" * nargs)
            if shared > 48 * 1024:
                fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
            limit = int(fn.get_attribute(drv.function_attribute.MAX_THREADS_PER_BLOCK))
        except drv.Error as exc:
            raise LoadError(f"{kernel} from {Path(path).name}: {exc}") from None
        return fn, limit, shared

    def _launch(self, fn: tuple[Any, int, int], grid, block, args: list) -> None:
        function, limit, shared = fn
        threads = math.prod(block)
        if threads > limit:
            raise LoadError(f"a block of {threads} threads but the kernel allows at most "
                            f"{limit} on {self.session.describe()} (registers)")
        function.prepared_async_call(tuple(grid), tuple(block), self.stream, *args,
                                     shared_size=shared)

    def run(self, fn: tuple[Any, int], grid, block, args: list) -> None:
        try:
            self._launch(fn, grid, block, args)
            self.stream.synchronize()
        except self.drv.Error as exc:
            raise Fault(str(exc)) from None

    def timed(self, fn: tuple[Any, int], grid, block, args: list) -> int:
        drv, stream = self.drv, self.stream
        try:
            drv.memset_d8_async(self.scratch, 0, self.scratch_bytes, stream)
            self.start.record(stream)
            self._launch(fn, grid, block, args)
            self.end.record(stream)
            self.end.synchronize()
            return int(round(self.end.time_since(self.start) * 1e6))
        except drv.Error as exc:
            raise Fault(str(exc)) from None


BACKENDS = {"emulator": EmulatorBackend, "pycuda": PyCudaBackend}


# ---------------------------------------------------------------- measuring


class DeviceMeasurer:
    """`measure(path, kernel, grid, block)` for one job (see the module docstring)."""

    def __init__(self, job: dict, best_ms: float | None, backend: Any = None):
        task = job["task"]
        self.job, self.best_ms = job, best_ms
        self.backend = backend if backend is not None else BACKENDS[job["backend"]]()
        inputs, self.reference = inputs_and_reference(task, job["seed"])
        buffers = [inputs[i] for i in task.buffer_inputs]
        self.poison = [poison(t.shape, t.dtype) for t in task.outputs]
        footprint = sum(a.nbytes for a in buffers) + sum(p.nbytes for p in self.poison)
        copies = rotation_copies(footprint, self.backend.l2_bytes)
        up = self.backend.upload
        self.sets = [[up(a) for a in buffers] + [up(p) for p in self.poison]
                     for _ in range(copies)]
        self.n_in = len(buffers)
        self.scratch_buffers: dict[tuple, Any] = {}

    def scratch(self, specs) -> list:
        """Zeroed device buffers for the candidate's scratch parameters (`specs`: shape
        and dtype of each), kept per spec: a kernel leaves its ZEROED ones zero, and
        its TRANSIENT ones need no contents."""
        out = []
        for shape, dtype in specs:
            key = (tuple(shape), str(dtype))
            if key not in self.scratch_buffers:
                self.scratch_buffers[key] = self.backend.upload(np.zeros(shape, dtype))
            out.append(self.scratch_buffers[key])
        return out

    def measure(self, path: str, kernel: str, grid, block, scratch_specs=(), shared: int = 0
                ) -> tuple[float | None, float | None, str | None]:
        """(median ms, min ms, error) of one candidate; raises Fault or LoadError."""
        backend = self.backend
        extra = self.scratch(scratch_specs)
        sets = [s + extra for s in self.sets]
        first_set = sets[0]
        grid, block = tuple(grid), tuple(block)
        fn = backend.load(path, kernel, len(first_set), shared)
        outs = first_set[self.n_in:self.n_in + len(self.poison)]
        for buf, p in zip(outs, self.poison):
            backend.write(buf, p)
        t0 = time.perf_counter_ns()
        backend.run(fn, grid, block, first_set)
        first = time.perf_counter_ns() - t0
        for k, (buf, like, ref) in enumerate(zip(outs, self.poison, self.reference)):
            why = mismatch(backend.read(buf, like), ref, self.job.get("budget_rtol"))
            if why is not None:
                return None, None, why.replace(": ", f": output {k}: ", 1)

        def call(i: int) -> int:
            return backend.timed(fn, grid, block, sets[i % len(sets)])

        times = timed_runs(call, first, self.job, self.best_ms)
        ms, fastest = float(np.median(times)) / 1e6, min(times) / 1e6
        self.best_ms = fastest if self.best_ms is None else min(self.best_ms, fastest)
        return ms, fastest, None


def main(argv: list[str]) -> int:
    return serve(argv, DeviceMeasurer, (LoadError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
