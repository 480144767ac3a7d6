"""nvcc invocation: cubins per architecture plus PTX, the build cache, one-line errors,
architecture parsing and the ptxas resource report. Compiling tests skip without nvcc."""
import shutil

import pytest

from hidetc.backends.toolchain import nvcc
from hidetc.backends.toolchain.cache import BuildCache
from hidetc.backends.toolchain.nvcc import compile_cubins, parse_archs, ptxas_resources
from hidetc.errors import ConfigError, ToolchainError

TWO_KERNELS = r"""
#include "scale.cuh"
extern "C" __global__ void add_one(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
extern "C" __global__ void reverse_smem(float *y, const float *x) {
  __shared__ float s[1024];
  s[threadIdx.x] = x[threadIdx.x] * SCALE;
  __syncthreads();
  y[threadIdx.x] = s[1023 - threadIdx.x];
}
"""
PTXAS_REPORT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spilly' for 'sm_90'
ptxas info    : Function properties for spilly
    1024 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 1024 bytes cumulative stack
ptxas info    : Compile time = 46.449 ms
ptxas info    : Compiling entry function 'tiny' for 'sm_90'
ptxas info    : Function properties for tiny
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
"""

try:
    NVCC_MISSING = None if nvcc.find_nvcc() else "nvcc not found"
except ToolchainError as exc:
    NVCC_MISSING = str(exc)
needs_nvcc = pytest.mark.skipif(NVCC_MISSING is not None, reason=str(NVCC_MISSING))


@pytest.fixture
def headers(tmp_path):
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "scale.cuh").write_text("#define SCALE 2.0f\n")
    return inc


@needs_nvcc
def test_two_archs_and_ptx(tmp_path, headers):
    out = compile_cubins({"model": TWO_KERNELS}, "sm_90,sm_80", tmp_path / "kernels",
                         include_dirs=[headers], cache=BuildCache(tmp_path / "cache"),
                         keep_logs=True)
    assert set(out) == {"sm_80", "sm_90", "compute_90"}
    for arch in ("sm_80", "sm_90"):
        cubin = out[arch]["model"]
        assert cubin == tmp_path / "kernels" / arch / "model.cubin"
        assert cubin.read_bytes()[:4] == b"\x7fELF"
        resources = ptxas_resources(cubin)
        assert set(resources) == {"add_one", "reverse_smem"}
        assert resources["reverse_smem"]["shared_bytes"] == 4096
        assert resources["add_one"]["registers"] > 0 and resources["add_one"]["spills"] == 0
    ptx = out["compute_90"]["model"].read_text()
    assert out["compute_90"]["model"].name == "model.compute_90.ptx"
    assert ".target sm_90" in ptx and ".entry add_one" in ptx and ".entry reverse_smem" in ptx


@needs_nvcc
def test_second_build_hits_the_cache_and_headers_are_keyed(tmp_path, headers, monkeypatch):
    cache = BuildCache(tmp_path / "cache")
    first = compile_cubins({"model": TWO_KERNELS}, ["sm_90"], tmp_path / "a", ptx=False,
                           include_dirs=[headers], cache=cache)
    calls = []
    real_run = nvcc._run
    monkeypatch.setattr(nvcc, "_run", lambda *a: calls.append(a) or real_run(*a))
    again = compile_cubins({"renamed": TWO_KERNELS}, ["sm_90"], tmp_path / "b", ptx=False,
                           include_dirs=[headers], cache=cache)
    assert calls == []
    assert again["sm_90"]["renamed"].read_bytes() == first["sm_90"]["model"].read_bytes()
    (headers / "scale.cuh").write_text("#define SCALE 3.0f\n")
    compile_cubins({"model": TWO_KERNELS}, ["sm_90"], tmp_path / "c", ptx=False,
                   include_dirs=[headers], cache=cache)
    # an edited header is a cache miss: the PTX again, the cubin from it
    assert [c[0][1] for c in calls] == ["-ptx", "-cubin"]


@needs_nvcc
def test_syntax_error_is_one_line_with_the_command(tmp_path):
    bad = 'extern "C" __global__ void k(float *x) { x[0] = undefined_name; }\n'
    with pytest.raises(ToolchainError) as info:
        compile_cubins({"bad": bad}, "sm_90", tmp_path / "out", cache=BuildCache(tmp_path / "c"))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("nvcc compiling bad for sm_90 failed: ")
    assert 'error: identifier "undefined_name" is undefined' in message
    # (the front end runs in the PTX step a cubin is assembled from)
    assert "| reproduce: " in message and " -ptx -arch=compute_90 " in message
    log = message.rsplit("| full log: ", 1)[1]
    assert "undefined_name" in open(log).read()
    assert any((tmp_path / "c" / "build").rglob("bad.cu"))


def test_missing_nvcc_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(nvcc, "SYSTEM_CUDA_DIRS", ())
    expected = ("nvcc not found: install the CUDA toolkit (nvcc) to compile for the cuda "
                "target, or use --target cpu")
    with pytest.raises(ToolchainError) as info:
        compile_cubins({"k": "x"}, "sm_90", tmp_path / "out")
    assert str(info.value) == expected
    fake_home = tmp_path / "cuda"
    (fake_home / "bin").mkdir(parents=True)
    shutil.copy("/bin/true", fake_home / "bin" / "nvcc")
    monkeypatch.setenv("CUDA_HOME", str(fake_home))
    assert nvcc.find_nvcc() == str(fake_home / "bin" / "nvcc")


def test_parse_archs():
    assert parse_archs("sm_90,sm_80") == ("sm_80", "sm_90")
    assert parse_archs(["8.6", "sm_90a", "90", "sm_90"]) == ("sm_86", "sm_90", "sm_90a")
    assert parse_archs(" sm_100 ") == ("sm_100",)
    for bad, message in [("sm_75", "sm_75 is not supported: hidetc targets sm_80"),
                         ("7.0", "sm_70 is not supported"), ("volta", "'volta' is not a GPU"),
                         ("compute_90", "'compute_90' is not a GPU"), ("", "no GPU architecture"),
                         ("sm_9", "'sm_9' is not")]:
        with pytest.raises(ConfigError, match=message):
            parse_archs(bad)
    assert nvcc.ptx_arch(("sm_80", "sm_90")) == "compute_90"


def test_ptxas_resources_from_text_and_log(tmp_path):
    expected = {"spilly": {"registers": 255, "shared_bytes": 4096, "spills": 8,
                           "spill_loads": 12, "stack_bytes": 1024},
                "tiny": {"registers": 8, "shared_bytes": 0, "spills": 0, "spill_loads": 0,
                         "stack_bytes": 0}}
    assert ptxas_resources(PTXAS_REPORT) == expected
    (tmp_path / "model.ptxas.log").write_text(PTXAS_REPORT)
    assert ptxas_resources(tmp_path / "model.cubin") == expected
    with pytest.raises(ToolchainError, match="no ptxas report"):
        ptxas_resources(tmp_path / "other.cubin")


def test_default_arch_and_jobs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                 # no nvidia-smi
    nvcc.default_arch.cache_clear()
    try:
        assert nvcc.default_arch() == "sm_90"
    finally:
        nvcc.default_arch.cache_clear()
    monkeypatch.setattr(nvcc, "mem_available_bytes", lambda: int(2.5 * (1 << 30)))
    assert nvcc.default_jobs(100) <= 2
    monkeypatch.setattr(nvcc, "mem_available_bytes", lambda: 1 << 20)
    assert nvcc.default_jobs(100) == 1
