"""`hidetc compile --shape NAME=1x3x224x224`: binding the dims an ONNX file leaves symbolic
or unknown (the `shapes` compile option), and every bad use a one-line error."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from helpers.cli import B, assert_one_line_error, invoke, relu_model
from onnx import TensorProto, helper

from hidetc.driver.config import CompileConfig, make_config
from hidetc.errors import ConfigError


def _symbolic_batch(unknown: bool = False) -> onnx.ModelProto:
    """y = relu(x + b), x: [N, 3] with N symbolic (or unknown: no dim_param)."""
    return relu_model([None if unknown else "N", 3])


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(_symbolic_batch(), path)
    return path


def test_shape_binds_the_symbolic_batch_and_runs(model_path, tmp_path):
    out = tmp_path / "out"
    result = invoke("compile", model_path, "-o", out, "--target", "cpu", "--shape", "x=4x3")
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "verification: passed" in result.output
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32", "shape": [4, 3]}]
    assert manifest["config"]["shapes"] == {"x": [4, 3]}
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    run = invoke("run", out, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npz",
                 "--repeat", 1)
    assert run.exit_code == 0, run.output
    with np.load(tmp_path / "y.npz") as saved:
        np.testing.assert_allclose(saved["y"], np.maximum(x + B, 0), rtol=1e-6)


@pytest.mark.parametrize("unknown", [False, True])
def test_dynamic_dim_without_shape_is_a_clean_error(tmp_path, unknown):
    onnx.save(_symbolic_batch(unknown), tmp_path / "dyn.onnx")
    result = invoke("compile", tmp_path / "dyn.onnx", "-o", tmp_path / "out", "--target", "cpu")
    assert_one_line_error(result, "input 'x' dim 0",
                          "--shape x=Nx3" if unknown else "--dim N=128 (one size)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["x", "x=", "=4x3", "x=4xa", "x=4x-3", "x=0x3", "x=4x3x",
                                   "x=4.0x3"])
def test_malformed_shape_is_a_one_line_usage_error(model_path, tmp_path, value):
    result = invoke("compile", model_path, "-o", tmp_path / "out", "--shape", value)
    assert_one_line_error(result, "--shape", "NAME=")
    assert not (tmp_path / "out").exists()


def test_shape_given_twice_or_for_an_unknown_input(model_path, tmp_path):
    result = invoke("compile", model_path, "-o", tmp_path / "out", "--shape", "x=1x3",
                    "--shape", "x=2x3")
    assert_one_line_error(result, "--shape", "'x' is given twice")
    result = invoke("compile", model_path, "-o", tmp_path / "out", "--target", "cpu",
                    "--shape", "x=4x3", "--shape", "z=1x2")
    assert_one_line_error(result, "unknown input 'z'", "model inputs: x")
    result = invoke("compile", model_path, "-o", tmp_path / "out", "--target", "cpu",
                    "--shape", "x=4x5")
    assert_one_line_error(result, "input 'x'", "does not match")
    assert not (tmp_path / "out").exists()


def test_shape_accepts_commas_and_repeats(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "z"], ["y"])], "g", [x, z], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "two.onnx")
    result = invoke("compile", tmp_path / "two.onnx", "-o", tmp_path / "out", "--target",
                    "cpu", "--shape", "x=2,3", "--shape", "z=2x3")
    assert result.exit_code == 0, result.output + str(result.exception)
    manifest = yaml.safe_load((tmp_path / "out" / "manifest.yaml").read_text())
    assert [i["shape"] for i in manifest["inputs"]] == [[2, 3], [2, 3]]


def test_config_validates_shapes(tmp_path):
    assert CompileConfig(shapes={"x": (np.int64(2), 3)}).shapes == {"x": [2, 3]}
    for bad in ({"x": [0, 3]}, {"x": [2, -1]}, {"x": "2x3"}, {"x": [2.0]}, {"x": [True]},
                {"": [1]}, [["x", [1]]]):
        with pytest.raises(ConfigError, match="shapes"):
            CompileConfig(shapes=bad)
    preset = tmp_path / "p.yaml"
    preset.write_text("shapes:\n  x: [4, 3]\n")
    assert make_config(str(preset)).shapes == {"x": [4, 3]}


def test_dim_binds_a_named_dimension_for_every_input(model_path, tmp_path):
    """--dim N=4 binds the file's dimension 'N' (x's batch) by name: the static compile."""
    out = tmp_path / "out"
    result = invoke("compile", model_path, "-o", out, "--target", "cpu", "--dim", "N=4")
    assert result.exit_code == 0, result.output + str(result.exception)
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32", "shape": [4, 3]}]
    assert manifest["config"]["dims"] == {"N": 4}


@pytest.mark.parametrize("args,fragments", [
    (["--dim", "N"], ["--dim 'N'", "NAME=1..512"]),
    (["--dim", "N=0"], ["--dim 'N=0'", "a range of sizes (1..512)"]),
    (["--dim", "N=4", "--dim", "N=5"], ["--dim: 'N' is given twice"]),
    (["--dim", "M=4"], ["--dim names 'M'", "named dimensions: N"]),
    (["--dim", "N=1..2x3"], ["--dim 'N=1..2x3'"]),
    (["--shape", "x=1..0x3"], ["--shape 'x=1..0x3'", "ids=1x1..512"]),
    (["--shape-opt", "x=2xa"], ["--shape-opt 'x=2xa'", "e.g. 1x128"]),
    (["--dim-opt", "N=4,,5"], ["--dim-opt 'N=4,,5'", "16,64,128"]),
    (["--dim", "N=1..8", "--dim-opt", "N=9"], ["tuning size 9 of dimension 'N' is outside "
                                               "its range 1..8"]),
])
def test_bad_ranges_and_tuning_sizes_are_one_line_errors(model_path, tmp_path, args,
                                                         fragments):
    result = invoke("compile", model_path, "-o", tmp_path / "out", "--target", "cpu", *args)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out").exists()


def test_config_validates_ranges_and_tuning_sizes():
    cfg = CompileConfig(shapes={"x": [1, "1..512"]}, dims={"seq": "1..512", "b": 2},
                        shape_opts={"x": [[1, 64]]}, dim_opts={"seq": (16, 128)})
    assert cfg.shapes == {"x": [1, "1..512"]} and cfg.dims == {"seq": "1..512", "b": 2}
    assert cfg.shape_opts == {"x": [[1, 64]]} and cfg.dim_opts == {"seq": [16, 128]}
    for key, bad in (("dims", {"s": "0..3"}), ("dims", {"s": 1.5}), ("dims", ["s"]),
                     ("shapes", {"x": ["4..2"]}), ("shape_opts", {"x": [1, 2]}),
                     ("shape_opts", {"x": []}), ("dim_opts", {"s": [0]}),
                     ("dim_opts", {"s": "16"})):
        with pytest.raises(ConfigError, match=f"^{key}: "):
            CompileConfig(**{key: bad})
