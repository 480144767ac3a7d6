"""Concurrent passes on one loaded model: execution contexts and the pool that lends them.

A loaded model (an executor) holds what every pass shares and no pass changes: the
kernels, the weights (read-only: on the cpu a read-only memory map), the manifest. What
one pass writes -- the activation arena with split-K's workspace and its arrival
counters, and on cuda the I/O buffers, the stream and its captured graph -- lives in an
*execution context*; a context serves one pass at a time. So a model is safe to call
from any number of threads: each pass in flight has a context of its own.

`ContextPool` lends contexts to the passes of `Executor.run` (callers that do not manage
contexts):
- at most `limit` contexts exist; a caller beyond waits for one to come back, which
  bounds the memory (one arena per context) whatever the number of threads (the
  executors' defaults: twice the cores on the cpu -- more passes than cores in flight
  let one pass's Python work overlap another's kernels, which pays on small models --,
  a few streams on a GPU);
- contexts are created on first use and kept for the next caller (no allocation per
  pass); a thread that comes and goes takes and returns one like any other, so none is
  tied to a thread and none leaks when a thread ends;
- a context whose pass raised is closed, not lent again: an aborted pass may leave its
  scratch mid-protocol (split-K's counters are kept zero by completed passes only);
  but for an `InputError`: inputs refused by the check that starts every pass ran no
  kernel, so the context is kept (a bad input costs no context, nor on cuda its
  captured graph);
- intra-op threads are shared out: a pass gets `max(1, cores // in_flight)` threads,
  `in_flight` counting itself and every other pass running on the model then (pooled or
  on a caller's own context), so k concurrent callers each run on cores / k threads
  instead of k teams of all cores fighting over them (`bench/concurrency.py` measures
  both; the numbers are in bench/results). `threads` set on the pool (`set_threads`)
  overrides the share for every pooled pass.

A context of the caller's own (`Executor.context(threads)`) is what a server that wants
control takes: its own scratch, a fixed intra-op thread count; it refuses to be entered
by a second thread while a pass runs on it (a one-line error, never a silent race). It
is outside the pool's `limit` (the caller holds it), but its passes count among those
in flight when the pool shares out the cores.

Assumes: an executor's `new_context(threads)` returns an object with `run(inputs)`,
a settable `threads`, `last_latency_ms` and `close()`; its passes check their inputs
before any kernel runs and raise `InputError` only from that check (or from a caller's
hook, which runs between launches, when every kernel started has completed).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, Optional

import numpy as np

from hidetc.backends.runtime.sizes import Dynamic, Pass, pass_for
from hidetc.errors import ArtifactError, InputError

CLOSED = "this model was closed; load it again to run it"


def share(cores: int, in_flight: int) -> int:
    """The intra-op threads of one pass while `in_flight` passes (itself included) run
    on `cores` cores: an even share, at least one."""
    return max(1, cores // max(in_flight, 1))


class ContextPool:
    """Lends execution contexts to concurrent passes (see the module docstring)."""

    def __init__(self, make: Callable[[int], Any], *, limit: int, cores: int):
        if limit < 1:
            raise ValueError(f"a context pool needs a limit of at least 1, got {limit}")
        self._make = make
        self.limit = limit
        self.cores = max(int(cores), 1)
        self.threads: Optional[int] = None       # set_threads: fixed, else the share
        self._cond = threading.Condition()
        self._idle: list[Any] = []
        self._created = 0        # contexts alive: idle ones and those lent out
        self._in_flight = 0      # passes running on the model (pooled or not)
        self._closed = False

    @property
    def created(self) -> int:
        """Contexts alive now (idle or lent out): never more than `limit`."""
        return self._created

    @property
    def idle(self) -> int:
        return len(self._idle)

    def offer(self, context: Any) -> None:
        """Add a context made elsewhere (the executor's first, which it set up and
        checked at load) to the idle ones."""
        with self._cond:
            self._created += 1
            self._idle.append(context)
            self._cond.notify()

    def begin(self) -> int:
        """Count one pass in flight (`end` uncounts it); the share of the cores it may
        take."""
        with self._cond:
            self._in_flight += 1
            return share(self.cores, self._in_flight)

    def end(self) -> None:
        with self._cond:
            self._in_flight -= 1

    def take(self) -> tuple[Any, int]:
        """A context for one pass and its thread count (the share, or `self.threads`);
        hand it back with `give_back`. Waits while `limit` contexts are lent out."""
        with self._cond:
            while not self._idle and self._created >= self.limit and not self._closed:
                self._cond.wait()
            if self._closed:
                raise ArtifactError(CLOSED)
            self._in_flight += 1
            threads = self.threads or share(self.cores, self._in_flight)
            if self._idle:
                return self._idle.pop(), threads
            self._created += 1
        try:
            return self._make(threads), threads
        except BaseException:
            with self._cond:
                self._created -= 1
                self._in_flight -= 1
                self._cond.notify()
            raise

    def give_back(self, context: Any, healthy: bool) -> None:
        """Return a context after its pass: kept for the next caller, or closed when the
        pass raised (or the pool was closed meanwhile)."""
        with self._cond:
            self._in_flight -= 1
            keep = healthy and not self._closed
            if keep:
                self._idle.append(context)
            else:
                self._created -= 1
            self._cond.notify()
        if not keep:
            context.close()

    def close(self) -> None:
        """Close the idle contexts; those lent out are closed when they come back."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._created -= len(idle)
            self._cond.notify_all()
        for context in idle:
            context.close()


class OwnContext:
    """A caller's own execution context (`Executor.context(threads)`): its scratch, a
    fixed intra-op thread count (None: the pool's share at each pass), one pass at a
    time. A context manager; `close()` frees its memory."""

    def __init__(self, context: Any, pool: ContextPool, threads: Optional[int]):
        self._context = context
        self._pool = pool
        self.threads = threads
        self._busy = threading.Lock()

    @property
    def last_latency_ms(self) -> float:
        return self._context.last_latency_ms

    @property
    def arena_bytes(self) -> int:
        return int(getattr(self._context, "arena_bytes", 0))

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._call("run", inputs)

    def _call(self, method: str, *args: Any) -> Any:
        if not self._busy.acquire(blocking=False):
            raise ArtifactError("this context is running a pass on another thread: a "
                                "context serves one pass at a time (take one per thread, "
                                "or call the model's run, which pools them)")
        try:
            if self._context is None:
                raise ArtifactError("this context was closed")
            threads = self._pool.begin()
            try:
                self._context.threads = self.threads or threads
                return getattr(self._context, method)(*args)
            finally:
                self._pool.end()
        finally:
            self._busy.release()

    def close(self) -> None:
        with self._busy:
            if self._context is not None:
                self._context.close()
                self._context = None

    def __enter__(self) -> "OwnContext":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Executor:
    """What every executor shares: `run` on a pooled context, `context(threads)` for a
    caller's own, `set_threads`, `pass_of(inputs)`, and `last_latency_ms` of the calling
    thread's last pass. A subclass sets `self.pool` (a `ContextPool` over its `new_context`)."""

    pool: ContextPool
    _local: threading.local
    manifest: dict
    dynamic: Optional[Dynamic]       # a dynamic artifact's sizes (`runtime.sizes`)

    def pass_of(self, inputs: Mapping[str, np.ndarray]) -> Pass:
        """The pass `inputs` make: the input and output specs at their sizes and the
        dispatch variant (`runtime.sizes.pass_for`; a one-line InputError outside the
        ranges)."""
        return pass_for(self.manifest, self.dynamic, inputs)

    def _init_pool(self, limit: int, cores: int) -> None:
        self._local = threading.local()
        self.pool = ContextPool(self.new_context, limit=limit, cores=cores)

    def new_context(self, threads: int) -> Any:
        raise NotImplementedError

    @property
    def last_latency_ms(self) -> float:
        """The latency of the calling thread's last pass (0 before its first)."""
        return getattr(self._local, "latency", 0.0)

    def set_threads(self, n: int) -> None:
        """Intra-op threads of every pooled pass from now on; n <= 0: the share again."""
        self.pool.threads = int(n) if int(n) > 0 else None

    def pooled(self, method: str, *args: Any) -> Any:
        """Call `method` of a pooled context: one pass, on a context of its own (the hot
        path of every `run`: two short critical sections, nothing allocated). The context
        goes back to the pool after the pass, or after an `InputError` (no kernel ran);
        any other exception closes it."""
        context, threads = self.pool.take()
        healthy = False
        try:
            context.threads = threads
            result = getattr(context, method)(*args)
            healthy = True
            return result
        except InputError:
            healthy = True
            raise
        finally:
            self._local.latency = context.last_latency_ms
            self.pool.give_back(context, healthy)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.pooled("run", inputs)

    def context(self, threads: Optional[int] = None) -> OwnContext:
        """A context of the caller's own (see `OwnContext`)."""
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        return OwnContext(self.new_context(int(threads or 1)), self.pool,
                          int(threads) if threads else None)

    def close(self) -> None:
        self.pool.close()
