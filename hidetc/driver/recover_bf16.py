"""A bf16 compile that misses its tolerance computes its costliest GEMMs in f32 instead.

Under `--precision bf16` the anchors marked `compute="bfloat16"`
(`hidetc.graph.passes.compute_bf16`) are the planned error: their kernels match their
own reference (the operands rounded) to f32 summation order, so the exact-order
rebuilds of `hidetc.driver.recover` cannot help. The numerics budget is split over
them: each node's share of the tolerance is `tolerance / marked nodes`, and its cost is
the error its rounding alone makes -- its output against the same op in f32, both on
the reference's exact inputs (`bf16_errors`, numpy only). The nodes over their share
come first, worst first; then, as the exact-order recovery does, the worst 1, 2, 4, ...
of all marked nodes (all of them last: an f32 model) are recompiled in f32
(`CompileConfig.keep_f32`) and the artifact is verified again after each round. The
first round that passes is kept, and `verification.recovery` records the nodes (their
error and share) and the first failure.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import numpy as np

from hidetc.driver.recover import rounds
from hidetc.graph.ir import Graph
from hidetc.graph.ops.registry import get_op
from hidetc.graph.passes.compute_bf16 import COMPUTE, computes_bf16

Rebuild = Callable[[tuple[str, ...]], tuple[dict, Optional[str]]]


def bf16_errors(graph: Graph, reference: Mapping[str, np.ndarray],
                inputs: Mapping[str, np.ndarray]) -> list[tuple[str, float]]:
    """(node name, norm-wise relative error its bf16 rounding alone makes) per marked
    node of `graph`, worst first; `reference` holds every node's values (`keep_all`),
    `inputs` the graph's inputs."""
    values = {**inputs, **graph.constants, **reference}
    found = []
    for node in graph.nodes:
        if not computes_bf16(node) or node.outputs[0] not in values:
            continue
        args = [values[v] if v else None for v in node.inputs]
        attrs = {k: v for k, v in node.attr_dict.items() if k != COMPUTE}
        exact = np.asarray(get_op(node.op).reference(args, attrs)[0], np.float64)
        got = np.asarray(values[node.outputs[0]], np.float64)
        scale = float(np.linalg.norm(exact))
        error = float(np.linalg.norm(got - exact)) / scale if scale else 0.0
        found.append((node.name, error))
    return sorted(found, key=lambda e: e[1], reverse=True)


def recover_bf16(ranked: list[tuple[str, float]], tolerance: float, rebuild: Rebuild,
                 failure: str) -> dict:
    """The rounds (see the module docstring): `rebuild(names)` compiles with those nodes
    in f32 and verifies: (manifest, None) when it passed, else (manifest, its one-line
    failure). Returns the manifest that passed, with `verification.recovery`, or {}."""
    if not ranked:
        return {}
    share = tolerance / len(ranked)
    for size in rounds(len(ranked)):
        picked = ranked[:size]
        manifest, again = rebuild(tuple(name for name, _ in picked))
        if again is None:
            manifest["verification"]["recovery"] = {
                "first_failure": failure, "share": share,
                "f32": [{"node": name, "bf16_error": error, "over_share": error > share}
                        for name, error in picked]}
            return manifest
    return {}
