"""The op catalogue. Importing this package registers every op definition.

Guarantees: after import, `REGISTRY` maps each supported ONNX op type (default domain,
latest-opset form) to its `OpDef`. Families: elementwise, reduce, nn, conv, shape,
index, misc; shared checks live in `common`.
"""
from hidetc.graph.ops import conv, elementwise, index, misc, nn, reduce, shape  # noqa: F401
from hidetc.graph.ops.registry import REGISTRY, OpDef, OpKind, define, get_op

__all__ = ["REGISTRY", "OpDef", "OpKind", "define", "get_op"]
