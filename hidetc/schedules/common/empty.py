"""The kernel of a task whose output has no elements (a zero in its shape, as in ONNX's
tril_zero/triu_zero tests): nothing to compute, so an empty body with the ABI every
kernel has (the task's buffer inputs, then its outputs), for either target. The rules'
task mappings need positive extents, so `build_kernel` of both targets routes such
tasks here before any rule runs."""
from __future__ import annotations

from hidetc.compute.task import Task
from hidetc.target import simt
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function


def is_empty(task: Task) -> bool:
    return any(t.size == 0 for t in task.outputs)


def build_empty(task: Task, name: str, target: str = "cpu") -> Function:
    kb = KernelBuilder(name, target)
    for i in task.buffer_inputs:
        kb.buffer(f"in{i}", task.inputs[i].dtype, task.inputs[i].shape)
    for k, t in enumerate(task.outputs):
        kb.buffer(f"out{k}", t.dtype, t.shape)
    if not simt(target):
        return kb.finish()
    return kb.finish(grid=(1, 1, 1), block=(32, 1, 1))
