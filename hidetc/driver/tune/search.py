"""The search: pick a config for every distinct templated task of a selection.

Which tasks: the selection's (`hidetc.driver.select.Selection.templated`: the anchors
of the fusion groups that have a schedule template, in the form the plan runs them),
each distinct task once (ResNet-50 has far fewer distinct convolutions than
convolutions); the fused neighbours never take part (tune once, fuse many).

Per task, in order:
1. the records: a winner measured before for the same template, task, device,
   architecture, toolchain, hidetc version and candidate space (`RecordStore.winner`;
   `space_digest`: the template's default, space and short list for the task, so a
   release that changes a space or a short list re-tunes instead of reusing winners
   picked from the old candidates), or, when tuning
   is off or no device is here (a cross-compile), a winner for the same template, task
   and architecture from any device (`RecordStore.find_winner`: records exported from a
   GPU machine and imported here). A stored config the space no longer has is ignored.
2. tuning (when on): the candidates of the space level -- 0: the template's default;
   1: a short list (the default, the template's `short_list` if it has one, then a
   seeded sample, SHORT_LIST in all); 2: the whole
   hardware-centric space -- measured in isolation (`hidetc.driver.tune.measure`), every
   result and the winner saved to the records. A candidate whose error against the
   float64 reference passes its share of the model's tolerance (`numerics_budget`) is
   dropped like a wrong one. A task whose candidates all fail keeps the default (and
   says so).
3. otherwise the template's default.

`tune` returns {task: Choice} for the plan (`hidetc.driver.plan.plan`) and a
`TuneSummary`.
"""
from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

from hidetc.compute.task import Task
from hidetc.driver.select import Selection
from hidetc.driver.tune.keys import key_for
from hidetc.driver.tune.measure import best, measure_candidates, prebuild
from hidetc.driver.tune.records import CandidateResult, RecordStore, resolve_config
from hidetc.schedules.template import config_over_range
from hidetc.target import Target

SHORT_LIST = 8
KEEP_SLACK = 0.03     # a range compile keeps an earlier variant's config within 3% of the best


@dataclass(frozen=True)
class Choice:
    template: Any
    config: Any
    source: str           # "default" | "records" | "imported" | "tuned" | "default (all failed)"
    time_ms: Optional[float] = None
    key: Any = None       # the records key it was looked up or tuned under (RecordKey)


@dataclass(frozen=True)
class _Pending:
    """A task to measure: its template, its records key and its candidates; `owner`,
    the selection's task the choice is for (itself, or the symbolic task it is the
    hint-size instance of)."""
    task: Task
    template: Any
    key: Any
    configs: list
    owner: Optional[Task] = None
    kept: tuple = ()           # configs earlier dispatch variants chose (`shared`)

    def __post_init__(self):
        if self.owner is None:
            self.owner = self.task


@dataclass
class TuneSummary:
    tasks: int = 0
    from_records: int = 0
    tuned: int = 0
    candidates: int = 0
    failures: int = 0
    seconds: float = 0.0
    failed: list[dict] = field(default_factory=list)   # {"task", "config", "error"}
    budget: Optional[float] = None     # a float32 kernel's share of the tolerance
    over_budget: int = 0               # candidates dropped for it

    def as_dict(self) -> dict:
        return {"tasks": self.tasks, "from_records": self.from_records, "tuned": self.tuned,
                "candidates": self.candidates, "failures": self.failures,
                "numerics_budget": self.budget, "over_budget": self.over_budget,
                "seconds": round(self.seconds, 2), "failed": self.failed[:20]}

    def line(self) -> str:
        return (f"tuning: {self.tasks} anchor signatures ({self.from_records} from records, "
                f"{self.tuned} tuned), {self.candidates} candidates measured, "
                f"{self.failures} dropped, {self.seconds:.1f}s")


def candidates(template, task: Task, target: Target, level: int) -> list:
    """The configs a space level measures (the default first). Configs that build the
    same kernel as an earlier one (the template's `kernel_key`, where it has one: a
    tile clamped to a small problem) are measured once, so a short list is SHORT_LIST
    distinct kernels."""
    default = template.default(task, target)
    if level <= 0:
        return [default]
    same = _kernel_key(template, task, target)
    first_of = {same(default): default}
    for c in template.space(task, target):
        first_of.setdefault(same(c), c)
    space = [c for c in first_of.values() if c != default]
    if level == 1:
        pick = getattr(template, "short_list", None)
        first = [first_of[same(c)] for c in (pick(task, target) if pick else ())
                 if same(c) in first_of]
        first = [c for c in dict.fromkeys(first) if c != default][:SHORT_LIST - 1]
        rest = [c for c in space if c not in first]
        fill = random.Random(0).sample(rest, min(SHORT_LIST - 1 - len(first), len(rest)))
        space = first + fill
    return [default] + space


def space_digest(template, task: Task, target: Target, over: Optional[Task] = None) -> str:
    """A digest of what tuning `task` with `template` chooses from: its default, its
    whole space and its short list (configs print their every field) -- with `over` (the
    task `task` is the hint of; itself for a static one), each config as it builds over
    its ranges (`config_over_range`), so a range compile whose candidates differ from the
    static task's (split-K unsplit) keeps its records under another key, and one whose
    candidates are the same shares them."""
    pick = getattr(template, "short_list", None)

    def fit(configs):
        return tuple(config_over_range(template, over, c) if over is not None else c
                     for c in configs)
    what = (fit([template.default(task, target)])[0], fit(template.space(task, target)),
            fit(pick(task, target)) if pick else ())
    return hashlib.sha256(repr(what).encode()).hexdigest()[:10]


def _kernel_key(template, task: Task, target: Target) -> Callable[[Any], Any]:
    key = getattr(template, "kernel_key", None)
    if key is None:
        return lambda config: config
    return lambda config: key(task, config, target)


# unit roundoff per float type: a share below a few of them is below what an exact
# kernel's own output rounding costs, so the share never goes under BUDGET_FLOOR of them
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8,
                 "float64": 2.0 ** -53}
BUDGET_FLOOR = 4


def numerics_budget(tolerance: Optional[float], task: Task, kernels: int) -> Optional[float]:
    """A kernel's share of the model's tolerance: the most norm-wise relative error (vs
    the op's reference in float64, on the task's real shapes) a candidate may have and
    still be chosen. The model's error is taken as the kernels' errors adding in
    quadrature (independent roundings), and half the tolerance is left for their growth
    through the layers: tolerance / (2 sqrt(kernels)), at least BUDGET_FLOOR unit
    roundoffs of the task's output type. None (no budget) without a tolerance or for
    non-float outputs. Documented beside the tolerances (`hidetc.driver.config`)."""
    return _share(tolerance, task.outputs[0].dtype if task.outputs else None, kernels)


def _share(tolerance: Optional[float], dtype: Optional[str], kernels: int) -> Optional[float]:
    if tolerance is None or dtype not in UNIT_ROUNDOFF:
        return None
    return max(tolerance / (2.0 * max(kernels, 1) ** 0.5), BUDGET_FLOOR * UNIT_ROUNDOFF[dtype])


class LocalMeasurer:
    """Candidates built and timed on this machine with the target backend's measurer
    (`backend.measure`, `backend.prebuild`: `hidetc.driver.tune.measure` and
    `measure_cuda`): what tuning uses unless a caller (a test) passes another
    `measure(task, template, configs, *, target, progress)`. `prebuild` compiles every
    task's candidates ahead, in parallel. `budget(task)`: the task's numerics budget
    (`numerics_budget`), None for none."""

    def __init__(self, backend, arch: str,
                 budget: Callable[[Task], Optional[float]] | None = None):
        self.backend = backend
        self.arch = arch
        self.budget = budget

    def prebuild(self, work: list, *, target: Target) -> None:
        prebuild(work, target=target, builder=self.backend.prebuild, arch=self.arch)

    def __call__(self, task: Task, template, configs: list, *, target: Target,
                 progress: Callable[[int], None] | None = None) -> list:
        return measure_candidates(task, template, configs, target=target,
                                  measurer=self.backend.measure, progress=progress,
                                  arch=self.arch,
                                  budget_rtol=self.budget(task) if self.budget else None)


def tune(selection: Selection, backend, limits: Target, *, tune: bool, level: int, arch: str,
         records: RecordStore, device: str, toolchain: str,
         progress: Callable[[str, int, int], None] | None = None,
         measure: Callable | None = None, tolerance: Optional[float] = None,
         shared: Optional[dict] = None) -> tuple[dict[Task, Choice], TuneSummary]:
    """{task: Choice} for every templated task of `selection` (see the module
    docstring). `progress(label, done, total)` is called as candidates finish. `limits`:
    the Target the kernels are built for; `arch` keys the records (the facts of the
    target that change the choice). `measure` times candidates (default
    `LocalMeasurer(backend, arch)`; its `prebuild`, where it has one, runs first over
    every pending task). `shared` (a range compile's, across its dispatch variants): per
    (template, symbolic task signature), the configs earlier variants chose; a symbolic
    task measures them too, beside its size's candidates (a size's space is pruned by
    the size; the neighbouring interval's winner, valid at every size, may beat it)."""
    clock = time.perf_counter()
    summary = TuneSummary()
    choices: dict[Task, Choice] = {}
    work = selection.templated()
    summary.tasks = len(work)
    # the launches the budget is shared over (only counted when candidates are measured)
    kernels = len(selection.items) if tune and tolerance is not None else 0
    summary.budget = _share(tolerance, "float32", kernels) if kernels else None
    measure = measure if measure is not None else LocalMeasurer(
        backend, arch, lambda task: numerics_budget(tolerance, task, kernels))
    pending: list[_Pending] = []
    for task, template, default in work:
        # a task with symbolic sizes is tuned (and its records kept) at the build's hint
        # sizes, the static task there: its configs are valid at every size
        static = task.hinted()
        key = key_for(static, template.name, device, arch, toolchain,
                      space_digest(template, static, limits, task))
        extra = shared.get((template.name, task.signature()), []) \
            if shared is not None and task.symbolic else []
        choice = _from_records(records, key, template, static, limits, exact=tune,
                               extra=extra)
        if choice is not None:
            choices[task] = replace(choice, key=key, config=config_over_range(
                template, task, choice.config))
            summary.from_records += 1
        elif tune:
            # what builds over the task's ranges (split-K unsplit where the range leaves
            # the tile count open), each once
            configs = list(dict.fromkeys(config_over_range(template, task, c) for c in
                                         [*candidates(template, static, limits, level),
                                          *extra]))
            pending.append(_Pending(static, template, key, configs, task, tuple(extra)))
        else:
            choices[task] = Choice(template, default, "default", key=key)
    total = sum(len(p.configs) for p in pending)
    farm = getattr(measure, "measure_all", None)
    measured = _measure_farm(measure, pending, records, limits, kernels, tolerance,
                             progress) if farm is not None and pending else None
    ahead = getattr(measure, "prebuild", None)
    if ahead is not None and pending and measured is None:
        if progress:
            progress("building candidates", 0, total)
        ahead([(p.task, p.template, p.configs) for p in pending], target=limits)
    done = 0
    for n, p in enumerate(pending):
        task, template, configs = p.task, p.template, p.configs
        label = f"{template.name} {n + 1}/{len(pending)}"

        def step(k: int, base=done, label=label) -> None:
            if progress:
                progress(label, base + k, total)

        results = measured[n] if measured is not None else \
            measure(task, template, configs, target=limits, progress=step)
        done += len(configs)
        summary.tuned += 1
        summary.candidates += len(results)
        failed = [r for r in results if r.error]
        summary.failures += len(failed)
        summary.over_budget += sum(r.error.startswith("over the numerics budget")
                                   for r in failed)
        summary.failed += [{"task": task.signature(), "config": r.config, "error": r.error}
                           for r in failed]
        winner = best(results)
        records.save(p.key, results, winner.config if winner else None)
        if winner is None:
            choices[p.owner] = Choice(template, configs[0], "default (all failed)", key=p.key)
        else:   # one result per config, in order (the measurer's contract)
            winner = _prefer_kept(results, winner, p.kept)
            config = configs[results.index(winner)]
            choices[p.owner] = Choice(template, config, "tuned", winner.time_ms, p.key)
    if shared is not None:
        for task, choice in choices.items():
            if task.symbolic:
                kept = shared.setdefault((choice.template.name, task.signature()), [])
                if repr(choice.config) not in {repr(c) for c in kept}:
                    kept.append(choice.config)
    summary.seconds = time.perf_counter() - clock
    return choices, summary


@dataclass(frozen=True)
class MeasureJob:
    """One task's candidates for a farm (a measurer with `measure_all`): the configs
    still to measure, the records key they are committed under, the numerics budget
    (`numerics_budget`; None: none) and a label for progress."""
    task: Task
    template: Any
    configs: list
    key: Any
    budget: Optional[float]
    label: str


def _measure_farm(farm, pending: list[_Pending], records: RecordStore, limits: Target,
                  kernels: int, tolerance: Optional[float],
                  progress: Callable[[str, int, int], None] | None) -> list[list]:
    """Every pending task's results through `farm.measure_all(jobs, target=, commit=,
    progress=)`, which may measure any jobs' candidates anywhere and in any order, and
    calls `commit(job index, results)` as results land: each is committed to the records
    at once (the key's candidates so far, no winner yet), so a run stopped midway keeps
    them, and a later run with the same records measures only the candidates a key has
    no result for. One result per config, in order (a config the farm gave none is
    an error result)."""
    have: list[dict[str, Any]] = []
    jobs = []
    for n, p in enumerate(pending):
        done = {r.config: r for r in records.candidates(p.key)}    # a stopped run's part
        have.append(done)
        jobs.append(MeasureJob(p.task, p.template, [c for c in p.configs if repr(c) not in done],
                               p.key, numerics_budget(tolerance, p.task, kernels),
                               f"{p.template.name} {n + 1}/{len(pending)}"))

    def ordered(n: int) -> list:
        return [have[n][repr(c)] for c in pending[n].configs if repr(c) in have[n]]

    def commit(n: int, results: Sequence) -> None:
        have[n].update({r.config: r for r in results})
        records.save(pending[n].key, ordered(n), None)

    farm.measure_all(jobs, target=limits, commit=commit, progress=progress)
    return [[have[n].get(repr(c)) or CandidateResult(repr(c), error="farm: not measured")
             for c in p.configs] for n, p in enumerate(pending)]


def _from_records(records: RecordStore, key, template, task: Task, limits: Target,
                  exact: bool, extra: Sequence = ()) -> Choice | None:
    stored = records.winner(key)
    source = "records"
    if stored is None and not exact:
        stored = records.find_winner(key)
        source = "imported"
    if stored is None:
        return None
    if extra:
        results = records.candidates(key)
        best_stored = next((r for r in results if r.config == stored), None)
        if best_stored is not None:
            stored = _prefer_kept(results, best_stored, tuple(extra)).config
    config = resolve_config(template, task, limits, stored) or next(
        (c for c in extra if repr(c) == stored), None)     # (another variant's winner)
    return Choice(template, config, source) if config is not None else None


def _prefer_kept(results: Sequence, winner, kept: tuple):
    """`winner`, or the fastest result of a config in `kept` (an earlier dispatch
    variant's choice) when it is within KEEP_SLACK of it: the same config in two
    variants is one kernel and one packed copy of its weights (a prepacked weight
    otherwise stored once per packing), for a loss the dispatch table reports."""
    names = {repr(c) for c in kept}
    near = [r for r in results if r.config in names and r.error is None
            and r.time_ms is not None and r.time_ms <= winner.time_ms * (1 + KEEP_SLACK)]
    return min(near, key=lambda r: r.time_ms) if near else winner


def measure_missing(records: RecordStore, key, task: Task, template, configs: Sequence,
                    measure: Callable, limits: Target) -> int:
    """Measure those of `configs` (of `template`, for the static `task`) that `key`'s
    records have no result for, and add them to its candidates, the winner kept (what a
    build already runs); the count measured. What a range compile's dispatch table
    (`driver.dispatch_report`) measures so that every config of the table has a time at
    every tuning size."""
    have = records.candidates(key)
    known = {c.config for c in have}
    missing = [c for c in dict.fromkeys(configs) if repr(c) not in known]
    if not missing:
        return 0
    results = measure(task, template, missing, target=limits)
    records.save(key, [*have, *results], records.winner(key))
    return len(missing)
