"""Conv and pools against ONNX Runtime over attribute variants: strides, pads,
dilations, groups, auto_pad, ceil_mode, count_include_pad, 1-D/2-D/3-D."""
import time

import numpy as np
import pytest

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import evaluate_node, infer_node
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops import REGISTRY, OpKind
from tests.graph.ort_harness import check_op, rand

CONV_CASES = [
    ((1, 3, 9, 9), (4, 3, 3, 3), {}),
    ((2, 3, 10, 7), (5, 3, 3, 2), {"strides": [2, 1], "pads": [1, 0, 2, 1]}),
    ((1, 4, 11, 11), (6, 2, 3, 3), {"group": 2, "dilations": [2, 1], "pads": [1, 1, 1, 1]}),
    ((1, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),
    ((1, 3, 9, 8), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 9, 8), (4, 3, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    ((1, 3, 9, 8), (4, 3, 3, 2), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 3, 9, 9), (4, 3, 3, 3), {"kernel_shape": [3, 3], "strides": [3, 3]}),
    ((2, 3, 13), (4, 3, 4), {"strides": [3], "pads": [2, 1], "dilations": [2]}),
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "strides": [1, 2, 1]}),
    ((1, 8, 7, 7), (4, 8, 1, 1), {}),
]


@pytest.mark.parametrize("x, w, attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv(x, w, attrs, bias):
    inputs = [rand(*x, seed=1), rand(*w, seed=2, low=-0.5, high=0.5)]
    if bias:
        inputs.append(rand(w[0], seed=3))
    check_op("Conv", inputs, attrs)


def test_conv_float64_matches_float32():
    # ORT has no float64 Conv: compare with the float32 path that the tests above check.
    x, w = rand(1, 2, 6, 6), rand(3, 2, 3, 3)
    node = Node.make("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    (y64,) = evaluate_node(node, [x.astype(np.float64), w.astype(np.float64)])
    (y32,) = evaluate_node(node, [x, w])
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, y32, rtol=1e-5, atol=1e-5)


POOL_CASES = [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [3, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [4, 4], "auto_pad": "SAME_LOWER", "strides": [2, 3]},
    {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 2]},
    {"kernel_shape": [2, 3], "dilations": [2, 1], "pads": [1, 1, 1, 1]},
]


@pytest.mark.parametrize("attrs", POOL_CASES)
def test_maxpool(attrs):
    check_op("MaxPool", [rand(2, 3, 9, 8)], attrs)


@pytest.mark.parametrize("attrs", POOL_CASES)
@pytest.mark.parametrize("include", [0, 1])
def test_avgpool(attrs, include):
    check_op("AveragePool", [rand(2, 3, 9, 8)], {**attrs, "count_include_pad": include})


def test_pools_1d_3d_and_int8():
    check_op("MaxPool", [rand(2, 3, 11)], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]})
    check_op("AveragePool", [rand(1, 2, 5, 6, 7)], {"kernel_shape": [2, 3, 2],
                                                    "ceil_mode": 1, "strides": [2, 2, 2]})
    check_op("MaxPool", [rand(1, 2, 6, 6, dtype=np.int8, low=-100, high=100)],
             {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]})
    check_op("AveragePool", [rand(1, 2, 7, 7)], {"kernel_shape": [3, 3]}, opset=13)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op):
    check_op(op, [rand(2, 3, 5, 4)])
    check_op(op, [rand(2, 3, 7)])


def test_conv_reference_is_fast():
    x = rand(1, 64, 56, 56)
    w = rand(64, 64, 3, 3, low=-0.1, high=0.1)
    node = Node.make("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    start = time.perf_counter()
    (y,) = evaluate_node(node, [x, w])
    assert y.shape == (1, 64, 56, 56)
    assert time.perf_counter() - start < 2.0


def infer(op, shapes, **attrs):
    node = Node.make(op, [f"i{k}" for k in range(len(shapes))], ["y"], name="c", **attrs)
    return infer_node(node, [TensorType("float32", s) for s in shapes])


def test_shapes_and_errors():
    assert infer("Conv", [(1, 3, 224, 224), (64, 3, 7, 7)], strides=[2, 2],
                 pads=[3, 3, 3, 3]) == [TensorType("float32", (1, 64, 112, 112))]
    assert infer("MaxPool", [(1, 64, 112, 112)], kernel_shape=[3, 3], strides=[2, 2],
                 pads=[1, 1, 1, 1]) == [TensorType("float32", (1, 64, 56, 56))]
    with pytest.raises(ShapeError, match=r"node 'c' \(Conv\): input 1 has shape \[4,2,3,3\]: "
                                         r"with group=1 expected dim 1 to be 3"):
        infer("Conv", [(1, 3, 9, 9), (4, 2, 3, 3)])
    with pytest.raises(ShapeError, match="smaller than the dilated kernel 5"):
        infer("Conv", [(1, 3, 4, 9), (4, 3, 3, 3)], dilations=[2, 1])
    with pytest.raises(ShapeError, match="kernel_shape is required"):
        infer("MaxPool", [(1, 3, 4, 4)])
    with pytest.raises(ShapeError, match=r"pads=\[1, 1\] must have 4 non-negative entries"):
        infer("AveragePool", [(1, 3, 4, 4)], kernel_shape=[2, 2], pads=[1, 1])
    with pytest.raises(ShapeError, match="auto_pad='SAME'"):
        infer("Conv", [(1, 3, 9, 9), (4, 3, 3, 3)], auto_pad="SAME")
    with pytest.raises(ShapeError, match=r"input 2 has shape \[3\], expected \[4\]"):
        infer("Conv", [(1, 3, 9, 9), (4, 3, 3, 3), (3,)])
    with pytest.raises(ShapeError, match="expected rank >= 3"):
        infer("GlobalAveragePool", [(3, 4)])


def test_maxpool_indices_output_is_rejected():
    node = Node.make("MaxPool", ["x"], ["y", "idx"], name="mp", kernel_shape=[2, 2])
    with pytest.raises(ShapeError, match=r"output 1 \('idx'\) is not supported"):
        infer_node(node, [TensorType("float32", (1, 1, 4, 4))])


def test_kinds():
    assert REGISTRY["Conv"].kind is OpKind.ANCHOR
    for op in ["MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"]:
        assert REGISTRY[op].kind is OpKind.REDUCE


def test_float16_conv_and_pools():
    x = rand(1, 3, 8, 8).astype(np.float16)
    w = rand(4, 3, 3, 3, low=-0.5, high=0.5).astype(np.float16)
    check_op("Conv", [x, w], {"pads": [1, 1, 1, 1]}, rtol=2e-3, atol=2e-3)
    check_op("MaxPool", [x], {"kernel_shape": [2, 2]})
    check_op("AveragePool", [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
             rtol=2e-3, atol=2e-3)
    check_op("GlobalAveragePool", [x], rtol=2e-3, atol=2e-3)
