"""Concat without copies: producers write their results straight into their slices of
a Concat's output (`FusionGroup.into`, hidetc/fusion/partition.py rule 4, the graft's
slice store in hidetc/fusion/graft.py, first-writer lifetimes in hidetc/driver/plan.py).

An Inception-like block (four branches, one of them an inner Concat that
`flatten_concats` splices into the outer one) is compiled for every store path:
the cpu channels-last graph (last-axis slices through the conv's [N*OH*OW, C] view),
the cpu NCHW graph at batch 1 (contiguous slices: one linear offset) and batch 2 (the
shifted logical index), cuda f16 (NHWC, emulated, f16 tolerance) and cuda f32 (NCHW,
emulated). Each compile verifies against ONNX Runtime (1e-4, f16 1e-2); the
partition is checked to have no Concat kernel, and the concats that must stay
(inputs read elsewhere, a graph input, a graph output) stay. A producer whose kernel
refuses the graft gets its Concat back as a kernel (the planner's fallback)."""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from helpers import targets
from helpers.fusion_graphs import inception_block, model, target_graph

import hidetc
from hidetc.driver.backend import backend_of
from hidetc.driver.context import plan_graph
from hidetc.driver.verify import compare, run_onnxruntime
from hidetc.frontend.onnx.importer import import_model
from hidetc.fusion import graft as graft_module
from hidetc.fusion.partition import check_partition, partition
from hidetc.graph.pipeline import optimize

NVCC = shutil.which("nvcc")


def _inputs(proto, seed: int = 1):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in proto.graph.input}


def _compile(tmp_path, proto, **options):
    path = tmp_path / "block.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", **options)   # verifies vs ORT
    assert result.manifest["fusion"]["fallbacks"] == []
    return path, result.manifest


def _ops(manifest) -> list[str]:
    return [k["op"] for k in manifest["kernels"]]


def _writers(manifest) -> int:
    return sum(1 for k in manifest["kernels"] if k["group"].get("into"))


def _slice_buffers(proto, layout: str) -> set[tuple[int, ...]]:
    """The shapes of the writers' output parameters (the Concat output as they see it)."""
    graph = target_graph(proto, targets.CPU, layout=layout)
    plan = plan_graph(graph, targets.CPU)
    return {tuple(r.function.params[-1].shape) for r in plan.launches if r.group.into}


# the store path each case takes: channels-last rows [N, H*W, C] (no div/mod), the flat
# contiguous slice of batch 1 NCHW, the shifted logical index of batch 2 NCHW (and of
# the channels-last max-pool, whose index is logical already)
PATHS = {(1, "auto"): {(1, 36, 40)}, (1, "nchw"): {(40 * 36,)}, (2, "nchw"): {(2, 40, 6, 6)}}


@pytest.mark.parametrize("batch,layout", sorted(PATHS))
def test_cpu_block_writes_branches_into_the_concat(tmp_path, batch, layout):
    proto = inception_block(n=batch)
    path, manifest = _compile(tmp_path, proto, target="cpu", layout=layout)
    assert "Concat" not in _ops(manifest)
    assert _writers(manifest) == 5           # b0, b1a, b1b, the pooled conv, max-pool
    assert _slice_buffers(proto, layout) <= PATHS[batch, layout] | {(batch, 6, 6, 40)}
    inputs = _inputs(proto)
    got = hidetc.load(tmp_path / "out").run(inputs)
    report = compare(got, run_onnxruntime(path, inputs), rtol=1e-4)
    assert report["status"] == "passed", report


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("precision", ["f16", "f32"])
def test_cuda_block_writes_branches_into_the_concat(tmp_path, precision):
    proto = inception_block()
    path, manifest = _compile(tmp_path, proto, target="cuda", precision=precision,
                              arch="sm_80")
    assert "Concat" not in _ops(manifest) and _writers(manifest) == 5
    inputs = _inputs(proto)
    got = hidetc.load(tmp_path / "out", emulate=True).run(inputs)
    report = compare(got, run_onnxruntime(path, inputs),
                     rtol=1e-2 if precision == "f16" else 1e-4)
    assert report["status"] == "passed", report


def test_partition_absorbs_only_private_group_outputs():
    """A Concat of a value read elsewhere, of a graph input, or one that is a graph
    output stays a kernel; the writers of an absorbed one carry its name."""
    from helpers.fusion_graphs import const
    nodes = [
        ("Conv", ["x", "w0"], ["a"], {}), ("Relu", ["a"], ["ra"], {}),
        ("Conv", ["x", "w1"], ["b"], {}), ("Relu", ["b"], ["rb"], {}),
        ("Concat", ["ra", "rb"], ["cat1"], {"axis": 1}),             # absorbed
        ("Conv", ["cat1", "w2"], ["c"], {}),
        ("Sigmoid", ["c"], ["sc"], {}),
        ("Concat", ["c", "sc"], ["cat2"], {"axis": 1}),              # c read by Sigmoid
        ("Concat", ["x", "sc"], ["cat3"], {"axis": 1}),              # a graph input
        ("Neg", ["cat2"], ["n2"], {}), ("Abs", ["cat2"], ["a2"], {}),
        ("Neg", ["cat3"], ["n3"], {}), ("Abs", ["cat3"], ["a3"], {}),
        ("Conv", ["x", "w3"], ["d"], {}),
        ("Concat", ["d", "n3"], ["y3"], {"axis": 1}),               # a graph output
    ]
    consts = {"w0": const((4, 4, 1, 1)), "w1": const((4, 4, 1, 1)), "w2": const((4, 8, 1, 1)),
              "w3": const((4, 4, 1, 1))}
    proto = model(nodes, {"x": [1, 4, 3, 3]}, ["n2", "a2", "a3", "y3"], consts)
    graph = optimize(import_model(proto))
    groups = partition(graph, refusals=backend_of(targets.CPU).refusals)
    check_partition(graph, groups)
    names = {n.name: n for n in graph.nodes}
    kept = sorted(names[g.anchor].outputs[0] for g in groups if names[g.anchor].op == "Concat")
    assert kept == ["cat2", "cat3", "y3"]
    writers = [g for g in groups if g.into]
    assert len(writers) == 2 and {names[g.into].outputs[0] for g in writers} == {"cat1"}


def test_graft_refusal_keeps_the_concat(tmp_path, monkeypatch):
    """When a writer's kernel refuses the slice store, the plan starts over with that
    Concat as a kernel of its own, and the result is still right."""
    real = graft_module._Graft.into_slice

    def refuse(self, *args):
        raise graft_module.GraftError("test: no slice stores")
    monkeypatch.setattr(graft_module._Graft, "into_slice", refuse)
    proto = inception_block()
    path = tmp_path / "block.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert _ops(result.manifest).count("Concat") == 1 and _writers(result.manifest) == 0
    assert any("no slice stores" in f["reason"] for f in result.manifest["fusion"]["fallbacks"])
    monkeypatch.setattr(graft_module._Graft, "into_slice", real)
