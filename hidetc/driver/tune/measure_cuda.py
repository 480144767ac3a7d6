"""Measuring tuning candidates for the cuda target (its backend's measurer, beside
`hidetc.driver.tune.measure`, which states the contract: one result per config, in order, the
same error strings, the same progress and stats).

Build: each config's kernel is built as `tune_k<j>` (j: its position in its unit;
`hidetc_*` names belong to the CUDA header), a cuda Function with `grid`/`block` attrs
and exactly the task's buffer inputs then outputs as parameters (then its scratch
buffers, which the worker passes zeroed), lowered and printed
with `print_cuda_module` (any exception there is "build: ..."). UNIT_SIZE kernels
make one .cu translation unit, and units are compiled `jobs` at a time: nvcc to a
cubin for `arch` (`compile_cubins`, cached by content under `<cache>/cuda`, no PTX)
and, for the emulator backend, g++ through `build_emulated` (objects and the linked
library cached too) -- so a second run of the same candidates compiles nothing. A
unit that fails either compiler is retried one kernel per module, so a bad candidate
drops alone ("compile: ..."). `stats.units_cached` counts the units for which no
compiler ran (seen through the build cache: nvcc and gcc ask it for a build
directory only on a miss).

Backends (`backend`; the worker runs one, see `hidetc.driver.tune.worker_cuda`):
- "pycuda": GPU 0 through pycuda, the cubins loaded with `module_from_buffer`, timed
  with CUDA events. The default wherever `hidetc.backends.runtime.select.gpu_available()`;
  elsewhere `backend=None` is a HidetcError. A cubin for an `arch` this GPU cannot run
  (another major version, or an `a` variant of another one) is measured as built for
  the GPU's own architecture instead (with a warning): the timings are of this device.
- "emulator": the same .cu run on the CPU by the CUDA emulator, timed with the host
  clock: meaningless as a ranking, but the whole protocol (check, faults, hangs,
  restarts) runs on machines without a GPU, which is what the tests need.

Measurement: `python -m hidetc.driver.tune.worker_cuda`, supervised exactly as the cpu worker
(`hidetc.driver.tune.common.run_workers`: per-candidate timeout, a killed or dead worker is
restarted after its candidate). A kernel fault on a GPU poisons the CUDA context, so
the worker reports "fault: <CUDA error>" and exits; the next candidate gets a fresh
worker. The emulator backend does the same on an EmulatorError; a segfaulting emulated
kernel kills the worker ("fault: signal 11 (SIGSEGV)").

Assumes: nvcc is installed (a missing one is every candidate's "compile: ..."); the op
has a numpy reference. Each candidate is launched with the dynamic shared memory its
printed kernel declares (`codegen.cuda.dynamic_shared_bytes`; 0 for static only).
"""
from __future__ import annotations

import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hidetc.backends.codegen.cuda import (
    CUDA_INCLUDE_DIR,
    dynamic_shared_bytes,
    print_cuda_module,
)
from hidetc.backends.toolchain.cache import BuildCache
from hidetc.backends.toolchain.nvcc import arch_number, compile_cubins, default_arch, parse_archs
from hidetc.compute.task import Task
from hidetc.driver.tune.common import (
    SEED,
    WARMUP,
    MeasureStats,
    build_in_units,
    measure_built,
)
from hidetc.driver.tune.records import CandidateResult
from hidetc.errors import HidetcError, ToolchainError
from hidetc.target import CudaTarget
from hidetc.tir import scratch
from hidetc.tir.ir import Buffer, Function
from hidetc.tir.pipeline import lower

log = logging.getLogger("hidetc.driver.tune")

BACKENDS = ("pycuda", "emulator")
WORKER = "hidetc.driver.tune.worker_cuda"
NO_GPU = "tuning for cuda needs a CUDA GPU here (or backend='emulator' for tests)"


def resolve_backend(backend: Optional[str], strict: bool = True) -> Optional[str]:
    """The backend to measure with: `backend` if known, else "pycuda" where a GPU is
    usable; without one, a HidetcError (`strict`) or None."""
    if backend is not None:
        if backend not in BACKENDS:
            raise HidetcError(f"unknown cuda measuring backend {backend!r} (expected one "
                              f"of {', '.join(BACKENDS)})")
        return backend
    from hidetc.backends.runtime.select import gpu_available
    if gpu_available():
        return "pycuda"
    if strict:
        raise HidetcError(NO_GPU)
    return None


def resolve_arch(arch: Optional[str], backend: Optional[str]) -> str:
    """One validated architecture (default: this machine's GPU, else nvcc's default);
    for the pycuda backend, one whose cubins this GPU can load (see the docstring)."""
    archs = parse_archs(arch or default_arch())
    if len(archs) != 1:
        raise HidetcError(f"tuning measures one architecture at a time, got {arch!r}")
    chosen = archs[0]
    if backend == "pycuda":
        gpu = default_arch()
        if not _runnable(chosen, gpu):
            log.warning("cubins for %s cannot run on this GPU (%s): measuring candidates "
                        "built for %s", chosen, gpu, gpu)
            chosen = gpu
    return chosen


def _runnable(arch: str, gpu: str) -> bool:
    """A cubin for `arch` loads on a GPU of architecture `gpu`: same major version,
    minor not newer; an arch-specific cubin (sm_90a) only on exactly that GPU."""
    if arch.endswith(("a", "f")):
        return arch.rstrip("af") == gpu.rstrip("af")
    a, g = arch_number(arch), arch_number(gpu)
    return a // 10 == g // 10 and a <= g


# ---------------------------------------------------------------- build


@dataclass
class _Unit:
    """One translation unit: kernels (candidate index, lowered fn); after compiling,
    `modules` maps each good candidate to the module (cubin or emulator library)
    holding its kernel."""
    name: str
    kernels: list[tuple[int, Function]]
    modules: dict[int, Path] = field(default_factory=dict)


class _WatchedCache(BuildCache):
    """The build cache, noting whether any compiler ran: nvcc and gcc ask for a build
    directory (to keep the source beside the log) only on a cache miss."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.compiled = False

    def build_dir(self, key: str) -> Path:
        self.compiled = True
        return super().build_dir(key)


def _launch_dims(fn: Function, what: str) -> tuple[int, int, int]:
    dims = fn.attr(what)
    if dims is None:
        raise ValueError(f"kernel {fn.name} has no {what!r} attr (cuda kernels carry their "
                         "launch shape)")
    dims = tuple(int(d) for d in (dims if isinstance(dims, (tuple, list)) else (dims,)))
    return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]


def _scratch_specs(fn: Function) -> tuple[tuple[tuple[int, ...], str], ...]:
    """(shape, dtype) of each scratch buffer the worker passes zeroed after the task's
    buffers (`hidetc.tir.scratch`)."""
    return tuple((tuple(b.shape), b.dtype) for b, _ in scratch.scratch_params(fn))


def _build_one(task: Task, template, config: Any, j: int, machine: CudaTarget) -> Function:
    """The lowered kernel of `config`, named `tune_k<j>`; raises if it cannot be
    built, lowered or printed as CUDA C, or lacks its launch shape."""
    name = f"tune_k{j}"
    fn = template.build(task, config, name, machine)
    want = len(task.buffer_inputs) + len(task.outputs)
    params = scratch.task_params(fn)
    if len(params) != want or not all(isinstance(p, Buffer) for p in params):
        raise ValueError(f"kernel {fn.name} has {len(params)} params, expected "
                         f"{want} buffers (the task's buffer inputs, then outputs)")
    fn = lower(replace(fn, name=name))
    _launch_dims(fn, "grid")
    _launch_dims(fn, "block")
    print_cuda_module([fn])
    return fn


def _build_units(task: Task, template, configs: Sequence, stats: MeasureStats,
                 errors: dict[int, str], machine: CudaTarget, prefix: str = "unit"
                 ) -> list[_Unit]:
    clock = time.perf_counter()
    units = build_in_units(configs, lambda c, j: _build_one(task, template, c, j, machine),
                           lambda n: _Unit(f"{prefix}{n}", []), stats, errors)
    stats.units += len(units)
    stats.build_s += time.perf_counter() - clock
    return units


def _compile_module(name: str, source: str, arch: str, backend: Optional[str],
                    out_dir: Path, cache: BuildCache) -> Path:
    """The module of one translation unit for `backend`: the cubin (pycuda; also the
    check that nvcc accepts the code for the emulator), or the emulator library."""
    cubins = compile_cubins({name: source}, arch, out_dir, include_dirs=[CUDA_INCLUDE_DIR],
                            jobs=1, cache=cache, ptx=False)
    if backend != "emulator":
        return cubins[arch][name]
    from hidetc.backends.runtime.emulator import build_emulated
    return build_emulated({name: source}, cache=cache)


def _compile_unit(unit: _Unit, arch: str, backend: Optional[str], out_dir: Path,
                  root: Path) -> tuple[dict[int, str], str]:
    """Fill `unit.modules`: ({candidate index: error} for kernels left out, "cached" |
    "built" | "split")."""
    cache = _WatchedCache(root)
    fns = [fn for _, fn in unit.kernels]
    try:
        module = _compile_module(unit.name, print_cuda_module(fns), arch, backend, out_dir,
                                 cache)
        unit.modules = {i: module for i, _ in unit.kernels}
        return {}, "built" if cache.compiled else "cached"
    except ToolchainError as exc:
        if len(unit.kernels) == 1:
            return {unit.kernels[0][0]: f"compile: {exc}"}, "split"
    failed: dict[int, str] = {}
    for j, (i, fn) in enumerate(unit.kernels):
        try:
            unit.modules[i] = _compile_module(f"{unit.name}_{j}", print_cuda_module([fn]),
                                              arch, backend, out_dir, cache)
        except ToolchainError as exc:
            failed[i] = f"compile: {exc}"
    return failed, "split"


def _compile_units(units: list[_Unit], arch: str, backend: Optional[str], out_dir: Path,
                   jobs: int, stats: MeasureStats, errors: dict[int, str]) -> None:
    clock = time.perf_counter()
    root = BuildCache().root

    def one(unit: _Unit) -> tuple[dict[int, str], str]:
        return _compile_unit(unit, arch, backend, out_dir, root)

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(units) or 1))) as pool:
        for failed, how in pool.map(one, units):
            errors.update(failed)
            stats.units_cached += how == "cached"
            stats.units_split += how == "split"
    stats.compile_s += time.perf_counter() - clock


# ---------------------------------------------------------------- measure


def measure_cuda(task: Task, template, configs: list, *, repeat: int, timeout_s: float,
                 jobs: int, progress: Optional[Callable[[int], None]],
                 stats: MeasureStats, machine: CudaTarget, arch: Optional[str] = None,
                 backend: Optional[str] = None,
                 budget_rtol: Optional[float] = None) -> list[CandidateResult]:
    """The cuda measurer: see the module docstring."""
    backend = resolve_backend(backend)
    arch = resolve_arch(arch, backend)
    stats.candidates = len(configs)
    errors: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="hidetc-tune-cuda-") as tmp:
        units = _build_units(task, template, configs, stats, errors, machine)
        _compile_units(units, arch, backend, Path(tmp) / "modules", jobs, stats, errors)
        candidates, index = [], []
        for unit in units:
            for i, fn in unit.kernels:
                if i in unit.modules:
                    candidates.append((str(unit.modules[i]), fn.name,
                                       _launch_dims(fn, "grid"), _launch_dims(fn, "block"),
                                       _scratch_specs(fn), dynamic_shared_bytes(fn)))
                    index.append(i)
        job = {"task": task, "candidates": candidates, "backend": backend,
               "repeat": max(1, repeat), "warmup": WARMUP, "seed": SEED,
               "budget_rtol": budget_rtol}
        return measure_built(configs, errors, index, module=WORKER, job=job,
                             timeout_s=timeout_s, progress=progress, stats=stats,
                             tmp=Path(tmp))


def prebuild_cuda(work: Sequence[tuple[Task, Any, Sequence]], *, jobs: int,
                  machine: CudaTarget, arch: Optional[str] = None,
                  backend: Optional[str] = None) -> None:
    """Build every task's units, then compile them all, `jobs` at a time: fills the
    caches `measure_cuda` then hits. Nothing is built where nothing could measure
    (no backend given and no GPU); errors are left for `measure_cuda` to report."""
    backend = resolve_backend(backend, strict=False)
    if backend is None or not work:
        return
    try:
        arch = resolve_arch(arch, backend)
    except HidetcError:
        return
    stats, units = MeasureStats(), []
    for n, (task, template, configs) in enumerate(work):
        units += _build_units(task, template, list(configs), stats, {}, machine,
                              prefix=f"t{n}_")
    with tempfile.TemporaryDirectory(prefix="hidetc-prebuild-cuda-") as tmp:
        _compile_units(units, arch, backend, Path(tmp), jobs, stats, {})
