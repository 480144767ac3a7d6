"""The loss, normalization and Einsum decompositions (frontend/onnx/losses.py,
normalization.py, einsum.py): the imported graph run by the numpy oracle against onnx's
ReferenceEvaluator or numpy (float32: rtol 1e-5; float64: 1e-10), the fused
LayerNormalization kept when only Y is read, a few models compiled for the CPU, and the
one-line errors for bad attributes and shapes."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import hidetc.tools.onnx_backend as backend
from hidetc.errors import ModelError
from hidetc.frontend import import_model
from hidetc.graph.reference import run_graph

F, D, I32, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64
NP = {F: np.float32, D: np.float64, I32: np.int32, I64: np.int64}


def model(op, inputs, outputs=("y",), opset=21, **attrs):
    """A one-node model; inputs: (name, elem type, shape); outputs: names ("" omitted)."""
    node = helper.make_node(op, [n for n, _, _ in inputs], list(outputs), name="n", **attrs)
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs if o]
    graph = helper.make_graph([node], "g", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def ours(proto, feeds):
    return list(run_graph(import_model(proto), feeds).values())


def assert_close(got, want, rtol=1e-5):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)


# ----------------------------------------------------------------------------- losses
def loss_case(op, shape, reduction, weight, ignore, rng, index=I64, log_prob=False):
    n, c, rest = shape[0], shape[1], list(shape[2:])
    inputs = [("x", F, list(shape)), ("t", index, [n] + rest)]
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "t": rng.integers(0, c, [n] + rest).astype(NP[index])}
    if ignore is not None:
        flat = feeds["t"].reshape(-1)
        flat[::3] = ignore            # include ignored samples (even out of [0, C))
    if weight:
        inputs.append(("w", F, [c]))
        feeds["w"] = rng.uniform(0.1, 2.0, c).astype(np.float32)
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    outputs = ("loss", "log_prob") if log_prob else ("loss",)
    opset = 22 if op == "NegativeLogLikelihoodLoss" else 13
    return model(op, inputs, outputs, opset=opset, **attrs), feeds


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("shape, reduction, weight, ignore", [
    ((3, 5), "none", False, None),
    ((3, 5), "mean", True, None),
    ((3, 5, 4), "sum", False, 2),
    ((3, 5, 4), "mean", True, 10),          # ignore_index beyond C: clamped before gathers
    ((2, 4, 3, 2), "mean", False, 1),
    ((2, 4, 3, 2), "none", True, -5),
    ((2, 3, 2, 2, 2), "sum", True, 0),
])
def test_losses_match_the_reference(op, shape, reduction, weight, ignore):
    rng = np.random.default_rng(1)
    proto, feeds = loss_case(op, shape, reduction, weight, ignore, rng)
    assert_close(ours(proto, feeds), ReferenceEvaluator(proto).run(None, feeds))


def test_sce_log_prob_output_and_int32_labels():
    rng = np.random.default_rng(2)
    proto, feeds = loss_case("SoftmaxCrossEntropyLoss", (2, 4, 3), "mean", True, 3, rng,
                             index=I32, log_prob=True)
    got = ours(proto, feeds)
    assert_close(got, ReferenceEvaluator(proto).run(None, feeds))
    assert got[1].shape == (2, 4, 3)


def test_unweighted_mean_with_ignore_index_divides_by_the_samples_kept():
    # the function body's semantics (the reference's no-weight, ignore_index=-1 shortcut
    # averages over every sample instead)
    rng = np.random.default_rng(3)
    proto, feeds = loss_case("NegativeLogLikelihoodLoss", (4, 3, 5), "mean", False, -1, rng)
    x, t = feeds["x"], feeds["t"]
    keep = t != -1
    picked = np.take_along_axis(x, np.where(keep, t, 0)[:, None], axis=1)[:, 0]
    want = np.float32(-(picked * keep).sum() / keep.sum())
    np.testing.assert_allclose(ours(proto, feeds)[0], want, rtol=1e-5)


def test_loss_errors_are_one_line():
    bad_target = model("NegativeLogLikelihoodLoss", [("x", F, [3, 5]), ("t", I64, [4])],
                       opset=22)
    with pytest.raises(ModelError, match=r"input 1 \(target\) has shape \[4\], expected \[3\]"):
        import_model(bad_target)
    bad_reduction = model("SoftmaxCrossEntropyLoss", [("x", F, [3, 5]), ("t", I64, [3])],
                          opset=13, reduction="avg")
    with pytest.raises(ModelError, match="reduction 'avg' is not one of none, sum, mean"):
        import_model(bad_reduction)


# ---------------------------------------------------------------------- normalization
def layer_norm(shape, axis, outputs, bias=True, dtype=F, **attrs):
    normalized = list(shape[axis:])
    inputs = [("x", dtype, list(shape)), ("s", dtype, normalized)]
    if bias:
        inputs.append(("b", dtype, normalized))
    return model("LayerNormalization", inputs, outputs, opset=17, axis=axis, **attrs)


def norm_feeds(proto, rng):
    feeds = {}
    for value in proto.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(shape).astype(
            NP[value.type.tensor_type.elem_type]) * 3 + 1
    return feeds


@pytest.mark.parametrize("shape, axis, outputs, bias, dtype, attrs", [
    ((2, 3, 5), -1, ("y", "mean", "inv"), True, F, {}),
    ((2, 3, 5), 1, ("y", "mean", "inv"), True, F, {"epsilon": 0.1}),
    ((4, 6), 0, ("y", "", "inv"), False, F, {}),
    ((2, 3, 4, 2), -3, ("y", "mean"), True, F, {}),
])
def test_layer_normalization_statistics_match_the_reference(shape, axis, outputs, bias,
                                                            dtype, attrs):
    proto = layer_norm(shape, axis, outputs, bias, dtype, **attrs)
    feeds = norm_feeds(proto, np.random.default_rng(4))
    got = ours(proto, feeds)
    assert_close(got, ReferenceEvaluator(proto).run(None, feeds), rtol=1e-5)
    assert [n.op for n in import_model(proto).nodes].count("LayerNormalization") == 0


@pytest.mark.parametrize("stash, stats_dtype", [(1, np.float32), (11, np.float64)])
def test_layer_normalization_statistics_have_the_stash_type(stash, stats_dtype):
    # as the spec and onnx's type inference say (the reference keeps X's type, stash 1 only)
    proto = layer_norm((2, 3, 4), 1, ("y", "mean", "inv"), dtype=D, stash_type=stash)
    feeds = norm_feeds(proto, np.random.default_rng(9))
    x, s, b = feeds["x"], feeds["s"], feeds["b"]
    mean = x.mean(axis=(1, 2), keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=(1, 2), keepdims=True) + 1e-5)
    y, got_mean, got_inv = ours(proto, feeds)
    assert y.dtype == np.float64 and got_mean.dtype == got_inv.dtype == stats_dtype
    rtol = 1e-5 if stash == 1 else 1e-12
    np.testing.assert_allclose(y, (x - mean) * inv * s + b, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(got_mean, mean, rtol=rtol)
    np.testing.assert_allclose(got_inv, inv, rtol=rtol)


def test_layer_normalization_with_only_y_read_stays_one_fused_node():
    for outputs in (("y",), ("y", "mean", "inv")):
        proto = layer_norm((2, 3, 5), -1, outputs, epsilon=1e-3)
        del proto.graph.output[1:]      # Mean/InvStdDev named but read by nobody
        graph = import_model(proto)
        assert [(n.op, n.outputs) for n in graph.nodes] == [("LayerNormalization", ("y",))]
        assert dict(graph.nodes[0].attrs) == {"axis": -1, "epsilon": pytest.approx(1e-3)}


def test_layer_normalization_mean_read_by_a_node():
    proto = layer_norm((3, 4), -1, ("y", "mean"))
    proto.graph.node.append(helper.make_node("Neg", ["mean"], ["z"], name="neg"))
    proto.graph.output[1].name = "z"
    feeds = norm_feeds(proto, np.random.default_rng(5))
    mean = feeds["x"].astype(np.float64).mean(axis=-1, keepdims=True)
    np.testing.assert_allclose(ours(proto, feeds)[1], -mean, rtol=1e-6)


@pytest.mark.parametrize("shape, axis, p", [
    ((2, 2, 3), -1, 2), ((2, 2, 3), 0, 2), ((3, 4), 1, 1), ((5,), 0, 1), ((2, 3, 4), 1, 1),
])
def test_lp_normalization_matches_the_spec(shape, axis, p):
    proto = model("LpNormalization", [("x", F, list(shape))], opset=22, axis=axis, p=p)
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    x[(0,) * x.ndim] = 0.0
    if x.ndim > 1:
        x[1] = 0.0                 # a zero norm somewhere (for axis 0, with p=2 below)
    norm = np.sum(np.abs(x) ** p, axis=axis, keepdims=True) ** (1.0 / p)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.where(norm == 0, 0, x / norm).astype(np.float32)
    assert_close(ours(proto, {"x": x}), [want])


def test_lp_normalization_rejects_other_orders():
    proto = model("LpNormalization", [("x", F, [2, 3])], opset=22, p=3)
    with pytest.raises(ModelError, match=r"node 'n' \(LpNormalization\): p=3 is not supported"):
        import_model(proto)


# ----------------------------------------------------------------------------- einsum
EQUATIONS = [
    ("ij->ji", [(3, 4)]), ("...ii->...i", [(3, 5, 5)]), ("i,i", [(5,), (5,)]), ("->", [()]),
    ("ij->i", [(3, 4)]), ("bij, bjk -> bik", [(5, 2, 3), (5, 3, 4)]), ("ii", [(4, 4)]),
    ("iii->i", [(3, 3, 3)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij,ij->", [(2, 3), (2, 3)]), ("i,j->ij", [(2,), (3,)]),
    ("...ij,...jk", [(2, 1, 3, 4), (5, 4, 2)]), ("ba", [(2, 3)]), ("Ba", [(2, 3)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]), ("ij,j->ij", [(2, 1), (3,)]),
    ("iij,jk->ik", [(3, 3, 2), (2, 4)]), ("ab,cd->", [(2, 3), (4, 5)]),
    ("a...,a...->...", [(3, 2, 4), (3, 1, 4)]), ("ij,ik->jk", [(3, 2), (3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
]


@pytest.mark.parametrize("equation, shapes", EQUATIONS)
def test_einsum_matches_numpy(equation, shapes):
    rng = np.random.default_rng(7)
    inputs = [(f"x{i}", D, list(s)) for i, s in enumerate(shapes)]
    feeds = {f"x{i}": rng.standard_normal(s) for i, s in enumerate(shapes)}
    proto = model("Einsum", inputs, opset=12, equation=equation)
    want = np.einsum(equation.replace(" ", ""), *feeds.values())
    assert_close(ours(proto, feeds), [np.asarray(want)], rtol=1e-10)


def test_einsum_on_integers():
    proto = model("Einsum", [("a", I64, [2, 3]), ("b", I64, [3, 4])], opset=12,
                  equation="ij,jk->ki")
    feeds = {"a": np.arange(6).reshape(2, 3), "b": np.arange(12).reshape(3, 4) - 5}
    np.testing.assert_array_equal(ours(proto, feeds)[0], np.einsum("ij,jk->ki", *feeds.values()))


@pytest.mark.parametrize("equation, shapes, message", [
    ("ij,jk->ik", [(2, 3)], "has 2 input term"),
    ("ijk->i", [(2, 3)], "term 'ijk' has 3 labels for an operand of rank 2"),
    ("ij->k", [(2, 3)], "output label 'k' appears but in no input"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j' has sizes 3 and 4"),
    ("...ij->ij", [(4, 2, 3)], "the output has no '...'"),
    ("i1->i", [(2, 3)], "has label '1'"),
])
def test_einsum_errors_are_one_line(equation, shapes, message):
    inputs = [(f"x{i}", F, list(s)) for i, s in enumerate(shapes)]
    with pytest.raises(ModelError, match=message):
        import_model(model("Einsum", inputs, opset=12, equation=equation))


# -------------------------------------------------------------------- compiled (CPU)
def test_compiled_on_cpu_match_the_reference():
    rng = np.random.default_rng(8)
    sce, sce_feeds = loss_case("SoftmaxCrossEntropyLoss", (2, 4, 3), "mean", True, 10, rng,
                               log_prob=True)
    norm = layer_norm((2, 3, 5), 1, ("y", "mean", "inv"))
    eins = model("Einsum", [("a", F, [2, 3, 4]), ("b", F, [2, 4, 5])], opset=12,
                 equation="bij,bjk->bki")
    cases = [(sce, sce_feeds), (norm, norm_feeds(norm, rng)),
             (eins, {"a": rng.standard_normal((2, 3, 4)).astype(np.float32),
                     "b": rng.standard_normal((2, 4, 5)).astype(np.float32)})]
    for proto, feeds in cases:
        with backend.prepare(proto, "CPU") as rep:
            got = [np.asarray(v) for v in rep.run(feeds)]
        assert_close(got, ReferenceEvaluator(proto).run(None, feeds), rtol=1e-4)
