"""The TIR lowering pipeline: one explicit, ordered list of passes.

    lower_mappings   MapFor -> For loops + index arithmetic (task mappings disappear);
                     first, so every later pass sees only plain loops.
    simplify         fold the mapping arithmetic while indices are still per dimension
                     (loop ranges prove `w // 8 % 16 -> w // 8`, extent-1 loops vanish,
                     constant tail predicates disappear).
    flatten_buffers  n-d accesses -> one row-major offset (what C indexes); after the
                     first simplify so range reasoning worked on small per-dim terms.
    simplify_flat    fold what flattening exposed (`0 * 64 + j`, constant offsets).

Grafting (`hidetc.fusion.graft`: the fused prologues and epilogues) rewrites a built
kernel's n-d global Loads and Stores before this pipeline runs; the plan finishes the
kernel (`ScheduleModule.finish_kernel`) and the build lowers it here, then prints it
(`hidetc.backends.codegen`: C for the cpu, CUDA C for cuda). On a SIMT kernel
(`target.simt` of its `target` attribute) `lower_mappings` unrolls the small mapping
loops and `simplify` knows the thread and block built-ins' ranges from its launch shape.

`lower(fn)` verifies the input and the output of every pass (lowered=True once
`lower_mappings` has run) and, given `dump_dir`, writes the printed IR of the input and
after each pass to `dump_dir/<fn.name>/NN_<pass>.txt` (00 is the input).

Assumes: `fn` was built by the KernelBuilder (or follows the same IR rules).
Guarantees: the result is verified, lowered and flattened -- ready for a C/CUDA printer.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Union

from hidetc.tir.ir import Function
from hidetc.tir.passes.flatten_buffers import flatten_buffers
from hidetc.tir.passes.lower_mappings import lower_mappings
from hidetc.tir.passes.simplify import simplify
from hidetc.tir.passes.verify import TirVerifyError, verify_function
from hidetc.tir.printer import format_function

Pass = Callable[[Function], Function]

LOWERING_PASSES: tuple[tuple[str, Pass], ...] = (
    ("lower_mappings", lower_mappings),
    ("simplify", simplify),
    ("flatten_buffers", flatten_buffers),
    ("simplify_flat", simplify),
)


def _dump(dump_dir: Optional[Path], fn_name: str, step: int, name: str, fn: Function) -> None:
    if dump_dir is None:
        return
    folder = Path(dump_dir) / fn_name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{step:02d}_{name}.txt").write_text(format_function(fn))


def _verify(fn: Function, lowered: bool, when: str) -> None:
    try:
        verify_function(fn, lowered=lowered)
    except TirVerifyError as err:
        raise TirVerifyError(f"{when}: {err}") from err


def lower(fn: Function, *, verify: bool = True,
          dump_dir: Optional[Union[str, Path]] = None,
          passes: tuple[tuple[str, Pass], ...] = LOWERING_PASSES) -> Function:
    """Run `passes` (default LOWERING_PASSES) over `fn`; see the module docstring."""
    dump = None if dump_dir is None else Path(dump_dir)
    lowered = False
    if verify:
        _verify(fn, lowered, "input of the lowering pipeline")
    _dump(dump, fn.name, 0, "input", fn)
    for step, (name, run) in enumerate(passes, start=1):
        fn = run(fn)
        lowered = lowered or name == "lower_mappings"
        if verify:
            _verify(fn, lowered, f"after pass {name}")
        _dump(dump, fn.name, step, name, fn)
    return fn
