"""Scalar definitions of elementwise ops: `UNARY[op](x, attrs)`, `BINARY[op](a, b)`.

Math follows numpy/ONNX: Relu/Max/Min propagate NaN (the printers' max/min do), Sigmoid
is 1 / (1 + exp(-x)), integer ops keep C semantics for non-negative operands.
"""
from __future__ import annotations

from typing import Any, Callable

import onnx

from hidetc.tir.ir import (
    FLOATS,
    Expr,
    as_expr,
    call,
    cast,
    eq,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    ne,
    select,
)

Unary = Callable[[Expr, dict[str, Any]], Expr]
Binary = Callable[[Expr, Expr], Expr]


def _math(func: str) -> Unary:
    return lambda x, attrs: call(func, x)


def _float(value: float, like: Expr) -> Expr:
    return as_expr(float(value), like) if like.dtype in FLOATS else as_expr(int(value), like)


def dtype_name(to: Any) -> str:
    """ONNX `to` attributes arrive as a TensorProto enum or already as a dtype name."""
    if isinstance(to, str):
        return to
    return str(onnx.helper.tensor_dtype_to_np_dtype(int(to)))


def _sigmoid(x: Expr, attrs: dict[str, Any]) -> Expr:
    one = _float(1.0, x)
    return one / (one + call("exp", -x))


def _leaky_relu(x: Expr, attrs: dict[str, Any]) -> Expr:
    return select(x < _float(0.0, x), x * _float(attrs.get("alpha", 0.01), x), x)


def _hard_sigmoid(x: Expr, attrs: dict[str, Any]) -> Expr:
    y = x * _float(attrs.get("alpha", 0.2), x) + _float(attrs.get("beta", 0.5), x)
    return minimum(maximum(y, _float(0.0, x)), _float(1.0, x))


UNARY: dict[str, Unary] = {
    "Relu": lambda x, attrs: maximum(x, _float(0.0, x)),
    "Sigmoid": _sigmoid,
    "Tanh": _math("tanh"),
    "Erf": _math("erf"),
    "Sqrt": _math("sqrt"),
    "Exp": _math("exp"),
    "Log": _math("log"),
    "Abs": _math("abs"),
    "Floor": _math("floor"),
    "Ceil": _math("ceil"),
    "Sin": _math("sin"),
    "Cos": _math("cos"),
    "Neg": lambda x, attrs: -x,
    "Reciprocal": lambda x, attrs: _float(1.0, x) / x,
    "Not": lambda x, attrs: logical_not(x),
    "Identity": lambda x, attrs: x,
    "Dropout": lambda x, attrs: x,
    "Cast": lambda x, attrs: cast(x, dtype_name(attrs["to"])),
    "LeakyRelu": _leaky_relu,
    "HardSigmoid": _hard_sigmoid,
    "Softplus": lambda x, attrs: call("log", _float(1.0, x) + call("exp", x)),
}

BINARY: dict[str, Binary] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b,
    "Pow": lambda a, b: call("pow", a, cast(b, a.dtype)),
    "Max": maximum,
    "Min": minimum,
    "Equal": eq,
    "Less": lambda a, b: a < b,
    "LessOrEqual": lambda a, b: a <= b,
    "Greater": lambda a, b: a > b,
    "GreaterOrEqual": lambda a, b: a >= b,
    "And": logical_and,
    "Or": logical_or,
    "Xor": ne,
    "Sum": lambda a, b: a + b,
}
