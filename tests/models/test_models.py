"""Tests for the ``models`` package: ONNX benchmark-model builders."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models
from models.__main__ import main as cli_main

# Op types each model must contain (full and tiny alike).
EXPECTED_OPS = {
    "resnet50": {"Conv", "BatchNormalization", "Relu", "MaxPool", "Add", "GlobalAveragePool",
                 "Flatten", "Gemm"},
    "inception_v3": {"Conv", "BatchNormalization", "Relu", "MaxPool", "AveragePool", "Concat",
                     "GlobalAveragePool", "Dropout", "Flatten", "Gemm"},
    "mobilenet_v2": {"Conv", "BatchNormalization", "Clip", "Constant", "Add",
                     "GlobalAveragePool", "Flatten", "Gemm"},
    "bert_base": {"Gather", "Add", "LayerNormalization", "Unsqueeze", "Cast", "Sub", "Mul",
                  "MatMul", "Shape", "Concat", "Reshape", "Transpose", "Div", "Softmax", "Erf",
                  "Constant"},
    "gpt2": {"Range", "Unsqueeze", "Gather", "Add", "LayerNormalization", "MatMul", "Split",
             "Shape", "Concat", "Reshape", "Transpose", "Div", "Slice", "Where", "Softmax", "Mul",
             "Pow", "Tanh", "Constant"},
}

OUTPUTS = {  # name -> (output name, full shape, tiny shape)
    "resnet50": ("output", (1, 1000), (1, 10)),
    "inception_v3": ("output", (1, 1000), (1, 10)),
    "mobilenet_v2": ("output", (1, 1000), (1, 10)),
    "bert_base": ("last_hidden_state", (1, 128, 768), (1, 16, 32)),
    "gpt2": ("logits", (1, 128, 50257), (1, 16, 100)),
}

INPUTS = {  # name -> full input specs
    "resnet50": {"input": (np.float32, (1, 3, 224, 224))},
    "inception_v3": {"input": (np.float32, (1, 3, 299, 299))},
    "mobilenet_v2": {"input": (np.float32, (1, 3, 224, 224))},
    "bert_base": {"input_ids": (np.int64, (1, 128)), "attention_mask": (np.int64, (1, 128))},
    "gpt2": {"input_ids": (np.int64, (1, 128))},
}


def op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_outputs(y: np.ndarray) -> None:
    assert np.isfinite(y).all(), "non-finite outputs"
    std = float(y.astype(np.float64).std())
    assert 1e-3 < std < 1e3, f"output std {std} out of range"
    assert np.abs(y).max() < 1e4, "exploding outputs"
    flat = y.reshape(-1, y.shape[-1])
    assert (flat.std(axis=-1) > 1e-4).all(), "some output rows are constant"


def check_model_common(name: str, model: onnx.ModelProto, tiny: bool) -> None:
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert op_types(model) == EXPECTED_OPS[name]
    out_name, full_shape, tiny_shape = OUTPUTS[name]
    assert [o.name for o in model.graph.output] == [out_name]
    feeds = models.sample_inputs(model, seed=0)
    (y,) = run_ort(model, feeds)
    assert y.shape == (tiny_shape if tiny else full_shape)
    assert y.dtype == np.float32
    check_outputs(y)


@pytest.fixture(scope="module")
def tiny_models() -> dict[str, onnx.ModelProto]:
    return {name: models.build(name, tiny=True) for name in models.REGISTRY}


def test_registry_names():
    assert set(models.REGISTRY) == set(EXPECTED_OPS)
    with pytest.raises(ValueError):
        models.build("no_such_model")


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_tiny_model(name, tiny_models):
    model = tiny_models[name]
    onnx.checker.check_model(model, full_check=True)
    check_model_common(name, model, tiny=True)


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_tiny_deterministic_and_seeded(name, tiny_models):
    again = models.build(name, tiny=True, seed=0)
    assert again.SerializeToString() == tiny_models[name].SerializeToString()
    other = models.build(name, tiny=True, seed=1)
    a = {t.name: t.raw_data for t in tiny_models[name].graph.initializer}
    b = {t.name: t.raw_data for t in other.graph.initializer}
    assert a.keys() == b.keys() and a != b


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_node_and_value_names_unique(name, tiny_models):
    g = tiny_models[name].graph
    names = [n.name for n in g.node]
    assert all(names) and len(names) == len(set(names))
    produced = [o for n in g.node for o in n.output]
    assert len(produced) == len(set(produced))
    assert all(n.name.startswith("/") for n in g.node)


def test_exporter_style_names(tiny_models):
    resnet = {n.name for n in tiny_models["resnet50"].graph.node}
    assert {"/conv1/Conv", "/bn1/BatchNormalization", "/maxpool/MaxPool",
            "/layer1/layer1.0/conv1/Conv", "/layer1/layer1.0/relu/Relu_2",
            "/layer1/layer1.0/downsample/downsample.0/Conv", "/fc/Gemm"} <= resnet
    bert = {n.name for n in tiny_models["bert_base"].graph.node}
    assert {"/encoder/layer.0/attention/self/query/MatMul",
            "/encoder/layer.1/intermediate/intermediate_act_fn/Erf",
            "/embeddings/LayerNorm/LayerNormalization"} <= bert
    gpt = {n.name for n in tiny_models["gpt2"].graph.node}
    assert {"/transformer/h.0/attn/Split", "/transformer/h.1/mlp/act/Tanh",
            "/transformer/Range", "/lm_head/MatMul"} <= gpt
    inits = {t.name for t in tiny_models["resnet50"].graph.initializer}
    assert {"conv1.weight", "bn1.running_var", "layer1.0.downsample.1.weight"} <= inits


@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_input_specs(name, tiny_models):
    full = {k: (np.dtype(d), s) for k, (d, s) in INPUTS[name].items()}
    specs = models.input_specs(tiny_models[name])
    assert list(specs) == list(full)
    for k, (dtype, shape) in specs.items():
        assert dtype == full[k][0] and len(shape) == len(full[k][1]) and shape[0] == 1


def test_sample_inputs_nlp(tiny_models):
    feeds = models.sample_inputs(tiny_models["bert_base"], seed=3)
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 100
    assert mask.dtype == np.int64 and mask[0, 0] == 1 and mask[0, -1] == 0
    assert set(np.unique(mask)) == {0, 1}
    gfeeds = models.sample_inputs(tiny_models["gpt2"], seed=3)
    assert gfeeds["input_ids"].max() < 100
    img = models.sample_inputs(tiny_models["resnet50"], seed=3)["input"]
    assert img.dtype == np.float32 and abs(float(img.std()) - 1.0) < 0.1


@pytest.mark.parametrize("name", ["resnet50", "inception_v3", "mobilenet_v2"])
def test_fold_bn_is_equivalent(name, tiny_models):
    folded = models.build(name, tiny=True, fold_bn=True)
    onnx.checker.check_model(folded, full_check=True)
    assert "BatchNormalization" not in op_types(folded)
    assert op_types(folded) == EXPECTED_OPS[name] - {"BatchNormalization"}
    feeds = models.sample_inputs(folded)
    (a,) = run_ort(tiny_models[name], feeds)
    (b,) = run_ort(folded, feeds)
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * float(np.abs(a).max()))


def test_gpt2_is_causal(tiny_models):
    model = tiny_models["gpt2"]
    feeds = models.sample_inputs(model)
    (a,) = run_ort(model, feeds)
    ids = feeds["input_ids"].copy()
    ids[0, 10:] = (ids[0, 10:] + 1) % 100
    (b,) = run_ort(model, {"input_ids": ids})
    np.testing.assert_allclose(a[:, :10], b[:, :10], rtol=1e-5, atol=1e-5)
    assert not np.allclose(a[:, 10:], b[:, 10:])


def test_gpt2_without_lm_head():
    model = models.build("gpt2", tiny=True, lm_head=False)
    onnx.checker.check_model(model, full_check=True)
    (y,) = run_ort(model, models.sample_inputs(model))
    assert [o.name for o in model.graph.output] == ["last_hidden_state"]
    assert y.shape == (1, 16, 32)
    check_outputs(y)


def test_gpt2_dynamic_is_the_static_model_at_every_length(tiny_models):
    """`dynamic=True`: input and logits [1, "seq", V], the same weights, the static
    model's logits at its length, any length 1..n_ctx runs, a prefix's logits are the
    longer sequence's first rows (causal), and past the position table ORT refuses."""
    model = models.build("gpt2", tiny=True, dynamic=True)
    onnx.checker.check_model(model, full_check=True)
    shape = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert shape == [1, "seq"]
    assert [d.dim_param or d.dim_value
            for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, "seq", 100]
    static = tiny_models["gpt2"]
    assert {t.name: t.raw_data for t in model.graph.initializer} == \
        {t.name: t.raw_data for t in static.graph.initializer}
    feeds = models.sample_inputs(static)
    np.testing.assert_allclose(run_ort(model, feeds)[0], run_ort(static, feeds)[0],
                               rtol=1e-5, atol=1e-6)
    ids = np.random.default_rng(1).integers(0, 100, (1, 32), dtype=np.int64)
    (full,) = run_ort(model, {"input_ids": ids})
    assert full.shape == (1, 32, 100)
    for length in (1, 7):
        (part,) = run_ort(model, {"input_ids": ids[:, :length]})
        np.testing.assert_allclose(part, full[:, :length], rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="out of data bounds"):
        run_ort(model, {"input_ids": np.zeros((1, 33), np.int64)})


def test_bert_attention_mask_is_applied(tiny_models):
    model = tiny_models["bert_base"]
    feeds = models.sample_inputs(model)
    n_valid = int(feeds["attention_mask"].sum())
    (a,) = run_ort(model, feeds)
    ids = feeds["input_ids"].copy()
    ids[0, n_valid:] = (ids[0, n_valid:] + 1) % 100  # change only masked-out tokens
    (b,) = run_ort(model, {**feeds, "input_ids": ids})
    np.testing.assert_allclose(a[:, :n_valid], b[:, :n_valid], rtol=1e-5, atol=1e-5)
    (c,) = run_ort(model, {**feeds, "attention_mask": np.ones_like(feeds["attention_mask"])})
    assert not np.allclose(a[:, :n_valid], c[:, :n_valid])


def test_external_data_round_trip(tmp_path, tiny_models):
    model = tiny_models["resnet50"]
    before = model.SerializeToString()
    path = tmp_path / "resnet50_tiny.onnx"
    models.save(model, path, external_data=True)
    assert model.SerializeToString() == before, "save() must not modify its argument"
    data = tmp_path / "resnet50_tiny.data"
    assert data.exists() and data.stat().st_size > path.stat().st_size
    models.save(model, path, external_data=True)  # overwriting must not grow the data file
    assert data.stat().st_size < 2 * path.stat().st_size + 200_000
    loaded = onnx.load(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    orig = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    back = {t.name: onnx.numpy_helper.to_array(t) for t in loaded.graph.initializer}
    assert orig.keys() == back.keys()
    for k in orig:
        np.testing.assert_array_equal(orig[k], back[k])
    feeds = models.sample_inputs(model)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, feeds)[0], run_ort(model, feeds)[0])


def test_save_inline(tmp_path, tiny_models):
    path = tmp_path / "bert.onnx"
    models.save(tiny_models["bert_base"], path)
    assert onnx.load(str(path)).SerializeToString() == tiny_models["bert_base"].SerializeToString()
    assert not (tmp_path / "bert.data").exists()


def test_cli(tmp_path, capsys):
    assert cli_main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(models.REGISTRY)
    out = tmp_path / "m.onnx"
    assert cli_main(["mobilenet_v2", "-o", str(out), "--tiny", "--seed", "2", "--fold-bn"]) == 0
    loaded = onnx.load(str(out))
    expected = models.build("mobilenet_v2", tiny=True, seed=2, fold_bn=True)
    assert loaded.SerializeToString() == expected.SerializeToString()
    gpath = tmp_path / "sub" / "g.onnx"  # missing directories are created
    assert cli_main(["gpt2", "-o", str(gpath), "--tiny", "--external-data"]) == 0
    assert (tmp_path / "sub" / "g.data").exists()


def test_cli_sample(tmp_path, capsys):
    path = tmp_path / "bert.onnx"
    model = models.build("bert_base", tiny=True)
    models.save(model, path, external_data=True)
    out = tmp_path / "in" / "input.npz"
    assert cli_main(["--sample", str(path), "-o", str(out), "--seed", "4"]) == 0
    with np.load(out) as data:
        loaded = {k: data[k] for k in data.files}
    expected = models.sample_inputs(model, seed=4)
    assert loaded.keys() == expected.keys()
    for k in expected:
        np.testing.assert_array_equal(loaded[k], expected[k])
        assert loaded[k].dtype == expected[k].dtype


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED_OPS))
def test_full_model(name):
    model = models.build(name)
    onnx.checker.check_model(model, full_check=True)
    assert {k: (np.dtype(d), s) for k, (d, s) in INPUTS[name].items()} == models.input_specs(model)
    check_model_common(name, model, tiny=False)
