"""Data-movement ops against ONNX Runtime: Reshape (0, -1, allowzero), Flatten,
Transpose, Squeeze/Unsqueeze, Concat, Split variants, Slice (negative steps, clamping),
Expand, Tile, Pad, DepthToSpace/SpaceToDepth; and their shape errors."""
import numpy as np
import pytest

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops import REGISTRY, OpKind
from tests.graph.ort_harness import check_op, rand


def i64(*values):
    return np.array(values, dtype=np.int64)


@pytest.mark.parametrize("shape, spec", [
    ((2, 3, 4), (4, 6)), ((2, 3, 4), (0, -1)), ((2, 3, 4), (-1,)), ((2, 3, 4), (0, 0, 2, 2)),
    ((2, 3, 4), (2, -1, 3)), ((6,), (1, 2, 1, 3)), ((1,), ()),
])
def test_reshape(shape, spec):
    check_op("Reshape", [rand(*shape), i64(*spec)])


def test_reshape_allowzero():
    check_op("Reshape", [rand(0, 3), i64(3, 0)], {"allowzero": 1})
    check_op("Reshape", [rand(2, 3), i64(0, 3)], {"allowzero": 0})


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check_op("Flatten", [rand(2, 3, 4)], {"axis": axis})


@pytest.mark.parametrize("perm", [None, (0, 2, 1), (2, 0, 1), (1, 0, 2)])
def test_transpose(perm):
    check_op("Transpose", [rand(2, 3, 4)], {} if perm is None else {"perm": perm})


def test_squeeze_unsqueeze():
    x = rand(1, 3, 1, 4)
    check_op("Squeeze", [x])
    check_op("Squeeze", [x, i64(0)])
    check_op("Squeeze", [x, i64(-2, 0)])
    check_op("Unsqueeze", [rand(3, 4), i64(0)])
    check_op("Unsqueeze", [rand(3, 4), i64(-1, 1)])
    check_op("Unsqueeze", [np.array(2.0, np.float32), i64(0)])
    check_op("Unsqueeze", [rand(3, 4), i64(0, 3)], opset=13)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    inputs = []
    for k, s in enumerate(shapes):
        s = list(s)
        s[axis] += k
        inputs.append(rand(*s, seed=k))
    check_op("Concat", inputs, {"axis": axis})
    check_op("Concat", [rand(2, 3, dtype=np.int64, low=0, high=9)], {"axis": axis % 2})


def test_split_variants():
    x = rand(6, 7)
    check_op("Split", [x, i64(2, 4)], outputs=2)
    check_op("Split", [x, i64(1, 2, 4)], {"axis": 1}, outputs=3)
    check_op("Split", [x, i64(3, 0, 4)], {"axis": -1}, outputs=3)
    check_op("Split", [x], {"num_outputs": 3}, outputs=3)
    check_op("Split", [x], {"num_outputs": 3, "axis": 1}, outputs=3)  # uneven: 3, 3, 1
    check_op("Split", [x], outputs=3, opset=13)                       # equal split, no attr


SLICES = [
    ((0,), (2,), None, None),
    ((1, 0), (3, -1), None, None),
    ((-1,), (-1000,), (1,), (-1,)),                          # full reverse of axis 1
    ((5, 1), (0, 100), (0, 2), (-2, 3)),
    ((10,), (-100,), (2,), (-3,)),                           # clamped start, negative step
    ((-3, 0), (2 ** 62, 2 ** 62), (0, 1), (1, 1)),
    ((0,), (0,), None, None),                                # empty
    ((-100,), (100,), (-1,), (1,)),
]


@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
def test_slice(starts, ends, axes, steps):
    inputs = [rand(6, 5, 7), i64(*starts), i64(*ends)]
    inputs += [None if axes is None else i64(*axes)]
    inputs += [None if steps is None else i64(*steps)]
    if steps is None:
        inputs.pop()
        if axes is None:
            inputs.pop()
    check_op("Slice", inputs)


def test_slice_of_empty_axis():
    check_op("Slice", [rand(0, 3), i64(-1), i64(-10), i64(0), i64(-1)])


def test_expand():
    check_op("Expand", [rand(3, 1), i64(2, 3, 4)])
    check_op("Expand", [rand(3, 4), i64(4)])
    check_op("Expand", [rand(1, 4), i64(3, 1)])


def test_tile():
    check_op("Tile", [rand(2, 3), i64(2, 3)])
    check_op("Tile", [rand(2, 1, 3), i64(1, 4, 0)])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = rand(3, 4, 5)
    check_op("Pad", [x, i64(0, 1, 2, 1, 2, 0)], {"mode": mode})
    check_op("Pad", [x, i64(1, -1, 0, 2, 1, -2)], {"mode": mode})


def test_pad_constant_value_and_axes():
    x = rand(3, 4)
    check_op("Pad", [x, i64(1, 2, 0, 1), np.array(1.5, np.float32)], consts=(1,))
    check_op("Pad", [x, i64(2, 3), None, i64(-1)], consts=(1, 3))
    check_op("Pad", [x, i64(1, 2, 0, 1)], opset=13)


def test_depth_space():
    check_op("DepthToSpace", [rand(2, 8, 3, 4)], {"blocksize": 2})
    check_op("DepthToSpace", [rand(2, 8, 3, 4)], {"blocksize": 2, "mode": "CRD"})
    check_op("SpaceToDepth", [rand(2, 3, 4, 6)], {"blocksize": 2})


def infer(op, types, values=None, **attrs):
    node = Node.make(op, [f"i{k}" for k in range(len(types))], ["y"], name="s", **attrs)
    return infer_node(node, types, values)


F = TensorType("float32", (2, 3, 4))


def test_errors():
    shape_t = TensorType("int64", (2,))
    with pytest.raises(ShapeError, match=r"node 's' \(Reshape\): input 1 \(shape\) must be a "
                                         r"constant known at compile time"):
        infer("Reshape", [F, shape_t], [None, None])
    with pytest.raises(ShapeError, match=r"input 1 \(shape\) \[5, 5\] has 25 elements, input 0 "
                                         r"\[2,3,4\] has 24"):
        infer("Reshape", [F, shape_t], [None, i64(5, 5)])
    with pytest.raises(ShapeError, match="more than one -1"):
        infer("Reshape", [F, shape_t], [None, i64(-1, -1)])
    with pytest.raises(ShapeError, match="cannot squeeze axis 1 of size 3"):
        infer("Squeeze", [F, TensorType("int64", (1,))], [None, i64(1)])
    with pytest.raises(ShapeError, match=r"input 1 has shape \[2,5,4\], expected \[2,3,4\] "
                                         r"except along axis 0"):
        infer("Concat", [F, TensorType("float32", (2, 5, 4))], axis=0)
    with pytest.raises(ShapeError, match=r"input 1 \(split\) \[1, 2\] does not sum to dim 2"):
        infer("Split", [F, shape_t], [None, i64(1, 2)])
    with pytest.raises(ShapeError, match="zero step"):
        infer("Slice", [F, TensorType("int64", (1,))] * 1 + [TensorType("int64", (1,))] * 3,
              [None, i64(0), i64(1), i64(0), i64(0)])
    with pytest.raises(ShapeError, match=r"perm=\[0, 1\] is not a permutation of 3 axes"):
        infer("Transpose", [F], perm=[0, 1])
    with pytest.raises(ShapeError, match=r"input 1 has shape \[5\], not broadcastable"):
        infer("Expand", [F, TensorType("int64", (1,))], [None, i64(5)])
    with pytest.raises(ShapeError, match=r"input 1 \(pads\) has 4 entries, expected 6"):
        infer("Pad", [F, TensorType("int64", (4,))], [None, i64(0, 0, 0, 0)])


def test_shape_inference_values():
    (out,) = infer("Slice", [F] + [TensorType("int64", (1,))] * 4,
                   [None, i64(-1), i64(-1000), i64(2), i64(-2)])
    assert out.shape == (2, 3, 2)
    outs = infer_node(Node.make("Split", ["x"], ["a", "b", "c"], num_outputs=3, axis=2),
                      [TensorType("float32", (2, 3, 7))])
    assert [t.shape for t in outs] == [(2, 3, 3), (2, 3, 3), (2, 3, 1)]


def test_kinds():
    for op in ["Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Concat",
               "Expand", "Split", "Tile", "Pad", "DepthToSpace", "SpaceToDepth"]:
        assert REGISTRY[op].kind is OpKind.INJECTIVE, op
    assert REGISTRY["Slice"].value_inputs == (1, 2, 3, 4)
