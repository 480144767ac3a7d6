"""The measuring worker: `python -m hidetc.driver.tune.worker JOB START BEST_MS FAILED`.

One process measures candidate kernels of one task so that a kernel that faults or
hangs takes down this process, never the compiler (`hidetc.driver.tune.measure` runs it,
watches it and restarts it after the failing candidate).

Input: JOB is a pickle written by the parent: {"task": Task, "candidates": [(so_path,
symbol), ...], "repeat", "warmup", "seed", "budget_s"} and optionally "prepare" (a
template whose `prepare_inputs(task, config, inputs)` gives the inputs a candidate
reads: weights packed at compile time) with "configs" (per candidate), and "passes"
(default 1; 2: positions n..2n-1 measure the candidates again in reverse order with
half the repeats, skipping those that failed: `hidetc.driver.tune.common._second_pass`);
START is the first position to measure (a restarted worker resumes after the one that
killed its predecessor); BEST_MS the best time (fastest run) measured so far (for
pruning), "-" if none; FAILED the positions that failed before (comma-separated; their
candidates are skipped in the second pass, reported as error "skipped").

Output: JSON lines on the original stdout (fd 1 is pointed at stderr first, so whatever
a kernel or library prints cannot corrupt the protocol):
    {"ready": true}                               inputs and reference computed
    {"start": k}                                  candidate k's first call begins
    {"result": k, "time_ms": median|null, "min_ms": min|null, "error": s|null}
then exit 0. A kernel that faults kills the process by its signal; the parent reads
which candidate was running from the last "start".

Per candidate: its library is loaded, `<symbol>_entry(void **args)` gets the buffers
(the task's buffer inputs in order, then the outputs). Correctness first: outputs are
filled with NaN (ints: a sentinel), one call, then each output against the numpy
reference (`get_op(task.op).reference`, on the float inputs widened to float64:
`wide_reference`) on the same inputs, the task's real shapes: floats by norm-wise
relative error <= `RTOL[dtype]` (the metric of `hidetc.driver.verify`), ints and bools
exactly; a mismatch is "wrong result: ...". A float error within RTOL but above the
job's `budget_rtol` (the candidate's share of the model's tolerance:
`search.numerics_budget`) drops the candidate too ("over the numerics budget: ...").
Then timing: `warmup` calls,
then up to `repeat` calls each timed alone with `time.perf_counter_ns` (monotonic);
the result is the median and the fastest run (the parent ranks by the fastest:
`hidetc.driver.tune.common`). Caches as in a model: a task whose weights are a graph
constant (the job's `prepare` template packs them) rotates copies of the packed
weights alone, enough to cover twice the last-level cache (`rotation_copies`,
`llc_bytes` from sysfs), so every call reads its weights from DRAM -- in a model the
other layers' weights have evicted them (ResNet-50's 100 MB cycle through a 32 MB L3
every inference) -- while its activations and outputs stay one warm copy, as the
neighbouring kernels leave them. Timed with everything warm, the tuner had picked
configs that ran up to 1.5x slower inside Inception-V3 than others it ranked below
them. Other tasks: when the inputs and outputs together are smaller than the L2 cache
(this host's, `target.host_caches`) the calls rotate among ROTATE_COPIES copies of them, so a call
does not find its data left hot in L1 by the previous one.
Early stopping: timing stops once the timed calls took `budget_s` (after at least
MIN_TIMED of them; a kernel whose checked call suggests that MIN_TIMED + warm-up calls
would overrun the budget gets no warm-up and may stop after one timed call), and a
candidate whose fastest of its first MIN_TIMED calls is PRUNE_FACTOR x slower than the
best fastest run so far is cut there (its median is over those calls; it cannot win).

Shared with the cuda worker (`hidetc.driver.tune.worker_cuda`): the protocol loop `serve`
(there a candidate may also raise `Fault`: it is reported as "fault: ..." and the
process exits at once, because its device is unusable), the timing loop `timed_runs`,
`make_inputs` and `mismatch`.

Inputs: seeded normal floats (bfloat16, ml_dtypes' type, counts as a float throughout:
`floating`); integers in [0, 2) (valid indices into any non-empty axis), random bools.
Parameter inputs (task.params) are passed to the reference as arrays, not to the
kernel. Assumes the task's op has a numpy reference and float or integer dtypes.
"""
from __future__ import annotations

import ctypes
import json
import os
import pickle
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np

RTOL = {"float32": 1e-4, "float64": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}
ROTATE_COPIES = 3
ROTATE_CACHE_FACTOR = 2      # rotated weight copies cover this many times the LLC
ROTATE_MAX = 256
ROTATE_BYTES = 1 << 30
LLC_FALLBACK = 32 * 1024 * 1024
MIN_TIMED = 3
PRUNE_FACTOR = 2.0


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the parent dies (no orphaned hanging kernels)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def floating(dtype) -> bool:
    """numpy's float types and bfloat16 (not a numpy floating subtype)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == ml_dtypes.bfloat16


def make_inputs(task, seed: int) -> list:
    """Every task input: arrays for buffers, arrays of the frozen values for params."""
    rng = np.random.default_rng(seed)
    arrays = []
    for t, p in zip(task.inputs, task.params):
        if t is None:
            arrays.append(None)
        elif p is not None:
            arrays.append(np.asarray(p, dtype=t.dtype).reshape(t.shape))
        elif floating(t.dtype):
            arrays.append(rng.standard_normal(t.shape).astype(t.dtype))
        elif t.dtype == "bool":
            arrays.append(rng.integers(0, 2, t.shape).astype(bool))
        else:
            arrays.append(rng.integers(0, 2, t.shape).astype(t.dtype))
    return arrays


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """Norm-wise relative error of float `got` against `ref` (the verification's metric;
    positions where both hold the same non-finite value agree)."""
    g, r = got.astype(np.float64), np.asarray(ref).reshape(got.shape).astype(np.float64)
    same = (np.isnan(g) & np.isnan(r)) | (np.isinf(r) & (g == r))
    g, r = g[~same], r[~same]
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(r))):
        return float("inf")
    denom, err = float(np.linalg.norm(r)), float(np.linalg.norm(g - r))
    return err / denom if denom > 0 else err


def mismatch(got: np.ndarray, ref: np.ndarray, budget: float | None = None) -> str | None:
    """Why `got` does not match `ref`, or None: "wrong result" past RTOL of its dtype;
    "over the numerics budget" past `budget` (the candidate's share of the model's
    tolerance, `hidetc.driver.tune.search.numerics_budget`)."""
    ref = np.asarray(ref)
    if got.shape != ref.shape and got.size != ref.size:
        return f"wrong result: shape {list(got.shape)} != {list(ref.shape)}"
    ref = ref.reshape(got.shape)
    if not floating(ref.dtype):
        bad = int(np.count_nonzero(got != ref))
        return f"wrong result: {bad} mismatches" if bad else None
    rel = rel_error(got, ref)
    if not rel <= RTOL.get(str(got.dtype), 1e-4):
        return f"wrong result: rel err {rel:.3g}"
    if budget is not None and rel > budget:
        return f"over the numerics budget: rel err {rel:.3g} > its share {budget:.3g}"
    return None


def wide_reference(task, inputs: list) -> list[np.ndarray]:
    """The op's numpy reference computed on the float inputs widened to float64 (the
    yardstick of a candidate's error: the reference's own float32 rounding is not
    charged to the candidate). Where widening changes what the op computes (a BitCast,
    a dtype-driven op) -- the wide result, rounded to the output type, differs from the
    native reference by more than RTOL -- or the reference refuses float64, the native
    reference is used."""
    from hidetc.graph.ops.registry import get_op
    op, attrs = get_op(task.op), dict(task.attrs)
    native = [np.asarray(r) for r in op.reference(inputs, attrs)]
    if not any(isinstance(a, np.ndarray) and floating(a.dtype) for a in inputs):
        return native
    wide_inputs = [a.astype(np.float64) if isinstance(a, np.ndarray) and floating(a.dtype)
                   else a for a in inputs]
    try:
        wide = [np.asarray(r) for r in op.reference(wide_inputs, attrs)]
    except Exception:                      # noqa: BLE001 -- a reference that needs its dtypes
        return native
    if len(wide) != len(native):
        return native
    out = []
    for w, n in zip(wide, native):
        if (not floating(n.dtype) or w.shape != n.shape
                or not rel_error(w.astype(n.dtype), n) <= RTOL.get(str(n.dtype), 1e-4)):
            out.append(n)
        else:
            out.append(w)
    return out


def _fill_poison(outs: list) -> None:
    for o in outs:
        if floating(o.dtype):
            o.fill(np.nan)
        elif o.dtype != np.bool_:
            o.fill(np.iinfo(o.dtype).min)


def rotation_copies(footprint: int, cache_bytes: int, most: int = ROTATE_MAX) -> int:
    """Copies to rotate among: 1 when one already exceeds ROTATE_CACHE_FACTOR x the
    cache, else enough to cover that, within `most` copies and ROTATE_BYTES."""
    footprint = max(int(footprint), 1)
    want = -(-ROTATE_CACHE_FACTOR * cache_bytes // footprint)
    return max(1, min(want, most, ROTATE_BYTES // footprint))


def llc_bytes() -> int:
    """This CPU's largest cache (sysfs), LLC_FALLBACK when it says nothing."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = f.read_text().strip().upper()
            unit = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
        except (OSError, ValueError):
            continue
    return max(sizes, default=LLC_FALLBACK)


def _pointers(arrays: list) -> ctypes.Array:
    ptrs = (ctypes.c_void_p * max(len(arrays), 1))()
    for i, a in enumerate(arrays):
        ptrs[i] = a.ctypes.data
    return ptrs


class Measurer:
    def __init__(self, job: dict, best_ms: float | None):
        from hidetc.schedules.cpu.prepack import WEIGHT_INPUT
        from hidetc.target import host_caches
        task = job["task"]
        self.job, self.best_ms = job, best_ms
        inputs = make_inputs(task, job["seed"])
        self.reference = wide_reference(task, inputs)
        buffers = [inputs[i] for i in task.buffer_inputs]
        self.out_specs = [(t.shape, t.dtype) for t in task.outputs]
        # the packed weights' position among the buffers (constant weights), else None
        self.weight = (task.buffer_inputs.index(WEIGHT_INPUT)
                       if job.get("prepare") is not None
                       and WEIGHT_INPUT in task.buffer_inputs else None)
        if self.weight is not None:   # copied per candidate, once its weights are packed
            self.copies = rotation_copies(buffers[self.weight].nbytes, llc_bytes())
            self.inputs = [buffers]
        else:
            footprint = sum(a.nbytes for a in buffers) + sum(r.nbytes for r in self.reference)
            self.copies = ROTATE_COPIES if footprint < host_caches()["l2_bytes"] else 1
            self.inputs = [buffers] + [self._rotated(buffers) for _ in range(self.copies - 1)]
        self.libs: dict[str, ctypes.CDLL] = {}
        self.packed: dict[int, list[np.ndarray]] = {}   # candidate -> its packed inputs
        self.pool: list[np.ndarray] = []                # the weight copies' memory

    def _rotated(self, buffers: list[np.ndarray]) -> list[np.ndarray]:
        """One more rotated set: a copy of the weights only, or of every buffer."""
        return [a.copy() if self.weight in (None, k) else a for k, a in enumerate(buffers)]

    def _weight_sets(self, first: list[np.ndarray]) -> list[list[np.ndarray]]:
        """`first` and copies-1 sets that differ in their weights, copied into memory
        kept from one candidate to the next (a few hundred MB of fresh pages per
        candidate cost more than the copy itself)."""
        w = first[self.weight]
        if (len(self.pool) != self.copies - 1
                or any(b.size < w.size or b.dtype != w.dtype for b in self.pool)):
            self.pool = [np.empty(w.size + w.size // 4, w.dtype)
                         for _ in range(self.copies - 1)]
        sets = [first]
        for buf in self.pool:
            view = buf[:w.size].reshape(w.shape)
            np.copyto(view, w)
            sets.append([view if k == self.weight else a for k, a in enumerate(first)])
        return sets

    def entry(self, so_path: str, symbol: str):
        lib = self.libs.get(so_path)
        if lib is None:
            lib = self.libs[so_path] = ctypes.CDLL(so_path)
        fn = getattr(lib, f"{symbol}_entry")
        fn.restype, fn.argtypes = None, [ctypes.c_void_p]
        return fn

    def candidate_inputs(self, so_path: str, symbol: str) -> list[list[np.ndarray]]:
        """The input copies as candidate (so_path, symbol) reads them: through the
        job's `prepare` template for its config when there is one (weights packed)."""
        prepare = self.job.get("prepare")
        if prepare is None:
            return self.inputs
        position = [tuple(c) for c in self.job["candidates"]].index((so_path, symbol))
        first = self.packed.get(position)
        if first is None:           # packed once per candidate (both passes)
            task = self.job["task"]
            slots = task.buffer_inputs
            full: list = [None] * len(task.inputs)
            for slot, array in zip(slots, self.inputs[0]):
                full[slot] = array
            full = prepare.prepare_inputs(task, self.job["configs"][position], full)
            first = self.packed[position] = [np.ascontiguousarray(full[slot]) for slot in slots]
        if self.weight is None:
            return [first] + [self._rotated(first) for _ in range(self.copies - 1)]
        # the rotated copies get their own memory (as the plain inputs do), not a repack
        return self._weight_sets(first)

    def measure(self, so_path: str, symbol: str
                ) -> tuple[float | None, float | None, str | None]:
        """(median ms, min ms, error) of one candidate."""
        fn = self.entry(so_path, symbol)
        inputs = self.candidate_inputs(so_path, symbol)
        sets = 1 if self.weight is not None else len(inputs)   # weights rotate alone
        outs = [[np.empty(shape, dtype) for shape, dtype in self.out_specs]
                for _ in range(sets)]
        outs = outs * (len(inputs) // sets)
        args = [_pointers(ins + o) for ins, o in zip(inputs, outs)]
        _fill_poison(outs[0])
        t0 = time.perf_counter_ns()
        fn(args[0])
        first = time.perf_counter_ns() - t0
        for k, (got, ref) in enumerate(zip(outs[0], self.reference)):
            why = mismatch(got, ref, self.job.get("budget_rtol"))
            if why is not None:
                return None, None, why.replace(": ", f": output {k}: ", 1)

        def call(i: int) -> int:
            a = args[i % len(args)]
            t0 = time.perf_counter_ns()
            fn(a)
            return time.perf_counter_ns() - t0

        times = timed_runs(call, first, self.job, self.best_ms)
        ms, fastest = statistics.median(times) / 1e6, min(times) / 1e6
        self.best_ms = fastest if self.best_ms is None else min(self.best_ms, fastest)
        return ms, fastest, None


def timed_runs(call: Callable[[int], int], first_ns: int, job: dict,
               best_ms: float | None) -> list[int]:
    """Warm-up, then the timed calls (ns each) with early stopping and pruning (see the
    module docstring). `call(i)` runs the candidate once on input copy i (mod the
    copies) and returns its time in ns; `first_ns` is the checked call's time."""
    spent, budget = 0, int(job["budget_s"] * 1e9)
    slow = first_ns * (job["warmup"] + MIN_TIMED) > budget   # seconds per call
    for i in range(0 if slow else job["warmup"]):
        call(i)
    times: list[int] = []
    min_timed = 1 if slow else MIN_TIMED
    for i in range(job["repeat"]):
        times.append(call(i))
        spent += times[-1]
        if len(times) >= min_timed:
            if spent > budget:
                break
            if (best_ms is not None and len(times) == MIN_TIMED
                    and min(times) / 1e6 > PRUNE_FACTOR * best_ms):
                break
    return times


class Fault(Exception):
    """A candidate left the process's device unusable (a kernel fault poisons a CUDA
    context): `serve` reports it as "fault: <message>", then the worker exits and the
    parent restarts one for the next candidate."""


def serve(argv: list[str], factory: Callable[[dict, float | None], Any],
          load_errors: tuple[type[BaseException], ...]) -> int:
    """The protocol loop (module docstring) over `factory(job, best_ms)`'s `measure(*c)`
    for each candidate c from START on. An exception in `load_errors` is that
    candidate's "load: ..." error; a `Fault` is reported, then the process ends at once
    (`os._exit`: no clean-up runs against a broken device)."""
    _die_with_parent()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                       # stray prints from kernels go to stderr

    def emit(**msg) -> None:
        out.write(json.dumps(msg) + "\n")
        out.flush()

    with open(argv[0], "rb") as f:
        job = pickle.load(f)
    start = int(argv[1])
    best_ms = float(argv[2]) if len(argv) > 2 and argv[2] != "-" else None
    n = len(job["candidates"])
    order = list(range(n)) + (list(reversed(range(n))) if job.get("passes", 1) > 1 else [])
    failed = {order[int(p)] for p in argv[3].split(",") if p} if len(argv) > 3 else set()
    full = job["repeat"]
    measurer = factory(job, best_ms)
    emit(ready=True)
    for k in range(start, len(order)):
        c = order[k]
        if k >= n:                      # the second pass: half the repeats
            job["repeat"] = max(1, full // 2)
            if c in failed:
                emit(result=k, time_ms=None, min_ms=None, error="skipped")
                continue
        emit(start=k)
        try:
            time_ms, min_ms, error = measurer.measure(*job["candidates"][c])
        except Fault as exc:
            emit(result=k, time_ms=None, min_ms=None, error=f"fault: {exc}")
            sys.stderr.flush()
            os._exit(0)
        except load_errors as exc:     # the module fails to load / has no such kernel
            time_ms, min_ms, error = None, None, f"load: {exc}"
        if error is not None:
            failed.add(c)
        emit(result=k, time_ms=time_ms, min_ms=min_ms, error=error)
    return 0


def main(argv: list[str]) -> int:
    return serve(argv, Measurer, (OSError, AttributeError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
