"""A failed verification is not a dead end: find the kernels that diverge, rebuild them
with exact-order configs, verify again.

Some configs trade accuracy for speed -- a Winograd convolution's transforms (see
`hidetc.schedules.cpu.winograd`) -- and the trade depends on the data and the machine:
each layer's error is small, but a deep model adds them up, and on some machine a
model misses its tolerance. Then, instead of failing:

1. every kernel is judged alone on exact inputs (`divergence.kernel_errors`: the
   reference interpreter's values of what it reads, its output against the
   reference's), launch by launch on the target;
2. the kernels whose template names an exact-order fallback for their config
   (`template.exact_config(task, config, target)`: the direct or GEMM convolution for
   a Winograd one) are ranked by that error, worst first;
3. the worst 1, 2, 4, ... of them (all of them last) are rebuilt with the fallback --
   every kernel of the same task signature takes it, since a config is chosen per
   task -- and the artifact is verified again after each round; the first round that
   passes is kept, and the manifest's `verification.recovery` records what was
   rebuilt (kernel, node, op, from, to, its error on exact inputs) and the first
   failure.

When no round passes (or no kernel has a fallback), the compile
(`verification.recover_artifact`) builds the model once more with its own NCHW layout
where the layout pass had changed it; only when that fails too does the compile fail,
with the original one-line error plus the kernel that diverges most on exact inputs.
Works on the plan's launch records (each holds its task, which `choices` is keyed by).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import numpy as np

from hidetc.driver.divergence import KernelError, kernel_errors
from hidetc.driver.launch import ExecutionPlan
from hidetc.driver.tune.search import Choice
from hidetc.schedules.template import base_template

SOURCE = "exact (verification recovery)"


@dataclass(frozen=True)
class Fallback:
    kernel: str
    error: KernelError
    task: Any
    choice: Choice
    config: Any          # the exact-order config to rebuild with


def fallbacks(plan: ExecutionPlan, choices: Mapping[Any, Choice],
              errors: list[KernelError]) -> list[Fallback]:
    """The kernels that have an exact-order fallback, worst error first (one per task:
    its worst kernel stands for it)."""
    found: dict[Any, Fallback] = {}
    for error in errors:
        record = plan.record(error.kernel)
        task = record.task if record is not None else None
        choice = choices.get(task) if task is not None else None
        if choice is None:
            continue
        exact = getattr(base_template(choice.template), "exact_config", None)
        config = exact(task, choice.config, plan.machine) if exact is not None else None
        if config is None or config == choice.config:
            continue
        known = found.get(task)
        if known is None or _rank(error) > _rank(known.error):
            found[task] = Fallback(error.kernel, error, task, choice, config)
    return sorted(found.values(), key=lambda f: _rank(f.error), reverse=True)


def _rank(error: KernelError) -> float:
    if error.rel_error is not None:
        return error.rel_error if error.rel_error == error.rel_error else float("inf")
    return float(error.mismatches or 0)


def rounds(n: int) -> list[int]:
    """How many of the ranked fallbacks each round applies: 1, 2, 4, ..., then all."""
    sizes, k = [], 1
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n] if n else []


def recover(plan: ExecutionPlan, run_with_hook: Callable, inputs: Mapping[str, np.ndarray],
            reference: Mapping[str, np.ndarray], choices: Mapping[Any, Choice],
            rebuild: Callable[[dict], tuple[dict, Optional[str]]],
            failure: str) -> tuple[dict, list[KernelError], int]:
    """Try the rounds (see the module docstring). `rebuild(choices)` plans, builds and
    verifies with those choices: (its manifest, None) when it passed, else (manifest,
    the failure's one-line message). Returns (the manifest that passed, with
    `verification.recovery`, or {} when no round passed; the errors measured; how many
    kernels had a fallback to try); raises nothing itself -- the caller reports."""
    errors = kernel_errors(plan.launches, run_with_hook, inputs, reference)
    ranked = fallbacks(plan, choices, errors)
    for round_, size in enumerate(rounds(len(ranked)), start=1):
        picked = ranked[:size]
        new = dict(choices)
        for f in picked:
            new[f.task] = Choice(f.choice.template, f.config, SOURCE)
        rebuilt, failed = rebuild(new)
        if failed is None:
            rebuilt["verification"]["recovery"] = {
                "first_failure": failure,
                "rebuilt": [{"kernel": f.kernel, "node": f.error.node, "op": f.error.op,
                             "from": repr(f.choice.config), "to": repr(f.config),
                             "error_on_exact_inputs": f.error.rel_error} for f in picked],
                "rounds": round_,
            }
            return rebuilt, errors, len(ranked)
    return {}, errors, len(ranked)


def worst_kernel(errors: list[KernelError]) -> Optional[KernelError]:
    """The kernel whose output diverges most on exact inputs (for the final error)."""
    return max(errors, key=_rank, default=None)
