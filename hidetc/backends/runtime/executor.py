"""Run a CPU artifact: load its shared library and weights, then call `hidetc_forward`
with the user's inputs, freshly allocated outputs and the arena of the pass's own
execution context (`runtime.contexts`: any number of threads may run one loaded model).

Assumes the manifest was read (and checksums checked) by `runtime.artifact`. Input
checking lives in `check_inputs` so every target shares the same messages. The library
is opened through `load_library`, so an artifact rebuilt at the same path and loaded
again in the same process runs its own kernels, never the earlier ones.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Optional

import numpy as np

from hidetc.backends.runtime import wait_policy
from hidetc.backends.runtime.contexts import Executor
from hidetc.backends.runtime.sizes import pass_for, read_dynamic, variant_view
from hidetc.backends.runtime.weights import WeightEntry, read_weights
from hidetc.backends.toolchain.cache import default_cache_dir
from hidetc.errors import ArtifactError, InputError
from hidetc.target import usable_cores


def check_inputs(specs: list[dict], inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Inputs in manifest order as C-contiguous arrays; one-line InputError otherwise."""
    names = [s["name"] for s in specs]
    unknown = sorted(set(inputs) - set(names))
    if unknown:
        raise InputError(f"unknown input(s) {', '.join(unknown)} (expected: {', '.join(names)})")
    arrays = []
    for spec in specs:
        name, dtype, shape = spec["name"], spec["dtype"], tuple(spec["shape"])
        if name not in inputs:
            raise InputError(f"missing input {name!r} ({dtype}{list(shape)})")
        array = np.asarray(inputs[name])
        if str(array.dtype) != dtype:
            raise InputError(f"input {name!r}: expected dtype {dtype}, got {array.dtype}")
        if tuple(array.shape) != shape:
            raise InputError(f"input {name!r}: expected shape {list(shape)}, "
                             f"got {list(array.shape)}")
        arrays.append(np.ascontiguousarray(array))
    return arrays


def collect_outputs(manifest: dict, inputs: list[np.ndarray], outputs: list[np.ndarray],
                    constants: Mapping[str, np.ndarray], variant: int = 0
                    ) -> dict[str, np.ndarray]:
    """Fill the outputs no kernel writes (see `output_sources`: a dynamic artifact's
    dispatch `variant` has its own) and name them all."""
    sources = manifest.get("output_sources", ())
    if variant:
        sources = manifest["dynamic"]["variants"][variant].get("output_sources", sources)
    for k, source in enumerate(sources):
        if source["kind"] == "input":
            outputs[k][...] = inputs[source["index"]]
        elif source["kind"] == "output":
            outputs[k][...] = outputs[source["index"]]
        elif source["kind"] == "constant":
            outputs[k][...] = constants[source["name"]]
    return {o["name"]: a for o, a in zip(manifest["outputs"], outputs)}


def value_bytes(manifest: dict, value: str, arena: np.ndarray, inputs: list[np.ndarray],
                outputs: list[np.ndarray], arena_start: Optional[int] = None
                ) -> Optional[np.ndarray]:
    """The bytes (a uint8 view) where graph value `value` lives in one pass: its arena
    region (at `arena_start` when given: a sanitized pass spaces the values, else at
    its planned offset), or its output or input buffer; None for weights or unknown."""
    memory = manifest["memory"]
    if value in memory["offsets"] and value in memory.get("bytes", {}):
        start = int(memory["offsets"][value]) if arena_start is None else arena_start
        return arena[start:start + int(memory["bytes"][value])]
    for k, spec in enumerate(manifest["outputs"]):
        if spec["name"] == value:
            return outputs[k].reshape(-1).view(np.uint8)
    for k, spec in enumerate(manifest["inputs"]):
        if spec["name"] == value:
            return inputs[k].reshape(-1).view(np.uint8)
    return None


def _pointers(arrays: list[np.ndarray]) -> ctypes.Array:
    ptrs = (ctypes.c_void_p * max(len(arrays), 1))()
    for i, a in enumerate(arrays):
        ptrs[i] = a.ctypes.data
    return ptrs


def load_library(path: Path) -> ctypes.CDLL:
    """dlopen the library at `path` under a file name that stands for its content.

    The dynamic loader hands back the library it already mapped for a file name, even
    when the file was replaced since (an artifact recompiled into the same directory and
    loaded again in one process): the old kernels would run on the new shapes. So the
    library is opened from a copy named by its sha256, `<cache>/libraries/<sha>.so`
    (the build cache's root, where the emulator's libraries are opened from too): one
    name only ever means one content. Written atomically; when the cache cannot be
    written the library is opened in place."""
    data = path.read_bytes()
    target = default_cache_dir() / "libraries" / f"{hashlib.sha256(data).hexdigest()}.so"
    try:
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".lib-", suffix=".tmp", dir=target.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.chmod(tmp, 0o755)
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    except OSError:
        target = path
    return ctypes.CDLL(str(target))


_NO_SIZES = np.zeros(1, np.int64)     # the sizes array of a static artifact's pass

# the OpenMP thread count last set on each OS thread (OpenMP keeps one per thread and
# process, whichever library set it)
_OMP_THREADS = threading.local()


def runtime_cores() -> int:
    """The intra-op threads one pass may use when alone: OMP_NUM_THREADS where the user
    set it (its first value), else the cores this process may run on."""
    first = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    return usable_cores()


class CpuExecutor(Executor):
    """A loaded cpu artifact: the library and the weights (a read-only map), shared by
    every pass; each pass runs on a `CpuContext` of its own (`contexts`). At most
    `max_contexts` pooled contexts (default: twice the cores; each holds one arena)."""

    def __init__(self, path: Path, manifest: dict, max_contexts: Optional[int] = None):
        self.manifest = manifest
        weights = manifest["weights"]
        entries = {k: WeightEntry(**v) for k, v in weights["entries"].items()}
        self._blob, self.constants = read_weights(path / weights["file"], entries)
        wait_policy.apply()         # before the first library needs libgomp
        try:
            self._lib = load_library(path / manifest["library"])
        except OSError as exc:
            raise ArtifactError(f"{path / manifest['library']}: cannot load ({exc})") from None
        self.dynamic = read_dynamic(manifest)
        names = [v.forward for v in self.dynamic.variants] if self.dynamic else \
            ["hidetc_forward"]
        self._forwards = [self._function(name, 5) for name in names]
        self._lib.hidetc_set_threads.argtypes = [ctypes.c_int]
        self._profiles = [self._function(name + "_profiled", 6, optional=True)
                          for name in names]
        self._profiled = self._profiles[0]
        self.arena_bytes = max(int(manifest["memory"]["arena_bytes"]), 64)
        cores = runtime_cores()
        # twice the cores: chosen from measurements on one 2-core machine
        # (bench/results/2026-12-07-concurrency.md), not checked on bigger ones
        self._init_pool(max_contexts or 2 * cores, cores)

    def _function(self, name: str, args: int, optional: bool = False):
        fn = getattr(self._lib, name, None)
        if fn is None:
            if optional:
                return None
            raise ArtifactError(f"{self.manifest['library']}: no launcher {name} (compiled "
                                f"by an older hidetc: recompile it)")
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * args
        return fn

    def sizes_of(self, inputs: Mapping[str, np.ndarray]) -> tuple[list[dict], list[dict],
                                                                  int, np.ndarray]:
        """The pass's input and output specs at its sizes, its dispatch variant and the
        sizes array (a static artifact: the manifest's specs, variant 0, no sizes)."""
        one = pass_for(self.manifest, self.dynamic, inputs)
        sizes = self.dynamic.array(one.sizes) if self.dynamic is not None else _NO_SIZES
        return one.inputs, one.outputs, one.variant, sizes

    def new_context(self, threads: int) -> "CpuContext":
        return CpuContext(self, threads)

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 10) -> list[float]:
        """Per launch (manifest order), the median milliseconds over `repeat` forward
        passes timed launch by launch (after one warm-up pass)."""
        if self._profiled is None:
            raise ArtifactError("this artifact has no profiling entry (compiled by an older "
                                "hidetc): recompile it to profile")
        return self.pooled("profile", inputs, repeat)

    def run_with_hook(self, inputs: Mapping[str, np.ndarray],
                      hook: Callable[[str, int, Callable], None]) -> dict[str, np.ndarray]:
        """One pass launch by launch through each kernel's exported `NAME_entry` (the
        manifest's `cpu.launches` say where each argument lives), with
        `hook("before" | "after", step, place)` around each launch; `place(value)` is the
        bytes (a uint8 view) where graph value `value` lives, or None (weights, or not
        in this pass). A dynamic artifact runs the variant the inputs' sizes select, by
        its own launch table and layout (`sizes.variant_view`). What the per-kernel
        comparison and the verification recovery drive; ArtifactError for an artifact
        without the table (an older hidetc)."""
        table = (self.manifest.get("cpu") or {}).get("launches")
        if table is None or len(table) != len(self.manifest["kernels"]):
            raise ArtifactError("this artifact has no launch table (compiled by an older "
                                "hidetc): recompile it to run it launch by launch")
        return self.pooled("run_with_hook", inputs, hook)


class CpuContext:
    """One pass at a time of a `CpuExecutor`: its own arena (zeroed once: the region the
    kernels keep zero starts so) and the intra-op thread count of its next pass.

    The thread count is set on the calling thread before each pass
    (`hidetc_set_threads`: OpenMP's thread-count setting belongs to the thread that
    calls, so passes on other threads keep theirs). The per-thread scratch stacks of the
    kernels (`codegen/c_scratch.SCRATCH_SOURCE`) belong to the OS threads and are freed
    when a thread ends."""

    def __init__(self, executor: CpuExecutor, threads: int):
        self._ex = executor
        self.threads = threads
        self.arena_bytes = executor.arena_bytes
        self._arena: Optional[np.ndarray] = np.zeros(executor.arena_bytes, np.uint8)
        self.last_latency_ms = 0.0

    def close(self) -> None:
        self._arena = None

    def _begin(self, inputs: Mapping[str, np.ndarray], fill: Callable = np.empty
               ) -> tuple[list[np.ndarray], list[np.ndarray], int, np.ndarray]:
        """The checked inputs and fresh outputs of a pass, its dispatch variant and
        sizes array (`CpuExecutor.sizes_of`); the calling thread's OpenMP team set to
        this pass's thread count."""
        specs_in, specs_out, variant, sizes = self._ex.sizes_of(inputs)
        arrays = check_inputs(specs_in, inputs)
        outs = [fill(o["shape"], o["dtype"]) for o in specs_out]
        omp = _OMP_THREADS
        if getattr(omp, "n", None) != self.threads:     # set only when it changes
            self._ex._lib.hidetc_set_threads(int(self.threads))
            omp.n = self.threads
        return arrays, outs, variant, sizes

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays, outs, variant, sizes = self._begin(inputs)
        in_ptrs, out_ptrs = _pointers(arrays), _pointers(outs)
        start = time.perf_counter()
        self._ex._forwards[variant](in_ptrs, out_ptrs, self._arena.ctypes.data,
                                    self._ex._blob.ctypes.data, sizes.ctypes.data)
        self.last_latency_ms = (time.perf_counter() - start) * 1e3
        return collect_outputs(self._ex.manifest, arrays, outs, self._ex.constants, variant)

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 10) -> list[float]:
        arrays, outs, variant, sizes = self._begin(inputs)
        manifest = self._ex.manifest
        count = manifest["dynamic"]["variants"][variant]["kernels"] if variant else \
            len(manifest["kernels"])
        in_ptrs, out_ptrs = _pointers(arrays), _pointers(outs)
        seconds = np.zeros((repeat + 1, max(count, 1)), np.float64)
        for r in range(repeat + 1):
            self._ex._profiles[variant](in_ptrs, out_ptrs, self._arena.ctypes.data,
                                        self._ex._blob.ctypes.data, sizes.ctypes.data,
                                        seconds[r].ctypes.data)
        return [float(v) for v in np.median(seconds[1:], axis=0) * 1e3]

    def run_with_hook(self, inputs: Mapping[str, np.ndarray],
                      hook: Callable[[str, int, Callable], None]) -> dict[str, np.ndarray]:
        manifest, lib, arena, blob = self._ex.manifest, self._ex._lib, self._arena, self._ex._blob
        arrays, outs, variant, sizes = self._begin(inputs, np.zeros)
        view = variant_view(manifest, variant)
        table = manifest["cpu"]["launches"] if not variant else \
            (manifest["cpu"].get("variant_launches") or [None] * variant)[variant - 1]
        if view is None or table is None:
            raise ArtifactError("this artifact holds no launch table of its dispatch variant "
                                f"{variant} (compiled by an older hidetc): recompile it to run "
                                f"it launch by launch")

        def place(value: str) -> Optional[np.ndarray]:
            return value_bytes(view, value, arena, arrays, outs)

        bases = {"input": [a.ctypes.data for a in arrays],
                 "output": [o.ctypes.data for o in outs]}
        for step, (kernel, args) in enumerate(zip(view["kernels"], table)):
            hook("before", step, place)
            ptrs = (ctypes.c_void_p * max(len(args), 1))()
            for i, (space, index) in enumerate(args):
                if space in bases:
                    ptrs[i] = bases[space][index]
                elif space == "size":           # the entry reads an int64 from there
                    ptrs[i] = sizes.ctypes.data + 8 * int(index)
                else:
                    base = arena if space == "arena" else blob
                    ptrs[i] = base.ctypes.data + int(index)
            getattr(lib, f"{kernel['name']}_entry")(ptrs)
            hook("after", step, place)
        return collect_outputs(manifest, arrays, outs, self._ex.constants, variant)
