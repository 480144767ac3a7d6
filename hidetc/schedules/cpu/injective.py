"""The CPU rule for injective and elementwise ops: rows of the output in parallel
(OpenMP), the last dimension as the inner loop so gcc can vectorize it.

Schedule: `for r in parallel(rows): for lead in spatial(*shape[:-1]).on(r): for j in
repeat(shape[-1]).on(0): out[lead, j] = compute(lead, j)`, with the value given by the
op's definition in `hidetc.compute.injective`. A Concat along the last axis (the NHWC
channel concat) copies each input's run of the row in its own loop instead (no select
per element, so each copy vectorizes).
"""
from __future__ import annotations

import math

from hidetc.compute.injective import COMPUTE
from hidetc.compute.task import Task
from hidetc.graph.guards import hint_value
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, Load, as_expr
from hidetc.tir.mapping import repeat, spatial


def build(task: Task, name: str) -> Function:
    kb = KernelBuilder(name, "cpu")
    buffers = {i: kb.buffer(f"in{i}", task.inputs[i].dtype, task.inputs[i].shape)
               for i in task.buffer_inputs}
    out_type = task.outputs[0]
    out = kb.buffer("out", out_type.dtype, out_type.shape)
    compute = COMPUTE[task.op]

    def load(i: int, idx) -> Load:
        return buffers[i][tuple(as_expr(x) for x in idx)]

    shape = out_type.shape
    if not shape:
        kb.store(out, (), compute(task, [], load))
        return kb.finish()
    lead, last = shape[:-1] or (1,), shape[-1]
    pieces = _last_axis_pieces(task)
    if pieces is None and _short_rows(tuple(hint_value(d) for d in shape)):
        _build_short_rows(kb, task, out, shape, compute, load)
        return kb.finish()
    with kb.for_range(math.prod(lead), kind="parallel", name="r") as r:
        with kb.for_mapping(spatial(*lead), r, names=[f"i{d}" for d in range(len(lead))]) as li:
            head = list(li[:len(shape) - 1])
            if pieces is not None:        # a Concat on the last axis: one copy per input
                for i, (offset, width) in enumerate(pieces):
                    with kb.for_range(width, name="j") as j:
                        kb.store(out, tuple(head + [j + offset]), load(i, head + [j]))
            else:
                with kb.for_mapping(repeat(last), 0, names=["j"]) as (j,):
                    idx = head + [j]
                    kb.store(out, tuple(idx), compute(task, idx, load))
    return kb.finish()


def _last_axis_pieces(task: Task) -> list[tuple[int, int]] | None:
    """(offset, width) of each input of a Concat along the last axis (NHWC channels:
    contiguous runs, copied without the per-element select), else None."""
    rank = len(task.outputs[0].shape)
    if task.op != "Concat" or rank < 2 or task.attr("axis") % rank != rank - 1:
        return None
    if sorted(task.buffer_inputs) != list(range(len(task.inputs))):
        return None
    widths = [t.shape[-1] for t in task.inputs]
    return [(sum(widths[:i]), w) for i, w in enumerate(widths)]


SHORT_ROW = 4         # a last dimension this short is no loop to vectorize: the one
SHORT_ROW_INNER = 8   # before it (at least this long) is the inner loop instead, when
SHORT_ROW_TASKS = 16  # the dimensions before those two give this many parallel rows


def _short_rows(shape: tuple) -> bool:
    return (len(shape) >= 2 and shape[-1] <= SHORT_ROW and shape[-2] >= SHORT_ROW_INNER
            and math.prod(shape[:-2]) >= SHORT_ROW_TASKS)


def _build_short_rows(kb: KernelBuilder, task: Task, out, shape: tuple, compute,
                      load) -> None:
    """Outputs whose last dimension is a few elements (an NCHW -> NHWC transpose of an
    RGB image: 3): the rows over the dimensions before the last two in parallel, the
    second-to-last as the inner loop and the last unrolled in it, so gcc vectorizes
    along the second-to-last (3 contiguous input rows, interleaved stores) instead of
    running a 3-element loop per position."""
    lead = shape[:-2]
    with kb.for_range(math.prod(lead), kind="parallel", name="r") as r:
        with kb.for_mapping(spatial(*lead), r, names=[f"i{d}" for d in range(len(lead))]) as li:
            head = list(li[:len(lead)])
            with kb.for_range(shape[-2], name="w") as w, \
                    kb.for_range(shape[-1], kind="unroll", name="j") as j:
                idx = head + [w, j]
                kb.store(out, tuple(idx), compute(task, idx, load))
