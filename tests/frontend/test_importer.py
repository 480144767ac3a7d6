"""The ONNX importer: canonical forms of older opsets, constant handling, value
propagation through Shape chains, external data, and every kind of bad input."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hidetc.errors import ModelError, ShapeError, UnsupportedOpError
from hidetc.frontend import import_model, load_model
from hidetc.graph.ir import TensorType
from hidetc.graph.reference import run_graph

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17, functions=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8, functions=list(functions))


def tensor_in(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def out(name):
    return helper.make_empty_tensor_value_info(name)


def const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.array(values, dtype=dtype), name)


def compare_with_ort(proto, feeds, rtol=1e-5, atol=1e-6):
    graph = import_model(proto)
    ours = run_graph(graph, feeds)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, feeds)
    assert list(ours) == [o.name for o in proto.graph.output]
    for (name, a), b in zip(ours.items(), theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)
    return graph


def x_feed(*shape):
    return {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def test_opset13_reduce_axes_attribute_becomes_input():
    node = helper.make_node("ReduceMean", ["x"], ["y"], name="rm", axes=[1, -1], keepdims=0)
    proto = model([node], [tensor_in("x", [2, 3, 4])], [out("y")], opset=13)
    graph = compare_with_ort(proto, x_feed(2, 3, 4))
    (made,) = graph.nodes
    assert made.op == "ReduceMean" and len(made.inputs) == 2 and "axes" not in made.attr_dict
    assert graph.constants[made.inputs[1]].tolist() == [1, -1]
    assert graph.types["y"] == TensorType("float32", (2,))


def test_opset13_reduce_without_axes_and_reducesum_input_form():
    nodes = [helper.make_node("ReduceMax", ["x"], ["a"]),
             helper.make_node("ReduceSum", ["x", "ax"], ["b"], keepdims=0)]
    proto = model(nodes, [tensor_in("x", [2, 3])], [out("a"), out("b")], [const("ax", [0])],
                  opset=13)
    graph = compare_with_ort(proto, x_feed(2, 3))
    assert graph.nodes[0].inputs == ("x",)


def test_opset13_split_forms():
    x = x_feed(6, 4)
    equal = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0)
    proto = model([equal], [tensor_in("x", [6, 4])], [out("a"), out("b"), out("c")], opset=13)
    graph = compare_with_ort(proto, x)
    assert graph.nodes[0].attr("num_outputs") == 3
    sized = helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1)
    proto = model([sized], [tensor_in("x", [6, 4])], [out("a"), out("b")],
                  [const("s", [1, 3])], opset=13)
    compare_with_ort(proto, x)


def test_legacy_split_attribute_becomes_input():
    node = helper.make_node("Split", ["x"], ["a", "b"], axis=0, split=[2, 4])
    proto = model([node], [tensor_in("x", [6, 4])], [out("a"), out("b")], opset=13)
    graph = import_model(proto)
    made = graph.nodes[0]
    assert "split" not in made.attr_dict and graph.constants[made.inputs[1]].tolist() == [2, 4]
    result = run_graph(graph, x_feed(6, 4))
    np.testing.assert_array_equal(result["a"], x_feed(6, 4)["x"][:2])
    assert graph.types["b"].shape == (4, 4)


def test_legacy_squeeze_axes_attribute_becomes_input():
    node = helper.make_node("Squeeze", ["x"], ["y"], axes=[0])
    graph = import_model(model([node], [tensor_in("x", [1, 3])], [out("y")], opset=13))
    assert graph.types["y"].shape == (3,) and len(graph.nodes[0].inputs) == 2


def test_shape_gather_concat_reshape_chain_gets_static_shapes():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="/Shape"),
        helper.make_node("Gather", ["s", "i0"], ["d0"], name="/Gather", axis=0),
        helper.make_node("Unsqueeze", ["d0", "ax0"], ["d0u"], name="/Unsqueeze"),
        helper.make_node("Concat", ["d0u", "minus1"], ["shape"], name="/Concat", axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"], name="/Reshape"),
        helper.make_node("Shape", ["flat"], ["fs"], name="/Shape_1", start=-1),
        helper.make_node("ConstantOfShape", ["fs"], ["ones"], name="/Cos",
                         value=helper.make_tensor("value", F, [1], [1.0])),
        helper.make_node("Range", ["zero", "d0", "one"], ["r"], name="/Range"),
        helper.make_node("Slice", ["flat", "zero1", "fs", "one1"], ["sl"], name="/Slice"),
        helper.make_node("Add", ["sl", "ones"], ["y"], name="/Add"),
    ]
    inits = [const("i0", 0), const("ax0", [0]), const("minus1", [-1]), const("zero", 0),
             const("one", 1), const("zero1", [0]), const("one1", [1])]
    proto = model(nodes, [tensor_in("x", [2, 3, 4])], [out("y"), out("r")], inits)
    graph = compare_with_ort(proto, x_feed(2, 3, 4))
    assert graph.types["flat"].shape == (2, 12)
    assert graph.types["ones"].shape == (12,)
    assert graph.types["r"] == TensorType("int64", (2,))
    assert graph.types["y"].shape == (2, 12)
    assert [n.op for n in graph.nodes] == [n.op_type for n in nodes]  # nothing folded away


def test_constant_nodes_become_constants():
    nodes = [
        helper.make_node("Constant", [], ["c0"], value=numpy_helper.from_array(
            np.array([[1.0, 2.0]], np.float32))),
        helper.make_node("Constant", [], ["c1"], value_float=0.5),
        helper.make_node("Constant", [], ["c2"], value_floats=[1.0, 2.0]),
        helper.make_node("Constant", [], ["c3"], value_int=3),
        helper.make_node("Constant", [], ["c4"], value_ints=[4, 1]),
        helper.make_node("Constant", [], ["c5"], value=numpy_helper.from_array(
            np.array(7, np.int64))),
        helper.make_node("Add", ["x", "c0"], ["a"]),
        helper.make_node("Mul", ["a", "c1"], ["b"]),
        helper.make_node("Sub", ["b", "c2"], ["c"]),
        helper.make_node("Reshape", ["c", "c4"], ["y"]),
    ]
    proto = model(nodes, [tensor_in("x", [2, 2])], [out("y"), out("c3"), out("c5")])
    graph = compare_with_ort(proto, x_feed(2, 2))
    assert [n.op for n in graph.nodes] == ["Add", "Mul", "Sub", "Reshape"]
    assert graph.constants["c1"].dtype == np.float32 and graph.constants["c1"].shape == ()
    assert graph.constants["c3"].dtype == np.int64 and graph.constants["c3"].shape == ()
    assert graph.constants["c5"].shape == ()
    assert graph.types["c2"] == TensorType("float32", (2,))


def test_constant_of_shape_value_and_cast_to_become_names():
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"],
                              value=helper.make_tensor("value", TensorProto.INT32, [1], [4])),
             helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT16),
             helper.make_node("CastLike", ["x", "c"], ["z"])]
    proto = model(nodes, [tensor_in("x", [3])], [out("y"), out("z")], [const("s", [3])])
    graph = compare_with_ort(proto, x_feed(3))
    cos, cast, castlike = graph.nodes
    assert cos.attr_dict == {"value": 4, "dtype": "int32"}
    assert cast.attr("to") == "float16"
    assert castlike.op == "Cast" and castlike.attr("to") == "int32"


def test_initializer_inputs_are_constants_and_outputs_keep_order():
    nodes = [helper.make_node("Add", ["x", "w"], ["first"]),
             helper.make_node("Mul", ["x", "w"], ["second"])]
    proto = model(nodes, [tensor_in("x", [3]), tensor_in("w", [3])],
                  [out("second"), out("first")], [const("w", [1, 2, 3], np.float32)])
    graph = compare_with_ort(proto, x_feed(3))
    assert graph.inputs == ("x",)
    assert graph.outputs == ("second", "first")
    assert "w" in graph.constants


def test_unnamed_nodes_get_names_and_order_is_fixed():
    nodes = [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Neg", ["x"], ["a"])]
    proto = model(nodes, [tensor_in("x", [3])], [out("y")])
    graph = import_model(proto)
    assert [n.op for n in graph.nodes] == ["Neg", "Relu"]
    assert [n.name for n in graph.nodes] == ["Neg_1", "Relu_0"]


def test_optional_outputs():
    ln = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"], name="ln")
    proto = model([ln], [tensor_in("x", [2, 4])], [out("y")],
                  [const("s", [1, 2, 3, 4], np.float32)])
    graph = compare_with_ort(proto, x_feed(2, 4))
    assert graph.nodes[0].outputs == ("y",)
    proto = model([ln], [tensor_in("x", [2, 4])], [out("y"), out("mean")],
                  [const("s", [1, 2, 3, 4], np.float32)])
    graph = compare_with_ort(proto, x_feed(2, 4))   # Mean read: the decomposition
    assert "LayerNormalization" not in [n.op for n in graph.nodes]
    drop = helper.make_node("Dropout", ["x"], ["y", "mask"])
    proto = model([drop], [tensor_in("x", [2, 4])], [out("y"), out("mask")])
    compare_with_ort(proto, x_feed(2, 4))


def test_local_functions_are_inlined():
    fn = helper.make_function("local", "Twice", ["a"], ["b"],
                              [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    node = helper.make_node("Twice", ["x"], ["y"], domain="local")
    proto = model([node], [tensor_in("x", [3])], [out("y")], functions=[fn])
    proto.opset_import.append(helper.make_opsetid("local", 1))
    graph = import_model(proto)
    assert [n.op for n in graph.nodes] == ["Add"]


def test_shapes_hook_binds_symbolic_dims():
    node = helper.make_node("Relu", ["x"], ["y"])
    proto = model([node], [tensor_in("x", ["batch", 3])], [out("y")])
    with pytest.raises(ModelError, match=r"^g: input 'x' dim 0 is symbolic \('batch'\); bind it "
                                         r"with --dim batch=128 \(one size\) or "
                                         r"--dim batch=1..512 \(a range\)$"):
        import_model(proto)
    graph = import_model(proto, shapes={"x": (5, 3)})
    assert graph.types["y"].shape == (5, 3)
    assert import_model(proto, dims={"batch": 6}).types["y"].shape == (6, 3)
    assert import_model(proto, dims={"batch": "7..7"}).types["y"].shape == (7, 3)
    with pytest.raises(ModelError, match=r"input 'x' dim 1: --shape gives 4, which does not "
                                         r"match the model's size 3"):
        import_model(proto, shapes={"x": (5, 4)})
    with pytest.raises(ModelError, match="--shape names unknown input 'z'"):
        import_model(proto, shapes={"z": (1,)})
    unknown = model([node], [tensor_in("x", [None, 3])], [out("y")])
    with pytest.raises(ModelError, match="input 'x' dim 0 is unknown"):
        import_model(unknown)
    rankless = model([node], [helper.make_tensor_value_info("x", F, None)], [out("y")])
    with pytest.raises(ModelError, match="input 'x' has no shape"):
        import_model(rankless)


def test_negative_and_impossible_shapes_are_one_line_errors():
    """A negative bound dim, or a tensor past 2^60 elements on an input or a node's
    output (a Tile of a fine input): refused at import naming the input or node, before
    any work that could hang on the size. (What a target can index or hold is checked
    when the model is planned for it: tests/e2e/test_big_tensors.py.) A negative dim
    *declared* by the model is a free one (ONNX Runtime's reading): bind it."""
    relu = helper.make_node("Relu", ["x"], ["y"])
    declared = model([relu], [tensor_in("x", [-3, 4])], [out("y")])
    with pytest.raises(ModelError, match=r"^g: input 'x' dim 0 is unknown .*--shape"):
        import_model(declared)
    assert import_model(declared, shapes={"x": (2, 4)}).types["y"].shape == (2, 4)
    with pytest.raises(ModelError, match=r"^g: input 'x' has 4611686018427387904 elements "
                                         r"\(shape \[1152921504606846976, 4\]\), more than "
                                         r"any machine can hold"):
        import_model(model([relu], [tensor_in("x", [2 ** 60, 4])], [out("y")]))
    with pytest.raises(ModelError, match=r"input 'x': bound shape \[-1, 4\] is negative"):
        import_model(model([relu], [tensor_in("x", ["n", 4])], [out("y")]),
                     shapes={"x": (-1, 4)})
    tile = helper.make_node("Tile", ["x", "r"], ["y"], name="big")
    proto = model([tile], [tensor_in("x", [2 ** 30, 4])], [out("y")],
                  [const("r", [2 ** 31, 1])])
    with pytest.raises(ModelError, match=r"node 'big' \(Tile\) output 'y' has "
                                         r"\d+ elements .* more than any machine can hold"):
        import_model(proto)


def test_value_needed_for_shape_must_be_static():
    node = helper.make_node("Reshape", ["x", "s"], ["y"], name="/r")
    proto = model([node], [tensor_in("x", [2, 3]), tensor_in("s", [2], TensorProto.INT64)],
                  [out("y")])
    with pytest.raises(ShapeError, match=r"^g: node '/r' \(Reshape\): input 1 \(shape\) must "
                                         r"be a constant known at compile time$"):
        import_model(proto)


def test_unsupported_ops_are_all_listed():
    nodes = [helper.make_node("Foo", ["x"], ["a"], name="n1"),
             helper.make_node("Relu", ["a"], ["b"], name="ok"),
             helper.make_node("Bar", ["b"], ["c"], name="/x/Bar"),
             helper.make_node("Foo", ["c"], ["d"], name="n2"),
             helper.make_node("FusedGemm", ["d"], ["y"], name="ms", domain="com.microsoft")]
    proto = model(nodes, [tensor_in("x", [3])], [out("y")])
    proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(UnsupportedOpError) as info:
        import_model(proto, source="model.onnx")
    assert str(info.value) == ("model.onnx: unsupported ops: Foo (node 'n1'), Bar (node "
                               "'/x/Bar'), com.microsoft.FusedGemm (node 'ms')")


@pytest.mark.parametrize("opset", [0, 29])
def test_opset_out_of_range(opset, tmp_path):
    proto = model([helper.make_node("Relu", ["x"], ["y"])], [tensor_in("x", [3])], [out("y")],
                  opset=opset)
    path = tmp_path / "model.onnx"
    onnx.save(proto, path)
    with pytest.raises(ModelError) as info:
        load_model(path)
    assert str(info.value) == (f"model.onnx: ai.onnx opset {opset} is not supported "
                               f"(supported: 1-28)")


@pytest.mark.parametrize("opset", [7, 12, 13, 15, 18, 21, 22, 28])
def test_supported_opsets(opset):
    proto = model([helper.make_node("Relu", ["x"], ["y"])], [tensor_in("x", [3])], [out("y")],
                  opset=opset)
    compare_with_ort(proto, x_feed(3))


def test_bad_files(tmp_path):
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelError, match=r"nope.onnx: no such file$"):
        load_model(missing)
    with pytest.raises(ModelError, match=r": not a file$"):
        load_model(tmp_path)
    text = tmp_path / "text.onnx"
    text.write_text("hello, this is definitely not a protobuf\n" * 10)
    with pytest.raises(ModelError, match=r"^text.onnx: not a valid ONNX model \(.+\)$"):
        load_model(text)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelError, match=r"^empty.onnx: not an ONNX model"):
        load_model(empty)
    proto = model([helper.make_node("Relu", ["x"], ["y"])], [tensor_in("x", [3])], [out("y")],
                  [const("w", np.zeros(1000), np.float32)])
    data = proto.SerializeToString()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=r"^truncated.onnx: not a valid ONNX model"):
        load_model(truncated)


def test_external_data(tmp_path):
    w = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    proto = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tensor_in("x", [2, 64])],
                  [out("y")], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "model.onnx"
    onnx.save(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    graph = load_model(path)
    np.testing.assert_array_equal(graph.constants["w"], w)
    x = x_feed(2, 64)["x"]
    np.testing.assert_allclose(run_graph(graph, {"x": x})["y"], x @ w, rtol=1e-5, atol=1e-5)
    os.remove(tmp_path / "weights.bin")
    with pytest.raises(ModelError, match=r"^model.onnx: initializer 'w': cannot read external "
                                         r"data file '.*weights.bin'"):
        load_model(path)


def test_undefined_input_and_output():
    proto = model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")],
                  [tensor_in("x", [3])], [out("y")])
    with pytest.raises(ModelError, match=r"node 'r' \(Relu\): input 'nowhere' is not produced"):
        import_model(proto)
    proto = model([helper.make_node("Relu", ["x"], ["y"])], [tensor_in("x", [3])], [out("zz")])
    with pytest.raises(ModelError, match="graph output 'zz' is not produced by any node"):
        import_model(proto)


def test_unsupported_dtype_input():
    proto = model([helper.make_node("Identity", ["x"], ["y"])],
                  [tensor_in("x", [3], TensorProto.STRING)], [out("y")])
    with pytest.raises(ModelError, match="input 'x' has unsupported element type STRING"):
        import_model(proto)
