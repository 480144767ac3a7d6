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
from hidetc.driver.backend import backend_of
from hidetc.driver.config import TOLERANCES
from hidetc.driver.tune.records import CandidateResult
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


def _batch_matmul_model(root, k: int, scale: float, seed: int):
    """m.onnx under `root`: y[b, 96] = x[b, k] @ w (w random, `scale`); (path, w)."""
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(seed).standard_normal((k, 96)).astype(np.float32) * scale
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 96])],
        [numpy_helper.from_array(w, "w")])
    path = root / "m.onnx"
    models.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, w


def test_a_small_m_range_of_half_matmuls(tmp_path):
    """x[b, 384] @ w for b in 1..256 in f16 on an A100: the small-M hints would pick the
    GEMV kernel or split-K, which are shaped by a static M (rows, tile count); over a
    range of M the compile takes the tensor-core kernel without split instead (it
    failed with 'the size b is symbolic, not a number'), right at every size."""
    path, w = _batch_matmul_model(tmp_path, 384, 0.05, seed=0)
    hidetc.compile_model(path, tmp_path / "out", target="cuda", precision="f16", gpu="a100",
                         dims={"b": "1..256"}, verify=False)
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    for b in (1, 3, 100):
        x = np.random.default_rng(b).standard_normal((b, 384)).astype(np.float32)
        report = compare(model.run({"x": x}), {"y": x @ w}, rtol=TOLERANCES["f16"])
        assert report["status"] == "passed", (b, report)



class _SplitFavouringFarm:
    """A stand-in tuning farm (the farm protocol lets a GPU-less compile tune): every
    split-K candidate measures fastest, as one may on a GPU at the build's hint."""

    def __init__(self):
        self.seen = []

    def record_facts(self, target, present=False):
        return backend_of(target).record_facts(target, True)

    def _times(self, configs):
        self.seen += configs
        return [CandidateResult(repr(c), 1.0 if getattr(c, "splits", 1) > 1 else 2.0 + i)
                for i, c in enumerate(configs)]

    def measure_all(self, jobs, *, target, commit, progress=None):
        for n, job in enumerate(jobs):
            commit(n, self._times(job.configs))

    def __call__(self, task, template, configs, *, target, progress=None):
        return self._times(configs)


def test_a_tuned_range_of_m_builds_unsplit_configs(tmp_path):
    """Tuning x[b, 3072] @ w for b in 1..256 measures its candidates at the hint sizes,
    where split-K configs exist and here win; split-K's workspace is sized by the tile
    count, which the range leaves open, so the tuner measures (and the build takes)
    each config as it builds over the range: unsplit (the compile failed in the plan
    before). Right at every size in the sanitizing emulator."""
    path, w = _batch_matmul_model(tmp_path, 3072, 0.02, seed=1)
    farm = _SplitFavouringFarm()
    result = hidetc.compile_model(path, tmp_path / "out", target="cuda", precision="f16",
                                  gpu="a100", dims={"b": "1..256"}, verify=False, tune=True,
                                  space=1, measure=farm, records=str(tmp_path / "r.sqlite"))
    assert farm.seen and not [c for c in farm.seen if getattr(c, "splits", 1) > 1]
    kernels = result.manifest["kernels"]
    assert all("splits=1)" in k["config"] for k in kernels if k.get("config"))
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    for b in (1, 77):
        x = np.random.default_rng(b).standard_normal((b, 3072)).astype(np.float32)
        report = compare(model.run({"x": x}), {"y": x @ w}, rtol=TOLERANCES["f16"])
        assert report["status"] == "passed", (b, report)
