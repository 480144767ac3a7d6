"""Which default-domain opsets, and per op which schema versions, the importer reads.

A model may import default-domain (ai.onnx) opsets `OPSET_RANGE` (1..28; 28 is the
newest opset of onnx 1.23). Within that range each node is checked on its own: the op's
schema in force at the model's opset (`onnx.defs.get_schema(op, opset)`) must be one the
handlers read.
  - The ops in `CHECKED` were reviewed against their whole schema history up to opset
    28 (the handlers' docstrings say what each version changed and how it is read):
    read are the version in force at opset `OLDEST_FORM_OPSET` (7) and every later one
    (or from `FIRST_VERSION[op]`). The opset 7..12 forms (attributes that later became
    inputs, Softmax's 2-D coercion, BatchNormalization's spatial, Dropout's ratio...)
    are converted by `legacy.py`, the changes of opsets 22..28 by `recent.py`; older
    schemas (consumed_inputs, broadcast/axis attributes on binary ops, is_test, Cast's
    string `to`) are refused, naming what differs. An op already in its opset-7 form at
    an older opset (Not-1, Transpose-1, MatMul-1...) is read there too.
  - Any other op of the catalogue (one added since, not reviewed yet) is read in the
    schema versions in force at opsets 13..21 only (the importer's range before the
    review), at a newer opset only while its schema is still the opset-21 one (an op
    born after opset 21: its first version only).

Assumes the installed onnx knows the schemas (onnx >= 1.15; with an onnx older than the
model's opset, the newest schema it knows stands in, which only matters for the
oldest-form check). Guarantees: `check_opset` and `check_versions` raise one-line
`ModelError`/`UnsupportedOpError`s (without the file prefix: the importer adds it).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Iterable

import onnx

from hidetc.errors import ModelError, UnsupportedOpError

OPSET_RANGE = (1, 28)
OLDEST_FORM_OPSET = 7
DEFAULT_DOMAINS = ("", "ai.onnx")
UNCHECKED_OPSETS = (13, 21)
# Ops reviewed against their schema history 1..28 (see the module docstring).
CHECKED = frozenset("""
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool
    BatchNormalization BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Cast CastLike
    Ceil Celu Clip Concat Constant ConstantOfShape Conv Cos Cosh CumSum DepthToSpace Div
    Dropout Elu Equal Erf Exp Expand Flatten Floor Gather GatherElements GatherND Gelu
    Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual GroupNormalization
    Hardmax HardSigmoid HardSwish Identity InstanceNormalization IsInf IsNaN
    LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax LRN MatMul Max MaxPool
    Mean MeanVarianceNormalization Min Mish Mod Mul Neg NonZero Not OneHot Or Pad Pow
    PRelu Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax
    ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize
    RMSNormalization Round ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin
    Sinh Size Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum
    SwiGLU Swish Tan Tanh ThresholdedRelu Tile Transpose Trilu Unsqueeze Upsample Where
    Xor
""".split())
# Checked ops whose oldest read schema is not the one in force at OLDEST_FORM_OPSET: op
# -> the first version read.
FIRST_VERSION: dict[str, int] = {}


def _merge_decomposers() -> None:
    """Add what each decomposition module reviewed (handlers.DECOMPOSERS)."""
    global CHECKED
    from hidetc.frontend.onnx.handlers import DECOMPOSERS
    for module in DECOMPOSERS:
        CHECKED = CHECKED | frozenset(module.CHECKED)
        FIRST_VERSION.update(module.FIRST_VERSION)


_merge_decomposers()


def is_onnx_op(op: str) -> bool:
    """Whether `op` is a default-domain ONNX op (the op catalogue also holds internal
    ops such as ConvNHWC, which a model may not use)."""
    return onnx.defs.has(op, "")


def _default_domain_nodes(graph: onnx.GraphProto) -> bool:
    """Whether `graph` or one of its subgraphs has a node of the default domain."""
    for node in graph.node:
        if node.domain in DEFAULT_DOMAINS:
            return True
        for attr in node.attribute:
            if any(_default_domain_nodes(g) for g in [*attr.graphs, *(
                    [attr.g] if attr.HasField("g") else [])]):
                return True
    return False


def check_opset(proto: onnx.ModelProto) -> int:
    """The model's default-domain opset, or ModelError naming domain and opset."""
    if proto.ir_version == 0 and not proto.opset_import and not proto.HasField("graph"):
        raise ModelError("not an ONNX model (no graph, no opset)")
    versions = [o.version for o in proto.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise ModelError("the model imports no default-domain (ai.onnx) opset")
    low, high = OPSET_RANGE
    if versions[0] == 0 and not _default_domain_nodes(proto.graph):
        return 0        # an opset that declares no operator, for a graph that uses none
    if not low <= versions[0] <= high:
        raise ModelError(f"ai.onnx opset {versions[0]} is not supported (supported: "
                         f"{low}-{high})")
    return versions[0]


@lru_cache(maxsize=None)
def _schema(op: str, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


@lru_cache(maxsize=None)
def first_version(op: str) -> int:
    """The oldest schema version of `op` the handlers read."""
    if op in FIRST_VERSION:
        return FIRST_VERSION[op]
    schema = _schema(op, OLDEST_FORM_OPSET)
    return schema.since_version if schema is not None else 1


def _difference(old: onnx.defs.OpSchema, new: onnx.defs.OpSchema) -> str:
    """What distinguishes an old schema from the oldest one read, in a few words."""
    dropped = sorted(set(old.attributes) - set(new.attributes))
    if dropped:
        return "attribute(s) " + ", ".join(f"'{a}'" for a in dropped)
    retyped = sorted(a for a in old.attributes if a in new.attributes
                     and old.attributes[a].type != new.attributes[a].type)
    if retyped:
        return "attribute(s) " + ", ".join(f"'{a}'" for a in retyped) + " of another type"
    old_inputs, new_inputs = [i.name for i in old.inputs], [i.name for i in new.inputs]
    if old_inputs != new_inputs:
        return f"inputs ({', '.join(old_inputs)}) instead of ({', '.join(new_inputs)})"
    return "an older definition"


@lru_cache(maxsize=None)
def _earliest(op: str) -> int:
    return next(o for o in range(1, OPSET_RANGE[1] + 1) if _schema(op, o) is not None)


def _unchecked(op: str, name: str, opset: int, version: int) -> None:
    low, high = (_schema(op, o) for o in UNCHECKED_OPSETS)
    newest = high.since_version if high is not None else _earliest(op)
    if (low is None or low.since_version <= version) and version <= newest:
        return
    raise UnsupportedOpError(
        f"node '{name}' ({op}): {op}-{version} (opset {opset}) is not supported: hidetc "
        f"reads {op} in its opset {UNCHECKED_OPSETS[0]}-{UNCHECKED_OPSETS[1]} forms only "
        f"(not reviewed for other opsets yet)")


def check_versions(nodes: Iterable[tuple[str, str]], opset: int) -> None:
    """Raise UnsupportedOpError for the first (op, node name) whose schema at `opset`
    is not one the handlers read."""
    for op, name in nodes:
        schema = _schema(op, opset)
        if schema is None:   # the op does not exist yet at this opset: read its first form
            continue
        if op not in CHECKED:
            _unchecked(op, name, opset, schema.since_version)
            continue
        first = first_version(op)
        if schema.since_version < first:
            why = _difference(schema, _schema(op, first) or schema)
            raise UnsupportedOpError(
                f"node '{name}' ({op}): {op}-{schema.since_version} (opset {opset}) is not "
                f"supported ({why}); hidetc reads {op} from version {first} (opset {first}+)")
