"""ONNX protobuf leaves -> Python/numpy: element types, tensors (incl. external data),
attributes, value-info shapes.

Element types: the numpy ones, bfloat16, and the narrow types (float8/float4/float8e8m0,
int4/uint4/int2/uint2) under their ml_dtypes names (`ir.NARROW_DTYPES`), which
`numpy_helper.to_array` returns unpacked, one element per byte.

Assumes onnx >= 1.15 (`numpy_helper.to_array(tensor, base_dir)` reads external data).
Guarantees: every problem raises `ModelError` with a one-line message WITHOUT the file
prefix (the importer adds "<file>: "); dtypes come out as names from `ir.DTYPES`;
attribute values come out as Python values (tensors as ndarrays, strings as str).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from hidetc.errors import ModelError
from hidetc.graph.ir import DTYPES

_ONNX_TO_NAME = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT8: "int8", onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32", onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "float8_e5m2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    onnx.TensorProto.FLOAT8E8M0: "float8_e8m0fnu",
    onnx.TensorProto.FLOAT4E2M1: "float4_e2m1fn",
    onnx.TensorProto.INT4: "int4", onnx.TensorProto.UINT4: "uint4",
    onnx.TensorProto.INT2: "int2", onnx.TensorProto.UINT2: "uint2",
}
assert set(_ONNX_TO_NAME.values()) == set(DTYPES)


def dtype_name(elem_type: int, what: str) -> str:
    """The dtype name of an ONNX element type, or ModelError naming `what`."""
    try:
        return _ONNX_TO_NAME[elem_type]
    except KeyError:
        kind = onnx.TensorProto.DataType.Name(elem_type) if elem_type in \
            onnx.TensorProto.DataType.values() else str(elem_type)
        raise ModelError(f"{what} has unsupported element type {kind}") from None


def tensor_array(tensor: onnx.TensorProto, base_dir: str, what: str) -> np.ndarray:
    """A TensorProto as an ndarray, reading external data relative to base_dir."""
    dtype_name(tensor.data_type, what)
    try:
        array = numpy_helper.to_array(tensor, base_dir)
    except (onnx.checker.ValidationError, OSError) as error:
        location = _external_location(tensor)
        if location is not None:
            path = os.path.join(base_dir, location)
            raise ModelError(f"{what}: cannot read external data file '{path}' "
                             f"({type(error).__name__})") from None
        raise ModelError(f"{what}: unreadable tensor data ({error})") from None
    except ValueError as error:
        raise ModelError(f"{what}: malformed tensor data ({str(error).splitlines()[0]})") from None
    return array if array.flags.c_contiguous else array.copy()


def _external_location(tensor: onnx.TensorProto) -> str | None:
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    entries = {entry.key: entry.value for entry in tensor.external_data}
    return entries.get("location", "?")


def attribute_value(attr: onnx.AttributeProto, base_dir: str, what: str) -> Any:
    """An attribute as a Python value; tensors become ndarrays; graphs are refused."""
    if attr.type == onnx.AttributeProto.TENSOR:
        return tensor_array(attr.t, base_dir, f"{what} attribute '{attr.name}'")
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS,
                     onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS,
                     onnx.AttributeProto.TENSORS, onnx.AttributeProto.TYPE_PROTO,
                     onnx.AttributeProto.TYPE_PROTOS):
        kind = onnx.AttributeProto.AttributeType.Name(attr.type)
        raise ModelError(f"{what}: attribute '{attr.name}' of type {kind} is not supported")
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return tuple(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
                     for v in value)
    return value


def value_info_dims(info: onnx.ValueInfoProto
                    ) -> tuple[str, list[int | str | None] | None] | None:
    """(dtype name, dims or None if rankless) of a tensor value-info, None if not a
    tensor; a dim is an int, a symbol name, or None (unknown: no value, or a negative
    one -- exporters write -1 for a free dimension, and ONNX Runtime treats it so)."""
    if info.type.WhichOneof("value") != "tensor_type":
        return None
    tensor_type = info.type.tensor_type
    dtype = dtype_name(tensor_type.elem_type, f"input '{info.name}'")
    if not tensor_type.HasField("shape"):
        return dtype, None
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        kind = dim.WhichOneof("value")
        dims.append((dim.dim_value if dim.dim_value >= 0 else None) if kind == "dim_value" else
                    dim.dim_param if kind == "dim_param" else None)
    return dtype, dims
