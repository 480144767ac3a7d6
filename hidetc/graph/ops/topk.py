"""TopK (OTHER: which elements are kept depends on the data).

Assumes the opset-11+ form: inputs X and K (int64, one element, a compile-time constant
since the output shape depends on it; the frontend turns TopK-1's `k` attribute into
that input), attributes `axis` (default -1, negative counts from the end), `largest`
(default 1) and `sorted` (default 1).
Guarantees: outputs Values (X's dtype) and Indices (int64), shaped like X with the axis
set to k, 0 <= k <= the axis extent. The order is the total order ONNX's reference
implementation uses: by value (descending for largest, ascending otherwise), ties by
the lower index; NaN counts as greater than every number (first for largest, last for
smallest). With sorted=0 any order is allowed; the sorted one is returned.
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import TensorType
from hidetc.graph.ops.common import (
    NUMERIC,
    arity,
    dtype_in,
    fail,
    fmt,
    int_list,
    norm_axis,
    rank_at_least,
)
from hidetc.graph.ops.registry import OpKind, define


def topk_k(values) -> int:
    """The k of a TopK whose K input is known, checked against the axis extent."""
    ks = int_list("TopK", values, 1, "K")
    if len(ks) != 1:
        fail("TopK", f"input 1 (K) has {len(ks)} elements, expected 1")
    return ks[0]


def _infer(types, attrs, values):
    arity("TopK", types, 2)
    dtype = dtype_in("TopK", types, 0, NUMERIC)
    dtype_in("TopK", types, 1, ("int64",))
    rank_at_least("TopK", types, 0, 1)
    shape = list(types[0].shape)
    axis = norm_axis("TopK", int(attrs.get("axis", -1)), len(shape))
    k = topk_k(values)
    if not 0 <= k <= shape[axis]:
        fail("TopK", f"input 1 (K) is {k}, expected 0..{shape[axis]} (the extent of axis "
                     f"{axis} of input 0 {fmt(shape)})")
    shape[axis] = k
    return [TensorType(dtype, tuple(shape)), TensorType("int64", tuple(shape))]


def _reference(inputs, attrs):
    x = inputs[0]
    axis = int(attrs.get("axis", -1)) % x.ndim
    k = int(np.ravel(inputs[1])[0])
    largest = bool(attrs.get("largest", 1))
    position = np.indices(x.shape)[axis]
    # ascending by value (NaN last), ties by index: ascending for smallest, descending
    # for largest (flipped below, so that the lower index comes first)
    order = np.lexsort((-position if largest else position, x), axis=axis)
    if largest:
        order = np.flip(order, axis=axis)
    order = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, order, axis=axis), order.astype(np.int64)]


define("TopK", OpKind.OTHER, _infer, _reference, value_inputs=(1,))
