"""One cuda artifact for a range of sizes (issue 36), cross-compiled (nvcc builds the
cubins; no GPU needed) and run in the emulator, sanitized, at three sizes of each
range against ONNX Runtime: the kernels take the sizes as int64 parameters, the grids
are expressions of them in the manifest, and each size runs its dispatch variant.
f32 at the f32 bound (1e-4 norm-wise), f16 (tensor cores, fused attention) at f16's."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml
from helpers.exporter_fixtures import DATA, assert_matches, reference

import hidetc
import models
from hidetc.driver.config import TOLERANCES
from hidetc.driver.verify import compare, run_onnxruntime
from hidetc.errors import InputError

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    out = tmp_path_factory.mktemp("cnn-cuda") / "out"
    hidetc.compile_model(DATA / "cnn_ts.onnx", out, target="cuda", arch="sm_90",
                         dims={"batch": "1..8"})
    return out


@pytest.fixture(scope="module")
def bert_f16(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bert-cuda")
    path = tmp / "bert.onnx"
    models.save(models.bert.build_bert_base(tiny=True, dynamic=True), path)
    hidetc.compile_model(path, tmp / "out", target="cuda", arch="sm_90", precision="f16",
                         dims={"seq": "1..32"})
    return path, tmp / "out"


def test_the_manifest_holds_grids_over_the_sizes(cnn):
    manifest = yaml.safe_load((cnn / "manifest.yaml").read_text())
    variants = manifest["dynamic"]["variants"]
    section = manifest["cuda"]
    assert len(section["variant_launches"]) == len(variants) - 1 >= 2
    grids = [d for launches in section["variant_launches"] for launch in launches
             for d in launch["grid"]]
    assert any(isinstance(d, str) and "batch" in d for d in grids)
    assert any(arg == ["size", 0] for launches in section["variant_launches"]
               for launch in launches for arg in launch["args"])
    sources = "".join(p.read_text() for p in (cnn / "kernels" / "src").glob("*.cu"))
    assert "int64_t sym_batch" in sources
    assert manifest["dynamic"]["graph_cache"] == 8
    assert all(k["registers"] > 0 for k in manifest["kernels"])     # ptxas read back


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_cnn_at_three_batches_in_the_emulator(cnn, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
    model = hidetc.load(cnn, emulate=True, sanitize=True)
    assert_matches(model.run({"x": x}), reference("cnn_ts", {"x": x}))


def test_a_size_outside_the_range_is_one_line(cnn):
    model = hidetc.load(cnn, emulate=True)
    with pytest.raises(InputError, match=r"^input 'x' dim 0 \('batch'\) is 9, outside its "
                                         r"range 1\.\.8$"):
        model.run({"x": np.zeros((9, 3, 16, 16), np.float32)})


@pytest.mark.parametrize("seq", [1, 7, 32])
def test_f16_bert_at_three_lengths_in_the_emulator(bert_f16, seq):
    path, out = bert_f16
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert any(k["op"] == "FusedAttention" for k in manifest["kernels"])
    rng = np.random.default_rng(seq)
    feeds = {"input_ids": rng.integers(0, 100, (1, seq)).astype(np.int64),
             "attention_mask": np.ones((1, seq), np.int64)}
    model = hidetc.load(out, emulate=True, sanitize=True)
    report = compare(model.run(feeds), run_onnxruntime(path, feeds), rtol=TOLERANCES["f16"])
    assert report["status"] == "passed", report


def test_two_symbols_dispatch_in_the_emulator(tmp_path):
    out = tmp_path / "out"
    hidetc.compile_model(DATA / "encoder_dynamo.onnx", out, target="cuda", arch="sm_90",
                         dims={"batch": "1..3", "seq": "1..40"},
                         dim_opts={"batch": [3], "seq": [8, 40]})
    model = hidetc.load(out, emulate=True, sanitize=True)
    for b, s in ((1, 1), (2, 13), (3, 40)):
        ids = np.random.default_rng(b * 100 + s).integers(0, 32, (b, s)).astype(np.int64)
        assert_matches(model.run({"ids": ids}), reference("encoder_dynamo", {"ids": ids}))


def test_a_profile_in_the_emulator_follows_the_size_s_variant(cnn):
    manifest = yaml.safe_load((cnn / "manifest.yaml").read_text())
    last = len(manifest["dynamic"]["variants"]) - 1
    model = hidetc.load(cnn, emulate=True)
    rows = model.profile({"x": np.zeros((8, 3, 16, 16), np.float32)})
    launches = manifest["cuda"]["variant_launches"][last - 1]
    assert [r["kernel"] for r in rows] == [launch["kernel"] for launch in launches]
    assert [r["grid"] for r in rows] == [launch["grid"] for launch in launches]


def test_the_sanitizer_sees_every_variant_s_arena(cnn):
    """Each dispatch variant's arena is poisoned and its values spaced between red zones
    by its own layout (the manifest's per-variant memory): a launch that never ran at
    batch 8 leaves the kernel after it reading poison, and the sanitizer says so."""
    from hidetc.backends.runtime.emulated import SanitizerError
    model = hidetc.load(cnn, emulate=True, sanitize=True)
    module = model._executor.module
    launch, skipped = module.launch, []

    def skip_the_first(kernel, *args, **kwargs):
        if not skipped:
            skipped.append(kernel)
            return None
        return launch(kernel, *args, **kwargs)
    module.launch = skip_the_first
    with pytest.raises(SanitizerError, match="poison"):
        model.run({"x": np.ones((8, 3, 16, 16), np.float32)})
    assert skipped


def test_a_small_m_range_of_half_matmuls(tmp_path):
    """x[b, 384] @ w for b in 1..256 in f16 on an A100: the small-M hints would pick the
    GEMV kernel or split-K, which are shaped by a static M (rows, tile count); over a
    range of M the compile takes the tensor-core kernel without split instead (it
    failed with 'the size b is symbolic, not a number'), right at every size."""
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((384, 96)).astype(np.float32) * 0.05
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 384])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 96])],
        [numpy_helper.from_array(w, "w")])
    path = tmp_path / "m.onnx"
    models.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    hidetc.compile_model(path, tmp_path / "out", target="cuda", precision="f16", gpu="a100",
                         dims={"b": "1..256"}, verify=False)
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    for b in (1, 3, 100):
        x = np.random.default_rng(b).standard_normal((b, 384)).astype(np.float32)
        report = compare(model.run({"x": x}), {"y": x @ w}, rtol=TOLERANCES["f16"])
        assert report["status"] == "passed", (b, report)
