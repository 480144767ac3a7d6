"""Strength-reduce Pow with a small constant exponent to multiplications (and Sqrt,
Reciprocal).

`Pow(x, c)` where `x` is a float tensor and `c` a constant with one element (any
shape that does not change the output's shape, any numeric dtype) becomes:
    c = 1    x                  (an Identity, then removed by `remove_identity.run`)
    c = 2    Mul(x, x)
    c = 3    Mul(Mul(x, x), x)
    c = 4    Mul(s, s) with s = Mul(x, x)
    c = 0.5  Sqrt(x)
    c = -1   Reciprocal(x)
Other exponents, integer bases and exponents that broadcast the output to a larger
shape are left alone. Why: the cpu target calls libm's scalar `powf` for Pow, which
keeps the loop (often a fused GEMM epilogue, e.g. GPT-2's GELU `Pow(x, 3)`) from
vectorizing; a multiplication costs nothing.

Assumes: node output types as inferred by the ops (the Pow output type equals the
base's type, checked). Guarantees: the Pow's output name and type are kept (the last
new node defines it; intermediate values and nodes get fresh names); results agree with
`pow` up to rounding: c = 2, -1 and 0.5 are correctly rounded like a correctly-rounded
pow, c = 3 and 4 round twice (within ~1.5 ulp; overflow and underflow to 0 as pow
does). Two IEEE corner cases differ from C's pow for c = 0.5: pow(-0, 0.5) = +0 where
Sqrt gives -0, and pow(-inf, 0.5) = +inf where Sqrt gives NaN. The exponent constant may
become unused (eliminate_dead_code drops it). Returns the same graph object when there
is nothing to rewrite.
"""
from __future__ import annotations

from hidetc.graph.ir import FLOAT_DTYPES, Graph, Node
from hidetc.graph.passes import remove_identity
from hidetc.graph.passes.common import Rewriter, node_base

EXPONENTS = (1.0, 2.0, 3.0, 4.0, 0.5, -1.0)


def run(graph: Graph) -> Graph:
    if not any(exponent(graph, node) is not None for node in graph.nodes):
        return graph
    rw = Rewriter(graph)
    has_identity = False
    for node in graph.nodes:
        c = exponent(graph, node)
        if c is None:
            rw.emit(node)
            continue
        x, y, base = node.inputs[0], node.outputs[0], node_base(node)
        if c == 1.0:
            rw.emit_typed(Node("Identity", (x,), (y,), name=rw.node_names.fresh(base)))
            has_identity = True
        elif c == 0.5:
            rw.add("Sqrt", (x,), f"{base}_sqrt", out=y)
        elif c == -1.0:
            rw.add("Reciprocal", (x,), f"{base}_reciprocal", out=y)
        elif c == 2.0:
            rw.add("Mul", (x, x), f"{base}_square", out=y)
        else:
            square = rw.add("Mul", (x, x), f"{base}_square")
            rw.add("Mul", (square, x if c == 3.0 else square), f"{base}_pow{int(c)}", out=y)
    out = rw.finish()
    return remove_identity.run(out) if has_identity else out


def exponent(graph: Graph, node: Node) -> float | None:
    """The exponent of a Pow this pass rewrites, else None."""
    if node.op != "Pow" or len(node.inputs) != 2 or not all(node.inputs):
        return None
    x, e = node.inputs
    array = graph.constants.get(e)
    if array is None or array.size != 1 or array.dtype.kind not in "fiu":
        return None
    xtype = graph.types.get(x)
    if xtype is None or xtype.dtype not in FLOAT_DTYPES:
        return None
    if graph.types.get(node.outputs[0]) != xtype:  # the exponent broadcasts the output
        return None
    value = float(array.reshape(-1)[0])
    return value if value in EXPONENTS else None
