"""Measuring candidates in isolation (`hidetc.driver.tune.measure`), cpu target: a real MatMul
template measured and ranked; a fake template whose candidates fault (segfault, integer
division by zero), hang, compute wrong values or fail to build -- each dropped with
its reason in one call while the good ones are still measured; a second call is served
from the build cache (nothing compiled or linked)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hidetc.compute.task import Task
from hidetc.driver.tune.measure import CandidateResult, MeasureStats, best, measure_candidates
from hidetc.driver.tune.worker import wide_reference
from hidetc.graph.ir import TensorType
from hidetc.schedules.cpu import TEMPLATES
from hidetc.schedules.cpu.microkernel import GemmConfig
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import cast, maximum

F32 = "float32"
N = 4096


def matmul_task(m: int, k: int, n: int) -> Task:
    return Task("MatMul", (TensorType(F32, (m, k)), TensorType(F32, (k, n))),
                (TensorType(F32, (m, n)),), (), (None, None))


def test_real_matmul_template_measured_and_ranked():
    task = matmul_task(64, 96, 80)
    configs = [GemmConfig(4, 16, 64, 128, 64), GemmConfig(5, 16, 64, 384, 256),
               GemmConfig(3, 32, 64, 128, 256, pack_b=False),
               GemmConfig(6, 16, 64, 128, 64, pack_a=False)]
    stats, seen = MeasureStats(), []
    results = measure_candidates(task, TEMPLATES["MatMul"], configs, repeat=10,
                                 progress=seen.append, stats=stats)
    assert [r.config for r in results] == [repr(c) for c in configs]
    assert all(r.error is None and r.time_ms > 0 for r in results), results
    winner = best(results)
    assert winner.time_ms == min(r.time_ms for r in results)
    assert seen[-1] == len(configs) and seen == sorted(seen)
    assert stats.units == 1 and stats.worker_starts == 1     # one worker, two passes
    print(f"\nmatmul 64x96x80: build {stats.build_s:.2f}s compile {stats.compile_s:.2f}s "
          f"(cached units {stats.units_cached}) measure {stats.measure_s:.2f}s; "
          + ", ".join(f"{r.time_ms * 1e3:.1f}us" for r in results))


def test_prepacked_kernels_measured_on_packed_weights():
    """Conv and MatMul candidates that read weights packed at compile time get them
    packed per config in the worker (a wrong layout would be "wrong result")."""
    from hidetc.graph.ops.registry import get_op
    from hidetc.schedules.cpu.prepack import Prepacked
    types = [TensorType(F32, (1, 16, 9, 9)), TensorType(F32, (24, 16, 3, 3)),
             TensorType(F32, (24,))]
    attrs = {"pads": (1, 1, 1, 1)}
    out = get_op("Conv").infer(types, attrs, [None] * 3)[0]
    conv = Task("Conv", tuple(types), (out,), tuple(sorted(attrs.items())), (None,) * 3)
    configs = [GemmConfig(5, 16, 64, 96, 128), GemmConfig(8, 8, pack_a=False),
               GemmConfig(4, 24, 32, 96, 256)]
    for task, template in ((conv, Prepacked(TEMPLATES["Conv"])),
                           (matmul_task(37, 70, 53), Prepacked(TEMPLATES["MatMul"]))):
        assert template.name.endswith("+prepacked")
        results = measure_candidates(task, template, configs, repeat=3)
        assert all(r.error is None and r.time_ms > 0 for r in results), results


# ---------------------------------------------------------------- a misbehaving template


@dataclass(frozen=True)
class FakeConfig:
    kind: str      # good | good2 | segv | fpe | hang | wrong | raise


class FakeReluTemplate:
    """Relu on N floats; each config is a different way to be right or wrong."""
    name = "test.fake_relu"

    def space(self, task, target):
        return [FakeConfig(k) for k in
                ("good", "segv", "hang", "fpe", "wrong", "raise", "good2")]

    def default(self, task, target):
        return FakeConfig("good")

    def build(self, task, config, name, target):
        kind = config.kind
        if kind == "raise":
            raise RuntimeError("this config cannot be built")
        kb = KernelBuilder(name)
        x, out = kb.buffer("x", F32, (N,)), kb.buffer("out", F32, (N,))
        if kind == "hang":   # ~4.6e18 dependent float adds: never ends
            with kb.for_range(2**31 - 1, name="a"):
                with kb.for_range(2**31 - 1, name="b"):
                    kb.store(out, (0,), out[0] + 1.0)
            return kb.finish()
        with kb.for_range(N, kind="parallel" if kind == "good2" else "serial") as i:
            if kind == "segv":      # 8 GiB past a 16 KiB buffer
                kb.store(out, (i + (2**31 - 1 - N),), x[i])
            elif kind == "fpe":     # an integer division by a zero gcc cannot see
                zero = cast(x[0] * 0.0, "int32")
                kb.store(out, (i,), cast(i // zero, F32))
            elif kind == "wrong":
                kb.store(out, (i,), maximum(x[i], 0.0) + 1e-2)
            else:
                kb.store(out, (i,), maximum(x[i], 0.0))
        return kb.finish()


def relu_task() -> Task:
    return Task("Relu", (TensorType(F32, (N,)),), (TensorType(F32, (N,)),), (), (None,))


def test_bad_candidates_are_dropped_with_reasons(tmp_path, monkeypatch):
    monkeypatch.setenv("HIDETC_CACHE_DIR", str(tmp_path / "cache"))
    template, task = FakeReluTemplate(), relu_task()
    configs = template.space(task, None)
    stats = MeasureStats()
    results = measure_candidates(task, template, configs, repeat=5, timeout_s=2.0,
                                 stats=stats)
    by_kind = {c.kind: r for c, r in zip(configs, results)}
    assert [r.config for r in results] == [repr(c) for c in configs]
    for kind in ("good", "good2"):
        assert by_kind[kind].error is None and by_kind[kind].time_ms > 0, by_kind[kind]
    assert by_kind["segv"].error.startswith("fault: signal 11"), by_kind["segv"]
    assert by_kind["fpe"].error.startswith("fault: signal 8"), by_kind["fpe"]
    assert by_kind["hang"].error == "timeout after 2s"
    assert by_kind["wrong"].error.startswith("wrong result: output 0: rel err")
    assert by_kind["raise"].error == "build: RuntimeError: this config cannot be built"
    assert all(r.time_ms is None for k, r in by_kind.items() if k not in ("good", "good2"))
    assert best(results) in (by_kind["good"], by_kind["good2"])
    # the first worker and one after each fault or timeout; the second pass skips them
    assert stats.units == 1 and stats.units_cached == 0 and stats.worker_starts == 4

    again = MeasureStats()
    results2 = measure_candidates(task, template, configs, repeat=5, timeout_s=2.0,
                                  stats=again)
    assert again.units == 1 and again.units_cached == 1 and again.units_split == 0
    assert again.compile_s < stats.compile_s
    assert [r.error for r in results2] == [r.error for r in results]


def test_failing_compile_drops_only_that_candidate(tmp_path, monkeypatch):
    """A kernel gcc rejects (here: its C gets an `#error`, marked by the constant the
    "wrong" kernel adds) makes its unit fail; the unit is retried kernel by kernel."""
    import hidetc.driver.tune.measure as measure

    monkeypatch.setenv("HIDETC_CACHE_DIR", str(tmp_path / "cache"))
    plain = measure._unit_source

    def poisoned(fns):
        text = plain(fns)
        return text + ("#error rejected by the test\n" if "0.01f" in text else "")

    monkeypatch.setattr(measure, "_unit_source", poisoned)
    configs = [FakeConfig("good"), FakeConfig("wrong"), FakeConfig("good2")]
    stats = MeasureStats()
    results = measure_candidates(relu_task(), FakeReluTemplate(), configs, repeat=3,
                                 stats=stats)
    assert results[0].error is None and results[2].error is None, results
    assert results[1].error.startswith("compile: gcc compiling"), results[1]
    assert "rejected by the test" in results[1].error
    assert stats.units == 1 and stats.units_split == 1


def test_no_winner_among_failures():
    assert best([CandidateResult("a", None, "x")]) is None


def test_worker_rotates_copies_of_constant_weights_alone():
    """Constant weights are timed cold, as in a model: each call reads another copy of
    them (copies covering twice the last-level cache); the activations stay one copy.
    Other tasks small enough for L2 rotate copies of every input."""
    import numpy as np

    from hidetc.driver.tune.worker import Measurer, rotation_copies
    from hidetc.schedules.cpu.prepack import Prepacked
    assert rotation_copies(1 << 20, 32 << 20) == 64
    assert rotation_copies(100 << 20, 32 << 20) == 1
    assert rotation_copies(4, 32 << 20, most=8) == 8
    task = matmul_task(37, 70, 53)
    cold = Measurer({"task": task, "seed": 0, "prepare": Prepacked(TEMPLATES["MatMul"])},
                    None)
    assert cold.copies > 8
    a0, b0 = cold.inputs[0]
    a1, b1 = cold._rotated(cold.inputs[0])
    assert a1 is a0 and b1 is not b0 and np.array_equal(b1, b0)
    plain = Measurer({"task": task, "seed": 0}, None)
    assert plain.copies == len(plain.inputs) > 1
    assert all(x is not y for x, y in zip(plain.inputs[0], plain.inputs[1]))


def test_second_pass_undoes_a_stall_and_drops_a_flaky_candidate(monkeypatch):
    """The cpu measurer's rematch (hidetc.driver.tune.common._rematch), with a stand-in worker
    (tests/helpers/stall_worker.py): the fastest candidate, stalled through its whole
    first pass, still wins; one that fails only in the second pass is dropped."""
    from pathlib import Path

    from helpers.stall_worker import FULL_REPEAT

    from hidetc.driver.tune.common import measure_built

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    configs = ["stalled", "plain", "flaky", "slow"]
    job = {"candidates": [(1.0, "stalled"), (1.2, "plain"), (1.1, "flaky"), (5.0, "plain")],
           "repeat": FULL_REPEAT}
    stats = MeasureStats()
    kw = dict(module="helpers.stall_worker", timeout_s=30.0, progress=None)
    once = measure_built(configs, {}, [0, 1, 2, 3], job=job, stats=MeasureStats(), **kw)
    assert [r.time_ms for r in once] == [8.0, 1.2, 1.1, 5.0]
    assert best(once).config == repr("flaky")
    results = measure_built(configs, {}, [0, 1, 2, 3], job=job, stats=stats, rematch=True,
                            **kw)
    assert [r.time_ms for r in results] == [1.0, 1.2, None, 5.0]
    assert results[2].error.startswith("wrong result")
    assert best(results).config == repr("stalled")
    assert stats.worker_starts == 1


def test_workers_run_numpy_blas_on_one_thread(monkeypatch):
    """OpenBLAS's spinning threads took the cores from the kernels' OpenMP threads:
    the workers get OPENBLAS_NUM_THREADS=1 whatever the caller's environment says."""
    from pathlib import Path

    from helpers.stall_worker import FULL_REPEAT

    from hidetc.driver.tune.common import measure_built

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "8")
    job = {"candidates": [(1.0, "blas")], "repeat": FULL_REPEAT}
    results = measure_built(["blas"], {}, [0], job=job, stats=MeasureStats(),
                            module="helpers.stall_worker", timeout_s=30.0, progress=None)
    assert results[0].time_ms == 1.0


def test_candidates_over_their_numerics_budget_are_dropped():
    """The worker measures each candidate's error against the op's reference in float64
    (`wide_reference`); one within the dtype's RTOL but over the job's budget is dropped
    as "over the numerics budget", naming its error and share; without a budget the
    same candidates pass."""
    task = matmul_task(32, 512, 48)
    configs = [GemmConfig(4, 16, 64, 128, 64), GemmConfig(5, 16, 64, 384, 256)]
    fine = measure_candidates(task, TEMPLATES["MatMul"], configs, repeat=2)
    assert all(r.error is None for r in fine), fine
    tight = measure_candidates(task, TEMPLATES["MatMul"], configs, repeat=2,
                               budget_rtol=1e-12)
    assert all(r.error is not None and r.error.startswith(
        "over the numerics budget: output 0: rel err ") and "> its share 1e-12" in r.error
        for r in tight), tight


def test_the_yardstick_is_float64_unless_that_changes_the_op():
    """A float MatMul's reference is computed in float64; a BitCast's (whose meaning
    depends on its input type) stays the native one."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 300)).astype(np.float32), \
        rng.standard_normal((300, 5)).astype(np.float32)
    (ref,) = wide_reference(matmul_task(8, 300, 5), [a, b])
    assert ref.dtype == np.float64
    np.testing.assert_allclose(ref, a.astype(np.float64) @ b, rtol=1e-12)
    bits = np.arange(-3, 3, dtype=np.int32)
    cast = Task("BitCast", (TensorType("int32", (6,)),), (TensorType(F32, (6,)),),
                (("to", F32),), (None,))
    (same,) = wide_reference(cast, [bits])
    np.testing.assert_array_equal(same.view(np.int32), bits)
    f = rng.standard_normal(6).astype(np.float32)
    back = Task("BitCast", (TensorType(F32, (6,)),), (TensorType("int32", (6,)),),
                (("to", "int32"),), (None,))
    (raw,) = wide_reference(back, [f])
    np.testing.assert_array_equal(raw, f.view(np.int32))
