"""In-place epilogues: a fused kernel whose epilogue reads a value at the index it
stores (a residual Add) writes its output over that value when it is the value's last
reader (hidetc/fusion/graft.py `in_place`, hidetc/driver/plan.py `_in_place`).

Each graph is compiled for the cpu target (the compile verifies against ONNX Runtime)
and run against the numpy reference; the manifest says which outputs took which
value's memory, and the offsets agree. The refusals are the hazards: a residual the
anchor also reads (the conv would read inputs already overwritten), a residual read
again later, a graph input (not in the arena)."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from helpers import targets
from helpers.fusion_graphs import const, model, resnet_block, target_graph

import hidetc
from hidetc.driver.context import plan_graph
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.reference import run_graph
from hidetc.tools.inspect import describe


def two_blocks(c: int = 8, hw: int = 6, reread: bool = False) -> onnx.ModelProto:
    """h0 = relu(conv0(x)); h1 = relu(conv2(relu(conv1(h0))) + h0); h2 likewise over
    h1; y = GAP(h2) (+ GAP(h1) when `reread`: h1 is read after the block that could
    overwrite it)."""
    conv = {"pads": [1, 1, 1, 1]}
    nodes = [("Conv", ["x", "w0", "b0"], ["c0"], conv), ("Relu", ["c0"], ["h0"], {})]
    consts = {"w0": const((c, c, 3, 3)), "b0": const((c,))}
    for k, (src, dst) in enumerate((("h0", "h1"), ("h1", "h2"))):
        a, b = f"wa{k}", f"wb{k}"
        nodes += [("Conv", [src, a, a + "b"], [f"ca{k}"], conv),
                  ("Relu", [f"ca{k}"], [f"ra{k}"], {}),
                  ("Conv", [f"ra{k}", b, b + "b"], [f"cb{k}"], {}),
                  ("Add", [f"cb{k}", src], [f"s{k}"], {}),
                  ("Relu", [f"s{k}"], [dst], {})]
        consts.update({a: const((c, c, 3, 3)), a + "b": const((c,)),
                       b: const((c, c, 1, 1)), b + "b": const((c,))})
    nodes.append(("GlobalAveragePool", ["h2"], ["y" if not reread else "g2"], {}))
    if reread:
        nodes += [("GlobalAveragePool", ["h1"], ["g1"], {}), ("Add", ["g2", "g1"], ["y"], {})]
    return model(nodes, {"x": [1, c, hw, hw]}, ["y"], consts)


def _compile(tmp_path, proto, **options):
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", **options)   # verifies vs ORT
    inputs = {i.name: np.random.default_rng(3).standard_normal(
        [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
        for i in proto.graph.input}
    got = hidetc.load(tmp_path / "out").run(inputs)
    want = run_graph(import_model(proto), inputs)
    for name, expected in want.items():
        np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-5, err_msg=name)
    return result.manifest


def _nhwc(name: str) -> str:
    return name + "_nhwc"


@pytest.mark.parametrize("layout", ["auto", "nchw"])
def test_residual_blocks_write_over_their_residuals(tmp_path, layout):
    manifest = _compile(tmp_path, two_blocks(), layout=layout)
    memory = manifest["memory"]
    name = _nhwc if layout == "auto" else (lambda v: v)
    assert memory["in_place"] == {name("h1"): name("h0"), name("h2"): name("h1")}
    offsets = memory["offsets"]
    assert offsets[name("h0")] == offsets[name("h1")] == offsets[name("h2")]
    assert memory["arena_bytes"] < memory["total_bytes"]
    assert "(2 written in place)" in describe(manifest)        # `hidetc inspect`
    # the kernels that write in place do not promise the C compiler distinct buffers
    src = tmp_path / "out" / "kernels" / "src"
    writer = next(k for k in manifest["kernels"] if k["args"][-1] == name("h1"))
    text = (src / f"{writer['name']}.c").read_text()
    signature = next(line for line in text.splitlines()
                     if line.startswith(f"void {writer['name']}("))
    assert signature.count("restrict") == signature.count("*") - 2, signature


def test_a_residual_read_later_keeps_its_memory(tmp_path):
    memory = _compile(tmp_path, two_blocks(reread=True))["memory"]
    assert memory["in_place"] == {_nhwc("h1"): _nhwc("h0")}    # h1 is read at the end


@pytest.mark.parametrize("residual", ["r1", "x"])
def test_a_residual_the_anchor_reads_or_a_graph_input_is_not_overwritten(tmp_path, residual):
    """r1 is also the second conv's input (overwriting it would feed the conv its own
    results); x is the caller's input, not in the arena (NCHW: no transposed copy)."""
    memory = _compile(tmp_path, resnet_block(residual=residual), layout="nchw")["memory"]
    assert memory["in_place"] == {}


def test_a_transposed_copy_of_the_input_is_overwritten(tmp_path):
    """Channels-last, the block's residual is the NHWC copy of x, dead after the add."""
    manifest = _compile(tmp_path, resnet_block(residual="x"))
    (overwritten,) = manifest["memory"]["in_place"].values()
    # the value overwritten is what the input's Transpose kernel writes
    writers = [k for k in manifest["kernels"] if overwritten in k["writes"]]
    assert [k["op"] for k in writers] == ["Transpose"] and "x" in writers[0]["args"]


def ffn_block(seq: int = 5, hidden: int = 12) -> onnx.ModelProto:
    """h = relu(x W0 + b0); s = relu(h W1 + b1) W2 + b2 + h; y = LayerNorm(s): the
    second projection's epilogue adds h, which nothing reads after it."""
    nodes = [("MatMul", ["x", "w0"], ["m0"], {}), ("Add", ["m0", "b0"], ["a0"], {}),
             ("Relu", ["a0"], ["h"], {}),
             ("MatMul", ["h", "w1"], ["m1"], {}), ("Add", ["m1", "b1"], ["a1"], {}),
             ("Relu", ["a1"], ["t"], {}),
             ("MatMul", ["t", "w2"], ["m2"], {}), ("Add", ["m2", "b2"], ["a2"], {}),
             ("Add", ["a2", "h"], ["s"], {}),
             ("LayerNormalization", ["s", "g", "b"], ["y"], {"axis": -1})]
    consts = {"w0": const((hidden, hidden)), "b0": const((hidden,)),
              "w1": const((hidden, 3 * hidden)), "b1": const((3 * hidden,)),
              "w2": const((3 * hidden, hidden)), "b2": const((hidden,)),
              "g": const((hidden,)) + 1, "b": const((hidden,))}
    return model(nodes, {"x": [1, seq, hidden]}, ["y"], consts)


def test_a_matmul_epilogue_writes_over_its_residual(tmp_path):
    memory = _compile(tmp_path, ffn_block())["memory"]
    assert memory["in_place"] == {"s": "h"}
    assert memory["offsets"]["s"] == memory["offsets"]["h"]


def test_the_cuda_target_keeps_separate_buffers(tmp_path):
    """In place is a cpu-target plan: cuda kernels still declare every buffer
    __restrict__ (and are not checked for single stores per element)."""
    plan = plan_graph(target_graph(two_blocks(), targets.CUDA), targets.CUDA)
    assert plan.in_place == {} and plan.launches


def test_cuda_in_place_drops_restrict_on_the_shared_buffers(tmp_path, monkeypatch):
    """With in-place outputs turned on for cuda (off by default), a kernel that writes
    over a residual it reads prints neither pointer `__restrict__` (nvcc would read a
    const restrict input through the non-coherent path, which assumes it does not change
    during the kernel), and the artifact run in the sanitizing emulator matches the
    reference."""
    import hidetc.schedules.cuda as cuda_schedules
    monkeypatch.setattr(cuda_schedules, "WRITES_IN_PLACE", True)
    proto = two_blocks()
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cuda", verify=False)
    assert result.manifest["memory"]["in_place"], "no output was written in place"
    sources = "".join(p.read_text() for p in (tmp_path / "out" / "kernels" / "src").glob("*.cu"))
    params = re.findall(r"__global__ void __launch_bounds__\(\d+\)\s*\w+\(([^)]*)\)", sources)
    assert params
    unrestricted = [p for ps in params for p in ps.split(",")
                    if "*" in p and "__restrict__" not in p]
    assert len(unrestricted) >= 2, "the shared output and input are still __restrict__"
    x = np.random.default_rng(3).standard_normal((1, 8, 6, 6)).astype(np.float32)
    got = hidetc.load(tmp_path / "out", emulate=True, sanitize=True).run({"x": x})
    want = run_graph(import_model(proto), {"x": x})
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-5)
