"""The transformers zoo (models/zoo.py) through both torch.onnx exporters and hidetc.

Slow (`make test-slow`, which installs torch 2.13.0, onnxscript 0.7.2 and transformers
into the venv); each case skips when torch or transformers (or, for the dynamo
exporter, onnxscript) is missing. Per (architecture, exporter): build the tiny model
(random weights, fixed seed), export it with the TorchScript exporter (opset 17) or the
dynamo exporter (its default opset), static shapes; compile it with hidetc's defaults
for the cpu target (compile_model verifies against ONNX Runtime itself and raises on a
failure); run the artifact on the example inputs and compare every output with PyTorch
eager: floats within 1e-4 norm-wise relative error and np.allclose(rtol=1e-3,
atol=1e-4), integers exactly. An exception inside torch.onnx.export is an xfail with
the exporter's first error line (not hidetc's concern).

HIDETC_ZOO_KEEP=DIR keeps each case's export as DIR/<arch>_<exporter>.onnx, its inputs
as DIR/<arch>_<exporter>.npz (by input name, for `hidetc run --input`) and torch's
outputs as DIR/<arch>_<exporter>.expected.npz (by output name).

Measured pass rate and times: bench/results/2026-12-06-transformers-zoo.md.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from helpers.c_runtime_twin import assert_runner_matches

from models import zoo

CASES = [(entry.name, exporter) for entry in zoo.ENTRIES for exporter in zoo.EXPORTERS]

NORM_RTOL = 1e-4                 # norm-wise: |got - want| / |want|
ELEM_RTOL, ELEM_ATOL = 1e-3, 1e-4


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _keep(name: str, exporter: str, path: Path, inputs: dict, expected: dict) -> None:
    """Copy the export and its inputs/expected outputs to $HIDETC_ZOO_KEEP, if set."""
    keep = os.environ.get("HIDETC_ZOO_KEEP")
    if not keep:
        return
    out = Path(keep)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}_{exporter}"
    (out / f"{stem}.onnx").write_bytes(path.read_bytes())
    np.savez(out / f"{stem}.npz", **inputs)
    np.savez(out / f"{stem}.expected.npz", **expected)


def _compare(name: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, f"{name}: shape {got.shape}, torch {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, torch {want.dtype}"
    if not np.issubdtype(want.dtype, np.floating):
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    assert np.all(np.isfinite(got)) == np.all(np.isfinite(want)), f"{name}: non-finite values"
    diff = got.astype(np.float64) - want
    norm_err = float(np.linalg.norm(diff) / max(np.linalg.norm(want.astype(np.float64)), 1e-30))
    worst = float(np.max(np.abs(diff) - ELEM_RTOL * np.abs(want))) if diff.size else 0.0
    assert norm_err <= NORM_RTOL, f"{name}: norm-wise relative error {norm_err:.3g}"
    assert np.allclose(got, want, rtol=ELEM_RTOL, atol=ELEM_ATOL), \
        f"{name}: max(|got - want| - {ELEM_RTOL} |want|) = {worst:.3g} > atol {ELEM_ATOL}"


@pytest.mark.slow
@pytest.mark.parametrize("name,exporter", CASES, ids=[f"{n}-{e}" for n, e in CASES])
def test_zoo_model(name, exporter, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
    import onnx

    import hidetc

    module, inputs = built = zoo.build(name)
    want = dict(zip(zoo.output_names(name), zoo.eager_outputs(module, inputs)))
    feeds = zoo.numpy_inputs(inputs)
    path = tmp_path / f"{name}_{exporter}.onnx"
    try:
        zoo.export(name, exporter, path, built)
    except Exception as error:  # the exporter's own failure, not hidetc's
        pytest.xfail(f"torch.onnx.export ({exporter}) failed: {_first_line(error)}")
    _keep(name, exporter, path, feeds, want)
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    assert [o.name for o in graph.output] == list(want)

    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed", result.manifest["verification"]
    got = hidetc.load(tmp_path / "out").run({k: feeds[k] for k in graph_inputs})
    assert sorted(got) == sorted(want)
    # the artifact's C runtime in a process without Python: the same bits
    assert_runner_matches(tmp_path / "out", {k: feeds[k] for k in graph_inputs}, got,
                          tmp_path / "runner")
    for output, expected in want.items():
        _compare(output, np.asarray(got[output]), expected)
