"""Training-mode forms of Dropout-12+ and BatchNormalization-14+, where deterministic.

- Dropout with training_mode true: with ratio 0 (known at import) it is the identity and
  its mask all true; with ratio > 0 the result is random (the mask comes from a random
  generator), which hidetc does not reproduce: a one-line UnsupportedOpError. A false
  or absent training_mode is the inference op (emitted as is).
- BatchNormalization with training_mode=1: Y normalizes with the batch statistics (mean
  and population variance over every axis but 1), and the optional outputs are
  running_mean = input_mean * momentum + mean * (1 - momentum), likewise running_var
  (onnx's reference definition), as ReduceMean/Sub/Mul/Add/Sqrt/Div nodes.
Assumes the inputs' types are known (ctx.types) and ratio/training_mode values are in
ctx.values when given (the backend binds them at compile time).
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import UnsupportedOpError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, emit, label, scalar


def dropout(node: OnnxNode, ctx: Context) -> Converted:
    training = ctx.values.get(node.input(2)) if node.input(2) else None
    if training is None or not bool(np.asarray(training).reshape(-1)[0]):
        return emit(node, ctx)     # inference (an unknown training_mode: the op's check)
    ratio = ctx.values.get(node.input(1)) if node.input(1) else np.array(0.5)
    if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
        raise UnsupportedOpError(f"{label(node)}: training_mode=true with a ratio other than "
                                 f"0 drops random elements, which is not supported")
    build = Builder(node, ctx)
    build.add("Identity", [node.inputs[0]], out=node.outputs[0])
    if len(node.outputs) > 1 and node.outputs[1]:
        shape = np.array(ctx.types[node.inputs[0]].shape, np.int64)
        build.add("Expand", [build.const("true", np.array(True)), build.const("shape", shape)],
                  out=node.outputs[1])
    return build.done()


def batch_normalization(node: OnnxNode, ctx: Context) -> Converted:
    if not node.attrs.get("training_mode", 0):
        return emit(node, ctx)
    x_type = ctx.types[node.inputs[0]]
    x, scale, bias, mean_in, var_in = node.inputs[:5]
    dtype, rank = x_type.dtype, x_type.rank
    eps = float(node.attrs.get("epsilon", 1e-5))
    momentum = float(node.attrs.get("momentum", 0.9))
    build = Builder(node, ctx)
    axes = build.const("axes", np.array([a for a in range(rank) if a != 1], np.int64))
    per_channel = build.const("channel_shape", np.array([1, -1] + [1] * (rank - 2), np.int64))
    mean = build.add("ReduceMean", [x, axes], keepdims=1)
    centered = build.add("Sub", [x, mean])
    var = build.add("ReduceMean", [build.add("Mul", [centered, centered]), axes], keepdims=1)
    std = build.add("Sqrt", [build.add("Add", [var, build.const("epsilon", scalar(eps, dtype))])])
    normalized = build.add("Div", [centered, std])
    scaled = build.add("Mul", [normalized, build.add("Reshape", [scale, per_channel])])
    build.add("Add", [scaled, build.add("Reshape", [bias, per_channel])], out=node.outputs[0])
    keep = build.const("momentum", scalar(momentum, dtype))
    rest = build.const("one_minus_momentum", scalar(1.0 - momentum, dtype))
    flat = build.const("flat", np.array([-1], np.int64))
    for out, running, batch in zip(node.outputs[1:3], (mean_in, var_in), (mean, var)):
        if out:
            build.add("Add", [build.add("Mul", [running, keep]),
                              build.add("Mul", [build.add("Reshape", [batch, flat]), rest])],
                      out=out)
    return build.done()


# The DECOMPOSERS interface (handlers.py): legacy.py's Dropout/BatchNormalization handlers
# call the functions above; the backend binds Dropout's ratio at compile time.
HANDLERS: dict = {}
EXTRA_OPS: tuple[str, ...] = ()
CHECKED: tuple[str, ...] = ()
FIRST_VERSION: dict[str, int] = {}
VALUE_INPUTS: dict[str, tuple[int, ...]] = {"Dropout": (1, 2)}
