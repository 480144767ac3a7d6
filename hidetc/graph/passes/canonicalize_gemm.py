"""Gemm -> MatMul (+ Mul) (+ Add): one matrix-product anchor op for later stages.

`Y = alpha * A' @ B' + beta * C` with `A' = A.T if transA`, `B' = B.T if transB` becomes
  - A', B': the operand itself, a new transposed constant when it is constant, else a
    `Transpose(perm=[1, 0])` node;
  - alpha != 1: folded into B' (else A') when that is a constant, else `Mul` of the
    product by a scalar constant;
  - beta != 1: folded into C when C is constant, else `Mul(C, beta)`;
  - `Add(product, C')` when C is given (Add broadcasts like Gemm's unidirectional C).
MatMul nodes, including MatMul with a constant 2-D weight, are left as they are.

Assumes: Gemm per ONNX (2-D A and B; C optional, broadcastable to [M, N]).
Guarantees: no Gemm remains; the Gemm's output name and type are kept (the last new
node defines it); new values and constants get fresh names derived from the Gemm's
name; replaced constants may become unused (eliminate_dead_code drops them). Returns
the same graph object when there is no Gemm.
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes.common import Rewriter, node_base


def run(graph: Graph) -> Graph:
    if not any(node.op == "Gemm" for node in graph.nodes):
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.op == "Gemm":
            lower_gemm(rw, node)
        else:
            rw.emit(node)
    return rw.finish()


def lower_gemm(rw: Rewriter, node: Node) -> None:
    base = node_base(node)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    a = transposed(rw, node.inputs[0], bool(node.attr("transA", 0)), f"{base}_a")
    b = transposed(rw, node.inputs[1], bool(node.attr("transB", 0)), f"{base}_b")
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    if alpha != 1.0 and b in rw.constants:
        b, alpha = scaled_constant(rw, b, alpha, f"{base}_b_scaled"), 1.0
    elif alpha != 1.0 and a in rw.constants:
        a, alpha = scaled_constant(rw, a, alpha, f"{base}_a_scaled"), 1.0
    y = node.outputs[0]
    last = alpha == 1.0 and not c
    product = rw.add("MatMul", (a, b), f"{base}_matmul", out=y if last else None)
    if alpha != 1.0:
        factor = rw.const(f"{base}_alpha", np.array(alpha, dtype=rw.types[product].dtype))
        product = rw.add("Mul", (product, factor), f"{base}_mul", out=None if c else y)
    if c:
        rw.add("Add", (product, scaled(rw, c, beta, base)), f"{base}_add", out=y)


def transposed(rw: Rewriter, value: str, transpose: bool, base: str) -> str:
    if not transpose:
        return value
    if value in rw.constants:
        return rw.const(f"{base}_t", rw.constants[value].T)
    return rw.add("Transpose", (value,), f"{base}_t", perm=(1, 0))


def scaled(rw: Rewriter, c: str, beta: float, base: str) -> str:
    """`beta * C`: a new constant when C is constant, else a Mul node."""
    if beta == 1.0:
        return c
    if c in rw.constants:
        return scaled_constant(rw, c, beta, f"{base}_c_scaled")
    factor = rw.const(f"{base}_beta", np.array(beta, dtype=rw.types[c].dtype))
    return rw.add("Mul", (c, factor), f"{base}_c_mul")


def scaled_constant(rw: Rewriter, value: str, factor: float, base: str) -> str:
    array = rw.constants[value]
    return rw.const(base, (array * np.asarray(factor, dtype=array.dtype)).astype(array.dtype))
