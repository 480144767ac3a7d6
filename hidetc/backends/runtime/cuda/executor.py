"""Run a CUDA artifact on GPU 0 with pycuda: kernels loaded once from the cubin for this
GPU, the weights uploaded once, and each pass on an execution context of its own
(`cuda.context`: an arena, I/O buffers, a stream and the forward pass captured once into
a CUDA graph that each pass replays), so any number of threads run one loaded model.

Assumes: the manifest was read (checksums checked) by `runtime.artifact`; its `cuda`
section follows `hidetc.backends.runtime.cuda.manifest`; every kernel is `extern "C"` and takes
its launch's args in order.

Guarantees:
- Construction loads the modules, uploads the weights and makes the first context, which
  runs the forward pass once launch by launch with a synchronize after each (inputs
  zeroed): a kernel that cannot launch or faults is named (launch index, kernel, grid,
  block) before anything is captured. Later contexts (`runtime.contexts`: pooled for
  `run`, at most `max_contexts`, default CONTEXTS; or a caller's own) are made on first
  use from any thread, one at a time in the process (`_SETUP_LOCK`).
- `close()` starts no pass any more; it frees the weights and modules when the last
  context is closed (those in a pass when the pool takes them back, a caller's own when
  its caller closes it, which refuses to run meanwhile).
- `run(inputs)`: check inputs (`check_inputs`, as the CPU executor), copy into the
  context's pinned buffers, H2D, replay between two CUDA events, D2H, synchronize.
  `last_latency_ms` is the device time between the events (the calling thread's last
  pass), i.e. the forward pass without the copies.
- A kernel fault during a replay is sticky (the CUDA context is unusable afterwards, for
  every execution context), so it is located in a child process that reruns the
  launches one by one with a synchronize after each (`hidetc.backends.runtime.cuda.locate`);
  the error names the kernel, and this executor refuses further runs. Out-of-memory
  names the bytes requested and free.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import ml_dtypes  # noqa: F401  (registers the "bfloat16" dtype name with numpy)
import numpy as np

from hidetc.backends.runtime.artifact import to_plain
from hidetc.backends.runtime.contexts import CLOSED, Executor
from hidetc.backends.runtime.cuda.context import ALIGN, CudaContext, free_all
from hidetc.backends.runtime.cuda.driver import session
from hidetc.backends.runtime.cuda.manifest import (
    CudaSection,
    LaunchSpec,
    parse_section,
    select_image,
)
from hidetc.backends.runtime.sizes import Pass, pass_at, pass_for, read_dynamic
from hidetc.backends.runtime.weights import read_weights
from hidetc.errors import ArtifactError

log = logging.getLogger(__name__)
# pooled contexts of a loaded model: each is a stream with its arena, I/O buffers and
# graph; a few streams in flight keep a GPU busy while the host copies and checks
CONTEXTS = 4
# captured shapes per context of a dynamic artifact (each a CUDA graph: host and device
# memory of its own); the least recently used one goes past this
GRAPH_CACHE = 8
DEFAULT_SHARED_LIMIT = 48 * 1024
LOCATE_PREFIX = "hidetc-locate: "
LOCATE_TIMEOUT_S = 300
_ZERO_CHUNK = 1 << 30
_WARNED: set[str] = set()
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[4])
# Held by every setup in the process (`CudaExecutor.setting_up`: an executor's, and each
# context's setup, warm-up and graph capture), so one runs at a time. A setup zeroes its
# memory with memsets on the legacy default stream, which the contexts' non-blocking
# streams do not wait for, so it ends with a whole-context synchronize (syncing only the
# new context's own stream would not wait for them). CUDA refuses to synchronize a
# context while any of its streams is capturing, whatever the capture mode (relaxed mode
# lets other potentially unsafe calls through, not this one), and fails that capture;
# the session's context is shared by every executor of the process. Hence one lock for
# the process rather than per executor. A pass synchronizes its own stream only, so
# passes go on beside a setup.
_SETUP_LOCK = threading.Lock()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


class CudaExecutor(Executor):
    """`CudaExecutor(path, manifest).run({name: array}) -> {name: array}`, from any thread.

    `use_graph=False` launches kernel by kernel on the stream instead of replaying a
    graph; `sync_each=True` (debugging, and the failure locator) also waits after every
    launch so an error names its kernel. `uses_graph` says which one is in effect (the
    first context's, found at load; a later context that cannot capture launches
    plainly and says why in `graph_unavailable`).
    `locate_timeout_s` bounds the child process that names a kernel after a fault.
    `max_contexts` bounds the pooled contexts (each an arena, I/O buffers and a graph).
    `graph_cache` bounds the shapes (sets of sizes) each context of a dynamic artifact
    keeps captured (default: the manifest's `dynamic.graph_cache`, else GRAPH_CACHE).
    """

    def __init__(self, path: Path, manifest: dict, *, use_graph: bool = True,
                 sync_each: bool = False, locate_timeout_s: float = LOCATE_TIMEOUT_S,
                 max_contexts: Optional[int] = None, graph_cache: Optional[int] = None):
        self.path = Path(path)
        self.manifest = manifest
        self.dynamic = read_dynamic(manifest)
        self.graph_cache = int(graph_cache or (manifest.get("dynamic") or {}).get(
            "graph_cache", GRAPH_CACHE))
        self.graph_unavailable: Optional[str] = None
        self._use_graph, self._sync_each = use_graph, sync_each
        self._locate_timeout_s = locate_timeout_s
        self._broken: Optional[str] = None
        self._allocations: list[Any] = []
        self._primary: Optional[CudaContext] = None
        self.uses_graph = False
        self._lock = threading.Lock()      # guards the three below
        self._closed = False
        self._live = 0                     # contexts alive: pooled, lent, callers' own
        self._released = False             # the weights and modules freed
        section = parse_section(manifest, str(self.path / "manifest.yaml"))
        self._session = session()
        self._drv = self._session.drv
        if self._session.fault:
            raise ArtifactError(self._session.fault)
        self._init_pool(max_contexts or CONTEXTS, 1)
        with self.setting_up(self.close):
            self._setup(section)
        try:
            self._primary = CudaContext(self, warm=True, use_graph=use_graph,
                                        sync_each=sync_each)
        except BaseException:
            self.close()
            raise
        self.uses_graph = self._primary.uses_graph
        self.pool.offer(self._primary)
        self._session.executors.add(self)

    def new_context(self, threads: int) -> CudaContext:
        if self._broken or self._session.fault:
            raise ArtifactError(self._broken or self._session.fault)
        return CudaContext(self, threads, use_graph=self._use_graph,
                           sync_each=self._sync_each)

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

    @contextmanager
    def setting_up(self, undo: Callable[[], None]) -> Iterator[None]:
        """The session's context current for a setup step (the executor's, or a new
        execution context's: its setup, warm-up and capture), under `_SETUP_LOCK` (one
        at a time in the process); if it fails, `undo()` frees what it made, and a
        driver error becomes a one-line ArtifactError."""
        with _SETUP_LOCK:
            pushed = self._enter()
            try:
                yield
            except self._drv.Error as exc:
                undo()
                raise ArtifactError(f"{self.path}: cannot set the artifact up on "
                                    f"{self._session.describe()} ({exc})") from None
            except BaseException:
                undo()
                raise
            finally:
                self._leave(pushed)

    def _adopt(self) -> None:
        """Count a context being made (its `close` calls `_retire`); a one-line error
        once this model was closed."""
        with self._lock:
            if self._closed:
                raise ArtifactError(CLOSED)
            self._live += 1

    def _retire(self) -> None:
        """A context was closed: the last one of a closed model frees what they shared."""
        with self._lock:
            self._live -= 1
        self._release()

    # ------------------------------------------------------------ setup (shared)

    def _setup(self, section: CudaSection) -> None:
        weights = self.manifest["weights"]
        blob, self.constants = read_weights(self.path / weights["file"], weights["entries"])
        weights_ptr = self._alloc(blob.nbytes, "weights", self._allocations)
        if blob.nbytes:
            self._drv.memcpy_htod(weights_ptr, blob)
        self._weights = (weights_ptr, blob.nbytes)
        self._functions = self._load_functions(section)
        self._variants = section.variants
        self._drv.Context.synchronize()

    def largest_pass(self) -> Pass:
        """The pass at every range's largest size (a static artifact's only pass): what
        a context's I/O buffers hold and its warm-up runs."""
        if self.dynamic is None:
            return pass_for(self.manifest, None, {})
        return pass_at(self.manifest, self.dynamic,
                       {name: hi for name, (_, hi) in self.dynamic.ranges.items()})

    def launches_of(self, one: Pass) -> tuple[LaunchSpec, ...]:
        """The launches of pass `one`: its variant's, bound at its sizes."""
        launches = self._variants[one.variant]
        if self.dynamic is None:
            return launches
        return tuple(spec.at(one.sizes, self.dynamic.order) for spec in launches)

    def _alloc(self, nbytes: int, what: str, owner: list) -> int:
        """A device buffer of `nbytes` (at least ALIGN), kept in `owner` (whose close
        frees it); OOM is a one-line ArtifactError."""
        try:
            allocation = self._drv.mem_alloc(max(int(nbytes), ALIGN))
        except self._drv.MemoryError:
            free, total = self._session.mem_info()
            raise ArtifactError(f"out of GPU memory: the {what} needs {nbytes:,} bytes but "
                                f"only {free:,} of {total:,} bytes are free on "
                                f"{self._session.describe()}") from None
        owner.append(allocation)
        return int(allocation)

    def _zero(self, pointer: int, nbytes: int) -> None:
        for offset in range(0, nbytes, _ZERO_CHUNK):
            self._drv.memset_d8(pointer + offset, 0, min(_ZERO_CHUNK, nbytes - offset))

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
        for spec in (spec for launches in section.variants for spec in launches):
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
        shared = max(s.shared_bytes for launches in section.variants for s in launches
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

    def _launch_error(self, spec: LaunchSpec, exc: Exception) -> ArtifactError:
        index = spec.index
        return ArtifactError(f"kernel launch {index} ({spec.kernel}, grid {list(spec.grid)}, "
                             f"block {list(spec.block)}, {spec.shared_bytes} B dynamic shared "
                             f"memory) failed on {self._session.describe()}: {exc}")

    def _no_graph(self, reason: str) -> None:
        """A context could not capture its graph: it launches plainly (said once)."""
        self.graph_unavailable = reason
        _warn_once(f"CUDA graph unavailable ({reason}); using plain stream launches")

    def _unusable(self, exc: Exception) -> str:
        """Record a sticky fault for this executor and the whole session; the message."""
        self._session.fault = (f"CUDA is unusable in this process after a GPU fault ({exc}); "
                               "a kernel fault breaks the process's CUDA context: restart "
                               "the process")
        return self._session.fault

    def _failure(self, exc: Exception, inputs: Mapping[str, np.ndarray]) -> ArtifactError:
        """A pass on `inputs` failed: the executor and the session are unusable from
        now on; the error names the kernel (`locate_failure`) where it can."""
        self._broken = self._unusable(exc)
        located = locate_failure(self.path, self.manifest, inputs, self._locate_timeout_s)
        if located:
            return ArtifactError(located)
        return ArtifactError(f"the forward pass failed on {self._session.describe()}: {exc} "
                             "(rerunning the launches one by one in a fresh process did not "
                             "reproduce it)")

    # ------------------------------------------------------------ running

    def set_threads(self, n: int) -> None:
        """Accepted for parity with the CPU executor; no effect on a GPU."""

    def _usable(self) -> None:
        """A one-line error if a fault made CUDA unusable or this model was closed."""
        broken = self._broken or self._session.fault
        if broken:
            raise ArtifactError(broken)
        if self._closed:
            raise ArtifactError(CLOSED)

    def replay(self) -> None:
        """Enqueue one forward pass on the first context's stream (no copies, no wait):
        for single-threaded timing loops (the GPU check), not beside concurrent runs. A
        one-line error once that context was closed (`CudaContext.ready`)."""
        self._primary.ready()
        self._primary.replay()

    def synchronize(self) -> None:
        """Wait for the first context's stream (see `replay`)."""
        self._primary.ready()
        self._primary.synchronize()

    def measure(self, repeat: int = 100, warmup: int = 10) -> list[float]:
        """Device milliseconds of `repeat` replays (after `warmup`) on a context's staged
        inputs (a single-threaded caller's: those of its last run)."""
        return self.pooled("measure", repeat, warmup)

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 10) -> list[float]:
        """Per launch (manifest order), the median device milliseconds over `repeat`
        un-captured passes (after one warm-up pass) on `inputs`: the launches are issued
        one by one on the stream with a CUDA event between every two, so launch i's time
        is the time between events i and i + 1 (a graph replay cannot be timed per
        kernel). Where the host falls behind the GPU, an interval also holds the host's
        launch gap, so very short kernels read high; their sum is not the replay's time."""
        return self.pooled("profile", inputs, repeat)

    # ------------------------------------------------------------ teardown

    def close(self) -> None:
        """Start no pass from now on (idempotent). The pool owns its contexts (the first
        among them): it closes the idle ones now and those lent out when they come back;
        a caller's own context refuses to run and is freed when its caller closes it.
        The weights and modules go with the last context (`_release`)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        super().close()
        self._release()

    def _release(self) -> None:
        """Free the weights and modules once the model is closed and no context lives
        (a pass in flight or a caller's context may still launch while one does)."""
        with self._lock:
            if not self._closed or self._live or self._released:
                return
            self._released = True
        self._functions, self._modules = {}, {}
        free_all(self._allocations)

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
