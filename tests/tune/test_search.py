"""The search over a graph's anchors: distinct tasks, space levels, records reused,
cross-compiles from imported records, all-failed tasks keeping the default. The
measurement is a stand-in here (tests/tune/test_measure.py covers the real one)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

from helpers import targets
from helpers.fusion_graphs import graph_of, resnet_block
from helpers.tasks import nhwc_task

from hidetc.driver.context import CompileContext
from hidetc.driver.tune.records import CandidateResult, RecordStore
from hidetc.driver.tune.search import (
    BUDGET_FLOOR,
    SHORT_LIST,
    UNIT_ROUNDOFF,
    candidates,
    numerics_budget,
    space_digest,
)
from hidetc.driver.tune.search import tune as tune_selection
from hidetc.schedules.cpu import TEMPLATES

DEVICE, ARCH, TOOLS = "cpu:test", "x86-64-avx2", "gcc test"


class FakeMeasure:
    """Times each config by its repr's length (deterministic); `fail` configs error."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = [], fail

    def __call__(self, task, template, configs, *, target, progress=None):
        self.calls.append((task, len(configs)))
        if progress:
            progress(len(configs))
        if self.fail:
            return [CandidateResult(repr(c), None, "fault: signal 11") for c in configs]
        return [CandidateResult(repr(c), float(len(repr(c)) % 7 + 1), None) for c in configs]


def selection(graph):
    return CompileContext.for_machine(targets.CPU).select(graph)


def anchor_tasks(graph):
    """(task, template) of the selection's distinct templated tasks."""
    return [(task, template) for task, template, _ in selection(graph).templated()]


def tune(graph, store, measure, **kw):
    options = dict(tune=True, level=1, arch=ARCH, records=store, device=DEVICE,
                   toolchain=TOOLS, measure=measure)
    options.update(kw)
    ctx = CompileContext.for_machine(targets.CPU)
    return tune_selection(ctx.select(graph), ctx.backend, targets.CPU, **options)


def test_distinct_anchor_tasks_and_levels():
    graph = graph_of(resnet_block())
    work = anchor_tasks(graph)
    assert [t.op for t, _ in work] == ["Conv", "MatMul"]   # the two convs are equal tasks
    task, template = work[0]
    # constant weights: tuned as the plan runs them, packed at compile time
    assert [t.name for _, t in work] == ["cpu.conv+prepacked", "cpu.matmul+prepacked"]
    target = targets.CPU
    default = template.default(task, target)
    assert candidates(template, task, target, 0) == [default]
    short = candidates(template, task, target, 1)
    assert short[0] == default and len(short) == SHORT_LIST and len(set(short)) == SHORT_LIST
    whole = candidates(template, task, target, 2)
    assert whole[0] == default and set(whole) >= set(template.space(task, target))


def test_tuned_once_then_reused(tmp_path):
    graph = graph_of(resnet_block())
    with RecordStore(tmp_path / "records.sqlite") as store:
        measure = FakeMeasure()
        choices, summary = tune(graph, store, measure)
        assert summary.tuned == 2 and summary.candidates == 2 * SHORT_LIST
        assert all(c.source == "tuned" for c in choices.values())
        for (task, n), choice in zip(measure.calls, choices.values()):
            results = [CandidateResult(repr(c), float(len(repr(c)) % 7 + 1), None)
                       for c in candidates(choice.template, task, targets.CPU, 1)]
            assert choice.time_ms == min(r.time_ms for r in results)
        again = FakeMeasure()
        choices2, summary2 = tune(graph, store, again)
        assert again.calls == [] and summary2.from_records == 2
        assert {t: c.config for t, c in choices2.items()} == \
            {t: c.config for t, c in choices.items()}


def test_a_changed_space_is_tuned_again(tmp_path, monkeypatch):
    """Records hold the winner among the candidates measured then: once a template's
    short list (or space, or default) changes, the task is measured again."""
    graph = graph_of(resnet_block())
    with RecordStore(tmp_path / "records.sqlite") as store:
        tune(graph, store, FakeMeasure())
        conv = TEMPLATES["Conv"]
        old = conv.short_list
        monkeypatch.setattr(type(conv), "short_list",
                            lambda self, task, target: tuple(reversed(old(task, target))))
        again = FakeMeasure()
        _, summary = tune(graph, store, again)
        assert [t.op for t, _ in again.calls] == ["Conv"]     # the MatMul's space is as before
        assert summary.from_records == 1 and summary.tuned == 1


def test_cross_compile_uses_imported_winners(tmp_path):
    graph = graph_of(resnet_block())
    with RecordStore(tmp_path / "gpu.sqlite") as store:
        choices, _ = tune(graph, store, FakeMeasure(), device="gpu-machine", toolchain="nvcc A")
        store.export(tmp_path / "winners.jsonl")
    with RecordStore(tmp_path / "ci.sqlite") as store:
        store.import_file(tmp_path / "winners.jsonl")
        off = FakeMeasure()
        cross, summary = tune(graph, store, off, tune=False, device="none", toolchain="nvcc B")
        assert off.calls == [] and summary.from_records == 2
        assert all(c.source == "imported" for c in cross.values())
        assert {t: c.config for t, c in cross.items()} == {t: c.config for t, c in choices.items()}


def test_no_tuning_and_no_records_gives_defaults(tmp_path):
    graph = graph_of(resnet_block())
    with RecordStore(tmp_path / "r.sqlite") as store:
        choices, summary = tune(graph, store, FakeMeasure(), tune=False)
    target = targets.CPU
    assert all(c.source == "default" and c.config == c.template.default(t, target)
               for t, c in choices.items())
    assert summary.tuned == 0


def test_all_candidates_failing_keeps_the_default(tmp_path):
    graph = graph_of(resnet_block())
    with RecordStore(tmp_path / "r.sqlite") as store:
        choices, summary = tune(graph, store, FakeMeasure(fail=True), level=0)
        assert summary.failures == 2 and len(summary.failed) == 2
        assert all(c.source == "default (all failed)" for c in choices.values())
        task = next(iter(choices))
        assert store.candidates(next(k for k in [_key(task, choices[task])]))[0].error
    assert "fault" in summary.failed[0]["error"]


def _key(task, choice):
    from hidetc.driver.tune.keys import key_for
    from hidetc.driver.tune.search import space_digest
    return key_for(task, choice.template.name, DEVICE, ARCH, TOOLS,
                   space_digest(choice.template, task, targets.CPU))


def test_candidates_measure_each_distinct_kernel_once():
    """A channels-last conv with few output channels: many configs clamp to the same
    kernel (`kernel_key`); every level measures distinct kernels, the whole space
    covers every kernel of it, the short list is SHORT_LIST distinct kernels."""
    task = nhwc_task((1, 40, 7, 7), (24, 40, 1, 1), True)
    template, target = TEMPLATES["ConvNHWC"], targets.CPU

    def key(cfg):
        return template.kernel_key(task, cfg, target)
    whole = candidates(template, task, target, 2)
    assert len({key(c) for c in whole}) == len(whole)
    assert {key(c) for c in whole} == {key(c) for c in template.space(task, target)}
    assert len(whole) < len(template.space(task, target))
    short = candidates(template, task, target, 1)
    assert short[0] == template.default(task, target)
    assert len({key(c) for c in short}) == len(short) == min(SHORT_LIST, len(whole))


def test_the_numerics_budget_shares_the_tolerance():
    """A kernel's share falls as 1/sqrt(kernels), never under a few unit roundoffs of
    its output type, and there is none for integer outputs or without a tolerance; the
    summary records the float32 share, and candidates dropped for it are counted."""
    graph = graph_of(resnet_block())
    task = next(t for t, _ in anchor_tasks(graph))
    shares = [numerics_budget(1e-4, task, n) for n in (1, 4, 100, 10 ** 6)]
    assert shares[0] == 5e-5 and shares[1] == 2.5e-5 and shares[2] == 5e-6
    assert shares[3] == BUDGET_FLOOR * UNIT_ROUNDOFF["float32"]
    assert numerics_budget(None, task, 10) is None

    class OverBudget(FakeMeasure):
        def __call__(self, task, template, configs, *, target, progress=None):
            return [CandidateResult(repr(c), None, "over the numerics budget: output 0: "
                                    "rel err 1e-05 > its share 5e-06") for c in configs]

    with RecordStore(":memory:") as store:
        choices, summary = tune(graph, store, OverBudget(), level=0, tolerance=1e-4)
    assert summary.over_budget == summary.failures > 0
    kernels = summary.as_dict()["numerics_budget"]
    assert 0 < kernels < 5e-5
    assert all(c.source == "default (all failed)" for c in choices.values())


def test_a_range_digest_names_the_configs_as_they_build_over_the_range():
    """A template whose configs change over a range (split-K made unsplit: `over_range`)
    digests a range compile's candidates as they build there, so its records never mix
    with the static task's; a template whose configs hold at every size shares them."""
    @dataclass(frozen=True)
    class Cfg:
        tile: int
        splits: int = 1

    class Plain:
        name = "plain"

        def default(self, task, target):
            return Cfg(64)

        def space(self, task, target):
            return [Cfg(64), Cfg(32, 4), Cfg(128, 2)]

    class Splitting(Plain):
        def over_range(self, task, config):
            return replace(config, splits=1)

    static, over = SimpleNamespace(symbolic=False), SimpleNamespace(symbolic=True)
    assert space_digest(Plain(), static, None, over) == space_digest(Plain(), static, None)
    assert space_digest(Splitting(), static, None, over) != \
        space_digest(Splitting(), static, None)
    assert space_digest(Splitting(), static, None, static) == \
        space_digest(Splitting(), static, None)
