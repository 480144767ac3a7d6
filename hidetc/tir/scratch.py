"""Scratch memory a kernel asks its launcher for.

A kernel's buffer parameters are its task's buffer inputs, then its outputs (what
grafting and the plan bind to graph values), then its scratch buffers, listed in the
Function's `scratch` attr as (parameter name, kind) in parameter order:

- `TRANSIENT`: room of the buffer's size for this launch alone; its contents on entry
  are undefined. The plan gives each launch its own arena value, live at that launch
  only (so it reuses memory of dead activations).
- `ZEROED`: memory that is all zeros when the launch starts and that the kernel leaves
  all zeros when it ends (split-K's per-tile arrival counters, reset by the block that
  arrives last). Launches run one after another, so the plan gives every such buffer
  the same arena region, live for the whole pass; every runtime zeroes its arena once
  when it allocates it (the CUDA executor, the emulator, the cpu executor).

The plan binds a scratch parameter to a placeholder value (`placeholder`) until it has
laid out memory; tests and the tuner pass `zero_arrays(fn)`.
"""
from __future__ import annotations

import numpy as np

from hidetc.tir.ir import Buffer, Function

TRANSIENT, ZEROED = "transient", "zeroed"
KINDS = (TRANSIENT, ZEROED)
# the arena value every ZEROED buffer is bound to (the plan's name, the runtimes' key)
ZEROED_REGION = "scratch.zeroed"
_PREFIX = "scratch:"


def scratch_params(fn: Function) -> list[tuple[Buffer, str]]:
    """The (buffer parameter, kind) of each scratch parameter of `fn`, in order."""
    kinds = dict(fn.attr("scratch", ()))
    out = [(p, kinds[p.name]) for p in fn.params
           if isinstance(p, Buffer) and p.name in kinds]
    if len(out) != len(kinds) or any(k not in KINDS for _, k in out):
        raise ValueError(f"{fn.name}: scratch attr {fn.attr('scratch')!r} does not name "
                         f"buffer parameters of kinds {KINDS}")
    if out and fn.params[-len(out):] != tuple(b for b, _ in out):
        raise ValueError(f"{fn.name}: scratch buffers must be the last parameters")
    return out


def task_params(fn: Function) -> tuple:
    """`fn`'s parameters without its scratch buffers (the task's inputs and outputs)."""
    count = len(fn.attr("scratch", ()))
    return fn.params[:len(fn.params) - count]


def nbytes(buf: Buffer) -> int:
    return int(np.prod(buf.shape, dtype=np.int64)) * np.dtype(buf.dtype).itemsize


def placeholder(buf: Buffer, kind: str) -> str:
    """The value name a scratch parameter is bound to before memory is laid out."""
    return f"{_PREFIX}{kind}:{buf.name}"


def parse_placeholder(value: str) -> tuple[str, str] | None:
    """(kind, parameter name) of a `placeholder` value, else None."""
    if not value.startswith(_PREFIX):
        return None
    kind, _, name = value[len(_PREFIX):].partition(":")
    return (kind, name) if kind in KINDS else None


def zero_arrays(fn: Function) -> list[np.ndarray]:
    """Zeroed host arrays for `fn`'s scratch parameters, in order (what a test or the
    tuner passes after the task's buffers)."""
    return [np.zeros(b.shape, b.dtype) for b, _ in scratch_params(fn)]
