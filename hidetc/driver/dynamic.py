"""A compile for ranges of sizes: the dispatch variants that cover them, and the sizes
the artifact is verified at.

A graph with symbolic sizes (`hidetc.graph.symbolic`) is planned like a static one,
inside `assume(ranges)` (what holds over the ranges is decided once) and
`guarded(hint)`: the passes, the selection and the templates plan their heuristics at
the hint sizes, the kernels take the sizes at run time, and every decision the ranges
leave open and that changes the code is recorded as a guard. Such a build -- a
*variant* -- is right wherever its guards hold. `plan_variants` splits each range into
intervals around its tuning sizes (`intervals`: cut at the geometric midpoints) and
builds one variant per cell of intervals, at its tuning sizes and assuming the cell's
ranges (the cell's bounds are guards) -- a cell of one size (a range's minimum, often
batch 1) is built from the graph at that size, static code with constant extents --;
then one more at the first size no variant
covers, until every size of the ranges is covered (checked over the whole grid of
sizes, vectorized, up to `GRID_LIMIT` points; beyond that over a grid of
`coverage_points` per symbol); one build per cell plus `MAX_EXTRA_VARIANTS` bounds
it. The runtime picks the first variant whose guards hold
(`hidetc.backends.runtime.sizes`): deterministic, nothing measured at run time.

Decided here: each variant's configs come from tuning (or the records) at its hint
sizes, the static tasks there (the compile's `build`; the loss against the best
per-size config at sizes other than the hint is not measured yet), memory is planned at
the largest sizes (one arena serves every size), and the artifact
is verified at `verification_sizes`: each range's minimum, 2, a prime inside, its
maximum, and the tuning sizes.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from hidetc.driver.launch import ExecutionPlan
from hidetc.errors import ConfigError
from hidetc.graph.dims import DimRange
from hidetc.graph.guards import Guard, guarded
from hidetc.graph.ir import Graph
from hidetc.graph.symbolic import SymDim, assume, samples

MAX_EXTRA_VARIANTS = 16   # builds beyond one per cell (a cell its guards split)
GRID_LIMIT = 1 << 22          # points of the size grid checked exhaustively


@dataclass(frozen=True)
class Variant:
    """One build: right wherever its guards hold (`hint`: the sizes it planned at)."""
    hint: Mapping[str, int]
    guards: tuple[Guard, ...]
    plan: ExecutionPlan

    def as_dict(self, forward: str, first: bool = False) -> dict:
        """The manifest's entry; a variant after the first also lists its launches'
        kernels (name, anchor node, op, template, config, the values of their arguments
        and what they write: what a per-launch profile names and a launch-by-launch run
        places) and its arena layout (`memory`: offsets and bytes); the first's are the
        manifest's `kernels` and `memory`."""
        plan = self.plan
        listed = {} if first else {
            "launch_kernels": [
                {"name": r.kernel, "node": r.node, "op": r.op,
                 "template": r.choice.get("template"), "config": r.choice.get("config"),
                 "args": list(r.values), "writes": list(r.writes)} for r in plan.launches],
            # its arena layout (values planned at the cell's largest sizes): what a
            # launch-by-launch run and the emulator's sanitizer place values by
            "memory": {"offsets": {k: int(v) for k, v in plan.memory.offsets.items()},
                       "bytes": {k: int(v) for k, v in plan.value_bytes.items()}}}
        return {"hint": dict(self.hint), "guards": [str(g) for g in self.guards],
                "forward": forward, "kernels": len(self.plan.launches), **listed,
                "arena_bytes": int(self.plan.memory.arena_bytes),
                "static": not self.plan.graph.symbols,
                "output_sources": self.plan.output_sources}


def plan_variants(graph: Graph, build: Callable[[Graph], ExecutionPlan]) -> list[Variant]:
    """The variants covering every size of `graph.symbols` (see the module docstring);
    `build(graph)` plans one (optimize, select, configs, plan), called inside
    `assume` (its cell's ranges) and `guarded`. ConfigError when one build per cell and
    MAX_EXTRA_VARIANTS more do not cover the ranges."""
    symbols = dict(graph.symbols)
    cells = list(itertools.product(*(intervals(r) for r in symbols.values())))
    names = list(symbols)
    variants: list[Variant] = []
    pending = [{n: c[0] for n, c in zip(names, cell)} for cell in cells]
    hint: Optional[dict[str, int]] = pending.pop(0)
    limit = len(cells) + MAX_EXTRA_VARIANTS
    while hint is not None:
        if len(variants) == limit:
            text = ", ".join(f"{k}={v}" for k, v in hint.items())
            raise ConfigError(f"{limit} builds do not cover the ranges "
                              f"({_ranges(symbols)}; not covered: {text}): narrow a "
                              f"range")
        cell = {n: next(c for c in intervals(symbols[n]) if c[1] <= hint[n] <= c[2])
                for n in names}
        narrowed = {n: DimRange(lo, hi, (hint[n],)) for n, (_, lo, hi) in cell.items()}
        bounds = [g for n, (_, lo, hi) in cell.items() for g in _interval_guards(
            n, lo, hi, symbols[n])]
        single = all(lo == hi for _, lo, hi in cell.values())   # one size: static code
        with assume(narrowed), guarded(hint) as guarding:
            plan = build(graph.at(hint) if single else graph)
        plan = _distinct_weights(_distinct_kernels(plan, variants, len(variants)), variants,
                                 len(variants))
        variants.append(Variant(dict(hint), tuple(bounds + guarding.guards), plan))
        with assume(symbols):
            pending = [h for h in pending if not any(
                all(g.holds(h) for g in v.guards) for v in variants)]
            hint = pending.pop(0) if pending else \
                uncovered(symbols, [v.guards for v in variants])
    return variants


def _distinct_weights(plan: ExecutionPlan, variants: list[Variant], index: int
                      ) -> ExecutionPlan:
    """`plan` with every weight whose name an earlier variant uses for other contents
    renamed `<name>@v<index>` (a static build folds constants of its own size)."""
    seen = {name: a for v in variants for name, a in v.plan.weights.items()}
    clash = {name for name, a in plan.weights.items() if name in seen and not (
        np.shape(seen[name]) == np.shape(a) and np.array_equal(seen[name], a))}
    if not clash:
        return plan
    new = {name: f"{name}@v{index}" for name in clash}
    launches = tuple(replace(r, values=tuple(new.get(v, v) for v in r.values))
                     for r in plan.launches)
    sources = [{**s, "name": new.get(s["name"], s["name"])} if s.get("kind") == "constant"
               else s for s in plan.output_sources]
    return replace(plan, launches=launches, output_sources=sources,
                   weights={new.get(k, k): a for k, a in plan.weights.items()})


def intervals(rng: DimRange) -> list[tuple[int, int, int]]:
    """(tuning size, lo, hi) per tuning size: the range split at the geometric midpoints
    between consecutive tuning sizes (1..512 at 1, 8, 64, 512: 1..2, 3..22, 23..181,
    182..512),
    so a size is planned with the tiles of the tuning size nearest it in ratio."""
    opts = list(rng.opts)
    cuts = [math.isqrt(a * b) for a, b in zip(opts, opts[1:])]
    los = [rng.lo] + [c + 1 for c in cuts]
    his = cuts + [rng.hi]
    return list(zip(opts, los, his))


def _interval_guards(name: str, lo: int, hi: int, rng: DimRange) -> list[Guard]:
    size = SymDim.symbol(name)
    out = []
    if lo > rng.lo:
        out.append(Guard(size - lo, ">="))
    if hi < rng.hi:
        out.append(Guard(size - hi, "<="))
    return out


def _distinct_kernels(plan: ExecutionPlan, variants: list[Variant], index: int
                      ) -> ExecutionPlan:
    """`plan` with every kernel whose name an earlier variant uses for other code
    renamed `<name>_v<index>`: a kernel's name stands for its task and config, and the
    code planned at another hint (its tiles) may differ -- the variants share one
    library, where a name is one function."""
    seen = {name: fn for v in variants for name, fn in v.plan.functions.items()}
    clash = {name for name, fn in plan.functions.items()
             if name in seen and seen[name] != fn}
    if not clash:
        return plan
    renamed = tuple(
        replace(r, kernel=f"{r.kernel}_v{index}",
                function=replace(r.function, name=f"{r.kernel}_v{index}"))
        if r.kernel in clash else r for r in plan.launches)
    return replace(plan, launches=renamed)


def uncovered(symbols: Mapping[str, DimRange], guard_sets: list[tuple[Guard, ...]]
              ) -> Optional[dict[str, int]]:
    """The first size (in grid order) where no guard set holds entirely, else None."""
    names = list(symbols)
    axes = [_axis(symbols[n]) for n in names]
    grids = np.meshgrid(*axes, indexing="ij")
    sizes = {n: g.reshape(-1) for n, g in zip(names, grids)}
    covered = np.zeros(grids[0].size, dtype=bool)
    for guards in guard_sets:
        holds = np.ones_like(covered)
        for guard in guards:
            holds &= np.asarray(guard.holds(sizes), dtype=bool)
        covered |= holds
    missing = np.flatnonzero(~covered)
    if missing.size == 0:
        return None
    k = int(missing[0])
    return {n: int(sizes[n][k]) for n in names}


def _axis(rng: DimRange) -> np.ndarray:
    """Every size of a range when the grid stays small, else the ends, the tuning sizes,
    powers of two and their neighbours, and evenly spread sizes."""
    count = rng.hi - rng.lo + 1
    if count <= coverage_points():
        return np.arange(rng.lo, rng.hi + 1, dtype=np.int64)
    picks = {rng.lo, rng.hi, *rng.opts}
    p = 1
    while p <= rng.hi:
        picks |= {p - 1, p, p + 1}
        p *= 2
    picks |= {int(x) for x in np.linspace(rng.lo, rng.hi, 257)}
    return np.array(sorted(x for x in picks if rng.lo <= x <= rng.hi), dtype=np.int64)


def coverage_points() -> int:
    """Sizes per symbol checked exhaustively: every size while the grid of two symbols
    stays within GRID_LIMIT."""
    return int(math.isqrt(GRID_LIMIT))


def verification_sizes(symbols: Mapping[str, DimRange],
                       variants: Sequence[Variant] = ()) -> list[dict[str, int]]:
    """The sizes a dynamic artifact is verified at: `symbolic.samples` (minimum, 2, a
    prime, maximum), each tuning size (the others at their largest tuning size), and
    each variant's hint (so every variant runs at least once)."""
    picks = samples(symbols)
    for variant in variants:
        if dict(variant.hint) not in picks:
            picks.append(dict(variant.hint))
    top = {s: r.opts[-1] for s, r in symbols.items()}
    for name, rng in symbols.items():
        for opt in rng.opts:
            sizes = {**top, name: opt}
            if sizes not in picks:
                picks.append(sizes)
    return picks


def _ranges(symbols: Mapping[str, DimRange]) -> str:
    return ", ".join(f"{n} in {r}" for n, r in symbols.items())
