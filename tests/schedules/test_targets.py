"""The machine model (hidetc.target) and what depends on it, as properties at other
core counts and other GPUs' limits: the cpu task shapes cover the work and give every
core a task whenever the work allows, at 1, 2, 16 and 64 cores; the CUDA templates'
spaces and defaults fit each arch's limits; a cross-compile records its target, takes
no tuning, and a load elsewhere warns."""
from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner
from helpers import targets
from helpers.fusion_graphs import resnet_block
from helpers.tasks import nhwc_task

import hidetc
from hidetc.compute.task import Task
from hidetc.driver.tune.keys import cpu_arch
from hidetc.errors import ConfigError
from hidetc.graph.ir import TensorType
from hidetc.schedules.cpu.microkernel import GemmConfig, default_gemm
from hidetc.schedules.cpu.task_shape import blocking
from hidetc.schedules.cuda import conv_tc, matmul_tc
from hidetc.schedules.cuda.tc_common import fits
from hidetc.target import (
    KNOWN_GPUS,
    CpuTarget,
    cuda_target,
    detect_cpu,
    host_caches,
    target_from_facts,
)
from hidetc.tools.cli import main

CORES = (1, 2, 16, 64)
# (M, N, K, batch): BERT-base's projections and attention, GPT-2's head, ResNet-50's
# implicit GEMMs (positions x channels), awkward and tiny ones
GEMMS = [(128, 768, 768, 1), (128, 3072, 768, 1), (128, 768, 3072, 1), (128, 128, 64, 12),
         (128, 50257, 768, 1), (3136, 64, 576, 1), (784, 128, 1152, 1), (196, 256, 2304, 1),
         (49, 512, 4608, 1), (1, 1000, 2048, 1), (7, 13, 5, 3), (1, 1, 1, 1),
         (4099, 7, 33, 1)]


@pytest.mark.parametrize("cores", CORES)
@pytest.mark.parametrize("m,n,k,batch", GEMMS)
def test_task_shapes_cover_the_work_and_fill_the_cores(m, n, k, batch, cores):
    """The row and column tiles cover M and N exactly once; whenever there are at least
    4 micro-tiles (MR x NR) per core, the busiest core (ceil(tasks / cores) tasks) gets
    at most 1.5x its even share of them. (Not "tasks >= cores": 196 rows in 16-row tiles
    on 16 cores is 13 tasks, and splitting their columns too would give the busiest
    core two tasks of the same total size, plus their packing.)"""
    for local_rows in (False, True):
        bl = blocking(default_gemm(m, n, targets.CPU.isa), m, n, k, batch, targets.cpu(cores),
                      local_rows=local_rows)
        assert bl.mt % bl.mr == 0 and bl.m_tiles * bl.mt >= m > (bl.m_tiles - 1) * bl.mt
        assert bl.n_tiles * bl.nc >= n > (bl.n_tiles - 1) * bl.nc
        tasks = batch * bl.m_tiles * bl.n_tiles
        micro = batch * -(-m // bl.mr) * -(-n // bl.nr)
        per_task = -(-min(bl.mt, m) // bl.mr) * -(-min(bl.nc, n) // bl.nr)
        if micro >= 4 * cores:
            busiest = -(-tasks // cores) * per_task
            assert busiest <= 1.5 * micro / cores, (bl, tasks, busiest, micro / cores)


def test_more_cores_never_fewer_tasks_for_big_gemms():
    for m, n, k, batch in GEMMS[:6]:
        counts = []
        for cores in CORES:
            bl = blocking(GemmConfig(), m, n, k, batch, targets.cpu(cores), local_rows=batch == 1)
            counts.append(batch * bl.m_tiles * bl.n_tiles)
        assert counts == sorted(counts), ((m, n, k, batch), counts)


def _f16_matmul(m: int, n: int, k: int) -> Task:
    f16 = "float16"
    return Task("MatMul", (TensorType(f16, (m, k)), TensorType(f16, (k, n))),
                (TensorType(f16, (m, n)),), (), (None, None))


def _f16_conv(x_shape, w_shape) -> Task:
    """A float16 ConvNHWC (shapes given NCHW / OIHW), padded to keep the map size."""
    task = nhwc_task(x_shape, w_shape, False, pads=[w_shape[2] // 2] * 4)
    f16 = [TensorType("float16", t.shape) if t is not None else None for t in task.inputs]
    return Task(task.op, tuple(f16), tuple(TensorType("float16", t.shape)
                                            for t in task.outputs), task.attrs, task.params)


@pytest.mark.parametrize("gpu", ["a100", "l4", "h200"])
def test_cuda_spaces_and_defaults_fit_each_arch(gpu):
    target = KNOWN_GPUS[gpu]
    for m, n, k, _ in GEMMS[:4]:
        task = _f16_matmul(m, n, k)
        space = matmul_tc.TEMPLATE.space(task, target)
        assert space and all(fits(c, target) for c in space)
        default = matmul_tc.TEMPLATE.default(task, target)
        assert default in space and fits(default, target)
    assert all(fits(c, target) for c in conv_tc.TEMPLATE.space(None, target))
    conv = _f16_conv((1, 256, 14, 14), (256, 256, 3, 3))
    default = conv_tc.TEMPLATE.default(conv, target)
    assert default in conv_tc.TEMPLATE.space(conv, target) and fits(default, target)


def test_defaults_follow_the_sm_count():
    """The tensor-core default is the cost model's (it fills the SMs, with split-K where
    the tiles alone do not): a GPU with fewer SMs may take bigger tiles, never smaller."""
    task = _f16_matmul(512, 3072, 768)
    a = matmul_tc.TEMPLATE.default(task, KNOWN_GPUS["l4"])      # 58 SMs
    b = matmul_tc.TEMPLATE.default(task, KNOWN_GPUS["h200"])    # 132 SMs
    assert a.bm * a.bn >= b.bm * b.bn


def test_cuda_target_from_names_arch_and_device():
    assert cuda_target(gpu="L4").sms == 58 and cuda_target(gpu="l4").arch == "sm_89"
    assert cuda_target(arch="sm_80").shared_optin_bytes == KNOWN_GPUS["a100"].shared_optin_bytes
    assert cuda_target(arch="sm_90").sms == 132
    assert "limits of" in cuda_target(arch="sm_120").name          # newer: newest known
    with pytest.raises(ConfigError, match="--gpu 'tpu': unknown GPU; known: a10, a100"):
        cuda_target(gpu="tpu")
    with pytest.raises(ConfigError, match="--gpu l4 is sm_89, but --arch says sm_90"):
        cuda_target(arch="sm_90", gpu="l4")
    seen = cuda_target(device={"name": "Some GPU", "arch": "sm_89", "sms": 46,
                               "l2_bytes": 32 << 20})
    assert (seen.name, seen.sms, seen.l2_bytes, seen.shared_optin_bytes) == \
        ("Some GPU", 46, 32 << 20, KNOWN_GPUS["l40s"].shared_optin_bytes)
    assert target_from_facts(seen.facts()) == seen


def test_blocks_per_sm_follows_the_occupancy_rules():
    a100, l4 = KNOWN_GPUS["a100"], KNOWN_GPUS["l4"]
    assert a100.blocks_per_sm(256, 64, 0) == 4          # registers: 32 warps of 2048
    assert a100.blocks_per_sm(128, 32, 0) == 16         # threads: 2048 / 128
    assert a100.blocks_per_sm(32, 16, 0) == 32          # the block limit
    assert a100.blocks_per_sm(128, 40, 48 * 1024) == 3  # shared: 164 KiB / 49 KiB
    assert l4.blocks_per_sm(32, 16, 0) == 24 and l4.blocks_per_sm(1024, 128, 0) == 0
    assert a100.blocks_per_sm(100, 33, 0) == a100.blocks_per_sm(128, 40, 0)  # rounding


def test_cpu_target_detection_and_overrides(tmp_path, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5})
    assert detect_cpu().cores == 3 and detect_cpu(cores=64).cores == 64
    with pytest.raises(ConfigError, match="--cpu-cores 0: expected at least 1"):
        detect_cpu(cores=0)
    with pytest.raises(ConfigError, match="unknown cpu ISA 'neon'"):
        CpuTarget(isa="neon", cores=2)
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                                  (2, "Unified", "2048K"), (3, "Unified", "105M")]):
        entry = tmp_path / f"index{index}"
        entry.mkdir()
        (entry / "level").write_text(f"{level}\n")
        (entry / "type").write_text(f"{kind}\n")
        (entry / "size").write_text(f"{size}\n")
    assert host_caches(tmp_path) == {"l1_bytes": 48 << 10, "l2_bytes": 2 << 20,
                                     "l3_bytes": 105 << 20}
    assert host_caches(tmp_path / "missing")["l2_bytes"] > 0     # the fallbacks
    assert cpu_arch(targets.cpu(16)) != cpu_arch(targets.cpu(2))  # records keyed by cores


def _block_file(tmp_path) -> Path:
    path = tmp_path / "block.onnx"
    onnx.save(resnet_block(), path)
    return path


def test_cross_compile_for_other_cores(tmp_path, caplog):
    path = _block_file(tmp_path)
    runner = CliRunner()
    result = runner.invoke(main, ["compile", str(path), "-o", str(tmp_path / "o16"),
                                  "--target", "cpu", "--cpu-cores", "16"])
    assert result.exit_code == 0, result.output
    assert "for: cpu " in result.output and "16 cores" in result.output
    doc = json.loads(runner.invoke(main, ["inspect", str(tmp_path / "o16"), "--json"]).output)
    kernels = doc["kernels"]
    assert all(k["cores"] == 16 and k["flops"] > 0 for k in kernels)
    convs = [k for k in kernels if k["op"].startswith("Conv")]
    assert convs and all(k["parallel_tasks"] >= 1 for k in convs)
    tuned = runner.invoke(main, ["compile", str(path), "-o", str(tmp_path / "t16"),
                                 "--target", "cpu", "--cpu-cores", "16", "--tune"])
    assert tuned.exit_code == 2
    assert "shaped for 16 cores and this process has" in tuned.output
    assert "compile with --no-tune" in tuned.output and not (tmp_path / "t16").exists()
    with caplog.at_level(logging.WARNING, logger="hidetc"):
        model = hidetc.load(tmp_path / "o16")
    assert model.manifest["machine"]["cores"] == 16
    assert any("compiled for 16 cores, this process has" in r.message for r in caplog.records)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cross_compile_for_a_named_gpu(tmp_path):
    path = _block_file(tmp_path)
    runner = CliRunner()
    result = runner.invoke(main, ["compile", str(path), "-o", str(tmp_path / "l4"),
                                  "--target", "cuda", "--gpu", "l4"])
    assert result.exit_code == 0, result.output
    assert "for: NVIDIA L4 (sm_89, 58 SMs" in result.output
    manifest = hidetc.load(tmp_path / "l4", emulate=True).manifest
    assert manifest["machine"]["sms"] == 58 and manifest["cuda"]["archs"] == ["sm_89"]
    doc = json.loads(runner.invoke(main, ["inspect", str(tmp_path / "l4"), "--json"]).output)
    assert all(k["blocks"] == math.prod(k["grid"]) and k["flops"] > 0 for k in doc["kernels"])
    assert all(k["registers"] > 0 and 1 <= k["blocks_per_sm"] <= 24 for k in doc["kernels"])
    bad = runner.invoke(main, ["compile", str(path), "-o", str(tmp_path / "x"), "--target",
                               "cuda", "--gpu", "l4", "--arch", "sm_90"])
    assert bad.exit_code == 2 and not (tmp_path / "x").exists()
    assert bad.output.strip() == "hidetc: error: --gpu l4 is sm_89, but --arch builds sm_90"


def test_the_isa_comes_from_the_target_in_one_process(tmp_path):
    """AVX2 kernels compiled in a process whose default ISA may be AVX-512: the sources
    use only 256-bit intrinsics, gcc builds them with AVX2's flags, they verify."""
    path = _block_file(tmp_path)
    result = hidetc.compile_model(path, tmp_path / "avx2", target="cpu", cpu_isa="avx2")
    assert result.manifest["cpu_isa"] == "avx2" == result.manifest["machine"]["isa"]
    assert result.manifest["verification"]["status"] == "passed"
    sources = "".join(p.read_text() for p in (tmp_path / "avx2" / "kernels" / "src").glob("*.c"))
    assert "_mm256_fmadd_ps" in sources and "_mm512" not in sources
    with pytest.raises(ConfigError, match="cpu_isa: expected one of avx2, avx512"):
        hidetc.compile_model(path, tmp_path / "x", target="cpu", cpu_isa="neon")
