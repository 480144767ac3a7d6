"""Measuring tuning candidates in isolation: build many configs of one task cheaply,
time each in a separate worker process, drop the bad ones with the reason.

`measure_candidates(task, template, configs)` returns one `CandidateResult` per config,
in order (`config` is `repr(config)`); `best(results)` is the fastest without error.
Errors (the candidate is dropped, logged on the `hidetc.driver.tune` logger, and the rest go
on): "build: ..." (the template or lowering raised), "compile: ..." (gcc or nvcc
rejected its code), "fault: signal N" (the worker died running it; cuda also "fault:
<CUDA error>"), "timeout after Xs", "wrong result: output K: rel err X" / "... N
mismatches" (checked against the op's numpy reference before timing), "load: ..." and
"worker ...: ..." for anything else.

Build (cpu): each config's kernel is built as `hidetc_tune_<j>` (j: its position in its
unit), lowered and printed (any exception there is "build: ..."); the kernels are
batched UNIT_SIZE to a translation unit
(one `print_c_module` + a `<name>_entry(void **args)` wrapper each, as
`codegen.launcher.entry_wrapper` emits for artifacts) and each unit is compiled and
linked into its own shared library, `jobs` units at a time (default: the cores, at
most one per free GiB of memory, at least 1). Objects go through the gcc build cache
(`toolchain.gcc.compile_object`); the linked library is cached too, under
`<cache root>/tune/<key>.so` with key = sha256(unit source, flags, compiler identity),
so a second tuning run of the same candidates compiles and links nothing. A unit that
fails to compile is retried one kernel per object, so one bad candidate costs only
itself ("compile: ..."); the good objects are linked into the unit's library.

A template with `prepare_inputs` (`hidetc.schedules.cpu.prepack.Prepacked`: weights
packed at compile time) gets each candidate's inputs through it in the worker, the
reference still computed from the plain inputs.

Measurement (cpu): `python -m hidetc.driver.tune.worker` (see that module for the protocol
and the timing discipline: the check on the real shapes, warm-up, median of `repeat`
monotonic-clock runs, rotated input copies, early stopping), one process at a time
and only after every unit is built (compiling beside it would disturb the timings);
then every candidate that measured is measured once more, in reverse order, and keeps
its faster pass (`hidetc.driver.tune.common`: a stall of the machine costs a candidate one
pass, not its rank).
The parent reads its JSON lines with a deadline: `timeout_s` from a candidate's
"start" to its result (the worker's own timing budget is half of that), so a hanging
candidate is killed; a dead worker names its signal. Either way the worker is
restarted after that candidate. Worker startup (imports, inputs, the reference) gets
STARTUP_TIMEOUT_S plus `timeout_s`; a worker that cannot start fails the remaining
candidates with the reason rather than restarting forever.

Timing noise: a median more than NOISY x the fastest run is logged as a warning (on a
busy machine a parallel kernel waits for a descheduled OpenMP thread). `stats`, a
`MeasureStats`, reports what a call built, found cached and how long each phase took.

Assumes: `template.build(task, config, name, target)` returns a kernel whose parameters are
exactly the task's buffer inputs (`task.buffer_inputs` order) then its outputs (a
kernel that does not is a "build: ..." error); the op has a numpy reference.
Guarantees: one result per config, in order, each with a time or an error, never
both; a faulting, hanging or wrong candidate never stops the call, and no worker
outlives it (it is killed, and dies with the parent).

Targets: a measurer per target -- `measure_cpu` / `prebuild_cpu` here, `measure_cuda` /
`prebuild_cuda` in `hidetc.driver.tune.measure_cuda` (nvcc cubins measured by
`python -m hidetc.driver.tune.worker_cuda` with pycuda and CUDA events on a GPU, or
with the emulator where there is none: the `backend` keyword) -- and the target's
backend (`hidetc.driver.backend`) says which; `measure_candidates` and `prebuild` take
it (`measurer=`, `builder=`; the cpu's by default). `arch` (the cuda architecture) and
`backend` are ignored by the cpu measurer. The worker supervision,
the stats and the result assembly shared by both live in `hidetc.driver.tune.common`.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.codegen.launcher import entry_wrapper
from hidetc.backends.toolchain.cache import BuildCache, cache_key
from hidetc.backends.toolchain.gcc import (
    LINK_FLAGS,
    LINK_LIBS,
    compile_object,
    compiler_identity,
    find_compiler,
    flags_for,
    link_shared,
)
from hidetc.compute.task import Task
from hidetc.driver.tune.common import (
    NOISY,
    SEED,
    STARTUP_TIMEOUT_S,
    WARMUP,
    MeasureStats,
    best,
    build_in_units,
    default_jobs,
    log,
    measure_built,
)
from hidetc.driver.tune.records import CandidateResult
from hidetc.errors import ToolchainError
from hidetc.schedules.template import Config
from hidetc.target import CpuTarget, Target, detect_cpu
from hidetc.tir.ir import Buffer, Function
from hidetc.tir.pipeline import lower

__all__ = ["CandidateResult", "MeasureStats", "best", "measure_candidates", "prebuild",
           "NOISY", "STARTUP_TIMEOUT_S"]


Measurer = Callable[..., list[CandidateResult]]


def measure_candidates(task: Task, template, configs: Sequence[Config], *,
                       target: Target | None = None, measurer: Measurer | None = None,
                       repeat: int = 20, timeout_s: float = 10.0,
                       jobs: int | None = None,
                       progress: Callable[[int], None] | None = None,
                       stats: MeasureStats | None = None, arch: str | None = None,
                       backend: str | None = None,
                       budget_rtol: float | None = None) -> list[CandidateResult]:
    """One result per config, in order (see the module docstring). `progress(n)` is
    called with the number of configs finished so far. `target`: the Target the
    kernels are built for (default: this host's cpu); `measurer`: its target's
    (`measure_cpu` by default: another target must name its backend's)."""
    stats = stats if stats is not None else MeasureStats()
    target = target if target is not None else detect_cpu()
    results = (measurer or _cpu_default(target, measure_cpu))(
        task, template, list(configs), repeat=repeat, timeout_s=timeout_s,
        jobs=jobs or default_jobs(), progress=progress, stats=stats, machine=target,
        arch=arch, backend=backend, budget_rtol=budget_rtol)
    for r in results:
        if r.error is not None:
            log.warning("dropped %s for %s: %s", r.config, task.signature(), r.error)
    return results


# ---------------------------------------------------------------- cpu: build


@dataclass
class _Unit:
    """One translation unit: kernels (candidate index, lowered fn); `so` once built."""
    kernels: list[tuple[int, Function]]
    so: Optional[Path] = None


def _build_one(task: Task, template, config: Config, j: int, machine: CpuTarget) -> Function:
    """The lowered kernel of `config`, named `hidetc_tune_<j>`; raises if it cannot be
    built, lowered or printed as C."""
    fn = template.build(task, config, f"hidetc_tune_{j}", machine)
    want = len(task.buffer_inputs) + len(task.outputs)
    if len(fn.params) != want or not all(isinstance(p, Buffer) for p in fn.params):
        raise ValueError(f"kernel {fn.name} has {len(fn.params)} params, expected "
                         f"{want} buffers (the task's buffer inputs, then outputs)")
    fn = lower(replace(fn, name=f"hidetc_tune_{j}"))
    _unit_source([fn])
    return fn


def _unit_source(fns: Sequence[Function]) -> str:
    return print_c_module(list(fns)) + "".join(entry_wrapper(fn) for fn in fns)


def _link_cached(sources: Sequence[str], cache: BuildCache, flags: Sequence[str]
                 ) -> tuple[Optional[Path], list[Optional[str]], bool]:
    """Compile `sources` (one object each, with `flags`: the target ISA's) and link them
    into a cached library; a source that fails to compile is left out and its error
    returned in its slot. The bool says the library came from the cache."""
    cc = find_compiler()
    key = cache_key([*sources, "\0".join(flags), "\0".join(LINK_FLAGS),
                     "\0".join(LINK_LIBS), compiler_identity(cc), "hidetc.driver.tune unit"])
    so = cache.root / "tune" / key[:2] / f"{key}.so"
    if so.is_file():
        return so, [None] * len(sources), True
    objects, errors = [], []
    for k, src in enumerate(sources):
        try:
            objects.append(compile_object(f"tune_{key[:12]}_{k}", src, flags, cache=cache))
            errors.append(None)
        except ToolchainError as exc:
            errors.append(f"compile: {exc}")
    if not objects:
        return None, errors, False
    link_shared(objects, so, flags)
    return so, errors, False


def _build_unit(unit: _Unit, cache: BuildCache, flags: Sequence[str]
                ) -> tuple[dict[int, str], str]:
    """Build `unit.so`: ({candidate index: error} for kernels left out, "cached" |
    "built" | "split")."""
    fns, kernels = [fn for _, fn in unit.kernels], unit.kernels
    try:
        unit.so, errors, cached = _link_cached([_unit_source(fns)], cache, flags)
        if unit.so is not None:
            return {}, "cached" if cached else "built"
    except ToolchainError as exc:       # the link failed
        errors = [f"compile: {exc}"]
    if len(kernels) == 1:               # nothing to split
        unit.kernels = []
        return {kernels[0][0]: errors[0]}, "split"
    sources = [_unit_source([fn]) for _, fn in kernels]
    try:
        unit.so, errors, _ = _link_cached(sources, cache, flags)
    except ToolchainError as exc:       # the link itself failed
        unit.so, errors = None, [f"compile: {exc}"] * len(kernels)
    unit.kernels = [k for k, e in zip(kernels, errors) if e is None]
    return {i: e for (i, _), e in zip(kernels, errors) if e is not None}, "split"


def _build_cpu(task: Task, template, configs: list, jobs: int, stats: MeasureStats,
               errors: dict[int, str], machine: CpuTarget) -> list[_Unit]:
    clock = time.perf_counter()
    units = build_in_units(configs, lambda c, j: _build_one(task, template, c, j, machine),
                           lambda n: _Unit([]), stats, errors)
    stats.units = len(units)
    stats.build_s = time.perf_counter() - clock
    clock = time.perf_counter()
    cache = BuildCache()
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(units) or 1))) as pool:
        flags = flags_for(machine.isa)
        for failed, how in pool.map(lambda u: _build_unit(u, cache, flags), units):
            errors.update(failed)
            stats.units_cached += how == "cached"
            stats.units_split += how == "split"
    stats.compile_s = time.perf_counter() - clock
    return units


# ---------------------------------------------------------------- cpu: measure


def measure_cpu(task: Task, template, configs: list, *, repeat: int, timeout_s: float,
                 jobs: int, progress: Optional[Callable[[int], None]],
                 stats: MeasureStats, machine: CpuTarget, arch: Optional[str] = None,
                 backend: Optional[str] = None,
                 budget_rtol: Optional[float] = None) -> list[CandidateResult]:
    stats.candidates = len(configs)
    errors: dict[int, str] = {}
    units = _build_cpu(task, template, configs, jobs, stats, errors, machine)
    index = [i for u in units if u.so is not None for i, _ in u.kernels]
    candidates = [(str(u.so), fn.name) for u in units if u.so is not None
                  for _, fn in u.kernels]
    job = {"task": task, "candidates": candidates, "repeat": max(1, repeat),
           "warmup": WARMUP, "seed": SEED, "budget_rtol": budget_rtol}
    if hasattr(template, "prepare_inputs"):   # weights packed per config (cpu.prepack)
        job["prepare"] = template
        job["configs"] = [configs[i] for i in index]
    return measure_built(configs, errors, index, module="hidetc.driver.tune.worker", job=job,
                         timeout_s=timeout_s, progress=progress, stats=stats, rematch=True)


Builder = Callable[..., None]


def prebuild(work: Sequence[tuple[Task, Any, Sequence[Config]]], *,
             target: Target | None = None,
             builder: Builder | None = None, jobs: Optional[int] = None,
             arch: Optional[str] = None, backend: Optional[str] = None) -> None:
    """Compile the candidates of many tasks ahead of measuring them, `jobs` translation
    units at a time across all tasks (a task's short list is one unit, so building task
    by task would leave cores idle), with the target's `builder` (`prebuild_cpu` by
    default: another target must name its backend's). Only fills the build caches:
    `measure_candidates` then finds every unit built; errors are left for it to
    report."""
    if work:
        target = target if target is not None else detect_cpu()
        (builder or _cpu_default(target, prebuild_cpu))(
            work, jobs=jobs or default_jobs(), machine=target, arch=arch, backend=backend)


def _cpu_default(target: Target, default: Callable) -> Callable:
    """The cpu's measurer or builder where the caller named none: only for a cpu
    target (measuring another target's kernels on the cpu would time the wrong code)."""
    if not isinstance(target, CpuTarget):
        raise ValueError(f"{target.kind} candidates need that target's measurer and "
                         f"builder (its backend's), not the cpu's")
    return default


def prebuild_cpu(work: Sequence[tuple[Task, Any, Sequence[Config]]], *, jobs: int,
                 machine: CpuTarget, arch: Optional[str] = None,
                 backend: Optional[str] = None) -> None:
    """The cpu's `prebuild`: each task's units built through the gcc build cache."""
    def one(item) -> None:
        task, template, configs = item
        _build_cpu(task, template, list(configs), 1, MeasureStats(), {}, machine)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, work))
