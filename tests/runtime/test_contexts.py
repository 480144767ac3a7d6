"""The execution-context pool (`hidetc.backends.runtime.contexts`) with fake contexts:
a context serves one pass at a time, never more than `limit` exist, the intra-op
threads are shared out among the passes in flight, a pass that raises drops its
context (but for refused inputs: no kernel ran), a caller's own context refuses a second
thread, and the libgomp wait policy is set only where nobody chose one."""
from __future__ import annotations

import threading
import time

import pytest
from helpers.threads import in_threads

from hidetc.backends.runtime import wait_policy
from hidetc.backends.runtime.contexts import Executor, share
from hidetc.errors import ArtifactError, InputError


class FakeContext:
    """Records the passes on it; a pass overlapping another on the same context fails;
    inputs with "bad" are refused before the pass starts, as `check_inputs` does."""

    def __init__(self, threads: int, gate: threading.Event | None = None):
        self.threads, self.gate, self.closed = threads, gate, False
        self.busy, self.passes, self.seen_threads = False, 0, []
        self.last_latency_ms = 0.0

    def run(self, inputs):
        assert not self.busy, "two passes on one context at once"
        assert not self.closed
        if inputs.get("bad"):
            raise InputError("unknown input(s) bad (expected: x)")
        self.busy = True
        self.seen_threads.append(self.threads)
        try:
            if self.gate is not None:
                self.gate.wait(5)
            else:
                time.sleep(0.001)
            if inputs.get("fail"):
                raise RuntimeError("a pass failed")
            self.passes += 1
            self.last_latency_ms = 1.0
            return {"y": inputs.get("x")}
        finally:
            self.busy = False

    def close(self):
        self.closed = True


class FakeExecutor(Executor):
    def __init__(self, limit: int, cores: int, gate=None):
        self.made: list[FakeContext] = []
        self.gate = gate
        self._init_pool(limit, cores)

    def new_context(self, threads):
        context = FakeContext(threads, self.gate)
        self.made.append(context)
        return context


def _hammer(executor, threads: int, runs: int, errors: list) -> None:
    def work(k):
        for r in range(runs):
            assert executor.run({"x": (k, r)}) == {"y": (k, r)}
    errors += in_threads(threads, work)


@pytest.mark.parametrize("limit,cores", [(1, 1), (2, 2), (3, 16), (8, 128)])
def test_one_pass_per_context_and_at_most_limit(limit, cores):
    executor = FakeExecutor(limit, cores)
    errors: list = []
    _hammer(executor, 8, 20, errors)
    assert not errors
    assert 1 <= len(executor.made) <= limit
    assert executor.pool.created == len(executor.made) == executor.pool.idle
    assert sum(c.passes for c in executor.made) == 8 * 20
    assert executor.last_latency_ms == 0.0          # the main thread ran nothing


@pytest.mark.parametrize("cores", [1, 2, 3, 16, 64, 128])
def test_shares_split_the_cores_among_the_passes_in_flight(cores):
    assert share(cores, 1) == cores
    for in_flight in range(1, 2 * cores + 2):
        assert 1 <= share(cores, in_flight) <= cores
        assert in_flight * share(cores, in_flight) <= max(cores, in_flight)
    gate = threading.Event()
    executor = FakeExecutor(limit=4, cores=cores, gate=gate)
    workers = [threading.Thread(target=executor.run, args=({"x": k},)) for k in range(4)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 5
    while executor.pool.created < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    for w in workers:
        w.join()
    seen = sorted(t for c in executor.made for t in c.seen_threads)
    # the k-th pass to start took cores // k threads
    assert seen == sorted(share(cores, k) for k in range(1, 5))


def test_set_threads_overrides_the_share():
    executor = FakeExecutor(limit=2, cores=8)
    executor.set_threads(3)
    executor.run({"x": 1})
    executor.set_threads(0)
    executor.run({"x": 1})
    assert executor.made[0].seen_threads == [3, 8]


def test_a_failed_pass_drops_its_context_and_others_go_on():
    executor = FakeExecutor(limit=2, cores=2)
    executor.run({"x": 0})
    first = executor.made[0]
    with pytest.raises(RuntimeError, match="a pass failed"):
        executor.run({"fail": True})
    assert first.closed and executor.pool.created == 0
    errors: list = []
    _hammer(executor, 4, 10, errors)
    assert not errors and executor.pool.created <= 2
    assert not any(c.closed for c in executor.made[1:])


def test_refused_inputs_keep_the_context():
    executor = FakeExecutor(limit=2, cores=2)
    executor.run({"x": 0})
    (first,) = executor.made
    for _ in range(3):
        with pytest.raises(InputError, match="unknown input"):
            executor.run({"bad": True})
    assert executor.run({"x": 1}) == {"y": 1}
    assert executor.made == [first] and not first.closed and first.passes == 2
    assert executor.pool.created == executor.pool.idle == 1


def test_a_failing_constructor_does_not_use_up_the_limit():
    executor = FakeExecutor(limit=1, cores=1)
    calls = []

    def broken(threads):
        calls.append(threads)
        raise ArtifactError("out of memory")
    executor.pool._make = broken
    for _ in range(3):
        with pytest.raises(ArtifactError, match="out of memory"):
            executor.run({"x": 1})
    assert len(calls) == 3 and executor.pool.created == 0


def test_closed_model_refuses_runs_and_closes_returning_contexts():
    gate = threading.Event()
    executor = FakeExecutor(limit=1, cores=1, gate=gate)
    worker = threading.Thread(target=executor.run, args=({"x": 1},))
    worker.start()
    while executor.pool.created < 1:
        time.sleep(0.001)
    executor.close()
    gate.set()
    worker.join()
    assert executor.made[0].closed
    with pytest.raises(ArtifactError, match="closed"):
        executor.run({"x": 1})


def test_own_context_is_one_pass_at_a_time():
    gate = threading.Event()
    executor = FakeExecutor(limit=1, cores=4, gate=gate)
    with executor.context(threads=2) as own:
        worker = threading.Thread(target=own.run, args=({"x": 1},))
        worker.start()
        while not own._context.busy:
            time.sleep(0.001)
        with pytest.raises(ArtifactError, match="one pass at a time"):
            own.run({"x": 2})
        gate.set()
        worker.join()
        assert own.run({"x": 3}) == {"y": 3}
        assert own._context.seen_threads == [2, 2]
    assert executor.made[0].closed and executor.pool.created == 0
    with pytest.raises(ValueError, match="at least 1"):
        executor.context(threads=0)


def test_wait_policy_only_where_nobody_chose(monkeypatch):
    assert wait_policy.settings({}) == {"GOMP_SPINCOUNT": str(wait_policy.SPIN_COUNT)}
    assert wait_policy.settings({"OMP_WAIT_POLICY": "active"}) == {}
    assert wait_policy.settings({"GOMP_SPINCOUNT": "7"}) == {}
    env: dict = {}
    monkeypatch.setattr(wait_policy, "libgomp_started", lambda: True)
    assert wait_policy.apply(env) == "started" and env == {}
    monkeypatch.setattr(wait_policy, "libgomp_started", lambda: False)
    assert wait_policy.apply(env) == "hidetc" and env == wait_policy.settings({})
    assert wait_policy.apply({"GOMP_SPINCOUNT": "7"}) == "user"
