"""The process-wide CUDA session of the CUDA executors.

- pycuda is imported here, lazily, when the first executor is built (the one documented
  lazy import: hidetc must import on machines without pycuda or without a GPU); every
  way that fails is a one-line ArtifactError ("pycuda is not installed: ...",
  "this artifact targets cuda but no CUDA GPU is visible (pycuda: ...)").
- One session per process: device 0, its *primary* context retained and made current
  on the thread that opened the session (as `pycuda.autoprimaryctx`, but explicit).
  At interpreter exit the executors still alive are closed, the context is popped (so
  pycuda finds an empty context stack) and the primary context released.
- CUDA graphs: pycuda 2026.1 has no graph API (no stream capture, no cuGraph*: checked
  against the imports of its `_driver` extension), so the few driver entry points
  needed are called through ctypes on the same libcuda that pycuda loaded, with the
  stream handle pycuda exposes as `Stream.handle`. `GraphAPI` is None (with the reason
  in `graph_unavailable`) where they cannot be found.

Assumes a single GPU per process is enough (device 0; CUDA_VISIBLE_DEVICES selects).
"""
from __future__ import annotations

import atexit
import ctypes
import importlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hidetc.errors import ArtifactError

PYCUDA_MISSING = "pycuda is not installed: pip install 'hidetc[cuda]'"
LIBCUDA = "libcuda.so.1"
CAPTURE_MODE_RELAXED = 2          # CU_STREAM_CAPTURE_MODE_RELAXED
STREAM_NON_BLOCKING = 1           # CU_STREAM_NON_BLOCKING


def no_gpu_message(detail: object) -> str:
    text = str(detail).strip().splitlines()
    return ("this artifact targets cuda but no CUDA GPU is visible (pycuda: "
            f"{text[0] if text else type(detail).__name__})")


def import_pycuda_driver(importer: Optional[Callable[[str], Any]] = None) -> Any:
    """`pycuda.driver`, or a one-line ArtifactError saying why it cannot be had."""
    try:
        return (importer or importlib.import_module)("pycuda.driver")
    except ModuleNotFoundError as exc:
        if (exc.name or "pycuda").split(".")[0] == "pycuda":
            raise ArtifactError(PYCUDA_MISSING) from None
        raise ArtifactError(f"pycuda cannot be imported ({exc}); reinstall it with "
                            "pip install 'hidetc[cuda]'") from None
    except ImportError as exc:     # e.g. libcuda.so.1 missing: no NVIDIA driver here
        raise ArtifactError(no_gpu_message(exc)) from None


# ---------------------------------------------------------------- CUDA graphs (ctypes)


class GraphError(RuntimeError):
    """A driver call of the graph API failed; the message names the call and the error."""


class GraphAPI:
    """cuStreamBeginCapture_v2 / cuStreamEndCapture / cuGraphInstantiateWithFlags /
    cuGraphLaunch / cuGraphExecDestroy / cuGraphDestroy through ctypes. Handles are ints."""

    def __init__(self, lib: ctypes.CDLL):
        vp, i, pvp = ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)
        self._begin = self._fn(lib, "cuStreamBeginCapture_v2", [vp, i])
        self._end = self._fn(lib, "cuStreamEndCapture", [vp, pvp])
        self._instantiate = self._fn(lib, "cuGraphInstantiateWithFlags",
                                     [pvp, vp, ctypes.c_ulonglong])
        self.launch = self._fn(lib, "cuGraphLaunch", [vp, vp])   # (exec, stream) -> rc
        self._exec_destroy = self._fn(lib, "cuGraphExecDestroy", [vp])
        self._graph_destroy = self._fn(lib, "cuGraphDestroy", [vp])
        self._error_name = self._fn(lib, "cuGetErrorName", [i, ctypes.POINTER(ctypes.c_char_p)])

    @staticmethod
    def _fn(lib: ctypes.CDLL, name: str, argtypes: list) -> Any:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
        return fn

    def error(self, call: str, rc: int) -> GraphError:
        name = ctypes.c_char_p()
        self._error_name(rc, ctypes.byref(name))
        label = name.value.decode() if name.value else f"error {rc}"
        return GraphError(f"{call} failed: {label}")

    def _check(self, call: str, rc: int) -> None:
        if rc != 0:
            raise self.error(call, rc)

    def capture(self, stream: int, body: Callable[[], None]) -> int:
        """Record what `body` enqueues on `stream` into a graph; return the handle of
        its instantiated executable graph (the graph itself is destroyed)."""
        self._check("cuStreamBeginCapture", self._begin(stream, CAPTURE_MODE_RELAXED))
        graph = ctypes.c_void_p()
        try:
            body()
        finally:
            ended = self._end(stream, ctypes.byref(graph))
        try:
            self._check("cuStreamEndCapture", ended)
            executable = ctypes.c_void_p()
            self._check("cuGraphInstantiateWithFlags",
                        self._instantiate(ctypes.byref(executable), graph, 0))
            return int(executable.value or 0)
        finally:
            if graph.value:
                self._graph_destroy(graph)

    def destroy(self, executable: int) -> None:
        if executable:
            self._exec_destroy(executable)


def _graph_api() -> tuple[Optional[GraphAPI], Optional[str]]:
    try:
        return GraphAPI(ctypes.CDLL(LIBCUDA)), None
    except (OSError, AttributeError) as exc:
        return None, f"the CUDA graph API is not available in {LIBCUDA} ({exc})"


# ---------------------------------------------------------------- the session


@dataclass
class CudaSession:
    drv: Any                       # the pycuda.driver module
    device: Any
    context: Any
    name: str
    capability: tuple[int, int]
    graphs: Optional[GraphAPI]
    graph_unavailable: Optional[str]
    fault: Optional[str] = None    # set after a sticky GPU fault: the context is dead
    thread: int = field(default_factory=threading.get_ident)
    executors: "weakref.WeakSet[Any]" = field(default_factory=weakref.WeakSet)

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    def describe(self) -> str:
        return f"{self.name} ({self.arch})"

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        free, total = self.drv.mem_get_info()
        return int(free), int(total)

    def limits(self) -> dict[str, Any]:
        """The device's facts under `hidetc.target.CudaTarget`'s field names (those the
        driver reports, and the clock and DRAM bandwidth from its clock rates and bus
        width; `cuda_target(device=...)` fills the rest from the arch)."""
        facts: dict[str, Any] = {"name": self.name, "arch": self.arch}
        for field_name, attribute in DEVICE_LIMITS.items():
            attr = getattr(self.drv.device_attribute, attribute, None)
            if attr is not None:
                try:
                    facts[field_name] = int(self.device.get_attribute(attr))
                except self.drv.Error:
                    pass
        rates = {}
        for name in ("CLOCK_RATE", "MEMORY_CLOCK_RATE", "GLOBAL_MEMORY_BUS_WIDTH"):
            attr = getattr(self.drv.device_attribute, name, None)
            try:
                rates[name] = int(self.device.get_attribute(attr)) if attr is not None else 0
            except self.drv.Error:
                rates[name] = 0
        if rates["CLOCK_RATE"]:                       # kHz
            facts["clock_mhz"] = rates["CLOCK_RATE"] // 1000
        if rates["MEMORY_CLOCK_RATE"] and rates["GLOBAL_MEMORY_BUS_WIDTH"]:
            # double data rate: two transfers of bus-width bits per memory clock
            facts["dram_gbps"] = (2 * rates["MEMORY_CLOCK_RATE"] * 1000
                                  * rates["GLOBAL_MEMORY_BUS_WIDTH"] // 8) // 10**9
        return facts


# CudaTarget field -> the CUDA device attribute that reports it
DEVICE_LIMITS = {"sms": "MULTIPROCESSOR_COUNT", "max_threads": "MAX_THREADS_PER_BLOCK",
                 "shared_bytes": "MAX_SHARED_MEMORY_PER_BLOCK",
                 "shared_optin_bytes": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
                 "shared_per_sm_bytes": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
                 "registers_per_block": "MAX_REGISTERS_PER_BLOCK",
                 "registers_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR",
                 "threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
                 "l2_bytes": "L2_CACHE_SIZE"}


_SESSION: Optional[CudaSession] = None
_EXIT_HOOKED = False
_LOCK = threading.Lock()


def _open(importer: Callable[[str], Any]) -> CudaSession:
    drv = import_pycuda_driver(importer)
    try:
        drv.init()
        count = drv.Device.count()
    except drv.Error as exc:
        raise ArtifactError(no_gpu_message(exc)) from None
    if count < 1:
        raise ArtifactError(no_gpu_message("no CUDA device found"))
    try:
        device = drv.Device(0)
        capability = tuple(int(x) for x in device.compute_capability())
        context = device.retain_primary_context()
        context.push()
    except drv.Error as exc:
        raise ArtifactError(f"cannot open a CUDA context on GPU 0 ({exc})") from None
    graphs, reason = _graph_api()
    return CudaSession(drv, device, context, str(device.name()), (capability[0], capability[1]),
                       graphs, reason)


def session(importer: Optional[Callable[[str], Any]] = None) -> CudaSession:
    """The process's CUDA session, opened on first use (thread-safe). `importer`
    (default `importlib.import_module`) is how pycuda is imported; tests pass a fake."""
    global _SESSION, _EXIT_HOOKED
    with _LOCK:
        if _SESSION is None:
            _SESSION = _open(importer or importlib.import_module)
            if not _EXIT_HOOKED:
                atexit.register(_close_session)
                _EXIT_HOOKED = True
        return _SESSION


def _close_session() -> None:
    global _SESSION
    with _LOCK:
        current, _SESSION = _SESSION, None
    if current is None:
        return
    for executor in list(current.executors):
        try:
            executor.close()
        except Exception:  # best effort at exit: the process is ending
            pass
    # Pop, then release the primary context explicitly: left to pycuda's destructor it
    # would call cuCtxDetach on it and print a clean-up warning at every exit.
    try:
        current.context.pop()
        current.context.detach()
    except Exception:  # best effort at exit
        pass
