"""A compile whose verification misses the tolerance rebuilds the diverging kernels with
exact-order configs and verifies again (issue 27 item 2), through the compile's seams:
the tuner's measurer (a stand-in ranking the Winograd convolution first, as records
would) and the verifier (one that plants a miss), so every test runs on every machine.

- a planted miss on every build with Winograd kernels: the compile comes back verified,
  the Winograd kernels rebuilt as exact-order ones, the recovery in the manifest, and
  the artifact right against ONNX Runtime;
- a miss on every build: one line naming the kernel that diverges most on exact inputs
  (each kernel judged alone against the reference interpreter);
- a miss of the channels-last build only: the model's own NCHW layout, last.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import hidetc
import models
from hidetc.driver.tune.records import CandidateResult
from hidetc.driver.verification import verify_artifact
from hidetc.errors import VerificationError
from hidetc.schedules.cpu.winograd import WinogradConfig

C = 48


def _model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((C, C, 3, 3)) / np.sqrt(9 * C))
                                     .astype(np.float32), f"w{i}") for i in range(3)]
    nodes, x = [], "x"
    for i in range(3):
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    graph = helper.make_graph(nodes, "convs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [1, C, 24, 24])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def winograd_first(task, template, configs, *, target, progress=None):
    """A stand-in measurer: F(4x4) Winograd configs fastest, then the rest in order."""
    return [CandidateResult(repr(c), (1.0 if isinstance(c, WinogradConfig) and c.m == 4
                                      else 100.0) + i, None) for i, c in enumerate(configs)]


def miss_if(planted):
    """A verifier that fails a build `planted(manifest, cfg)` picks, else verifies."""
    def verify(path, manifest, yardstick, cfg):
        if planted(manifest, cfg):
            raise VerificationError("verification failed: output 'r2' differs (planted)")
        return verify_artifact(path, manifest, yardstick, cfg)
    return verify


def _error(out, proto) -> float:
    """The artifact's norm-wise relative error against ONNX Runtime."""
    x = models.sample_inputs(proto, seed=0)
    got = hidetc.load(out).run(x)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, x)
    (g,) = got.values()
    g, w = g.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(g - w) / np.linalg.norm(w))


def _winograd_convs(manifest) -> int:
    return sum("WinogradConfig" in (k.get("config") or "") for k in manifest["kernels"])


def _compile(tmp_path, name, **options):
    path = tmp_path / "m.onnx"
    if not path.is_file():
        models.save(_model(), path)
    return hidetc.compile_model(path, tmp_path / name, target="cpu", tune=True, space=2,
                                records=str(tmp_path / "records.sqlite"),
                                measure=winograd_first, **options)


def test_a_missed_tolerance_is_recovered_with_exact_configs(tmp_path):
    tuned = _compile(tmp_path, "w", verify=False)
    assert _winograd_convs(tuned.manifest) == 3
    result = _compile(tmp_path, "out", verifier=miss_if(
        lambda manifest, cfg: _winograd_convs(manifest) > 0))
    verification = result.manifest["verification"]
    assert verification["status"] == "passed"
    recovery = verification["recovery"]
    assert "planted" in recovery["first_failure"]
    assert recovery["rebuilt"] and all("WinogradConfig" in r["from"] and
                                       "Winograd" not in r["to"] for r in recovery["rebuilt"])
    assert _winograd_convs(result.manifest) == 0
    assert _error(tmp_path / "out", _model()) <= 1e-4
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_an_unrecoverable_miss_names_the_worst_kernel(tmp_path):
    with pytest.raises(VerificationError, match=r"verification failed: .*planted.*; "
                                                r"exact-order rebuilds did not pass either, "
                                                r"nor did the model's own NCHW layout; the "
                                                r"kernel diverging most on exact inputs is "
                                                r"\w+ \(\w+ '[^']+': relative error"):
        _compile(tmp_path, "out", verifier=miss_if(lambda manifest, cfg: True))
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_the_last_resort_is_the_models_own_layout(tmp_path):
    """No kernel has an exact-order fallback (the defaults), and the channels-last
    build misses (a verifier that fails every build of the default layout pass): the
    model is rebuilt once with its own NCHW layout, which passes, and the manifest's
    config says so (so every later per-kernel check rebuilds the same graph)."""
    proto = _model()
    path = tmp_path / "m.onnx"
    models.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu", tune=False,
                                  verifier=miss_if(lambda manifest, cfg: cfg.layout == "auto"))
    recovery = result.manifest["verification"]["recovery"]
    assert recovery["layout"] == "nchw" and "planted" in recovery["first_failure"]
    assert result.manifest["config"]["layout"] == "nchw"
    assert not any(k["op"] == "ConvNHWC" for k in result.manifest["kernels"])
    assert _error(tmp_path / "out", proto) < 1e-4
