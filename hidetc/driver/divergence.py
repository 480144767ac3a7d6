"""Each kernel of an artifact judged alone against the reference interpreter: what the
per-kernel comparison (`kernel_check`, `hidetc run --emulate --sanitize --compare`) and
the verification recovery (`recover`) measure.

One pass runs the launches one by one (`run_with_hook` of the CPU executor or the
emulator) and, before each launch, writes the reference's values of everything the
kernel reads where it reads them; after it, compares what it wrote (the manifest's
`writes`) with the reference's values. So each kernel is judged on exact inputs and
errors do not carry from one kernel into the next. A value several launches write (the
slices of a Concat) is compared after its last writer.

Errors are norm-wise relative (the metric of `hidetc.driver.verify`); integers and
booleans count mismatched elements. Assumes `reference` holds every value of the graph
the artifact was planned from (`run_graph(..., keep_all=True)`), so the names match.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

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


def kernel_errors(manifest: dict, run_with_hook: Callable, inputs: Mapping[str, np.ndarray],
                  reference: Mapping[str, np.ndarray],
                  stop: Optional[Callable[[KernelError], bool]] = None) -> list[KernelError]:
    """Every kernel's error on exact inputs, in launch order (see the module docstring);
    with `stop`, the pass stops measuring after the first error `stop` accepts."""
    kernels = manifest["kernels"]
    last_writer: dict[str, int] = {}
    for step, kernel in enumerate(kernels):
        for value in kernel.get("writes", []):
            last_writer[value] = step
    writers = Counter(v for k in kernels for v in k.get("writes", []))
    found: list[KernelError] = []
    done = [False]

    def hook(when: str, step: int, place) -> None:
        if done[0]:
            return
        kernel = kernels[step]
        writes = set(kernel.get("writes", []))
        if when == "before":
            for value in set(kernel["args"]) - writes:
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
            error = KernelError(step, kernel["name"], kernel["op"], kernel["node"], value,
                                rel, entry.get("mismatches") if rel is None else None,
                                writers[value])
            found.append(error)
            if stop is not None and stop(error):
                done[0] = True
                return

    run_with_hook(inputs, hook)
    return found
