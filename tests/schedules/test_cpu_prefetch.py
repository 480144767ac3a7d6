"""Software prefetch of weights packed ahead of time (`avx2.Ahead`): the CPU kernels that
read prepacked weights panels -- channels-last direct convs (K in chunks, or the whole K
with a panel of at most PREFETCH_PANEL_BYTES) and MatMul with a constant B -- prefetch
the panel the next micro-tiles will read. A prefetch never faults, so an address outside
the weights would go unnoticed by the value checks: here every `__builtin_prefetch` of
the printed kernel is redefined to count addresses inside and outside the weights
buffer, and the kernel's output is checked against numpy as well."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from helpers import targets
from helpers.tasks import matmul_task, nhwc_task, task_reference

from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.toolchain.gcc import build_shared_library
from hidetc.schedules.cpu import TEMPLATES, conv_direct_last
from hidetc.schedules.cpu import conv as cpu_conv
from hidetc.schedules.cpu import matmul as cpu_matmul
from hidetc.schedules.cpu.conv_direct import DirectConfig
from hidetc.schedules.cpu.microkernel import GemmConfig
from hidetc.tir.pipeline import lower

COUNTING = r"""
static const char *pf_lo, *pf_hi;
static long pf_inside, pf_outside;
void pf_bounds(const char *lo, const char *hi) {
  pf_lo = lo; pf_hi = hi; pf_inside = pf_outside = 0;
}
long pf_counts(long *outside) { *outside = pf_outside; return pf_inside; }
#define __builtin_prefetch(p, rw, level) ((void)(((const char *)(p) < pf_lo || \
    (const char *)(p) >= pf_hi) ? __atomic_fetch_add(&pf_outside, 1, __ATOMIC_RELAXED) \
    : __atomic_fetch_add(&pf_inside, 1, __ATOMIC_RELAXED)))
"""

CASES = [   # task, config, whether it prefetches
    # K in chunks of 32 over 3 panels per task: next panel, then the next chunk's first
    (nhwc_task((1, 96, 7, 7), (80, 96, 1, 1), True), DirectConfig(4, 32, mc=64, nc=96, kc=32),
     True),
    # a short last chunk (3x3 x 20 channels: runs of 60 in chunks of 32)
    (nhwc_task((1, 20, 6, 5), (40, 20, 3, 3), False, pads=[1, 1, 1, 1]),
     DirectConfig(4, 16, mc=8, nc=32, kc=32), True),
    # the whole K in registers, panels of 144 x 32 floats (18 KB)
    (nhwc_task((1, 16, 9, 9), (64, 16, 3, 3), True, pads=[1, 1, 1, 1]),
     DirectConfig(8, 32, mc=16, nc=64, kc=0), True),
    # the whole K in registers, panels of 1152 x 32 floats (147 KB): none
    (nhwc_task((1, 128, 5, 5), (32, 128, 3, 3), True, pads=[1, 1, 1, 1]),
     DirectConfig(8, 32, mc=16, nc=32, kc=0), False),
    (matmul_task((3, 300), (300, 100)), GemmConfig(3, 32, mc=6, nc=64, kc=64), True),
    (matmul_task((1, 257), (257, 40)), GemmConfig(4, 16, mc=4, nc=48, kc=100), True),
]


@pytest.mark.parametrize("task,cfg,prefetches", CASES,
                         ids=[f"{t.op}-{i}" for i, (t, _, _) in enumerate(CASES)])
def test_prefetched_addresses_stay_inside_the_weights(tmp_path, task, cfg, prefetches):
    assert conv_direct_last.PREFETCH_PANEL_BYTES == 128 * 1024   # the cases are sized on it
    fn = lower(TEMPLATES[task.op].build(task, cfg, "k", targets.CPU, prepacked=True))
    source = print_c_module([fn])
    assert ("__builtin_prefetch" in source) == prefetches
    lib = ctypes.CDLL(str(build_shared_library({"k": COUNTING + source}, tmp_path / "k.so")))
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(t.shape).astype(np.float32) for t in task.inputs]
    module = cpu_matmul if task.op == "MatMul" else cpu_conv
    packed = np.ascontiguousarray(module.prepack_weights(task, cfg, inputs[1]))
    args = [inputs[0], packed, *inputs[2:]]
    out = np.empty(task.outputs[0].shape, np.float32)
    base = packed.ctypes.data
    lib.pf_bounds(ctypes.c_void_p(base), ctypes.c_void_p(base + packed.nbytes))
    lib.k(*[a.ctypes.data_as(ctypes.c_void_p) for a in args],
          out.ctypes.data_as(ctypes.c_void_p))
    outside = ctypes.c_long()
    lib.pf_counts.restype = ctypes.c_long
    inside = lib.pf_counts(ctypes.byref(outside))
    assert outside.value == 0
    assert (inside > 0) == prefetches
    ref = task_reference(task, inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))
