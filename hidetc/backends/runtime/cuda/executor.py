"""Run a CUDA artifact on GPU 0 with pycuda: kernels loaded from the cubin for this GPU,
the whole forward pass captured once into a CUDA graph and replayed per inference.

Assumes: the manifest was read (checksums checked) by `runtime.artifact`; its `cuda`
section follows `hidetc.backends.runtime.cuda.manifest`; every kernel is `extern "C"` and takes
its launch's args in order. The executor is used by one thread at a time (a thread
other than the one that opened the CUDA session pushes the context for each call).

Guarantees:
- All device memory is allocated at construction: one arena (`memory.arena_bytes`), one
  weights buffer (the whole weights file, uploaded once; weight args are offsets into
  it), one I/O buffer holding every input and output at a fixed address, and a pinned
  host staging buffer per input and output. So a captured graph stays valid, and a run
  allocates nothing on the device.
- Construction runs the forward pass once, launch by launch with a synchronize after
  each (inputs zeroed): a kernel that cannot launch or faults is named (launch index,
  kernel, grid, block) before anything is captured. Then the pass is captured ONCE into
  a CUDA graph (stream capture; see `driver.GraphAPI`) and replayed by every `run`;
  where capture is impossible it falls back to plain stream launches (the reason is
  logged once, and kept in `graph_unavailable`).
- `run(inputs)`: check inputs (`check_inputs`, as the CPU executor), copy into the
  pinned buffers, H2D, replay between two CUDA events, D2H, synchronize. The replay
  itself is one ctypes call (`replay()`); `last_latency_ms` is the device time between
  the events, i.e. the forward pass without the copies.
- A kernel fault during a replay is sticky (the context is unusable afterwards), so it
  is located in a child process that reruns the launches one by one with a synchronize
  after each (`hidetc.backends.runtime.cuda.locate`); the error names the kernel, and this
  executor refuses further runs. Out-of-memory names the bytes requested and free.
"""
from __future__ import annotations

import ctypes
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import ml_dtypes  # noqa: F401  (registers the "bfloat16" dtype name with numpy)
import numpy as np

from hidetc.backends.runtime.artifact import to_plain
from hidetc.backends.runtime.cuda.driver import STREAM_NON_BLOCKING, GraphError, session
from hidetc.backends.runtime.cuda.manifest import (
    CudaSection,
    LaunchSpec,
    pack_args,
    parse_section,
    select_image,
)
from hidetc.backends.runtime.executor import check_inputs, collect_outputs
from hidetc.backends.runtime.weights import read_weights
from hidetc.errors import ArtifactError

log = logging.getLogger(__name__)
ALIGN = 256                    # bytes: every device buffer starts at a multiple of this
DEFAULT_SHARED_LIMIT = 48 * 1024
LOCATE_PREFIX = "hidetc-locate: "
LOCATE_TIMEOUT_S = 300
_ZERO_CHUNK = 1 << 30
_WARNED: set[str] = set()
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[4])


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


@dataclass(frozen=True)
class _Slot:
    """One input or output: a fixed device address and its pinned host staging buffer."""
    device: int
    host: np.ndarray     # typed, shaped view of `raw`
    raw: np.ndarray      # the pinned bytes (what the copies use)
    nbytes: int


class CudaExecutor:
    """`CudaExecutor(path, manifest).run({name: array}) -> {name: array}`.

    `use_graph=False` launches kernel by kernel on the stream instead of replaying a
    graph; `sync_each=True` (debugging, and the failure locator) also waits after every
    launch so an error names its kernel. `uses_graph` says which one is in effect.
    `locate_timeout_s` bounds the child process that names a kernel after a fault.
    """

    def __init__(self, path: Path, manifest: dict, *, use_graph: bool = True,
                 sync_each: bool = False, locate_timeout_s: float = LOCATE_TIMEOUT_S):
        self.path = Path(path)
        self.manifest = manifest
        self.last_latency_ms = 0.0
        self.uses_graph = False
        self.graph_unavailable: Optional[str] = None
        self._sync_each = sync_each
        self._locate_timeout_s = locate_timeout_s
        self._broken: Optional[str] = None
        self._allocations: list[Any] = []
        self._graph_exec = 0
        self._closed = False
        section = parse_section(manifest, str(self.path / "manifest.yaml"))
        self._session = session()
        self._drv = self._session.drv
        if self._session.fault:
            raise ArtifactError(self._session.fault)
        pushed = self._enter()
        try:
            self._setup(section)
            self._launch_all(sync_each=True)          # warm-up: names a failing kernel
            if use_graph and not sync_each:
                self._capture()
        except self._drv.Error as exc:
            self.close()
            raise ArtifactError(f"{self.path}: cannot set the artifact up on "
                                f"{self._session.describe()} ({exc})") from None
        except BaseException:
            self.close()
            raise
        finally:
            self._leave(pushed)
        self._session.executors.add(self)

    def _enter(self) -> bool:
        """Make the session's context current on a thread other than the one that opened
        the session; True when it was pushed (then `_leave` pops it)."""
        if threading.get_ident() == self._session.thread:
            return False
        self._session.context.push()
        return True

    def _leave(self, pushed: bool) -> None:
        if pushed:
            self._drv.Context.pop()

    # ------------------------------------------------------------ setup

    def _setup(self, section: CudaSection) -> None:
        drv = self._drv
        weights = self.manifest["weights"]
        blob, self.constants = read_weights(self.path / weights["file"], weights["entries"])
        arena_bytes = int(self.manifest["memory"]["arena_bytes"])
        arena = self._alloc(arena_bytes, "activation arena")
        self._zero(arena, arena_bytes)
        weights_ptr = self._alloc(blob.nbytes, "weights")
        if blob.nbytes:
            drv.memcpy_htod(weights_ptr, blob)
        self._inputs = self._stage(self.manifest["inputs"], "inputs")
        self._outputs = self._stage(self.manifest["outputs"], "outputs")
        self._stream = drv.Stream(STREAM_NON_BLOCKING)
        self._start, self._end = drv.Event(), drv.Event()
        functions = self._load_functions(section)
        self._specs = section.launches
        ins = [s.device for s in self._inputs]
        outs = [s.device for s in self._outputs]
        self._prepared = [
            (functions[(spec.module, spec.kernel)]._launch_kernel, spec.grid, spec.block,
             pack_args(spec, ins, outs, (arena, arena_bytes), (weights_ptr, blob.nbytes)),
             spec.shared_bytes)
            for spec in section.launches]
        drv.Context.synchronize()

    def _alloc(self, nbytes: int, what: str) -> int:
        """A device buffer of `nbytes` (at least ALIGN); OOM is a one-line ArtifactError."""
        try:
            allocation = self._drv.mem_alloc(max(int(nbytes), ALIGN))
        except self._drv.MemoryError:
            free, total = self._session.mem_info()
            raise ArtifactError(f"out of GPU memory: the {what} needs {nbytes:,} bytes but "
                                f"only {free:,} of {total:,} bytes are free on "
                                f"{self._session.describe()}") from None
        self._allocations.append(allocation)
        return int(allocation)

    def _zero(self, pointer: int, nbytes: int) -> None:
        for offset in range(0, nbytes, _ZERO_CHUNK):
            self._drv.memset_d8(pointer + offset, 0, min(_ZERO_CHUNK, nbytes - offset))

    def _stage(self, specs: list[dict], what: str) -> list[_Slot]:
        """Device buffers (one allocation, ALIGN-ed offsets) + pinned host buffers."""
        dtypes = [np.dtype(s["dtype"]) for s in specs]
        sizes = [int(np.prod(s["shape"], dtype=np.int64)) * d.itemsize
                 for s, d in zip(specs, dtypes)]
        offsets, total = [], 0
        for size in sizes:
            offsets.append(total)
            total += -(-size // ALIGN) * ALIGN
        base = self._alloc(total, what)
        self._zero(base, total)
        slots = []
        for spec, dtype, size, offset in zip(specs, dtypes, sizes, offsets):
            raw = self._drv.pagelocked_empty(max(size, 1), np.uint8)[:size]
            host = raw.view(dtype).reshape(tuple(spec["shape"]))
            slots.append(_Slot(base + offset, host, raw, size))
        return slots

    def _load_functions(self, section: CudaSection) -> dict[tuple[str, str], Any]:
        gpu = self._session.describe()
        modules = {}
        for spec in section.modules:
            rel, how = select_image(spec, self._session.capability, gpu)
            file = self.path / rel
            if not file.is_file():
                raise ArtifactError(f"{file}: listed in the manifest but missing")
            if how.startswith("PTX"):
                _warn_once(f"{file}: no cubin for {self._session.arch}; loading the {how}")
            try:
                modules[spec.name] = self._drv.module_from_file(str(file))
            except self._drv.Error as exc:
                raise ArtifactError(f"{file}: cannot load the {how} on {gpu} ({exc})") from None
        self._modules = modules
        functions: dict[tuple[str, str], Any] = {}
        for spec in section.launches:
            key = (spec.module, spec.kernel)
            if key not in functions:
                functions[key] = self._function(modules[spec.module], spec, section)
            self._check_block(functions[key], spec)
        return functions

    def _function(self, module: Any, spec: LaunchSpec, section: CudaSection) -> Any:
        try:
            fn = module.get_function(spec.kernel)
        except self._drv.Error as exc:
            raise ArtifactError(f"{spec.describe()}: kernel {spec.kernel!r} is not in module "
                                f"{spec.module!r} ({exc})") from None
        shared = max(s.shared_bytes for s in section.launches
                     if (s.module, s.kernel) == (spec.module, spec.kernel))
        if shared > DEFAULT_SHARED_LIMIT:
            try:
                fn.set_attribute(self._drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 shared)
            except self._drv.Error as exc:
                raise ArtifactError(f"{spec.describe()}: needs {shared:,} bytes of dynamic "
                                    f"shared memory, more than {self._session.describe()} "
                                    f"allows ({exc})") from None
        return fn

    def _check_block(self, fn: Any, spec: LaunchSpec) -> None:
        limit = int(fn.get_attribute(self._drv.function_attribute.MAX_THREADS_PER_BLOCK))
        if spec.threads > limit:
            raise ArtifactError(f"{spec.describe()}: a block of {spec.threads} threads but "
                                f"the kernel allows at most {limit} on "
                                f"{self._session.describe()} (registers per thread)")

    # ------------------------------------------------------------ launching

    def _launch_error(self, index: int, exc: Exception) -> ArtifactError:
        spec = self._specs[index]
        return ArtifactError(f"kernel launch {index} ({spec.kernel}, grid {list(spec.grid)}, "
                             f"block {list(spec.block)}, {spec.shared_bytes} B dynamic shared "
                             f"memory) failed on {self._session.describe()}: {exc}")

    def _launch_all(self, sync_each: bool = False) -> None:
        """Enqueue every launch on the stream; with `sync_each`, wait after each one."""
        stream, error = self._stream, self._drv.Error
        for index, (launch, grid, block, args, shared) in enumerate(self._prepared):
            try:
                launch(grid, block, args, shared, stream)
            except error as exc:
                raise self._launch_error(index, exc) from None
            if sync_each:
                try:
                    stream.synchronize()
                except error as exc:
                    self._broken = self._unusable(exc)
                    raise self._launch_error(index, exc) from None

    def _capture(self) -> None:
        handle = getattr(self._stream, "handle", None)
        reason = self._session.graph_unavailable
        if reason is None and handle is None:
            reason = "this pycuda's Stream has no handle"
        if reason is None:
            try:
                self._graph_exec = self._session.graphs.capture(int(handle), self._launch_all)
            except (GraphError, ArtifactError) as exc:
                reason = f"stream capture failed: {exc}"
        if reason is not None:
            self.graph_unavailable = reason
            _warn_once(f"CUDA graph unavailable ({reason}); using plain stream launches")
            return
        self._graph_launch = self._session.graphs.launch
        self._graph_args = (ctypes.c_void_p(self._graph_exec), ctypes.c_void_p(int(handle)))
        self.uses_graph = True
        self.replay()
        self.synchronize()

    def replay(self) -> None:
        """Enqueue one forward pass on the executor's stream (no copies, no wait)."""
        if self.uses_graph:
            rc = self._graph_launch(*self._graph_args)
            if rc:
                raise ArtifactError(f"CUDA graph replay failed on {self._session.describe()}: "
                                    f"{self._session.graphs.error('cuGraphLaunch', rc)}")
        else:
            self._launch_all(self._sync_each)

    def synchronize(self, inputs: Optional[Mapping[str, np.ndarray]] = None) -> None:
        """Wait for the stream; a failure is located (see the module docstring)."""
        try:
            self._stream.synchronize()
        except self._drv.Error as exc:
            raise self._failure(exc, inputs) from None

    def _unusable(self, exc: Exception) -> str:
        """Record a sticky fault for this executor and the whole session; the message."""
        self._session.fault = (f"CUDA is unusable in this process after a GPU fault ({exc}); "
                               "a kernel fault breaks the process's CUDA context: restart "
                               "the process")
        return self._session.fault

    def _failure(self, exc: Exception, inputs: Optional[Mapping[str, np.ndarray]]
                 ) -> ArtifactError:
        self._broken = self._unusable(exc)
        if inputs is None:
            inputs = {s["name"]: slot.host.copy() for s, slot in
                      zip(self.manifest["inputs"], self._inputs)}
        located = locate_failure(self.path, self.manifest, inputs, self._locate_timeout_s)
        if located:
            return ArtifactError(located)
        return ArtifactError(f"the forward pass failed on {self._session.describe()}: {exc} "
                             "(rerunning the launches one by one in a fresh process did not "
                             "reproduce it)")

    # ------------------------------------------------------------ running

    def set_threads(self, n: int) -> None:
        """Accepted for parity with the CPU executor; no effect on a GPU."""

    def _usable_inputs(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The checked input arrays; a one-line error if a fault made CUDA unusable."""
        broken = self._broken or self._session.fault
        if broken:
            raise ArtifactError(broken)
        return check_inputs(self.manifest["inputs"], inputs)

    def _upload(self, arrays: list[np.ndarray]) -> None:
        """Copy the inputs into their pinned buffers and enqueue the copies to the device."""
        for slot, array in zip(self._inputs, arrays):
            if slot.nbytes:
                np.copyto(slot.host, array)
                self._drv.memcpy_htod_async(slot.device, slot.raw, self._stream)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = self._usable_inputs(inputs)
        pushed = self._enter()
        try:
            self._enqueue(arrays)
            self.synchronize(dict(inputs))
            self.last_latency_ms = float(self._end.time_since(self._start))
            outs = [slot.host.copy() for slot in self._outputs]
        finally:
            self._leave(pushed)
        return collect_outputs(self.manifest, arrays, outs, self.constants)

    def _enqueue(self, arrays: list[np.ndarray]) -> None:
        drv, stream = self._drv, self._stream
        self._upload(arrays)
        self._start.record(stream)
        self.replay()
        self._end.record(stream)
        for slot in self._outputs:
            if slot.nbytes:
                drv.memcpy_dtoh_async(slot.raw, slot.device, stream)

    def measure(self, repeat: int = 100, warmup: int = 10) -> list[float]:
        """Device milliseconds of `repeat` replays (after `warmup`) on the staged inputs."""
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
        return times

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 10) -> list[float]:
        """Per launch (manifest order), the median device milliseconds over `repeat`
        un-captured passes (after one warm-up pass) on `inputs`: the launches are issued
        one by one on the stream with a CUDA event between every two, so launch i's time
        is the time between events i and i + 1 (a graph replay cannot be timed per
        kernel). Where the host falls behind the GPU, an interval also holds the host's
        launch gap, so very short kernels read high; their sum is not the replay's time."""
        arrays = self._usable_inputs(inputs)
        pushed = self._enter()
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
                        raise self._launch_error(index, exc) from None
                    events[index + 1].record(stream)
                self.synchronize(dict(inputs))
                times[r] = [float(b.time_since(a)) for a, b in zip(events, events[1:])]
        finally:
            self._leave(pushed)
        return [float(v) for v in np.median(times[1:], axis=0)]

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """Free the graph and the device buffers (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.uses_graph = False
        if self._graph_exec and self._session.graphs is not None:
            self._session.graphs.destroy(self._graph_exec)
        self._graph_exec = 0
        self._prepared, self._modules = [], {}
        for allocation in self._allocations:
            try:
                allocation.free()
            except Exception:  # a faulted context cannot free; the process exit will
                pass
        self._allocations = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def locate_failure(path: Path, manifest: dict, inputs: Mapping[str, np.ndarray],
                   timeout: float = LOCATE_TIMEOUT_S) -> Optional[str]:
    """Rerun the artifact in a fresh process, launch by launch with a synchronize after
    each; return its one-line error naming the failing kernel, or None."""
    with tempfile.TemporaryDirectory(prefix="hidetc-locate-") as tmp:
        manifest_path, inputs_path = Path(tmp) / "manifest.json", Path(tmp) / "inputs.npz"
        try:
            manifest_path.write_text(json.dumps(to_plain(manifest)))
            with open(inputs_path, "wb") as f:
                np.savez(f, **{k: np.asarray(v) for k, v in inputs.items()})
        except (TypeError, ValueError, OSError):
            return None
        paths = [_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1",
                   PYTHONPATH=os.pathsep.join(p for p in paths if p))
        cmd = [sys.executable, "-m", "hidetc.backends.runtime.cuda.locate", str(path),
               str(manifest_path), str(inputs_path)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except (OSError, subprocess.TimeoutExpired):
            return None
    for line in proc.stdout.splitlines():
        if line.startswith(LOCATE_PREFIX):
            return line[len(LOCATE_PREFIX):]
    return None
