"""One execution context of a CUDA artifact: the memory and the stream one pass at a time
writes, so that passes on several threads run on one loaded model (`runtime.contexts`).

Assumes: a `CudaExecutor` (the loaded model: session, functions, weights on the device)
that this context's calls go through for allocation, launch errors and fault handling.

Guarantees:
- All of a context's device memory is allocated when it is made: one arena
  (`memory.arena_bytes`, zeroed once: split-K's counters start zero and every completed
  pass leaves them so), one I/O buffer holding every input and output at a fixed
  address, and a pinned host staging buffer per input and output; so its captured graph
  stays valid, and a pass allocates nothing on the device.
- Its own non-blocking stream, CUDA events and CUDA graph: the launches are packed once
  with its arena's and I/O buffers' addresses and captured ONCE into a graph (relaxed
  capture mode: other threads' passes during the capture are allowed) that every pass
  replays; where capture is impossible it uses plain stream launches (the reason is in
  the executor's `graph_unavailable`). Setup and capture run under the executor's
  `setting_up` (one at a time in the process: the setup's whole-context synchronize is
  refused while another stream captures; see `cuda.executor._SETUP_LOCK`); a pass
  synchronizes its own stream only.
- A pass refuses (one line) on a closed context, after the model was closed, or after a
  fault (`ready`). The context counts itself alive in the executor from its making to
  its `close` (`CudaExecutor._adopt` / `_retire`), so the shared weights and modules
  outlive every context that may still launch.
- Every call makes the session's CUDA context current on the calling thread (pushed and
  popped around the call on a thread other than the session's), so a context may move
  between threads from one pass to the next.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

from hidetc.backends.runtime.cuda.driver import STREAM_NON_BLOCKING, GraphError
from hidetc.backends.runtime.cuda.manifest import pack_args
from hidetc.backends.runtime.executor import check_inputs, collect_outputs
from hidetc.errors import ArtifactError

ALIGN = 256                    # bytes: every device buffer starts at a multiple of this


@dataclass(frozen=True)
class Slot:
    """One input or output: a fixed device address and its pinned host staging buffer."""
    device: int
    host: np.ndarray     # typed, shaped view of `raw`
    raw: np.ndarray      # the pinned bytes (what the copies use)
    nbytes: int


def free_all(allocations: list) -> None:
    """Free device allocations and empty the list (a faulted CUDA context cannot free:
    the process's exit will)."""
    for allocation in allocations:
        try:
            allocation.free()
        except Exception:  # noqa: BLE001
            pass
    allocations.clear()


def staged_bytes(specs: list[dict]) -> int:
    """The device bytes of one I/O buffer holding `specs` (inputs or outputs), each at an
    ALIGN-ed offset: what a context allocates besides its arena."""
    total = 0
    for spec in specs:
        size = int(np.prod(spec["shape"], dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize
        total += -(-size // ALIGN) * ALIGN
    return total


class CudaContext:
    """A stream, an arena, I/O buffers and a captured graph of one `CudaExecutor`.

    `warm=True` (the executor's first context) first runs the pass launch by launch with
    a synchronize after each (inputs zeroed): a kernel that cannot launch or faults is
    named (launch index, kernel, grid, block) before anything is captured."""

    def __init__(self, executor: Any, threads: int = 1, *, warm: bool = False,
                 use_graph: bool = True, sync_each: bool = False):
        executor._adopt()                          # a one-line error once it was closed
        self._ex = executor
        self.threads = threads                     # a GPU pass has no intra-op threads
        self.last_latency_ms = 0.0
        self.uses_graph = False
        self._sync_each = sync_each
        self._allocations: list[Any] = []
        self._graph_exec = 0
        self._closed = False
        self._drv = executor._drv
        with executor.setting_up(self.close):
            self._setup()
            if warm:
                self._launch_all(sync_each=True)
            if use_graph and not sync_each:
                self._capture()

    # ------------------------------------------------------------ setup

    def _setup(self) -> None:
        ex, drv = self._ex, self._drv
        manifest = ex.manifest
        self.arena_bytes = int(manifest["memory"]["arena_bytes"])
        arena = ex._alloc(self.arena_bytes, "activation arena", self._allocations)
        ex._zero(arena, self.arena_bytes)
        self._inputs = self._stage(manifest["inputs"], "inputs")
        self._outputs = self._stage(manifest["outputs"], "outputs")
        self._stream = drv.Stream(STREAM_NON_BLOCKING)
        self._start, self._end = drv.Event(), drv.Event()
        ins = [s.device for s in self._inputs]
        outs = [s.device for s in self._outputs]
        self._prepared = [
            (ex._functions[(spec.module, spec.kernel)]._launch_kernel, spec.grid, spec.block,
             pack_args(spec, ins, outs, (arena, self.arena_bytes), ex._weights),
             spec.shared_bytes)
            for spec in ex._specs]
        drv.Context.synchronize()

    def _stage(self, specs: list[dict], what: str) -> list[Slot]:
        """Device buffers (one allocation, ALIGN-ed offsets) + pinned host buffers."""
        ex, nbytes = self._ex, staged_bytes(specs)
        base = ex._alloc(nbytes, what, self._allocations)
        ex._zero(base, nbytes)
        slots, offset = [], 0
        for spec in specs:
            dtype = np.dtype(spec["dtype"])
            size = int(np.prod(spec["shape"], dtype=np.int64)) * dtype.itemsize
            raw = self._drv.pagelocked_empty(max(size, 1), np.uint8)[:size]
            host = raw.view(dtype).reshape(tuple(spec["shape"]))
            slots.append(Slot(base + offset, host, raw, size))
            offset += -(-size // ALIGN) * ALIGN
        return slots

    def _capture(self) -> None:
        ex = self._ex
        handle = getattr(self._stream, "handle", None)
        reason = ex._session.graph_unavailable
        if reason is None and handle is None:
            reason = "this pycuda's Stream has no handle"
        if reason is None:
            try:
                self._graph_exec = ex._session.graphs.capture(int(handle), self._launch_all)
            except (GraphError, ArtifactError) as exc:
                reason = f"stream capture failed: {exc}"
        if reason is not None:
            ex._no_graph(reason)
            return
        self._graph_launch = ex._session.graphs.launch
        self._graph_args = (ctypes.c_void_p(self._graph_exec), ctypes.c_void_p(int(handle)))
        self.uses_graph = True
        self.replay()
        self.synchronize()

    # ------------------------------------------------------------ launching

    def _launch_all(self, sync_each: bool = False) -> None:
        """Enqueue every launch on the stream; with `sync_each`, wait after each one."""
        stream, error = self._stream, self._drv.Error
        for index, (launch, grid, block, args, shared) in enumerate(self._prepared):
            try:
                launch(grid, block, args, shared, stream)
            except error as exc:
                raise self._ex._launch_error(index, exc) from None
            if sync_each:
                try:
                    stream.synchronize()
                except error as exc:
                    self._ex._broken = self._ex._unusable(exc)
                    raise self._ex._launch_error(index, exc) from None

    def replay(self) -> None:
        """Enqueue one forward pass on this context's stream (no copies, no wait)."""
        if self.uses_graph:
            rc = self._graph_launch(*self._graph_args)
            if rc:
                session = self._ex._session
                raise ArtifactError(f"CUDA graph replay failed on {session.describe()}: "
                                    f"{session.graphs.error('cuGraphLaunch', rc)}")
        else:
            self._launch_all(self._sync_each)

    def synchronize(self, inputs: Optional[Mapping[str, np.ndarray]] = None) -> None:
        """Wait for the stream; a failure is located (`CudaExecutor._failure`)."""
        try:
            self._stream.synchronize()
        except self._drv.Error as exc:
            if inputs is None:
                inputs = {s["name"]: slot.host.copy() for s, slot in
                          zip(self._ex.manifest["inputs"], self._inputs)}
            raise self._ex._failure(exc, inputs) from None

    def _upload(self, arrays: list[np.ndarray]) -> None:
        """Copy the inputs into their pinned buffers and enqueue the copies to the device."""
        for slot, array in zip(self._inputs, arrays):
            if slot.nbytes:
                np.copyto(slot.host, array)
                self._drv.memcpy_htod_async(slot.device, slot.raw, self._stream)

    # ------------------------------------------------------------ passes

    def ready(self) -> None:
        """A one-line error unless a pass may start here: the model closed or CUDA
        unusable after a fault (`CudaExecutor._usable`), or this context closed (by its
        caller, or by the pool after a pass on it failed)."""
        self._ex._usable()
        if self._closed:
            raise ArtifactError("this execution context was closed (by its caller, or "
                                "after a pass on it failed)")

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ex = self._ex
        self.ready()
        arrays = check_inputs(ex.manifest["inputs"], inputs)
        pushed = ex._enter()
        try:
            self._upload(arrays)
            self._start.record(self._stream)
            self.replay()
            self._end.record(self._stream)
            for slot in self._outputs:
                if slot.nbytes:
                    self._drv.memcpy_dtoh_async(slot.raw, slot.device, self._stream)
            self.synchronize(dict(inputs))
            self.last_latency_ms = float(self._end.time_since(self._start))
            outs = [slot.host.copy() for slot in self._outputs]
        finally:
            ex._leave(pushed)
        return collect_outputs(ex.manifest, arrays, outs, ex.constants)

    def measure(self, repeat: int = 100, warmup: int = 10) -> list[float]:
        """Device milliseconds of `repeat` replays (after `warmup`) on the staged inputs."""
        self.ready()
        pushed = self._ex._enter()
        try:
            for _ in range(warmup):
                self.replay()
            self.synchronize()
            times = []
            for _ in range(repeat):
                self._start.record(self._stream)
                self.replay()
                self._end.record(self._stream)
                self.synchronize()
                times.append(float(self._end.time_since(self._start)))
        finally:
            self._ex._leave(pushed)
        return times

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 10) -> list[float]:
        """Per launch, the median device milliseconds over `repeat` un-captured passes
        (see `CudaExecutor.profile`)."""
        ex = self._ex
        self.ready()
        arrays = check_inputs(ex.manifest["inputs"], inputs)
        pushed = ex._enter()
        try:
            drv, stream = self._drv, self._stream
            self._upload(arrays)
            events = [drv.Event() for _ in range(len(self._prepared) + 1)]
            times = np.zeros((max(repeat, 1) + 1, len(self._prepared)))
            for r in range(times.shape[0]):
                events[0].record(stream)
                for index, (launch, grid, block, args, shared) in enumerate(self._prepared):
                    try:
                        launch(grid, block, args, shared, stream)
                    except drv.Error as exc:
                        raise ex._launch_error(index, exc) from None
                    events[index + 1].record(stream)
                self.synchronize(dict(inputs))
                times[r] = [float(b.time_since(a)) for a, b in zip(events, events[1:])]
        finally:
            ex._leave(pushed)
        return [float(v) for v in np.median(times[1:], axis=0)]

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """Free the graph and the device buffers (idempotent); the last context of a
        closed model frees the weights and modules too (`CudaExecutor._retire`)."""
        if self._closed:
            return
        self._closed = True
        self.uses_graph = False
        graphs = self._ex._session.graphs
        if self._graph_exec and graphs is not None:
            graphs.destroy(self._graph_exec)
        self._graph_exec = 0
        self._prepared = []
        free_all(self._allocations)
        self._ex._retire()
