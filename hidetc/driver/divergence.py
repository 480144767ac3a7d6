"""Each kernel of an artifact judged alone against the reference interpreter: what the
per-kernel comparison (`kernel_check`, `hidetc run --emulate --sanitize --compare`) and
the verification recovery (`recover`) measure.

One pass runs the launches one by one (`run_with_hook` of the CPU executor or the
emulator) and, before each launch, writes the reference's values of everything the
kernel reads where it reads them; after it, compares what it wrote (its `writes`) with
the reference's values. The launches are the plan's records (`LaunchRecord`: a
compile's recovery) or read back from an artifact's manifest (`launches_of`:
`kernel_check`). So each kernel is judged on exact inputs and errors do not carry
from one kernel into the next. A value several launches write (the slices of a
Concat) is compared after its last writer.

Errors are norm-wise relative (the metric of `hidetc.driver.verify`); integers and
booleans count mismatched elements. Assumes `reference` holds every value of the graph
the artifact was planned from (`run_graph(..., keep_all=True)`), so the names match.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from hidetc.driver.verify import compare


@dataclass(frozen=True)
class KernelError:
    step: int
    kernel: str               # the kernel's name in the manifest
    op: str
    node: str
    value: str                # the value it wrote that was compared
    rel_error: Optional[float]    # floats: norm-wise relative error
    mismatches: Optional[int]     # integers and booleans: elements that differ
    writers: int = 1          # launches writing `value` (a Concat's slices)

    def exceeds(self, rtol: float) -> bool:
        if self.rel_error is not None:
            return not self.rel_error <= rtol       # NaN exceeds
        return bool(self.mismatches)

    def describe(self, rtol: Optional[float] = None) -> str:
        if self.rel_error is not None:
            bound = f" > {rtol:g}" if rtol is not None else ""
            return f"relative error {self.rel_error:.3g}{bound}"
        return f"{self.mismatches} mismatched elements"


@dataclass(frozen=True)
class Launched:
    """What the comparison needs of a launch (a `LaunchRecord` has the same fields)."""
    kernel: str
    op: str
    node: str
    values: tuple[str, ...]     # the graph value each argument holds
    writes: tuple[str, ...]


def launches_of(manifest: dict) -> list[Launched]:
    """The launches an artifact's manifest records, in order."""
    return [Launched(k["name"], k["op"], k.get("node", ""), tuple(k["args"]),
                     tuple(k.get("writes", ()))) for k in manifest["kernels"]]


def kernel_errors(launches: Sequence, run_with_hook: Callable,
                  inputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                  stop: Optional[Callable[[KernelError], bool]] = None) -> list[KernelError]:
    """Every kernel's error on exact inputs, in launch order (see the module docstring);
    with `stop`, the pass stops measuring after the first error `stop` accepts."""
    kernels = list(launches)
    last_writer: dict[str, int] = {}
    for step, kernel in enumerate(kernels):
        for value in kernel.writes:
            last_writer[value] = step
    writers = Counter(v for k in kernels for v in k.writes)
    found: list[KernelError] = []
    done = [False]

    def hook(when: str, step: int, place) -> None:
        if done[0]:
            return
        kernel = kernels[step]
        writes = set(kernel.writes)
        if when == "before":
            for value in set(kernel.values) - writes:
                view, want = place(value), reference.get(value)
                if view is not None and want is not None and view.nbytes == want.nbytes:
                    view[...] = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
            return
        for value in sorted(writes):
            view, want = place(value), reference.get(value)
            if view is None or want is None or last_writer[value] != step:
                continue
            want = np.asarray(want)
            got = view[:want.nbytes].view(want.dtype).reshape(want.shape)
            entry = compare({value: got}, {value: want}, 0.0)["outputs"][value]
            rel = entry.get("rel_error", float("inf") if "error" in entry else None)
            error = KernelError(step, kernel.kernel, kernel.op, kernel.node, value,
                                rel, entry.get("mismatches") if rel is None else None,
                                writers[value])
            found.append(error)
            if stop is not None and stop(error):
                done[0] = True
                return

    run_with_hook(inputs, hook)
    return found
