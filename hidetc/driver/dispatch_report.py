"""The dispatch table of a range compile with its measured loss (the manifest's
`dynamic.dispatch`, shown by `hidetc inspect`).

Each dispatch variant's anchors are tuned (or read from the records) at the variant's
hint sizes (`driver.api._compile_ranges`), so the records hold, for every anchor and
hint, each candidate config's measured time there. A row of the table is one anchor
signature (the nodes sharing it counted) and says, per variant, at the variant's hint
sizes: the config the artifact runs there, its measured time, the best time measured
there and the loss (time / best - 1: 0 where it was tuned there and runs the winner);
`others`, the loss each other variant's config would have at these sizes -- what
choosing the neighbouring interval's config costs, the loss at the sizes between two
hints being bounded by it where times change smoothly --; and `single_config_loss`, the
least worst-case loss one of the table's configs would have over every hint (what the
table gains over one config for the whole range, as TensorRT's single `opt` tunes).

Assumes: `choices` per variant are `hidetc.driver.tune.search.Choice`s carrying their
records `key`. Guarantees: `dispatch_table` measures nothing (it reads the records); a
tuning compile first calls `measure_table`, which measures the table's configs each
hint lacks (a short-list space measures different candidates at each size). A time the
records do not hold (a default config under `--no-tune`) is None and so are its
losses.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from hidetc.driver.tune.records import RecordStore
from hidetc.driver.tune.search import measure_missing


def dispatch_table(variants: Sequence[Any], choices: Sequence[Mapping[Any, Any]],
                   records: RecordStore) -> list[dict]:
    """The rows (see the module docstring) of `variants` (`driver.dynamic.Variant`s) whose
    anchors took `choices[k]` (task -> Choice) in variant k."""
    times: dict[Any, dict[str, float]] = {}

    def measured(key) -> dict[str, float]:
        if key not in times:
            times[key] = {} if key is None else {
                c.config: c.time_ms for c in records.candidates(key) if c.time_ms is not None}
        return times[key]

    rows: dict[tuple, dict] = {}
    for node, entries in _per_node(variants, choices).items():
        ident = tuple((k, t.signature(), c.template.name, repr(c.config)) for k, t, c in entries)
        if ident in rows:
            rows[ident]["nodes"] += 1
            continue
        rows[ident] = _row(variants, entries, measured)
    return list(rows.values())


def measure_table(variants: Sequence[Any], choices: Sequence[Mapping[Any, Any]],
                  records: RecordStore, measure, limits) -> int:
    """Measure, at each variant's hint sizes, the configs the other variants chose for the
    same anchor (same template) that the records do not hold there yet (a short-list
    space measures other candidates at each size), so that the table has every loss;
    the count measured (`tune.search.measure_missing`)."""
    count = 0
    for entries in _per_node(variants, choices).values():
        for k, task, choice in entries:
            if choice.key is None:
                continue
            same = [c.config for _, _, c in entries if c.template.name == choice.template.name]
            static = task.at(variants[k].hint) if task.symbolic else task
            count += measure_missing(records, choice.key, static, choice.template, same,
                                     measure, limits)
    return count


def _per_node(variants, choices) -> dict[str, list]:
    """Per anchor node, its (variant, task, Choice) in each variant that has it."""
    per_node: dict[str, list] = {}
    for k, (variant, chosen) in enumerate(zip(variants, choices)):
        for launch in variant.plan.launches:
            choice = chosen.get(launch.task)
            if choice is not None:
                per_node.setdefault(launch.node, []).append((k, launch.task, choice))
    return per_node


def _row(variants, entries, measured) -> dict:
    configs = {k: repr(c.config) for k, _, c in entries}
    at = []
    for k, task, choice in entries:
        there = measured(choice.key)
        best = min(there.values()) if there else None
        at.append({"variant": k, "sizes": dict(variants[k].hint), "config": configs[k],
                   "source": choice.source, "ms": there.get(configs[k]), "best_ms": best,
                   "candidates": len(there), "loss": _loss(there.get(configs[k]), best),
                   "others": {f"v{j}": _loss(there.get(c), best)
                              for j, c in configs.items() if j != k and c != configs[k]}})
    symbolic = next((t for _, t, _ in entries if t.symbolic), entries[0][1])
    losses = [a["loss"] for a in at]
    return {"task": symbolic.signature(), "template": entries[0][2].template.name,
            "nodes": 1, "at": at,
            "worst_loss": max(losses) if losses and None not in losses else None,
            "single_config_loss": _single(at, configs)}


def _loss(ms: Optional[float], best: Optional[float]) -> Optional[float]:
    return None if ms is None or not best else round(ms / best - 1.0, 4)


def _single(at: list[dict], configs: Mapping[int, str]) -> Optional[float]:
    """The least, over the table's configs, of the worst loss one config would have at
    every hint; None where a loss is not measured."""
    worst = []
    for k, config in configs.items():
        losses = [a["loss"] if a["variant"] == k or a["config"] == config
                  else a["others"].get(f"v{k}") for a in at]
        if None in losses:
            return None
        worst.append(max(losses))
    return min(worst) if worst else None


def describe(rows: list[dict]) -> list[str]:
    """`hidetc inspect`'s lines for the table."""
    if not rows:
        return []
    worst = [r["worst_loss"] for r in rows]
    single = [r["single_config_loss"] for r in rows]
    head = f"dispatch: {len(rows)} anchor signature(s); "
    if None in worst:
        head += "not every config was measured (compile with tuning to measure the table)"
    else:
        head += f"loss against the best config measured at each tuning size: at most " \
                f"{100 * max(worst):.1f}%"
        if None not in single:
            head += f"; one config for the whole range would lose up to " \
                    f"{100 * max(single):.1f}%"
    lines = [head]
    for r in rows:
        parts = []
        for a in r["at"]:
            where = ",".join(f"{k}={v}" for k, v in a["sizes"].items())
            loss = "unmeasured" if a["loss"] is None else f"{100 * a['loss']:+.1f}%"
            parts.append(f"{where}: {loss}")
        lines.append(f"  {r['task']} x{r['nodes']} ({r['template']}): " + "; ".join(parts))
    return lines
