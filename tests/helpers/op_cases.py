"""One-node ONNX test cases shared by the end-to-end op tests of every target:
op, graph inputs, attributes, constant inputs. Shapes are awkward on purpose (1, primes,
broadcasts, non-multiples of any tile)."""
from __future__ import annotations

import numpy as np
import onnx

R = np.random.default_rng(0)


def f(*shape):
    return R.standard_normal(shape).astype(np.float32)


def pos(*shape):
    return (R.random(shape) + 0.1).astype(np.float32)


def i64(values):
    return np.array(values, dtype=np.int64)


CASES = {
    "relu": ("Relu", {"x": f(3, 7)}, {}, {}),
    "sigmoid": ("Sigmoid", {"x": f(13)}, {}, {}),
    "tanh": ("Tanh", {"x": f(2, 3, 5)}, {}, {}),
    "erf": ("Erf", {"x": f(1, 17)}, {}, {}),
    "sqrt": ("Sqrt", {"x": pos(5, 3)}, {}, {}),
    "exp": ("Exp", {"x": f(4, 4)}, {}, {}),
    "neg_abs": ("Abs", {"x": f(7)}, {}, {}),
    "clip": ("Clip", {"x": f(3, 11)}, {}, {"lo": np.array(0, np.float32),
                                           "hi": np.array(6, np.float32)}),
    "add_bcast": ("Add", {"a": f(2, 3, 5), "b": f(3, 1)}, {}, {}),
    "sub_const": ("Sub", {"a": f(1, 5)}, {}, {"b": f(5)}),
    "mul_scalar": ("Mul", {"a": f(4, 3)}, {}, {"b": np.array(0.5, np.float32)}),
    "div": ("Div", {"a": f(3, 7), "b": pos(7)}, {}, {}),
    "pow": ("Pow", {"a": pos(3, 5)}, {}, {"b": np.array(3.0, np.float32)}),
    "equal_where": ("Where", {"c": R.random((3, 5)) < 0.5, "a": f(3, 5), "b": f(1, 5)}, {}, {}),
    "cast": ("Cast", {"x": f(2, 9) * 10}, {"to": onnx.TensorProto.INT64}, {}),
    "not": ("Not", {"x": R.random((4, 3)) < 0.5}, {}, {}),
    "equal": ("Equal", {"a": i64([[1, 2, 3]]), "b": i64([[1], [2]])}, {}, {}),
    "and": ("And", {"a": R.random((2, 3)) < 0.5, "b": R.random((3,)) < 0.5}, {}, {}),
    "transpose": ("Transpose", {"x": f(2, 3, 5, 7)}, {"perm": [0, 2, 3, 1]}, {}),
    "reshape": ("Reshape", {"x": f(2, 3, 10)}, {}, {"s": i64([6, -1, 2])}),
    "flatten": ("Flatten", {"x": f(2, 3, 5)}, {"axis": 2}, {}),
    "squeeze": ("Squeeze", {"x": f(3, 1, 5)}, {}, {"axes": i64([1])}),
    "unsqueeze": ("Unsqueeze", {"x": f(3, 5)}, {}, {"axes": i64([0, 3])}),
    "slice": ("Slice", {"x": f(7, 11)}, {}, {"st": i64([1, -2]), "en": i64([6, 0]),
                                             "ax": i64([0, 1]), "sp": i64([2, -3])}),
    "concat": ("Concat", {"a": f(2, 3), "b": f(2, 5), "c": f(2, 1)}, {"axis": 1}, {}),
    "gather": ("Gather", {"x": f(11, 5)}, {"axis": 0}, {"i": i64([[0, -1], [3, 10]])}),
    "gather_axis1": ("Gather", {"x": f(3, 7, 2)}, {"axis": 1}, {"i": i64(4)}),
    "gather_elements": ("GatherElements", {"x": f(3, 4)}, {"axis": 1},
                        {"i": i64([[0, 3], [1, -1], [2, 2]])}),
    "gather_nd": ("GatherND", {"x": f(3, 4, 5)}, {}, {"i": i64([[0, 1], [2, 3]])}),
    "expand": ("Expand", {"x": f(3, 1)}, {}, {"s": i64([2, 3, 5])}),
    "matmul": ("MatMul", {"a": f(7, 13), "b": f(13, 300)}, {}, {}),
    "matmul_batched": ("MatMul", {"a": f(2, 3, 5, 7), "b": f(3, 7, 6)}, {}, {}),
    "matmul_vec": ("MatMul", {"a": f(7), "b": f(7, 3)}, {}, {}),
    "matmul_const": ("MatMul", {"a": f(1, 5, 11)}, {}, {"w": f(11, 3)}),
    "gemm": ("Gemm", {"a": f(3, 5)}, {"transB": 1, "alpha": 0.5, "beta": 2.0},
             {"w": f(7, 5), "c": f(7)}),
    "conv": ("Conv", {"x": f(1, 3, 11, 13)}, {"pads": [1, 1, 1, 1]}, {"w": f(5, 3, 3, 3),
                                                                       "b": f(5)}),
    "conv_stride_dil": ("Conv", {"x": f(2, 4, 17, 10)},
                        {"strides": [2, 3], "dilations": [2, 1], "pads": [2, 0, 1, 2]},
                        {"w": f(6, 4, 3, 2)}),
    "conv_groups": ("Conv", {"x": f(1, 6, 9, 9)}, {"group": 3, "pads": [1, 1, 1, 1]},
                    {"w": f(9, 2, 3, 3)}),
    "conv_depthwise": ("Conv", {"x": f(1, 8, 7, 7)}, {"group": 8, "strides": [2, 2],
                                                      "pads": [1, 1, 1, 1]},
                       {"w": f(8, 1, 3, 3)}),
    "conv_same": ("Conv", {"x": f(1, 2, 8, 7)}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
                  {"w": f(3, 2, 3, 3)}),
    "maxpool": ("MaxPool", {"x": f(1, 3, 11, 11)}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                                    "pads": [1, 1, 1, 1]}, {}),
    "maxpool_ceil": ("MaxPool", {"x": f(1, 2, 10, 9)}, {"kernel_shape": [3, 3],
                                                        "strides": [2, 2], "ceil_mode": 1}, {}),
    "avgpool_pad": ("AveragePool", {"x": f(1, 3, 7, 7)},
                    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, {}),
    "avgpool": ("AveragePool", {"x": f(1, 3, 8, 7)},
                {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}, {}),
    "global_avgpool": ("GlobalAveragePool", {"x": f(2, 3, 5, 7)}, {}, {}),
    "reduce_mean": ("ReduceMean", {"x": f(3, 5, 7)}, {"keepdims": 1}, {"ax": i64([-1])}),
    "reduce_sum_all": ("ReduceSum", {"x": f(3, 5)}, {"keepdims": 0}, {}),
    "reduce_max_mid": ("ReduceMax", {"x": f(2, 5, 3)}, {"keepdims": 0}, {"ax": i64([1])}),
    "reduce_max_int": ("ReduceMax", {"x": i64([[3, -7, 5], [-2, -9, -4]])}, {"keepdims": 0},
                       {"ax": i64([1])}),
    "reduce_min_int": ("ReduceMin", {"x": i64([[3, -7, 5], [-2, -9, -4]])}, {"keepdims": 1},
                       {"ax": i64([0])}),
    "softmax": ("Softmax", {"x": f(2, 3, 17) * 5}, {"axis": -1}, {}),
    "softmax_axis1": ("Softmax", {"x": f(2, 7, 3)}, {"axis": 1}, {}),
    "softmax_long_row": ("Softmax", {"x": f(2, 4099) * 3}, {"axis": -1}, {}),
    "layernorm": ("LayerNormalization", {"x": f(2, 3, 19)}, {"axis": -1, "epsilon": 1e-5},
                  {"s": f(19), "b": f(19)}),
    "layernorm_big_mean": ("LayerNormalization", {"x": f(3, 129) + 1e3}, {"axis": -1},
                           {"s": f(129), "b": f(129)}),
    "layernorm_2d_broadcast_scale": ("LayerNormalization", {"x": f(2, 3, 4, 5)}, {"axis": 2},
                                     {"s": f(1, 5), "b": f(4, 1)}),
    "logsumexp_large": ("ReduceLogSumExp", {"x": f(3, 7) * 50 + 100}, {"keepdims": 0},
                        {"ax": i64([1])}),
    "batchnorm": ("BatchNormalization", {"x": f(1, 3, 4, 5)}, {"epsilon": 1e-5},
                  {"s": f(3), "b": f(3), "m": f(3), "v": pos(3)}),
    "split": ("Split", {"x": f(2, 10)}, {"axis": 1}, {"sp": i64([3, 7])}),
    # GPT-2 GELU's Pow(x, 3) on signed inputs (simplify_pow makes it (x*x)*x)
    "pow_cube_signed": ("Pow", {"a": f(5, 19) * 3}, {}, {"b": np.array(3.0, np.float32)}),
}
N_OUTPUTS = {"split": 2}
