"""The C runtime's cuda path (`runtime/c/cuda*.c`) without a GPU, against the fake CUDA
driver (`helpers.c_runtime_cuda`): the image chosen per compute capability; a GPU, driver
or kernel the artifact cannot run on a machine error; driver calls failing at load,
context creation and in a pass, a failed capture, sync-each -- every failure one line with
the right status; nothing leaked (the fake counts)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from helpers.c_runtime_cuda import (
    ARENA,
    DEVICE,
    FAKE_SOURCE,
    IMAGES,
    MACHINE,
    MEMORY,
    OK,
    N,
    W,
    host_outputs,
    launches,
    needs_gcc,
    static_artifact,
)

pytestmark = needs_gcc


# ---------------------------------------------------------------- images and the machine


@pytest.mark.parametrize("cc, image", [(90, "sm_90"), (86, "sm_80"), (80, "sm_80"),
                                       (100, "compute_90"), (120, "compute_90")])
def test_image_for_the_compute_capability(cuda, tmp_path, monkeypatch, cc, image):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("FAKE_CUDA_CC", str(cc))
    cuda.model(root)
    [module] = cuda.calls("cuModuleLoadData")
    assert module["head"] == IMAGES[image][:16].hex()
    cuda.assert_released()


@pytest.mark.parametrize("cc, images, message", [
    (70, {}, "is sm_70, which hidetc does not support"),
    (120, {"ptx": False}, "has sm_80, sm_90 but Fake GPU (sm_120) is sm_120; recompile with "
                          "--arch sm_120"),
    (89, {"archs": ("sm_90",), "ptx": True}, "has sm_90 and PTX compute_90 but Fake GPU "
                                             "(sm_89) is sm_89")])
def test_no_image_for_the_gpu_is_a_machine_error(cuda, tmp_path, monkeypatch, cc, images,
                                                 message):
    root = tmp_path / "static"
    static_artifact(root, **images)
    monkeypatch.setenv("FAKE_CUDA_CC", str(cc))
    status, _ = cuda.load(root)
    assert status == MACHINE
    assert message in cuda.error() and "\n" not in cuda.error()
    cuda.assert_released()


def test_missing_driver_or_gpu_is_a_machine_error(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("HIDETC_CUDA_DRIVER", "/nonexistent/libcuda.so.1")
    status, _ = cuda.load(root)
    assert status == MACHINE
    error = cuda.error()
    assert "/nonexistent/libcuda.so.1" in error and "CUDA driver cannot be loaded" in error
    assert "\n" not in error and str(root) in error
    monkeypatch.setenv("HIDETC_CUDA_DRIVER", cuda.env_driver)
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "0")
    assert cuda.load(root)[0] == MACHINE
    assert "no CUDA GPU is visible (no CUDA device found)" in cuda.error()
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuInit")
    monkeypatch.setenv("FAKE_CUDA_FAIL_RC", "100")
    assert cuda.load(root)[0] == MACHINE
    assert "CUDA_ERROR_NO_DEVICE" in cuda.error()
    cuda.assert_released()


def test_driver_without_an_entry_point_is_a_machine_error(cuda, tmp_path, monkeypatch):
    old = tmp_path / "libfakecuda_old.so"
    subprocess.run(["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-pthread",
                    "-DFAKE_CUDA_OLD_DRIVER", str(FAKE_SOURCE), "-o", str(old)], check=True)
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("HIDETC_CUDA_DRIVER", str(old))
    assert cuda.load(root)[0] == MACHINE
    assert f"the CUDA driver {old} has no cuGraphInstantiateWithFlags" in cuda.error()
    cuda.assert_released()


def test_block_over_the_kernels_limit_is_a_machine_error(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("FAKE_CUDA_MAX_THREADS", "32")
    assert cuda.load(root)[0] == MACHINE
    assert "launch 0 (fake_add): a block of 64 threads but the kernel allows at most 32" \
        in cuda.error()
    cuda.assert_released()


# ---------------------------------------------------------------- driver failures


@pytest.mark.parametrize("call, message", [
    ("cuModuleLoadData", "kernels/sm_90.cubin: loading the cubin of module 'model': "
                         "cuModuleLoadData failed on Fake GPU (sm_90): CUDA_ERROR_INVALID_VALUE"),
    ("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain failed"),
    ("cuModuleGetFunction", "launch 0 (fake_add): kernel 'fake_add' of module 'model': "
                            "cuModuleGetFunction failed"),
    ("cuMemcpyHtoDAsync", "uploading the weights"),
    ("cuFuncSetAttribute", "launch 2 (fake_copy) needs 65536 bytes of dynamic shared memory")])
def test_failing_call_at_load_names_it(cuda, tmp_path, monkeypatch, call, message):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("FAKE_CUDA_FAIL", call)
    status, _ = cuda.load(root)
    assert status == (MACHINE if call == "cuFuncSetAttribute" else DEVICE)
    assert message in cuda.error() and "\n" not in cuda.error()
    cuda.assert_released()


def test_failing_calls_in_a_pass_name_the_call_and_launch(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    context = cuda.context(model)
    x = np.ones(N, np.float32)
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuLaunchKernel@2")
    assert cuda.run(context, [x], host_outputs()) == DEVICE
    assert cuda.error() == ("launch 1 (scalars, grid [2, 3, 4], block [8, 4, 2], 0 B dynamic "
                            "shared memory): cuLaunchKernel failed on Fake GPU (sm_90): "
                            "CUDA_ERROR_INVALID_VALUE")
    assert cuda.live("graphs") == 0 and cuda.live("execs") == 0     # the capture undone
    monkeypatch.delenv("FAKE_CUDA_FAIL")
    outputs = host_outputs()
    assert cuda.run(context, [x], outputs) == OK, cuda.error()      # the context goes on
    np.testing.assert_array_equal(outputs[0], x + W[:N])
    for call, rc, where in [("cuGraphLaunch", 1, "replaying the forward pass"),
                            ("cuMemcpyHtoDAsync", 1, "input 'x' (256 bytes)"),
                            ("cuMemcpyDtoHAsync", 1, "output 'y' (256 bytes)"),
                            ("cuStreamSynchronize", 700, "a kernel fault")]:
        monkeypatch.setenv("FAKE_CUDA_FAIL", f"{call}@1")
        monkeypatch.setenv("FAKE_CUDA_FAIL_RC", str(rc))
        assert cuda.run(context, [x], host_outputs()) == DEVICE, call
        assert call in cuda.error() and where in cuda.error(), cuda.error()
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuMemAlloc@1")
    monkeypatch.setenv("FAKE_CUDA_FAIL_RC", "2")
    assert cuda.create(model)[0] == MEMORY
    assert cuda.error() == (f"out of GPU memory: {ARENA} bytes for the activation arena but "
                            f"only 1073741824 of 17179869184 bytes are free on Fake GPU (sm_90)")
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuMemAlloc@2")
    monkeypatch.setenv("FAKE_CUDA_FAIL_RC", "1")
    assert cuda.create(model)[0] == DEVICE
    assert "allocating the input and output buffers" in cuda.error()
    assert cuda.live("streams") == 1 and cuda.live("events") == 2   # the good context's
    cuda.assert_released()


def test_capture_failure_falls_back_to_plain_launches(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    context = cuda.context(cuda.model(root))
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuGraphInstantiateWithFlags")
    x = np.ones(N, np.float32)
    for _ in range(2):
        cuda.clear()
        outputs = host_outputs()
        assert cuda.run(context, [x], outputs) == OK, cuda.error()
        np.testing.assert_array_equal(outputs[0], x + W[:N])
        assert {kv["graph"] for kv in launches(cuda)} == {"-"}
    assert len(cuda.calls("cuStreamBeginCapture")) == 0             # not tried again
    assert cuda.live("graphs") == 0
    cuda.assert_released()


def test_sync_each_launches_plainly_and_waits_after_each(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("HIDETC_CUDA_SYNC_EACH", "1")
    context = cuda.context(cuda.model(root))
    cuda.clear()
    assert cuda.run(context, [np.ones(N, np.float32)], host_outputs()) == OK, cuda.error()
    heads = [h for h, _ in cuda.lines()]
    assert "cuStreamBeginCapture" not in heads
    seq = [h for h in heads if h in ("launch", "cuStreamSynchronize")]
    assert seq == ["launch", "cuStreamSynchronize"] * 3 + ["cuStreamSynchronize"]
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuStreamSynchronize@2")
    monkeypatch.setenv("FAKE_CUDA_FAIL_RC", "700")
    assert cuda.run(context, [np.ones(N, np.float32)], host_outputs()) == DEVICE
    assert cuda.error().startswith("launch 1 (scalars, grid [2, 3, 4]")
    assert "CUDA_ERROR_ILLEGAL_ADDRESS (a kernel fault" in cuda.error()
    cuda.assert_released()
