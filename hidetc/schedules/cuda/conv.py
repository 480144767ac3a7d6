"""CUDA direct 2-D convolution (NCHW, OIHW, groups, strides, pads, dilations): one
thread per output element (`spatial(N, OC, OH, OW)` over the global thread index), the
taps predicated against the padding (no address outside the input is formed).

The rule (`conv_gemm.build_conv`) uses it for depthwise convolution (one input channel
per group, more than one group), where the implicit GEMM of `conv_gemm` would have a
reduction of only KH*KW and M = the channel multiplier; every other conv is the GEMM.

Precision: float32, float16 and bfloat16 storage accumulate in float32 (a half: the
result plus bias rounded once), float64 in float64. Guarantees: correct for every shape.
"""
from __future__ import annotations

from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.window import begin_pads
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Const, Function, block_idx, call, cast, logical_and, thread_idx
from hidetc.tir.mapping import spatial

THREADS = 256


def build_direct_conv(task: Task, name: str) -> Function:
    x_type, w_type, out_type = task.inputs[0], task.inputs[1], task.outputs[0]
    if len(x_type.shape) != 4:
        raise UnsupportedOpError(f"Conv: only 2-D convolution is supported, "
                                 f"got input rank {len(x_type.shape)}")
    n, c, h, w = x_type.shape
    oc, icg, kh_n, kw_n = w_type.shape
    oh, ow = out_type.shape[2:]
    ocg = oc // task.attr("group", 1)
    strides = task.attr("strides") or (1, 1)
    dil = task.attr("dilations") or (1, 1)
    pb = begin_pads(task, (h, w), (oh, ow), (kh_n, kw_n), strides, dil)
    dt = out_type.dtype
    acc_dt = "float32" if dt in ("float16", "bfloat16") else dt
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", dt, (n, c, h, w))
    wt = kb.buffer("w", dt, (oc, icg, kh_n, kw_n))
    bias = kb.buffer("bias", dt, (oc,)) if 2 in task.buffer_inputs else None
    out = kb.buffer("out", dt, (n, oc, oh, ow))
    worker = block_idx() * THREADS + thread_idx()
    with kb.for_mapping(spatial(n, oc, oh, ow), worker, names=["b", "o", "y", "xo"]) as idx:
        b, o, y, xo = idx
        init = cast(bias[o], acc_dt) if bias is not None else Const(0.0, acc_dt)
        acc = kb.declare("acc", acc_dt, init)
        with kb.for_range(icg, name="ic") as ic, kb.for_range(kh_n, name="kh") as kh:
            iy = y * strides[0] - pb[0] + kh * dil[0]
            with kb.if_then(logical_and(iy >= 0, iy < h)):
                with kb.for_range(kw_n, name="kw") as kw:
                    ix = xo * strides[1] - pb[1] + kw * dil[1]
                    with kb.if_then(logical_and(ix >= 0, ix < w)):
                        ch = (o // ocg) * icg + ic
                        kb.assign(acc, call("fma", cast(wt[o, ic, kh, kw], acc_dt),
                                            cast(x[b, ch, iy, ix], acc_dt), acc))
        kb.store(out, (b, o, y, xo), cast(acc, dt))
    blocks = max(ceil_div(out_type.size, THREADS), 1)
    return kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))
