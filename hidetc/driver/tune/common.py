"""What the cpu and cuda candidate measurers share (the parent side): the stats, the
ranking, the default build parallelism, and the supervision of the measuring worker
processes.

`run_workers(module, job, n, ...)` runs `python -m <module> JOB START BEST_MS FAILED` (the
protocol is in `hidetc.driver.tune.worker`) over candidates 0..n-1: one process at a time,
its JSON lines read with a deadline -- `timeout_s` from a candidate's "start" to its
result, STARTUP_TIMEOUT_S plus `timeout_s` for the worker to start -- so a hanging
candidate is killed ("timeout after Xs"), a dead worker names its signal ("fault:
signal N (NAME)"), and either way a fresh worker resumes after that candidate, carrying
the best time so far (for pruning). A worker may also end on its own right after
reporting a candidate (the cuda worker does, after a fault that poisons its device
context); it is then restarted at the next candidate like any other. A worker that
fails outside any candidate (it cannot start) fails the remaining candidates with the
reason ("worker: ...") rather than restarting forever.

`measure_built(...)` is the common tail of a measurer: the candidates that built are
measured by the workers, and one `CandidateResult` per config comes back, in order,
each with a time or an error, never both; `progress(n)` hears the count finished.

The time a candidate is ranked by (`CandidateResult.time_ms`) is its fastest timed run,
not the worker's median: on a shared machine the median takes in other tenants' load
(a 2-core tuning run saw medians 3x the minimum) and ranked near-equal configs by luck;
the fastest run is the kernel's own speed. A median more than NOISY x the minimum is
still logged. The cpu measurer also asks for a second pass (`rematch`, `_second_pass`):
the same worker measures every candidate that measured again, in reverse order, and
each keeps its faster pass, so a stall that held all of one candidate's runs does not
decide its rank.

The workers' numpy runs its BLAS on one thread (`BLAS_THREADS`): OpenBLAS's threads
spin after each call (the reference, the result check) and take the cores from the
kernel's OpenMP threads on a small machine (what that did to the measurements:
bench/results/2026-12-06-decision-notes.md).

Guarantees: no worker outlives `run_workers` (it is killed, and the worker asks the
kernel to kill it when its parent dies).
"""
from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from hidetc.backends.runtime import wait_policy
from hidetc.driver.tune.records import CandidateResult

log = logging.getLogger("hidetc.driver.tune")

UNIT_SIZE = 16
BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}   # in the workers
STARTUP_TIMEOUT_S = 120.0
WARMUP = 2
SEED = 0
NOISY = 2.0         # median / min above this: a warning that the machine is busy

OnResult = Callable[[int, Optional[float], Optional[str]], None]


@dataclass
class MeasureStats:
    """What one `measure_candidates` call did (pass one in to have it filled)."""
    candidates: int = 0
    built: int = 0              # kernels built and lowered
    units: int = 0              # shared libraries (cpu) / modules (cuda) needed
    units_cached: int = 0       # ... found in the cache (nothing compiled or linked)
    units_split: int = 0        # ... whose batched compile failed (retried per kernel)
    worker_starts: int = 0
    build_s: float = 0.0        # template build + lowering + printing the source
    compile_s: float = 0.0      # gcc / nvcc (+ g++ for the emulator), all units
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


def build_error(exc: BaseException) -> str:
    """The "build: ..." reason of a template, lowering or printing failure."""
    return f"build: {type(exc).__name__}: {exc}".splitlines()[0]


def build_in_units(configs: Sequence, build: Callable, new_unit: Callable,
                   stats: "MeasureStats", errors: dict) -> list:
    """Each config's kernel, `build(config, j)` with j its place in its unit, grouped into
    units of at most UNIT_SIZE (`new_unit(n)` makes the n-th, with a `kernels` list of
    (config index, function)); a config whose build raises is recorded in `errors` by
    index and left out (any template bug drops one candidate), the others counted in
    `stats.built`. Units left empty are dropped."""
    units: list = []
    for i, config in enumerate(configs):
        if not units or len(units[-1].kernels) == UNIT_SIZE:
            units.append(new_unit(len(units)))
        try:
            fn = build(config, len(units[-1].kernels))
        except Exception as exc:  # noqa: BLE001
            errors[i] = build_error(exc)
            continue
        units[-1].kernels.append((i, fn))
        stats.built += 1
    return [u for u in units if u.kernels]


# ---------------------------------------------------------------- the worker process


class WorkerProcess:
    """One `python -m <module>` worker and a line reader with deadlines."""

    def __init__(self, module: str, job_path: Path, start: int, best_ms: Optional[float],
                 log_path: Path, failed: Sequence[int] = ()):
        argv = [sys.executable, "-m", module, str(job_path), str(start),
                "-" if best_ms is None else repr(best_ms), ",".join(map(str, failed))]
        self.log_path = log_path
        self._log = open(log_path, "ab")
        env = dict(os.environ)          # the worker imports this very hidetc
        env.update(BLAS_THREADS)        # see the module docstring
        env.update(wait_policy.settings(env))    # measured as the executor will run them
        root = str(Path(__file__).resolve().parents[3])
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


def drive(worker: WorkerProcess, pos: int, timeout_s: float, on_result: OnResult
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
            k, t, fastest = int(msg["result"]), msg.get("time_ms"), msg.get("min_ms")
            if t is not None and fastest and t > NOISY * fastest:
                log.warning("noisy timing of candidate %d: median %.4g ms, min %.4g ms "
                            "(is the machine busy?)", k, t, fastest)
            if t is not None and fastest is not None:
                t = fastest          # ranked by the fastest run (module docstring)
            on_result(k, t, msg.get("error"))
            if t is not None:
                best_ms = t if best_ms is None else min(best_ms, t)
            pos, running = k + 1, None
        deadline = time.monotonic() + timeout_s


def run_workers(module: str, job: dict, n: int, *, timeout_s: float, tmp: Path,
                stats: MeasureStats, on_result: OnResult) -> None:
    """Measure candidates 0..n-1 of `job` (pickled for the worker, which gets
    "budget_s" = timeout_s / 2 added), restarting the worker after each fault or
    timeout (told the positions that failed so far); `on_result(position, time_ms,
    error)` for every candidate."""
    job_path = tmp / "job.pkl"
    with open(job_path, "wb") as f:
        pickle.dump({**job, "budget_s": timeout_s / 2}, f)
    pos, best_ms, failed = 0, None, []

    def record(k: int, time_ms: Optional[float], error: Optional[str]) -> None:
        if error is not None:
            failed.append(k)
        on_result(k, time_ms, error)

    while pos < n:
        worker = WorkerProcess(module, job_path, pos, best_ms,
                               tmp / f"worker{stats.worker_starts}.log", failed)
        stats.worker_starts += 1
        try:
            nxt, seen, fatal = drive(worker, pos, timeout_s, record)
        finally:
            worker.close()
        if seen is not None:
            best_ms = seen if best_ms is None else min(best_ms, seen)
        if fatal is None and nxt == pos:
            fatal = "the worker exited without measuring anything"
        if fatal is not None:
            for k in range(nxt, n):
                on_result(k, None, f"worker: {fatal}")
            return
        pos = nxt


def measure_built(configs: Sequence, errors: dict[int, str], index: list[int], *,
                  module: str, job: dict, timeout_s: float,
                  progress: Optional[Callable[[int], None]], stats: MeasureStats,
                  tmp: Optional[Path] = None, rematch: bool = False
                  ) -> list[CandidateResult]:
    """Measure the built candidates -- `job["candidates"][k]` is config `index[k]` --
    and return one result per config; `errors` holds the configs that did not build
    (reported to `progress` first). `tmp` is where the job and worker logs go (a
    temporary directory of its own when None). `rematch`: the worker measures every
    candidate twice (`_second_pass`)."""
    done = len(errors)
    if progress and done:
        progress(done)
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
    if index:
        own = tempfile.TemporaryDirectory(prefix="hidetc-tune-") if tmp is None else None
        with own or contextlib.nullcontext():
            folder = tmp or Path(own.name)
            if rematch:
                run_workers(module, {**job, "passes": 2}, 2 * len(index), timeout_s=timeout_s,
                            tmp=folder, stats=stats,
                            on_result=_second_pass(index, on_result, times, errors))
            else:
                run_workers(module, job, len(index), timeout_s=timeout_s, tmp=folder,
                            stats=stats, on_result=on_result)
    stats.measure_s = time.perf_counter() - clock
    return [CandidateResult(repr(c), times[i], None) if i in times else
            CandidateResult(repr(c), None, errors.get(i, "not measured"))
            for i, c in enumerate(configs)]


def _second_pass(index: list[int], first: OnResult, times: dict[int, float],
                 errors: dict[int, str]) -> OnResult:
    """The results of a two-pass measurement (the worker's job "passes": 2): positions
    0..n-1 are the first pass (reported by `first`), n..2n-1 the candidates again in
    reverse order, half the repeats, pruned against the best time so far; a candidate
    keeps the faster of its two fastest runs. A stall of the machine (seen:
    bench/results/2026-12-06-decision-notes.md) then costs a candidate one pass, not
    its rank. Candidates that failed are skipped
    by the worker ("skipped"); one that faults, hangs or computes a wrong result only
    in the second pass is dropped all the same."""
    n = len(index)

    def on_result(k: int, time_ms: Optional[float], error: Optional[str]) -> None:
        if k < n:
            first(k, time_ms, error)
            return
        i = index[2 * n - 1 - k]
        if error is not None and error != "skipped" and not error.startswith("worker"):
            errors[i] = error
            times.pop(i, None)
        elif error is None and time_ms is not None and i in times:
            times[i] = min(times[i], float(time_ms))
    return on_result
