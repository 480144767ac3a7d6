"""The partition pass: which nodes each group takes, the illegal cases staying apart,
and the invariants `check_partition` proves."""
from __future__ import annotations

import pytest
from helpers import targets
from helpers.fusion_graphs import attention, const, graph_of, model, resnet_block

from hidetc.driver.backend import backend_of
from hidetc.fusion.partition import FusionGroup, PartitionError, check_partition, partition
from hidetc.graph.passes import choose_layout


def ops(graph, names):
    by_name = {n.name: n.op for n in graph.nodes}
    return [by_name[n] for n in names]


def summary(graph, machine=None):
    refusals = backend_of(machine).refusals if machine is not None else None
    return [(ops(graph, [g.anchor])[0], ops(graph, g.prologues), ops(graph, g.epilogues))
            for g in partition(graph, refusals=refusals)]


def test_resnet_block_fuses_bias_relu_and_residual():
    graph = graph_of(resnet_block())
    groups = summary(graph)
    assert groups == [
        ("Conv", [], ["Relu"]),
        ("Conv", [], ["Add", "Relu"]),
        ("GlobalAveragePool", [], ["Reshape"]),
        ("MatMul", [], ["Add"]),
    ]


def test_attention_groups():
    graph = graph_of(attention())
    groups = summary(graph)
    # Q/K/V: bias, head split and transpose are epilogues of each projection
    assert groups.count(("MatMul", [], ["Add", "Reshape", "Transpose"])) == 3
    # scale and mask ride on the score matmul; the merge of heads on PV
    assert ("MatMul", [], ["Mul", "Add"]) in groups
    assert ("Softmax", [], []) in groups
    assert ("MatMul", [], ["Transpose", "Reshape"]) in groups
    # bias + residual before LayerNorm; bias + GELU (which reads f1 twice: a branch
    # that rejoins) after the first FFN matmul
    assert ("MatMul", [], ["Add", "Add"]) in groups
    assert ("MatMul", [], ["Add", "Mul", "Erf", "Add", "Mul", "Mul"]) in groups
    check_partition(graph, partition(graph))


def test_branches_that_rejoin_fuse():
    nodes = [("MatMul", ["x", "w"], ["m"], {}),
             ("Relu", ["m"], ["r"], {}),
             ("Sigmoid", ["m"], ["s"], {}),
             ("Add", ["r", "s"], ["y"], {})]
    graph = graph_of(model(nodes, {"x": [3, 4]}, ["y"], {"w": const((4, 5))}))
    assert summary(graph) == [("MatMul", [], ["Relu", "Sigmoid", "Add"])]


def test_shared_value_stays_unfused():
    nodes = [("MatMul", ["x", "w"], ["m"], {}),
             ("Relu", ["m"], ["r"], {}),
             ("Sigmoid", ["r"], ["y1"], {}),
             ("MatMul", ["m", "w2"], ["y2"], {})]
    graph = graph_of(model(nodes, {"x": [3, 4]}, ["y1", "y2"],
                           {"w": const((4, 5)), "w2": const((5, 2))}))
    groups = summary(graph)
    assert groups[0] == ("MatMul", [], [])          # m: two consumers that never rejoin
    assert ("MatMul", [], []) in groups[1:]
    assert ("Sigmoid", ["Relu"], []) in groups      # an injective group; r is private


def test_broadcast_consumer_and_reduction_in_between_stay_apart():
    nodes = [("MatMul", ["x", "w"], ["m"], {}),            # m: [3, 1]
             ("Add", ["m", "b"], ["y0"], {}),              # broadcasts m: not bijective in m
             ("ReduceSum", ["y0"], ["r"], {"keepdims": 1}),
             ("Exp", ["r"], ["y"], {})]
    graph = graph_of(model(nodes, {"x": [3, 4]}, ["y"],
                           {"w": const((4, 1)), "b": const((3, 6))}))
    groups = summary(graph)
    assert groups[0] == ("MatMul", [], [])
    # the Add is an injective prologue of the reduction, the Exp its epilogue
    assert groups[1] == ("ReduceSum", ["Add"], ["Exp"])


def test_branch_that_does_not_rejoin_stays_apart():
    nodes = [("MatMul", ["x", "w"], ["m"], {}),
             ("Relu", ["m"], ["r"], {}),
             ("Exp", ["m"], ["e"], {}),
             ("ReduceSum", ["e"], ["s"], {"keepdims": 1}),
             ("Add", ["r", "s"], ["y"], {})]   # rejoins only through a reduction
    graph = graph_of(model(nodes, {"x": [3, 4]}, ["y"], {"w": const((4, 5))}))
    groups = summary(graph)
    assert groups[0] == ("MatMul", [], [])
    assert ("ReduceSum", ["Exp"], []) in groups


def test_graph_output_is_not_fused_through():
    nodes = [("MatMul", ["x", "w"], ["m"], {}), ("Relu", ["m"], ["y"], {})]
    graph = graph_of(model(nodes, {"x": [3, 4]}, ["m", "y"], {"w": const((4, 5))}))
    assert summary(graph) == [("MatMul", [], []), ("Relu", [], [])]


def test_unfused_baseline_and_checker():
    graph = graph_of(resnet_block())
    single = partition(graph, fuse=False)
    assert len(single) == len(graph.nodes) and not any(g.fused for g in single)
    groups = partition(graph)
    with pytest.raises(PartitionError, match="two groups"):
        check_partition(graph, groups + [FusionGroup(groups[0].anchor)])
    with pytest.raises(PartitionError, match="no group"):
        check_partition(graph, groups[1:])
    with pytest.raises(PartitionError, match="before any group"):
        check_partition(graph, groups[::-1])


def test_channels_last_conv_keeps_its_input_transpose_apart():
    """On the cpu a ConvNHWC never takes a Transpose prologue (each of its contiguous
    channel loads would become a gather): the NCHW graph input's Transpose runs as its
    own kernel; the residual Add and Relu still fuse. (On cuda it would be taken.)"""
    graph = choose_layout.run(graph_of(resnet_block(residual="r1")),
                              choose_layout.wants_nhwc)
    assert ("ConvNHWC", ["Transpose"], ["Relu"]) in summary(graph, targets.CUDA)
    assert ("ConvNHWC", [], ["Relu"]) in summary(graph, targets.CPU)
    graph = choose_layout.run(graph_of(resnet_block()), choose_layout.wants_nhwc_cpu)
    groups = summary(graph, targets.CPU)
    assert ("Transpose", [], []) in groups
    assert ("ConvNHWC", [], ["Add", "Relu"]) in groups
    assert all("Transpose" not in pro for op, pro, _ in groups if op == "ConvNHWC")
