"""The op catalogue. Importing this package registers every op definition.

Guarantees: after import, `REGISTRY` maps each supported ONNX op type (default domain,
latest-opset form) to its `OpDef`. Families: elementwise, reduce, nn, norm, conv,
shape, index, resize, misc, and the internal ops graph passes introduce (`layout`'s
ConvNHWC, `fused_attention`'s FusedAttention; `integer`'s ConvIntegerNHWC);
shared checks live in `common`.
"""
from hidetc.graph.ops import (  # noqa: F401
    conv,
    elementwise,
    fused_attention,
    grid_sample,
    index,
    integer,
    layout,
    misc,
    nn,
    norm,
    reduce,
    resize,
    roi_align,
    shape,
    topk,
)
from hidetc.graph.ops.registry import REGISTRY, OpDef, OpKind, define, get_op

__all__ = ["REGISTRY", "OpDef", "OpKind", "define", "get_op"]
