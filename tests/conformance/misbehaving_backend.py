"""A backend that misbehaves on purpose, for the pool's containment tests: by the op of
the model's first node it segfaults (Abs), hangs (Relu), exits (Neg), raises (Sign),
returns wrong values (Floor), or delegates to ONNX Runtime (anything else)."""
from __future__ import annotations

import ctypes
import os
import time

import numpy as np
import onnxruntime.backend as ort


class Rep:
    def __init__(self, op: str, inner):
        self.op, self.inner = op, inner

    def run(self, inputs, **kwargs):
        if self.op == "Abs":
            ctypes.string_at(0)          # SIGSEGV, as a faulty kernel would
        if self.op == "Relu":
            time.sleep(3600)             # a hang
        outputs = self.inner.run(inputs)
        if self.op == "Floor":
            return [np.asarray(o) + 1 for o in outputs]
        return outputs


class MisbehavingBackend:
    @classmethod
    def prepare(cls, model, device="CPU", **kwargs):
        op = model.graph.node[0].op_type
        if op == "Neg":
            os._exit(3)
        if op == "Sign":
            raise RuntimeError("deliberate failure\nsecond line")
        return Rep(op, ort.prepare(model, device))
