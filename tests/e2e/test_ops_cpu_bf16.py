"""Every op case of `test_ops_cpu` under `--precision bf16` (where this CPU has
AVX512_BF16): a case whose lowered graph has an anchor marked compute="bfloat16"
(MatMul, Gemm, one-group Conv ...) is compiled in bf16, verified against ONNX Runtime
in f32 at the bf16 tolerance (2e-2 norm-wise) and its outputs compared with the numpy
reference at that tolerance; every other case lowers to exactly the f32 graph (the
marking is the only difference bf16 makes), which `test_ops_cpu` already runs."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.onnx_util import one_node_model
from helpers.op_cases import CASES, N_OUTPUTS

import hidetc
from hidetc import cpu_isa
from hidetc.driver.backend import CpuBackend
from hidetc.driver.config import TOLERANCES
from hidetc.errors import HidetcError
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.passes.compute_bf16 import computes_bf16
from hidetc.graph.pipeline import lower_precision, optimize
from hidetc.graph.reference import run_graph

pytestmark = pytest.mark.skipif(cpu_isa.BF16 not in cpu_isa.host_features(),
                                reason="this CPU lacks AVX512_BF16")


def lowered(path, precision: str):
    graph = optimize(load_model(path))
    return lower_precision(graph, precision, passes=CpuBackend().graph_passes(precision))


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_in_bf16(case, tmp_path):
    op, inputs, attrs, constants = CASES[case]
    outputs = [f"out{i}" for i in range(N_OUTPUTS.get(case, 1))]
    path = tmp_path / "model.onnx"
    onnx.save(one_node_model(op, inputs, outputs, attrs, constants), path)
    try:
        graph = lowered(path, "bf16")
    except HidetcError:
        pytest.skip("not compiled in f32 either (test_ops_cpu checks the error)")
    if not any(computes_bf16(n) for n in graph.nodes):
        assert graph.nodes == lowered(path, "f32").nodes
        return
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu", precision="bf16")
    assert result.manifest["verification"]["status"] == "passed"
    got = hidetc.load(tmp_path / "out").run(inputs)
    expected = run_graph(load_model(path), inputs)
    for name in outputs:
        assert got[name].dtype == expected[name].dtype
        want = expected[name].astype(np.float64)
        err = np.linalg.norm(got[name] - want) / max(np.linalg.norm(want), 1e-30)
        assert err <= TOLERANCES["bf16"], (name, err)
