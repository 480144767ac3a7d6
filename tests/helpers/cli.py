"""What the CLI tests share: `invoke` (click's runner on `hidetc ...`, arguments as
text), `assert_one_line_error` (exit 2, one `hidetc: error: ` line holding every
fragment, stderr's last: no traceback), and `relu_model` (y = relu(x + b), a tiny model whose input
dims may be named or unknown)."""
from __future__ import annotations

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper

from hidetc.tools.cli import main

B = np.array([1.0, -2.0, 3.0], np.float32)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(result, *fragments: str, alone: bool = True) -> None:
    """`alone`: the error is all of stderr; else (a command that logs progress first)
    the one error line is stderr's last."""
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("hidetc: error: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], result.stderr
    assert len(lines) == 1 or not alone, result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def relu_model(dims: list) -> onnx.ModelProto:
    """y = relu(x + b), x of `dims` (str: a named symbolic dim; None: unknown), b (3
    floats, `B`) broadcast on the last."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    nodes = [helper.make_node("Add", ["x", "b"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [onnx.numpy_helper.from_array(B, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
