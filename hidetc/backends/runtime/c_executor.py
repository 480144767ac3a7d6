"""Run an artifact through its own C runtime (`OUT/lib/libhidetc_runtime.so`, `hidetc.h`)
from Python: `hidetc.load(OUT, runtime="c")`.

What it is for: the C runtime and the Python runtime execute the same plan, so the tests
run both on the same inputs and compare bit for bit; and a Python caller gets the C
path's per-call cost. The library is opened through `executor.load_library` (a copy
named by its content), so two artifacts' runtimes never share a handle by path.

Guarantees: the same `Executor` surface as the Python executors (`run` on pooled
contexts from any thread, `context(threads)`, `set_threads`); inputs checked in Python
first with the Python runtime's messages (`check_inputs`, at the sizes
`sizes.pass_for` binds), then by the C side; a C error becomes a one-line
`InputError` (bad shapes and arguments) or `ArtifactError` (anything else) with the
runtime's message. Outputs are fresh arrays per pass, shaped as the C side says.
Assumes: the artifact carries the runtime (`manifest["runtime"]`; an older artifact is
an ArtifactError asking for a recompile).
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from hidetc.backends.runtime.contexts import Executor
from hidetc.backends.runtime.executor import check_inputs, load_library, runtime_cores
from hidetc.backends.runtime.sizes import read_dynamic
from hidetc.errors import ArtifactError, InputError

MAX_RANK = 16
STATUS = ("ok", "argument", "io", "format", "version", "checksum", "machine", "shape",
          "memory", "busy", "device", "internal")
_INPUT_STATUSES = (1, 7)          # argument, shape: the caller's inputs


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int),
                ("dtype_name", ctypes.c_char_p), ("elem_bytes", ctypes.c_size_t),
                ("rank", ctypes.c_int), ("dims", ctypes.c_int64 * MAX_RANK),
                ("dim_min", ctypes.c_int64 * MAX_RANK), ("dim_max", ctypes.c_int64 * MAX_RANK)]


class ContextOptions(ctypes.Structure):
    _fields_ = [("threads", ctypes.c_int), ("stream", ctypes.c_void_p),
                ("io_on_device", ctypes.c_int)]


_SIGNATURES = {
    "hidetc_abi_version": ([], ctypes.c_int),
    "hidetc_last_error": ([], ctypes.c_char_p),
    "hidetc_model_load": ([ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p], ctypes.c_int),
    "hidetc_model_free": ([ctypes.c_void_p], None),
    "hidetc_model_num_inputs": ([ctypes.c_void_p], ctypes.c_int),
    "hidetc_model_num_outputs": ([ctypes.c_void_p], ctypes.c_int),
    "hidetc_model_weight_bytes": ([ctypes.c_void_p], ctypes.c_size_t),
    "hidetc_model_input_info": ([ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(TensorInfo)],
                                ctypes.c_int),
    "hidetc_model_output_info": ([ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(TensorInfo)],
                                 ctypes.c_int),
    "hidetc_model_input_dim_name": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
                                    ctypes.c_char_p),
    "hidetc_model_output_dim_name": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
                                     ctypes.c_char_p),
    "hidetc_context_create": ([ctypes.c_void_p, ctypes.POINTER(ContextOptions),
                               ctypes.c_void_p], ctypes.c_int),
    "hidetc_context_free": ([ctypes.c_void_p], None),
    "hidetc_context_set_input_shape": ([ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int64)], ctypes.c_int),
    "hidetc_context_output_shape": ([ctypes.c_void_p, ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_int),
                                     ctypes.POINTER(ctypes.c_int64)], ctypes.c_int),
    "hidetc_context_workspace_bytes": ([ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
                                       ctypes.c_int),
    "hidetc_context_set_workspace": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t],
                                     ctypes.c_int),
    "hidetc_context_set_threads": ([ctypes.c_void_p, ctypes.c_int], ctypes.c_int),
    "hidetc_context_run": ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
    "hidetc_context_last_latency_ms": ([ctypes.c_void_p], ctypes.c_double),
}


def open_runtime(path: Path) -> ctypes.CDLL:
    """The runtime library at `path` with its API's signatures declared."""
    try:
        lib = load_library(path)
    except OSError as exc:
        raise ArtifactError(f"{path}: cannot load the C runtime ({exc})") from None
    for name, (args, result) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


def check(lib: ctypes.CDLL, status: int) -> None:
    """Raise the C runtime's error of `status` (nothing for HIDETC_OK)."""
    if status == 0:
        return
    message = (lib.hidetc_last_error() or b"").decode("utf-8", "replace")
    name = STATUS[status] if 0 <= status < len(STATUS) else str(status)
    if status in _INPUT_STATUSES:
        raise InputError(message)
    raise ArtifactError(f"C runtime ({name}): {message}")


class CRuntimeExecutor(Executor):
    """A model loaded by the artifact's C runtime; passes on C contexts (`CContext`)."""

    def __init__(self, path: Path, manifest: dict, max_contexts: Optional[int] = None,
                 verify_checksums: bool = True):
        section = manifest.get("runtime")
        if not section:
            raise ArtifactError(f"{path}: this artifact carries no C runtime (compiled by an "
                                f"older hidetc): recompile it")
        self.manifest = manifest
        self.dynamic = read_dynamic(manifest)
        self.lib = open_runtime(path / section["library"])
        handle = ctypes.c_void_p()
        check(self.lib, self.lib.hidetc_model_load(str(path).encode(),
                                                   0 if verify_checksums else 1,
                                                   ctypes.byref(handle)))
        self.handle = handle
        self.weight_bytes = int(self.lib.hidetc_model_weight_bytes(handle))
        self._outputs = len(manifest["outputs"])
        self._closed = threading.Event()
        self._contexts: set["CContext"] = set()     # the open ones (closed: forgotten)
        self._contexts_lock = threading.Lock()
        cores = runtime_cores()
        self._init_pool(max_contexts or 2 * cores, cores)

    def new_context(self, threads: int) -> "CContext":
        context = CContext(self, threads)
        with self._contexts_lock:
            self._contexts.add(context)
        return context

    def _forget(self, context: "CContext") -> None:
        with self._contexts_lock:
            self._contexts.discard(context)

    def close(self) -> None:
        """Free the pooled contexts, then the model (once every context is closed)."""
        super().close()
        with self._contexts_lock:
            contexts = list(self._contexts)
        for context in contexts:
            context.close()
        if self.handle:
            self.lib.hidetc_model_free(self.handle)
            self.handle = None


class CContext:
    """One pass at a time on a C context (the arena is the C side's)."""

    def __init__(self, executor: CRuntimeExecutor, threads: int):
        self._ex = executor
        lib = executor.lib
        handle = ctypes.c_void_p()
        options = ContextOptions(threads=int(threads))
        check(lib, lib.hidetc_context_create(executor.handle, ctypes.byref(options),
                                             ctypes.byref(handle)))
        self._handle = handle
        self._threads = int(threads)
        self.last_latency_ms = 0.0

    @property
    def threads(self) -> int:
        return self._threads

    @threads.setter
    def threads(self, n: int) -> None:
        if int(n) != self._threads and self._handle:
            check(self._ex.lib, self._ex.lib.hidetc_context_set_threads(self._handle, int(n)))
        self._threads = int(n)

    def close(self) -> None:
        if self._handle:
            self._ex.lib.hidetc_context_free(self._handle)
            self._handle = None
            self._ex._forget(self)

    def workspace_bytes(self) -> int:
        size = ctypes.c_size_t()
        check(self._ex.lib, self._ex.lib.hidetc_context_workspace_bytes(self._handle,
                                                                        ctypes.byref(size)))
        return int(size.value)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ex, lib = self._ex, self._ex.lib
        if not self._handle:
            raise ArtifactError("this context was closed")
        arrays = check_inputs(ex.pass_of(inputs).inputs, inputs)
        if ex.dynamic is not None:
            for k, a in enumerate(arrays):
                dims = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
                check(lib, lib.hidetc_context_set_input_shape(self._handle, k, a.ndim, dims))
        outs = []
        rank, dims = ctypes.c_int(), (ctypes.c_int64 * MAX_RANK)()
        for k, spec in enumerate(ex.manifest["outputs"]):
            check(lib, lib.hidetc_context_output_shape(self._handle, k, ctypes.byref(rank),
                                                       dims))
            outs.append(np.empty(tuple(dims[:rank.value]), spec["dtype"]))
        in_ptrs = (ctypes.c_void_p * max(len(arrays), 1))(*[a.ctypes.data for a in arrays])
        out_ptrs = (ctypes.c_void_p * max(len(outs), 1))(*[o.ctypes.data for o in outs])
        check(lib, lib.hidetc_context_run(self._handle, in_ptrs, out_ptrs))
        self.last_latency_ms = float(lib.hidetc_context_last_latency_ms(self._handle))
        return {spec["name"]: o for spec, o in zip(ex.manifest["outputs"], outs)}
