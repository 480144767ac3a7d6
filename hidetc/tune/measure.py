"""Measuring tuning candidates in isolation: build many configs of one task cheaply,
time each in a separate worker process, drop the bad ones with the reason.

`measure_candidates(task, template, configs)` returns one `CandidateResult` per config,
in order (`config` is `repr(config)`); `best(results)` is the fastest without error.
Errors (the candidate is dropped, logged on the `hidetc.tune` logger, and the rest go
on): "build: ..." (the template or lowering raised), "compile: ..." (gcc rejected its
code), "fault: signal N" (the worker died running it), "timeout after Xs", "wrong
result: output K: rel err X" / "... N mismatches" (checked against the op's numpy
reference before timing), "load: ..." and "worker ...: ..." for anything else.

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

Measurement (cpu): `python -m hidetc.tune.worker` (see that module for the protocol
and the timing discipline: the check on the real shapes, warm-up, median of `repeat`
monotonic-clock runs, rotated input copies, early stopping), one process at a time
and only after every unit is built (compiling beside it would disturb the timings).
The parent reads its JSON lines with a deadline: `timeout_s` from a candidate's
"start" to its result (the worker's own timing budget is half of that), so a hanging
candidate is killed; a dead worker names its signal. Either way the worker is
restarted after that candidate. Worker startup (imports, inputs, the reference) gets
STARTUP_TIMEOUT_S plus `timeout_s`; a worker that cannot start fails the remaining
candidates with the reason rather than restarting forever.

Timing noise: a median more than NOISY x the fastest run is logged as a warning (on a
busy machine a parallel kernel waits for a descheduled OpenMP thread). `stats`, a
`MeasureStats`, reports what a call built, found cached and how long each phase took.

Assumes: `template.build(task, config, name)` returns a kernel whose parameters are
exactly the task's buffer inputs (`task.buffer_inputs` order) then its outputs (a
kernel that does not is a "build: ..." error); the op has a numpy reference.
Guarantees: one result per config, in order, each with a time or an error, never
both; a faulting, hanging or wrong candidate never stops the call, and no worker
outlives it (it is killed, and dies with the parent).

Targets: "cpu" only for now. A "cuda" measurer (pycuda, CUDA events, the same worker
protocol over cubins) plugs into `MEASURERS`; until then `target="cuda"` raises a
HidetcError.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hidetc.codegen.c import print_c_module
from hidetc.codegen.launcher import entry_wrapper
from hidetc.errors import HidetcError, ToolchainError
from hidetc.schedules.task import Task
from hidetc.schedules.template import Config
from hidetc.tir.ir import Buffer, Function
from hidetc.tir.pipeline import lower
from hidetc.toolchain.cache import BuildCache, cache_key
from hidetc.toolchain.gcc import (
    DEFAULT_FLAGS,
    LINK_FLAGS,
    LINK_LIBS,
    compile_object,
    compiler_identity,
    find_compiler,
    link_shared,
)
from hidetc.tune.records import CandidateResult

log = logging.getLogger("hidetc.tune")

UNIT_SIZE = 16
STARTUP_TIMEOUT_S = 120.0
WARMUP = 2
SEED = 0
NOISY = 2.0         # median / min above this: a warning that the machine is busy

__all__ = ["CandidateResult", "MeasureStats", "best", "measure_candidates"]


@dataclass
class MeasureStats:
    """What one `measure_candidates` call did (pass one in to have it filled)."""
    candidates: int = 0
    built: int = 0              # kernels built and lowered
    units: int = 0              # shared libraries needed
    units_cached: int = 0       # ... found in the cache (nothing compiled or linked)
    units_split: int = 0        # ... whose batched compile failed (retried per kernel)
    worker_starts: int = 0
    build_s: float = 0.0        # template build + lowering + printing C
    compile_s: float = 0.0      # gcc, all units
    measure_s: float = 0.0      # the worker processes


def best(results: Sequence[CandidateResult]) -> Optional[CandidateResult]:
    """The fastest result without error (the first of equals), None if all failed."""
    ok = [r for r in results if r.error is None and r.time_ms is not None]
    return min(ok, key=lambda r: r.time_ms) if ok else None


def default_jobs() -> int:
    """Parallel units: the cores, at most one per GiB of available memory, >= 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    free_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free_gib = int(line.split()[1]) // (1024 * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return max(1, min(cores, free_gib if free_gib is not None else cores))


def measure_candidates(task: Task, template, configs: Sequence[Config], *,
                       target: str = "cpu", repeat: int = 20, timeout_s: float = 10.0,
                       jobs: int | None = None,
                       progress: Callable[[int], None] | None = None,
                       stats: MeasureStats | None = None) -> list[CandidateResult]:
    """One result per config, in order (see the module docstring). `progress(n)` is
    called with the number of configs finished so far."""
    measurer = MEASURERS.get(target)
    if measurer is None:
        raise HidetcError(f"measuring tuning candidates for target {target!r} is not "
                          f"implemented yet (supported: {', '.join(MEASURERS)})")
    stats = stats if stats is not None else MeasureStats()
    results = measurer(task, template, list(configs), repeat=repeat, timeout_s=timeout_s,
                       jobs=jobs or default_jobs(), progress=progress, stats=stats)
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


def _build_one(task: Task, template, config: Config, j: int) -> Function:
    """The lowered kernel of `config`, named `hidetc_tune_<j>`; raises if it cannot be
    built, lowered or printed as C."""
    fn = template.build(task, config, f"hidetc_tune_{j}")
    want = len(task.buffer_inputs) + len(task.outputs)
    if len(fn.params) != want or not all(isinstance(p, Buffer) for p in fn.params):
        raise ValueError(f"kernel {fn.name} has {len(fn.params)} params, expected "
                         f"{want} buffers (the task's buffer inputs, then outputs)")
    fn = lower(replace(fn, name=f"hidetc_tune_{j}"))
    _unit_source([fn])
    return fn


def _unit_source(fns: Sequence[Function]) -> str:
    return print_c_module(list(fns)) + "".join(entry_wrapper(fn) for fn in fns)


def _link_cached(sources: Sequence[str], cache: BuildCache
                 ) -> tuple[Optional[Path], list[Optional[str]], bool]:
    """Compile `sources` (one object each) and link them into a cached library; a
    source that fails to compile is left out and its error returned in its slot.
    The flag says the library came from the cache."""
    cc = find_compiler()
    key = cache_key([*sources, "\0".join(DEFAULT_FLAGS), "\0".join(LINK_FLAGS),
                     "\0".join(LINK_LIBS), compiler_identity(cc), "hidetc.tune unit"])
    so = cache.root / "tune" / key[:2] / f"{key}.so"
    if so.is_file():
        return so, [None] * len(sources), True
    objects, errors = [], []
    for k, src in enumerate(sources):
        try:
            objects.append(compile_object(f"tune_{key[:12]}_{k}", src, DEFAULT_FLAGS,
                                          cache=cache))
            errors.append(None)
        except ToolchainError as exc:
            errors.append(f"compile: {exc}")
    if not objects:
        return None, errors, False
    link_shared(objects, so, DEFAULT_FLAGS)
    return so, errors, False


def _build_unit(unit: _Unit, cache: BuildCache) -> tuple[dict[int, str], str]:
    """Build `unit.so`: ({candidate index: error} for kernels left out, "cached" |
    "built" | "split")."""
    fns, kernels = [fn for _, fn in unit.kernels], unit.kernels
    try:
        unit.so, errors, cached = _link_cached([_unit_source(fns)], cache)
        if unit.so is not None:
            return {}, "cached" if cached else "built"
    except ToolchainError as exc:       # the link failed
        errors = [f"compile: {exc}"]
    if len(kernels) == 1:               # nothing to split
        unit.kernels = []
        return {kernels[0][0]: errors[0]}, "split"
    sources = [_unit_source([fn]) for _, fn in kernels]
    try:
        unit.so, errors, _ = _link_cached(sources, cache)
    except ToolchainError as exc:       # the link itself failed
        unit.so, errors = None, [f"compile: {exc}"] * len(kernels)
    unit.kernels = [k for k, e in zip(kernels, errors) if e is None]
    return {i: e for (i, _), e in zip(kernels, errors) if e is not None}, "split"


def _build_cpu(task: Task, template, configs: list, jobs: int, stats: MeasureStats,
               errors: dict[int, str]) -> list[_Unit]:
    clock = time.perf_counter()
    units: list[_Unit] = []
    for i, config in enumerate(configs):
        if not units or len(units[-1].kernels) == UNIT_SIZE:
            units.append(_Unit([]))
        try:
            fn = _build_one(task, template, config, len(units[-1].kernels))
        except Exception as exc:  # noqa: BLE001 -- any template bug drops one candidate
            errors[i] = f"build: {type(exc).__name__}: {exc}".splitlines()[0]
            continue
        units[-1].kernels.append((i, fn))
        stats.built += 1
    units = [u for u in units if u.kernels]
    stats.units = len(units)
    stats.build_s = time.perf_counter() - clock
    clock = time.perf_counter()
    cache = BuildCache()
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(units) or 1))) as pool:
        for failed, how in pool.map(lambda u: _build_unit(u, cache), units):
            errors.update(failed)
            stats.units_cached += how == "cached"
            stats.units_split += how == "split"
    stats.compile_s = time.perf_counter() - clock
    return units


# ---------------------------------------------------------------- cpu: measure


class _Worker:
    """One `python -m hidetc.tune.worker` process and a line reader with deadlines."""

    def __init__(self, job_path: Path, start: int, best_ms: Optional[float], log_path: Path):
        argv = [sys.executable, "-m", "hidetc.tune.worker", str(job_path), str(start)]
        if best_ms is not None:
            argv.append(repr(best_ms))
        self.log_path = log_path
        self._log = open(log_path, "ab")
        env = dict(os.environ)          # the worker imports this very hidetc
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env)
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)

    def read(self, deadline: float) -> Optional[dict]:
        """The next message; None at EOF (the worker died); TimeoutError past deadline."""
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not self._sel.select(left):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def death(self) -> str:
        """Why the worker ended: its signal, or its exit code and last stderr line."""
        code = self.proc.wait()
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = "?"
            return f"fault: signal {-code} ({name})"
        self._log.flush()
        tail = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln]
        return f"worker exited with code {code}" + (f": {tail[-1]}" if tail else "")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._sel.close()
        self.proc.stdout.close()
        self._log.close()


def _drive(worker: _Worker, pos: int, timeout_s: float, on_result: Callable
           ) -> tuple[int, Optional[float], Optional[str]]:
    """Read one worker until it ends: (next position, best time seen, fatal reason --
    set when the worker failed outside any candidate, so restarting would not help)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S + timeout_s
    running: Optional[int] = None
    best_ms: Optional[float] = None
    while True:
        try:
            msg = worker.read(deadline)
        except TimeoutError:
            if running is None:
                return pos, best_ms, "worker stalled outside a candidate (killed)"
            on_result(running, None, f"timeout after {timeout_s:g}s")
            return running + 1, best_ms, None
        if msg is None:
            reason = worker.death()
            if running is not None:
                on_result(running, None, reason)
                return running + 1, best_ms, None
            return pos, best_ms, (reason if worker.proc.returncode != 0 else None)
        if "start" in msg:
            running = int(msg["start"])
        elif "result" in msg:
            k, t = int(msg["result"]), msg.get("time_ms")
            if t is not None and msg.get("min_ms") and t > NOISY * msg["min_ms"]:
                log.warning("noisy timing of candidate %d: median %.4g ms, min %.4g ms "
                            "(is the machine busy?)", k, t, msg["min_ms"])
            on_result(k, t, msg.get("error"))
            if t is not None:
                best_ms = t if best_ms is None else min(best_ms, t)
            pos, running = k + 1, None
        deadline = time.monotonic() + timeout_s


def _run_workers(task: Task, candidates: list[tuple[str, str]], *, repeat: int,
                 timeout_s: float, tmp: Path, stats: MeasureStats,
                 on_result: Callable[[int, Optional[float], Optional[str]], None]) -> None:
    """Measure `candidates` [(so path, symbol)], restarting the worker after each
    fault or timeout; `on_result(position, time_ms, error)` for every candidate."""
    job_path = tmp / "job.pkl"
    with open(job_path, "wb") as f:
        pickle.dump({"task": task, "candidates": candidates, "repeat": max(1, repeat),
                     "warmup": WARMUP, "seed": SEED, "budget_s": timeout_s / 2}, f)
    pos, best_ms = 0, None
    while pos < len(candidates):
        worker = _Worker(job_path, pos, best_ms, tmp / f"worker{stats.worker_starts}.log")
        stats.worker_starts += 1
        try:
            nxt, seen, fatal = _drive(worker, pos, timeout_s, on_result)
        finally:
            worker.close()
        if seen is not None:
            best_ms = seen if best_ms is None else min(best_ms, seen)
        if fatal is None and nxt == pos:
            fatal = "the worker exited without measuring anything"
        if fatal is not None:
            for k in range(nxt, len(candidates)):
                on_result(k, None, f"worker: {fatal}")
            return
        pos = nxt


def _measure_cpu(task: Task, template, configs: list, *, repeat: int, timeout_s: float,
                 jobs: int, progress: Optional[Callable[[int], None]],
                 stats: MeasureStats) -> list[CandidateResult]:
    stats.candidates = len(configs)
    errors: dict[int, str] = {}
    units = _build_cpu(task, template, configs, jobs, stats, errors)
    done = len(errors)
    if progress and done:
        progress(done)
    candidates = [(str(u.so), fn.name) for u in units if u.so is not None
                  for _, fn in u.kernels]
    index = [i for u in units if u.so is not None for i, _ in u.kernels]
    times: dict[int, float] = {}

    def on_result(k: int, time_ms: Optional[float], error: Optional[str]) -> None:
        nonlocal done
        if error is None and time_ms is None:
            error = "worker: no time reported"
        if error is not None:
            errors[index[k]] = error
        else:
            times[index[k]] = float(time_ms)
        done += 1
        if progress:
            progress(done)

    clock = time.perf_counter()
    if candidates:
        with tempfile.TemporaryDirectory(prefix="hidetc-tune-") as tmp:
            _run_workers(task, candidates, repeat=repeat, timeout_s=timeout_s,
                         tmp=Path(tmp), stats=stats, on_result=on_result)
    stats.measure_s = time.perf_counter() - clock
    return [CandidateResult(repr(c), times[i], None) if i in times else
            CandidateResult(repr(c), None, errors.get(i, "not measured"))
            for i, c in enumerate(configs)]


MEASURERS: dict[str, Callable[..., list[CandidateResult]]] = {"cpu": _measure_cpu}


def prebuild(work: Sequence[tuple[Task, Any, Sequence[Config]]], *, target: str = "cpu",
             jobs: Optional[int] = None) -> None:
    """Compile the candidates of many tasks ahead of measuring them, `jobs` translation
    units at a time across all tasks (a task's short list is one unit, so building task
    by task would leave cores idle). Only fills the build cache: `measure_candidates`
    then finds every unit built; errors are left for it to report."""
    if target != "cpu" or not work:
        return
    jobs = jobs or default_jobs()

    def one(item) -> None:
        task, template, configs = item
        _build_cpu(task, template, list(configs), 1, MeasureStats(), {})

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, work))
