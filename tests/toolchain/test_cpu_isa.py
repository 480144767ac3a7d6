"""The CPU vector ISA (hidetc/cpu_isa.py): HIDETC_CPU_ISA picks AVX2 or
AVX-512 per process (auto: what the host has); the micro-kernels' vector widths cover
every NR (AVX-512 panels of 24 columns: a zmm and a ymm); a small CNN + MatMul model
compiles, runs and verifies against ONNX Runtime with each ISA the host can run (each
in a subprocess, since the ISA is fixed at import); an artifact built for an ISA the
host lacks is refused at load with a one-line error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hidetc import cpu_isa
from hidetc.schedules.cpu import avx2

X86 = "avx2" in cpu_isa.host_flags()


def _python(code: str, isa: str) -> subprocess.CompletedProcess:
    env = {**os.environ, cpu_isa.ENV: isa}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=600)


def test_env_picks_the_isa_and_bad_values_fail_cleanly():
    for isa in ("avx512", "avx2"):
        out = _python("from hidetc.cpu_isa import current; print(current().name)",
                      isa)
        assert out.returncode == 0 and out.stdout.strip() == isa, out.stderr
    bad = _python("from hidetc.cpu_isa import current; current()", "sse9")
    assert bad.returncode != 0 and "HIDETC_CPU_ISA='sse9'" in bad.stderr


def test_vector_widths_follow_the_target_isa():
    """The micro-kernels' vectors come from the target's lanes, in one process."""
    assert avx2.widths(24, 16) == [16, 8] and avx2.offsets(40, 16) == [0, 16, 32]
    assert avx2.widths(24, 8) == [8, 8, 8]


MODEL = """
    import json, sys, numpy as np, onnx
    from onnx import TensorProto, helper, numpy_helper
    import hidetc
    rng = np.random.default_rng(0)
    w = lambda *s: numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32))
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1], group=40),
             helper.make_node("Conv", ["c1", "w2"], ["c2"]),
             helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    inits = [w(40, 3, 3, 3), w(40, 1, 3, 3), w(24, 40, 1, 1), w(24, 37)]
    for t, name in zip(inits, ["w0", "w1", "w2", "fc"]):
        t.name = name
    graph = helper.make_graph(nodes, "isa", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 11, 9])], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [1, 37])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, sys.argv[1] if len(sys.argv) > 1 else "{path}")
    result = hidetc.compile_model("{path}", "{out}", target="cpu", tune=False,
                                  verify={verify})
    print(json.dumps({{"isa": result.manifest["cpu_isa"],
                       "status": result.manifest.get("verification", {{}}).get("status")}}))
"""


@pytest.mark.skipif(not X86, reason="an x86 host with AVX2")
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_model_compiles_and_verifies_with_each_isa(isa, tmp_path):
    runs = cpu_isa.host_supports(cpu_isa.ISAS[isa])
    out = _python(MODEL.format(path=tmp_path / "m.onnx", out=tmp_path / "out",
                               verify=runs), isa)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["isa"] == isa
    if runs:
        assert report["status"] == "passed"
        return
    # built for an ISA this host lacks: cross-compiled (not verified), and loading says
    # so in one line
    assert report["status"] == "skipped"
    load = _python(f"import hidetc; hidetc.load({str(tmp_path / 'out')!r})", "auto")
    assert load.returncode != 0 and "which this CPU lacks" in load.stderr


def test_a_forced_isa_the_host_lacks_cross_compiles(tmp_path, monkeypatch):
    """No tuning (its candidates could not run: an explicit --tune is a ConfigError)
    and verification skipped, as for cuda without a GPU."""
    import onnx
    from helpers.fusion_graphs import resnet_block

    import hidetc
    from hidetc.driver.backend import CpuBackend
    monkeypatch.setattr(CpuBackend, "runs_kernels", staticmethod(lambda machine: False))
    path = tmp_path / "m.onnx"
    onnx.save(resnet_block(), path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "skipped"
    assert "cross-compiled" in result.manifest["verification"]["reason"]
    assert result.manifest["tuning"]["enabled"] is False
    from hidetc.errors import ConfigError
    with pytest.raises(ConfigError, match="no-tune"):
        hidetc.compile_model(path, tmp_path / "out2", target="cpu", tune=True)
