"""ReduceMax / ReduceMin over a trailing contiguous dim fold in interleaved lanes
(`schedules/cpu/reduce._lane_fold`: the dynamic quantization's whole-tensor min and
max): the results equal numpy's exactly, NaN propagated, for reductions over the last
dim, over several dims ending in it, over everything, with ragged tails, and where the
rule's serial fold applies (a reduction not over the last dim)."""
import numpy as np
import pytest
from onnx import helper

import hidetc.tools.onnx_backend as backend


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("shape, axes", [((3, 5, 37), [1, 2]), ((3, 5, 37), [2]),
                                         ((2, 64, 77), None), ((4, 33), [0, 1]),
                                         ((40, 17), [1]), ((6, 20), [0])])
def test_min_max_reductions_are_exact(op, shape, axes):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    if len(shape) == 3:
        x[1, 2, 3] = np.nan
    attrs = {} if axes is None else {"axes": axes}
    node = helper.make_node(op, ["x"], ["y"], keepdims=0, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with backend.prepare(model, "CPU") as rep:
        got = rep.run({"x": x})[0]
    ref = (np.max if op == "ReduceMax" else np.min)(x, axis=None if axes is None
                                                    else tuple(axes))
    np.testing.assert_array_equal(got, ref)
