"""The operator catalogue: one `OpDef` per graph op type.

Each op has a kind (how it may be fused and scheduled), a shape/dtype rule and a numpy
reference. Op types and semantics are ONNX's (latest opset form: parameters that became
inputs in later opsets are inputs here); the frontend converts older forms.

`infer(types, attrs, values)` gets the input `TensorType`s (None for an omitted optional
input), the attribute dict, and for each input its constant value as a numpy array when
known (else None). Inputs listed in `value_inputs` must be known: the rule raises
`ShapeError` otherwise. It returns the output types.

`reference(inputs, attrs)` computes the outputs with numpy (None for omitted inputs).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional, Sequence

import numpy as np

from hidetc.errors import ShapeError
from hidetc.graph.ir import TensorType


class OpKind(str, Enum):
    BIJECTIVE = "bijective"   # elementwise-like: each output element from one input element
    INJECTIVE = "injective"   # each output element is a function of input elements by index
    REDUCE = "reduce"         # output elements combine many input elements
    ANCHOR = "anchor"         # compute-heavy: scheduled by a template (matmul, conv)
    OTHER = "other"           # shape-only or data-dependent ops, folded or special-cased


Attrs = dict[str, Any]
Values = Sequence[Optional[np.ndarray]]
InferFn = Callable[[Sequence[Optional[TensorType]], Attrs, Values], list[TensorType]]
ReferenceFn = Callable[[Sequence[Optional[np.ndarray]], Attrs], list[np.ndarray]]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: OpKind
    infer: InferFn
    reference: ReferenceFn
    value_inputs: tuple[int, ...] = ()


REGISTRY: dict[str, OpDef] = {}


def define(name: str, kind: OpKind, infer: InferFn, reference: ReferenceFn,
           value_inputs: tuple[int, ...] = ()) -> OpDef:
    if name in REGISTRY:
        raise ValueError(f"op {name} defined twice")
    opdef = OpDef(name, kind, infer, reference, value_inputs)
    REGISTRY[name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ShapeError(f"unknown op type {name!r}") from None
