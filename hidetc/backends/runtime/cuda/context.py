"""One execution context of a CUDA artifact: the memory and the stream one pass at a time
writes, so that passes on several threads run on one loaded model (`runtime.contexts`).

Assumes: a `CudaExecutor` (the loaded model: session, functions, weights on the device)
that this context's calls go through for allocation, launch errors and fault handling.

Guarantees:
- All of a context's device memory is allocated when it is made: one arena
  (`memory.arena_bytes`, zeroed once: split-K's counters start zero and every completed
  pass leaves them so; a pass whose dispatch variant differs from the last one's first
  zeroes its variant's counters, which another variant's values may have covered),
  one I/O buffer holding every input and output at a fixed
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
- A dynamic artifact (manifest `dynamic`): the I/O buffers hold the inputs and outputs
  at the ranges' largest sizes (one allocation, fixed addresses) and a pass copies only
  its own bytes; each distinct set of sizes is a `_Shape` (its dispatch variant's
  launches bound at the sizes and packed, and its graph, captured on first use) in a
  least-recently-used cache of at most `CudaExecutor.graph_cache` shapes: the least
  recently used one's graph is destroyed when a new one would pass the bound. The
  warm-up (first context) runs the largest sizes' launches.
"""
from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import numpy as np

from hidetc.backends.runtime.cuda.driver import STREAM_NON_BLOCKING, GraphError
from hidetc.backends.runtime.cuda.manifest import pack_args
from hidetc.backends.runtime.executor import check_inputs, collect_outputs
from hidetc.backends.runtime.sizes import Pass, kept_zero
from hidetc.errors import ArtifactError

ALIGN = 256                    # bytes: every device buffer starts at a multiple of this


@dataclass(frozen=True)
class Slot:
    """One input or output: a fixed device address and its pinned host staging buffer."""
    device: int
    host: np.ndarray     # typed, shaped view of `raw`
    raw: np.ndarray      # the pinned bytes (what the copies use)
    nbytes: int


@dataclass
class _Shape:
    """One set of sizes on a context: its launches bound and packed (empty ones left
    out), its captured graph (0: none yet) and that graph's launch arguments."""
    prepared: list
    graph_exec: int = 0
    graph_args: Optional[tuple] = field(default=None)


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
        self._use_graph = use_graph and not sync_each
        self._shapes: "OrderedDict[tuple, _Shape]" = OrderedDict()
        self._shape: Optional[_Shape] = None       # the last pass's
        self._pass: Optional[Pass] = None
        self._kept_zero_for: Optional[int] = None   # the variant whose region is zero
        self._closed = False
        self._drv = executor._drv
        with executor.setting_up(self.close):
            self._setup()
            self._select(executor.largest_pass(), capture=False)
            if warm:
                self._launch_all(sync_each=True)
            if self._use_graph and executor.dynamic is None:
                self._capture()
            elif self._use_graph:     # each shape is captured on its first pass
                self.uses_graph = executor._session.graph_unavailable is None

    # ------------------------------------------------------------ setup

    def _setup(self) -> None:
        ex, drv = self._ex, self._drv
        manifest = ex.manifest
        self.arena_bytes = int(manifest["memory"]["arena_bytes"])
        arena = ex._alloc(self.arena_bytes, "activation arena", self._allocations)
        ex._zero(arena, self.arena_bytes)
        largest = ex.largest_pass()
        self._inputs = self._stage(largest.inputs, "inputs")
        self._outputs = self._stage(largest.outputs, "outputs")
        self._arena = arena
        self._stream = drv.Stream(STREAM_NON_BLOCKING)
        self._start, self._end = drv.Event(), drv.Event()
        drv.Context.synchronize()

    def _pack(self, one: Pass) -> list:
        """The launches of pass `one` (its variant's, bound at its sizes), packed."""
        ex = self._ex
        ins = [s.device for s in self._inputs]
        outs = [s.device for s in self._outputs]
        prepared = []
        for spec in ex.launches_of(one):
            if spec.empty:
                continue
            prepared.append((ex._functions[(spec.module, spec.kernel)]._launch_kernel,
                             spec.grid, spec.block,
                             pack_args(spec, ins, outs, (self._arena, self.arena_bytes),
                                       ex._weights),
                             spec.shared_bytes, spec))
        return prepared

    def _select(self, one: Pass, capture: bool = True) -> None:
        """Make pass `one`'s shape current: from the cache (now the most recently used),
        else packed and, with graphs on and `capture`, captured -- evicting the least
        recently used shape past the bound (its graph destroyed)."""
        key = tuple(one.sizes.get(s, 0) for s in (self._ex.dynamic.order
                                                  if self._ex.dynamic else ()))
        self._pass = one
        self._keep_zero(one.variant)
        shape = self._shapes.get(key)
        if shape is not None:
            self._shapes.move_to_end(key)
            self._shape = shape
        else:
            self._shape = shape = _Shape(self._pack(one))
            self._shapes[key] = shape
            while len(self._shapes) > max(1, self._ex.graph_cache):
                _, old = self._shapes.popitem(last=False)
                self._destroy(old)
        if capture and self._use_graph and not shape.graph_exec:
            with self._ex.setting_up(lambda: None):
                self._capture()

    def _keep_zero(self, variant: int) -> None:
        """Zero `variant`'s kept-zero region (`sizes.kept_zero`) on this context's stream
        when the last pass ran another variant, whose values may sit there (ahead of
        the pass's launches or its capture, on the same stream). The region of the
        variant that ran last is zero already: every completed pass leaves it so."""
        if variant == self._kept_zero_for:
            return
        offset, nbytes = kept_zero(self._ex.manifest, variant)
        if nbytes:
            self._drv.memset_d8_async(self._arena + offset, 0, nbytes, self._stream)
        self._kept_zero_for = variant

    def _destroy(self, shape: _Shape) -> None:
        graphs = self._ex._session.graphs
        if shape.graph_exec and graphs is not None:
            graphs.destroy(shape.graph_exec)
        shape.graph_exec, shape.graph_args = 0, None

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
        """Capture the current shape's launches into a graph (replayed once to check
        it); where impossible, this context launches plainly from now on."""
        ex, shape = self._ex, self._shape
        handle = getattr(self._stream, "handle", None)
        reason = ex._session.graph_unavailable
        if reason is None and handle is None:
            reason = "this pycuda's Stream has no handle"
        if reason is None:
            try:
                shape.graph_exec = ex._session.graphs.capture(int(handle), self._launch_all)
            except (GraphError, ArtifactError) as exc:
                reason = f"stream capture failed: {exc}"
        if reason is not None:
            ex._no_graph(reason)
            self._use_graph = False
            self.uses_graph = False
            return
        self._graph_launch = ex._session.graphs.launch
        shape.graph_args = (ctypes.c_void_p(shape.graph_exec), ctypes.c_void_p(int(handle)))
        self.uses_graph = True
        self.replay()
        self.synchronize()

    # ------------------------------------------------------------ launching

    def _launch_all(self, sync_each: bool = False) -> None:
        """Enqueue every launch on the stream; with `sync_each`, wait after each one."""
        stream, error = self._stream, self._drv.Error
        for launch, grid, block, args, shared, spec in self._shape.prepared:
            try:
                launch(grid, block, args, shared, stream)
            except error as exc:
                raise self._ex._launch_error(spec, exc) from None
            if sync_each:
                try:
                    stream.synchronize()
                except error as exc:
                    self._ex._broken = self._ex._unusable(exc)
                    raise self._ex._launch_error(spec, exc) from None

    def replay(self) -> None:
        """Enqueue one forward pass (the current shape's) on this context's stream (no
        copies, no wait)."""
        if self.uses_graph and self._shape.graph_exec:
            rc = self._graph_launch(*self._shape.graph_args)
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
                inputs = {s["name"]: _host(slot, s).copy() for s, slot in
                          zip(self._pass.inputs, self._inputs)}
            raise self._ex._failure(exc, inputs) from None

    def _upload(self, arrays: list[np.ndarray]) -> None:
        """Copy the inputs into their pinned buffers and enqueue the copies to the device
        (a pass's own bytes: the buffers hold the largest sizes)."""
        for slot, array in zip(self._inputs, arrays):
            if array.nbytes:
                raw = slot.raw[:array.nbytes]
                np.copyto(raw.view(array.dtype).reshape(array.shape), array)
                self._drv.memcpy_htod_async(slot.device, raw, self._stream)

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
        one = ex.pass_of(inputs)
        arrays = check_inputs(one.inputs, inputs)
        pushed = ex._enter()
        try:
            self._select(one)
            self._upload(arrays)
            self._start.record(self._stream)
            self.replay()
            self._end.record(self._stream)
            views = [_host(slot, spec) for slot, spec in zip(self._outputs, one.outputs)]
            for slot, view in zip(self._outputs, views):
                if view.nbytes:
                    self._drv.memcpy_dtoh_async(slot.raw[:view.nbytes], slot.device,
                                                self._stream)
            self.synchronize(dict(inputs))
            self.last_latency_ms = float(self._end.time_since(self._start))
            outs = [view.copy() for view in views]
        finally:
            ex._leave(pushed)
        return collect_outputs(ex.manifest, arrays, outs, ex.constants, one.variant)

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
        one = ex.pass_of(inputs)
        arrays = check_inputs(one.inputs, inputs)
        pushed = ex._enter()
        try:
            drv, stream = self._drv, self._stream
            self._select(one, capture=False)
            prepared = self._shape.prepared
            self._upload(arrays)
            events = [drv.Event() for _ in range(len(prepared) + 1)]
            times = np.zeros((max(repeat, 1) + 1, len(prepared)))
            for r in range(times.shape[0]):
                events[0].record(stream)
                for index, (launch, grid, block, args, shared, spec) in enumerate(prepared):
                    try:
                        launch(grid, block, args, shared, stream)
                    except drv.Error as exc:
                        raise ex._launch_error(spec, exc) from None
                    events[index + 1].record(stream)
                self.synchronize(dict(inputs))
                times[r] = [float(b.time_since(a)) for a, b in zip(events, events[1:])]
        finally:
            ex._leave(pushed)
        median = dict(zip((p[-1].index for p in prepared), np.median(times[1:], axis=0)))
        # per launch of the variant; an empty one (no block at these sizes) took 0
        return [float(median.get(k, 0.0)) for k in range(len(ex._variants[one.variant]))]

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """Free the graph and the device buffers (idempotent); the last context of a
        closed model frees the weights and modules too (`CudaExecutor._retire`)."""
        if self._closed:
            return
        self._closed = True
        self.uses_graph = False
        for shape in self._shapes.values():
            self._destroy(shape)
        self._shapes.clear()
        self._shape = None
        free_all(self._allocations)
        self._ex._retire()


def _host(slot: Slot, spec: dict) -> np.ndarray:
    """The pinned host bytes of `slot` viewed as one pass's tensor (`spec`: its dtype and
    shape at the pass's sizes; the slot holds the largest)."""
    dtype = np.dtype(spec["dtype"])
    n = int(np.prod(spec["shape"], dtype=np.int64)) * dtype.itemsize
    return slot.raw[:n].view(dtype).reshape(tuple(spec["shape"]))
