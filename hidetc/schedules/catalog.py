"""The schedule templates of every target and the sizes of their spaces
(`hidetc inspect --space`).

A template's space is hardware-centric: it depends on the target (and the precision),
never on the input shape, so one representative task per (template, precision,
variant) measures it. A variant is a family of tasks one template schedules with a
different space (the CPU Conv template: implicit GEMM vs direct depthwise). Which
precisions a template serves is its `precisions` attribute (default: f32 only).

`template_spaces(sets)` -> [SpaceInfo], for (label, target, template registry) sets (a
target backend's `space_set`); `format_spaces` renders the table.
The test suite checks every entry against `MAX_SPACE` and that the configs are
distinct, so a template that grows past the budget fails there, not in the tuner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType
from hidetc.schedules.template import MAX_SPACE, Target

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "int8": "int8"}


@dataclass(frozen=True)
class SpaceInfo:
    target: str
    template: str
    ops: tuple[str, ...]
    precision: str
    variant: str
    configs: int


def _t(dtype: str, *shape: int) -> TensorType:
    return TensorType(dtype, tuple(shape))


def _task(op: str, inputs, output, attrs=(), params=None) -> Task:
    params = tuple(params) if params is not None else (None,) * len(inputs)
    return Task(op, tuple(inputs), (output,), tuple(attrs), params)


def _matmul(dt: str, big: bool) -> dict[str, Task]:
    m, k, n = (1000, 997, 7) if big else (64, 48, 32)
    return {"": _task("MatMul", [_t(dt, m, k), _t(dt, k, n)], _t(dt, m, n))}


def _conv(dt: str, big: bool) -> dict[str, Task]:
    c, hw = (512, 7) if big else (16, 14)
    pads = (("pads", (1, 1, 1, 1)),)
    gemm = _task("Conv", [_t(dt, 1, c, hw, hw), _t(dt, 2 * c, c, 3, 3), None],
                 _t(dt, 1, 2 * c, hw, hw), pads)
    depthwise = _task("Conv", [_t(dt, 1, c, hw, hw), _t(dt, c, 1, 3, 3), None],
                      _t(dt, 1, c, hw, hw), (("group", c),) + pads)
    return {"gemm": gemm, "depthwise": depthwise}


def _conv_nhwc(dt: str, big: bool) -> dict[str, Task]:
    """f16 (cuda: the tensor-core conv) one variant; f32 (cpu) a 3x3 stride-1 conv (the
    direct and the Winograd configs) and a depthwise one."""
    c, hw = (512, 7) if big else (16, 14)
    pads = (("pads", (1, 1, 1, 1)),)
    direct = _task("ConvNHWC", [_t(dt, 1, hw, hw, c), _t(dt, 2 * c, 3, 3, c), None],
                   _t(dt, 1, hw, hw, 2 * c), pads)
    if dt != "float32":
        return {"": direct}
    depthwise = _task("ConvNHWC", [_t(dt, 1, hw, hw, c), _t(dt, c, 3, 3, 1), None],
                      _t(dt, 1, hw, hw, c), (("group", c),) + pads)
    return {"direct+winograd": direct, "depthwise": depthwise}


def _row_op(op: str, dt: str, big: bool) -> dict[str, Task]:
    rows, n = (3, 4099) if big else (8, 128)
    x = _t(dt, rows, n)
    if op.startswith("Reduce"):
        return {"": _task(op, [x, _t("int64", 1)], _t(dt, rows, 1), params=(None, (1,)))}
    if op == "LayerNormalization":
        return {"": _task(op, [x, _t(dt, n), _t(dt, n)], x, (("axis", -1),))}
    if op.startswith("Global"):
        return {"": _task(op, [_t(dt, 1, rows, 7, 7)], _t(dt, 1, rows, 1, 1))}
    return {"": _task(op, [x], x, (("axis", -1),))}


def _integer(op: str, big: bool) -> dict[str, Task]:
    """The integer anchors (uint8 activations, int8 weights, an activation zero point):
    a GEMM variant and, for the convolutions, a depthwise one (the direct kernel)."""
    zero = _t("uint8")
    if op == "MatMulInteger":
        m, k, n = (1000, 997, 7) if big else (64, 48, 32)
        return {"": _task(op, [_t("uint8", m, k), _t("int8", k, n), zero],
                          _t("int32", m, n))}
    c, hw = (512, 7) if big else (16, 14)
    pads = (("pads", (1, 1, 1, 1)),)
    last = op.endswith("NHWC")
    x = _t("uint8", 1, hw, hw, c) if last else _t("uint8", 1, c, hw, hw)
    out = (lambda ch: _t("int32", 1, hw, hw, ch)) if last else \
        (lambda ch: _t("int32", 1, ch, hw, hw))
    w = (lambda o, i: _t("int8", o, 3, 3, i)) if last else (lambda o, i: _t("int8", o, i, 3, 3))
    return {"gemm": _task(op, [x, w(2 * c, c), zero], out(2 * c), pads),
            "depthwise": _task(op, [x, w(c, 1), zero], out(c), (("group", c),) + pads)}


def representative_tasks(op: str, dtype: str, big: bool = False) -> dict[str, Task]:
    """variant -> a task of `op` in `dtype` (the variant is '' for most ops); `big`
    gives other (larger, awkward) shapes, to check that a space ignores shapes."""
    if op in ("MatMulInteger", "ConvInteger", "ConvIntegerNHWC"):
        return _integer(op, big)
    if op == "MatMul":
        return _matmul(dtype, big)
    if op == "Conv":
        return _conv(dtype, big)
    if op == "ConvNHWC":
        return _conv_nhwc(dtype, big)
    return _row_op(op, dtype, big)


def grouped_templates(registry: Mapping[str, Any]) -> dict[int, tuple[Any, list[str]]]:
    """id(template) -> (template, the ops it serves), in registry order."""
    grouped: dict[int, tuple[Any, list[str]]] = {}
    for op, template in registry.items():
        grouped.setdefault(id(template), (template, []))[1].append(op.split("/")[0])
    return grouped


def template_spaces(sets: Iterable[tuple[str, Target, Mapping[str, Any]]]
                    ) -> list[SpaceInfo]:
    """One row per (target, template, precision, variant, space size) of each (label,
    target, op -> template registry) set: a template whose space differs between the
    ops it serves (single- vs multi-pass reductions) gets a row per size, listing its
    ops."""
    rows = []
    for label, target, registry in sets:
        for template, ops in grouped_templates(registry).values():
            for precision in getattr(template, "precisions", ("f32",)):
                sizes: dict[tuple[str, int], list[str]] = {}
                for op in dict.fromkeys(ops):
                    for variant, task in representative_tasks(op, DTYPES[precision]).items():
                        if not getattr(template, "serves", lambda _: True)(task):
                            continue           # (the bf16 conv: no depthwise variant)
                        size = len(template.space(task, target))
                        sizes.setdefault((variant, size), []).append(op)
                rows += [SpaceInfo(label, template.name, tuple(served), precision, variant,
                                   size) for (variant, size), served in sizes.items()]
    return rows


def format_spaces(rows: list[SpaceInfo]) -> str:
    width = max([11] + [len(r.variant) + 1 for r in rows])
    lines = [f"{'target':<7}{'template':<22}{'precision':<10}{'variant':<{width}}"
             f"{'configs':>7}  ops"]
    for r in rows:
        ops = ", ".join(r.ops) if len(r.ops) <= 4 else f"{', '.join(r.ops[:3])}, ... " \
                                                        f"({len(r.ops)} ops)"
        lines.append(f"{r.target:<7}{r.template:<22}{r.precision:<10}"
                     f"{r.variant or '-':<{width}}{r.configs:>7}  {ops}")
    lines.append(f"(at most {MAX_SPACE} configs per template, precision and variant; "
                 f"spaces depend on the target and the op's kind; a conv's a little on "
                 f"its map size)")
    return "\n".join(lines)
