"""Small M on the tensor cores (issue 41.3): a 32-row tile is in the defaults and the
cost model takes it for M <= 32, and a kernel whose tiles overhang M skips the 16-row
sub-tiles that start past M (`TcKernel.row_guard`): counted from the tiny BERT f16
plan, no launch spends an mma on rows that are all past M."""
from __future__ import annotations

import math

import pytest
from helpers.fusion_graphs import target_graph

import models
from hidetc.driver.context import plan_graph
from hidetc.schedules.cuda import cost
from hidetc.schedules.cuda.matmul_tc import DEFAULTS
from hidetc.schedules.cuda.tc_common import MMA_M, cuda_target
from hidetc.target import KNOWN_GPUS

GPUS = ("a100", "h100-sxm", "l4")


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("m,n,k", [(1, 768, 768), (16, 64, 64), (32, 768, 3072),
                                   (32, 3072, 768), (24, 96, 200)])
def test_the_cost_model_takes_a_32_row_tile_for_small_m(gpu, m, n, k):
    choice = cost.gemm_choice(cost.Gemm(m, n, k, 1, 2 * (m * k + k * n)), DEFAULTS,
                              cuda_target(KNOWN_GPUS[gpu]))
    assert choice.bm == 32 and choice.bm // choice.wm == 32, choice


@pytest.mark.parametrize("gpu", GPUS)
def test_tiny_bert_spends_no_mma_on_rows_past_m(gpu):
    machine = KNOWN_GPUS[gpu]
    graph = target_graph(models.build("bert_base", tiny=True), machine, precision="f16")
    plan = plan_graph(graph, machine)
    seen = 0
    for launch in plan.launches:
        fn = plan.functions[launch.kernel]
        gemm = fn.attr("gemm")
        if gemm is None or launch.choice.get("template") != "cuda.matmul_tc":
            continue
        m, _, _, _, _, cfg = gemm
        # rows the mma covers per column tile: whole tiles, or with the guard the
        # 16-row sub-tiles that start before M
        rows = math.ceil(m / MMA_M) * MMA_M if fn.attr("row_guard") else \
            math.ceil(m / cfg.bm) * cfg.bm
        assert rows - m < MMA_M, (launch.kernel, m, cfg)
        if m <= 32:
            assert cfg.bm == 32, (launch.kernel, m, cfg)
        seen += 1
    assert seen
