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


def ints(dtype, low, high, *shape):
    return R.integers(low, high, shape).astype(dtype)


def with_ties(*shape):
    """Floats from a few values, so arg-reductions meet ties."""
    return R.integers(-2, 3, shape).astype(np.float32)


def special(*shape):
    """Floats with zeros, -0, +-inf and NaN sprinkled in."""
    x = f(*shape)
    flat = x.reshape(-1)
    flat[::5] = 0.0
    flat[1::7] = -0.0
    flat[2::6] = np.inf
    flat[3::8] = -np.inf
    flat[4::9] = np.nan
    return x


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
    # short output rows (last dim <= 4: cpu injective._build_short_rows)
    "transpose_short_rows": ("Transpose", {"x": f(2, 3, 17, 9)}, {"perm": [0, 2, 3, 1]}, {}),
    "where_short_rows": ("Where", {"c": R.random((4, 5, 9, 1)) < 0.5, "a": f(4, 5, 9, 2),
                                   "b": f(1, 5, 1, 2)}, {}, {}),
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
    # constant weights are pre-packed on the cpu target; as a graph input they are not.
    # 23 output channels (not a multiple of any MR), N = 99 columns (a 3-column ragged
    # panel: the split-k narrow micro-kernel) and K = 63 (odd)
    "conv_ragged": ("Conv", {"x": f(1, 7, 9, 11)}, {"pads": [1, 1, 1, 1]},
                    {"w": f(23, 7, 3, 3), "b": f(23)}),
    "conv_weights_input": ("Conv", {"x": f(1, 7, 9, 11), "w": f(23, 7, 3, 3)},
                           {"pads": [1, 1, 1, 1]}, {}),
    "maxpool": ("MaxPool", {"x": f(1, 3, 11, 11)}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                                    "pads": [1, 1, 1, 1]}, {}),
    "maxpool_ceil": ("MaxPool", {"x": f(1, 2, 10, 9)}, {"kernel_shape": [3, 3],
                                                        "strides": [2, 2], "ceil_mode": 1}, {}),
    "avgpool_pad": ("AveragePool", {"x": f(1, 3, 7, 7)},
                    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, {}),
    # count_include_pad with auto_pad (the divisor counts the resolved pads) and the
    # ceil_mode overrun (not counted)
    "avgpool_pad_same": ("AveragePool", {"x": f(1, 2, 9, 8)},
                         {"kernel_shape": [3, 4], "auto_pad": "SAME_UPPER",
                          "count_include_pad": 1}, {}),
    "avgpool_pad_ceil": ("AveragePool", {"x": f(1, 2, 8, 9)},
                         {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1],
                          "ceil_mode": 1, "count_include_pad": 1}, {}),
    # kernels larger than the padded input under ceil_mode (an exported global pool):
    # one window per channel, cut to the input, as ONNX Runtime gives
    "avgpool_kernel_past_input": ("AveragePool", {"x": f(1, 3, 7, 7)},
                                  {"kernel_shape": [13, 13], "strides": [13, 13],
                                   "ceil_mode": 1}, {}),
    "maxpool_kernel_past_input": ("MaxPool", {"x": f(1, 2, 5, 6)},
                                  {"kernel_shape": [7, 8], "strides": [7, 8],
                                   "pads": [1, 1, 0, 0], "ceil_mode": 1}, {}),
    "avgpool": ("AveragePool", {"x": f(1, 3, 8, 7)},
                {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}, {}),
    # big enough for an interior (the branch-free windows) beside every border
    "maxpool_interior": ("MaxPool", {"x": f(1, 4, 21, 20)},
                         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                          "dilations": [2, 1]}, {}),
    "avgpool_interior": ("AveragePool", {"x": f(1, 3, 12, 13)},
                         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, {}),
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
    "softmax_lanes": ("Softmax", {"x": f(3, 37) * 4}, {"axis": -1}, {}),
    "logsoftmax_lanes": ("LogSoftmax", {"x": f(3, 45) * 4}, {"axis": -1}, {}),
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
# op coverage part B: ops the importer accepted with no kernel on either target
CASES.update({
    "trilu_upper_k": ("Trilu", {"x": f(2, 5, 7)}, {}, {"k": i64(2)}),
    "trilu_lower_neg_k": ("Trilu", {"x": f(6, 4)}, {"upper": 0}, {"k": i64(-1)}),
    "trilu_lower_int": ("Trilu", {"x": ints(np.int32, -9, 9, 3, 4, 3)}, {"upper": 0}, {}),
    "trilu_empty": ("Trilu", {"x": f(2, 0, 3)}, {}, {}),
    "argmax_keep": ("ArgMax", {"x": f(3, 7, 5)}, {"axis": 1}, {}),
    "argmax_last_ties": ("ArgMax", {"x": with_ties(4, 9)},
                         {"axis": -1, "keepdims": 0, "select_last_index": 1}, {}),
    "argmin_first_ties": ("ArgMin", {"x": with_ties(5, 3, 2)}, {"axis": 0, "keepdims": 0}, {}),
    "argmin_int_last": ("ArgMin", {"x": ints(np.int64, -3, 3, 3, 11)},
                        {"axis": 1, "select_last_index": 1}, {}),
    "hardmax": ("Hardmax", {"x": with_ties(3, 5, 4)}, {"axis": 1}, {}),
    "cumsum_mid": ("CumSum", {"x": f(3, 7, 5)}, {}, {"ax": np.array(1, np.int64)}),
    "cumsum_excl_rev": ("CumSum", {"x": f(4, 9)}, {"exclusive": 1, "reverse": 1},
                        {"ax": np.array(-1, np.int32)}),
    "cumsum_int_first": ("CumSum", {"x": ints(np.int32, -50, 50, 6, 5)}, {"exclusive": 1},
                         {"ax": np.array([0], np.int64)}),
    # scatters: data, indices (duplicates where the reduction makes them defined), updates
    "scatter_nd_slices": ("ScatterND", {"d": f(5, 4, 3), "i": i64([[3], [-5]]),
                                        "u": f(2, 4, 3)}, {}, {}),
    "scatter_nd_add_dups": ("ScatterND", {"d": f(3, 4, 5), "i": i64([[0, 1], [2, -1], [0, 1]]),
                                          "u": f(3, 5)}, {"reduction": "add"}, {}),
    "scatter_nd_mul_elems": ("ScatterND", {"d": f(2, 3),
                                           "i": i64([[[1, 2], [0, 0]], [[1, 2], [1, 0]]]),
                                           "u": f(2, 2)}, {"reduction": "mul"}, {}),
    "scatter_nd_max": ("ScatterND", {"d": f(4, 6), "i": i64([[1], [3], [1]]), "u": f(3, 6)},
                       {"reduction": "max"}, {}),
    "scatter_elements_axis1": ("ScatterElements", {"d": f(4, 6),
                                                   "i": i64([[0, 5], [-1, 2], [3, 4]]),
                                                   "u": f(3, 2)}, {"axis": 1}, {}),
    "scatter_elements_add_dups": ("ScatterElements",
                                  {"d": f(3, 5), "i": i64([[1, 0, 2, 1, 1], [1, 2, 2, 0, -2]]),
                                   "u": f(2, 5)}, {"axis": 0, "reduction": "add"}, {}),
    "scatter_elements_min": ("ScatterElements",
                             {"d": f(2, 3, 4),
                              "i": i64([[[0, 0, 3], [1, 1, 1]], [[2, 3, 2], [0, 1, 2]]]),
                              "u": f(2, 2, 3)}, {"axis": 2, "reduction": "min"}, {}),
    "bitwise_and_i32_bcast": ("BitwiseAnd", {"a": ints(np.int32, -2**31, 2**31 - 1, 3, 5),
                                             "b": ints(np.int32, -2**31, 2**31 - 1, 5)}, {}, {}),
    "bitwise_or_i8": ("BitwiseOr", {"a": ints(np.int8, -128, 127, 4, 3),
                                    "b": ints(np.int8, -128, 127, 4, 3)}, {}, {}),
    "bitwise_xor_i64": ("BitwiseXor", {"a": ints(np.int64, -2**62, 2**62, 7),
                                       "b": ints(np.int64, -2**62, 2**62, 2, 7)}, {}, {}),
    "bitwise_not_u8": ("BitwiseNot", {"x": ints(np.uint8, 0, 255, 3, 5)}, {}, {}),
    "bitwise_not_i64": ("BitwiseNot", {"x": ints(np.int64, -2**62, 2**62, 9)}, {}, {}),
    # (Gelu is opset 20, newer than these one-node models: its node tests cover it)
    "sign": ("Sign", {"x": special(4, 5)}, {}, {}),
    "sign_int": ("Sign", {"x": ints(np.int32, -3, 3, 11)}, {}, {}),
    "isnan": ("IsNaN", {"x": special(3, 7)}, {}, {}),
    "isinf_pos": ("IsInf", {"x": special(5, 4)}, {"detect_negative": 0}, {}),
    "prelu_channel": ("PRelu", {"x": f(2, 3, 4, 5)}, {}, {"s": f(3, 1, 1)}),
    "prelu_input_slope": ("PRelu", {"x": f(3, 7), "s": f(7)}, {}, {}),
    "batchnorm_runtime_params": ("BatchNormalization",
                                 {"x": f(2, 3, 4, 5), "s": f(3), "b": f(3), "m": f(3),
                                  "v": pos(3)}, {"epsilon": 1e-3}, {}),
    "pow_int32": ("Pow", {"a": ints(np.int32, -6, 7, 3, 5), "b": ints(np.int32, 0, 7, 5)},
                  {}, {}),
    "pow_int64_float_exp": ("Pow", {"a": ints(np.int64, -9, 10, 2, 4),
                                    "b": np.array([0.0, 1.0, 2.0, 3.0], np.float32)}, {}, {}),
    "mvn": ("MeanVarianceNormalization", {"x": f(2, 3, 5, 7) + 3}, {}, {}),
    "mvn_axes": ("MeanVarianceNormalization", {"x": f(3, 4, 5)}, {"axes": [0, 2]}, {}),
    "pad_reflect": ("Pad", {"x": f(3, 5, 4)}, {"mode": "reflect"},
                    {"p": i64([0, 2, 3, 1, 4, 0])}),
    "pad_edge_crop": ("Pad", {"x": f(4, 6)}, {"mode": "edge"}, {"p": i64([2, -1, 1, 3])}),
    "lrn": ("LRN", {"x": f(2, 7, 3, 5)}, {"size": 5, "alpha": 1e-2, "beta": 0.6, "bias": 1.5},
            {}),
    "resize_nearest_up": ("Resize", {"x": f(1, 2, 3, 4)}, {"mode": "nearest"},
                          {"roi": np.zeros(0, np.float32),
                           "sc": np.array([1, 1, 2.5, 1.75], np.float32)}),
    "resize_nearest_ceil_sizes": ("Resize", {"x": f(2, 3, 5, 7)},
                                  {"mode": "nearest", "nearest_mode": "ceil",
                                   "coordinate_transformation_mode": "asymmetric",
                                   "axes": [3, 2]},
                                  {"roi": np.zeros(0, np.float32),
                                   "sc": np.zeros(0, np.float32), "sz": i64([4, 8])}),
    "resize_linear_down": ("Resize", {"x": f(1, 3, 11, 9)}, {"mode": "linear"},
                           {"roi": np.zeros(0, np.float32),
                            "sc": np.array([1, 1, 0.6, 0.8], np.float32)}),
    "resize_linear_align_up": ("Resize", {"x": f(2, 2, 4, 5)},
                               {"mode": "linear",
                                "coordinate_transformation_mode": "align_corners"},
                               {"roi": np.zeros(0, np.float32),
                                "sc": np.zeros(0, np.float32), "sz": i64([2, 2, 7, 9])}),
    "resize_cubic": ("Resize", {"x": f(1, 1, 6, 5)}, {"mode": "cubic", "exclude_outside": 1,
                                                      "cubic_coeff_a": -0.5},
                     {"roi": np.zeros(0, np.float32),
                      "sc": np.array([1, 1, 1.5, 2], np.float32)}),
    "resize_tf_crop": ("Resize", {"x": f(1, 2, 6, 7)},
                       {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
                        "extrapolation_value": 3.5, "axes": [2, 3]},
                       {"roi": np.array([0.2, -0.1, 0.9, 1.3], np.float32),
                        "sc": np.zeros(0, np.float32), "sz": i64([5, 4])}),
    "resize_linear_antialias": ("Resize", {"x": f(1, 2, 13, 9)},
                                {"mode": "linear", "antialias": 1},
                                {"roi": np.zeros(0, np.float32),
                                 "sc": np.zeros(0, np.float32), "sz": i64([1, 2, 5, 4])}),
})
N_OUTPUTS = {"split": 2}
