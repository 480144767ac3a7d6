"""Binding the inputs' dimensions (`hidetc.frontend.onnx.input_dims.resolve`) and the
size-range texts (`hidetc.graph.dims`): sizes, ranges, named dims shared by inputs,
tuning sizes, and every bad binding a one-line ModelError naming what to fix."""
from __future__ import annotations

import pytest

from hidetc.errors import ModelError
from hidetc.frontend.onnx.input_dims import resolve
from hidetc.graph.dims import (
    DimRange,
    default_opts,
    parse_opt_shape,
    parse_shape,
    parse_size,
    parse_sizes,
)

GPT = {"ids": ["batch", "seq"], "mask": ["batch", "seq"]}


def test_size_texts():
    assert parse_size("128") == DimRange(128, 128)
    assert parse_size(" 1..512 ") == DimRange(1, 512)
    assert str(parse_size("1..512")) == "1..512" and str(parse_size("7")) == "7"
    assert parse_shape("1x1..512") == [DimRange(1, 1), DimRange(1, 512)]
    assert parse_shape("2,3..4") == [DimRange(2, 2), DimRange(3, 4)]
    assert parse_sizes("16,64,128") == (16, 64, 128)
    assert parse_opt_shape("1x128") == [1, 128]
    for bad in ("", "0", "-1", "a", "5..2", "1...3", "1..", "..4", "1.5", "0..3"):
        with pytest.raises(ValueError) as info:
            parse_size(bad)
        assert "\n" not in str(info.value)
    for bad in ("", "1x", "1xa", "1x0..3"):
        with pytest.raises(ValueError, match="1x1..512"):
            parse_shape(bad)
    for bad in ("", "1,,2", "0", "a"):
        with pytest.raises(ValueError, match="16,64,128"):
            parse_sizes(bad)


@pytest.mark.parametrize("lo,hi", [(1, 1), (1, 2), (1, 32), (1, 512), (3, 1024), (64, 65),
                                   (100, 10 ** 6)])
def test_default_tuning_sizes_spread_over_the_range(lo, hi):
    opts = default_opts(lo, hi)
    assert list(opts) == sorted(set(opts)) and all(lo <= o <= hi for o in opts)
    assert opts[0] == lo and opts[-1] == hi and 1 <= len(opts) <= 4
    if hi >= 27 * lo:                 # a wide range: sizes in different octaves
        assert len(opts) == 4 and opts[0] < opts[1] < opts[2] < opts[3]
    assert DimRange(lo, hi).opts == opts


def test_a_range_checks_its_tuning_sizes():
    assert DimRange(1, 512, (128, 16, 16)).opts == (16, 128)
    with pytest.raises(ValueError, match="outside the range 1..512"):
        DimRange(1, 512, (600,))
    with pytest.raises(ValueError):
        DimRange(5, 4)
    assert 7 in DimRange(1, 8) and 9 not in DimRange(1, 8) and 0 not in DimRange(1, 8)


def test_file_sizes_stay_and_named_dims_are_shared():
    bound = resolve({"x": ["batch", 3, 224, 224]}, dims={"batch": DimRange(1, 32)})
    assert bound.inputs == {"x": ("batch", 3, 224, 224)}
    assert bound.symbols == {"batch": DimRange(1, 32)} and not bound.static
    assert bound.shapes_at({"batch": 5}) == {"x": [5, 3, 224, 224]}
    shared = resolve(GPT, shapes={"ids": parse_shape("1x1..512")})
    assert shared.inputs == {"ids": (1, "seq"), "mask": (1, "seq")}
    assert shared.symbols == {"seq": DimRange(1, 512)}
    static = resolve(GPT, dims={"batch": DimRange(2, 2), "seq": DimRange(7, 7)})
    assert static.static and static.inputs == {"ids": (2, 7), "mask": (2, 7)}


def test_unknown_dims_become_symbols_of_their_own():
    bound = resolve({"x": [None, 4]}, shapes={"x": [DimRange(1, 9), DimRange(4, 4)]})
    assert bound.inputs == {"x": ("x_0", 4)} and bound.symbols == {"x_0": DimRange(1, 9)}
    with pytest.raises(ModelError, match=r"input 'x' dim 0 is unknown .*--shape x=Nx4 "):
        resolve({"x": [None, 4]})
    with pytest.raises(ModelError, match=r"input 'x' has no shape; bind one with --shape"):
        resolve({"x": None})
    rankless = resolve({"x": None}, shapes={"x": parse_shape("2x3")})
    assert rankless.inputs == {"x": (2, 3)}


def test_tuning_sizes_by_name_or_by_shape():
    by_name = resolve(GPT, dims={"batch": DimRange(1, 1), "seq": DimRange(1, 512)},
                      dim_opts={"seq": [16, 128]})
    assert by_name.symbols["seq"].opts == (16, 128)
    by_shape = resolve(GPT, shapes={"ids": parse_shape("1x1..512")},
                       shape_opts={"ids": [[1, 64], [1, 384]], "mask": [[1, 64]]})
    assert by_shape.symbols["seq"].opts == (64, 384)
    with pytest.raises(ModelError, match="tuning size 600 of dimension 'seq' is outside "
                                         "its range 1..512"):
        resolve(GPT, shapes={"ids": parse_shape("1x1..512")}, dim_opts={"seq": [600]})
    with pytest.raises(ModelError, match=r"tuning size 2 of dimension 'batch' is outside "
                                         r"its range 1$"):
        resolve(GPT, shapes={"ids": parse_shape("1x1..512")}, shape_opts={"ids": [[2, 8]]})
    with pytest.raises(ModelError, match=r"--shape-opt x: dim 1 is 5, the input's size "
                                         r"there is 3"):
        resolve({"x": ["n", 3]}, shapes={"x": parse_shape("1..4x3")},
                shape_opts={"x": [[2, 5]]})
    with pytest.raises(ModelError, match=r"--shape-opt ids=8: 1 dimensions, the input has 2"):
        resolve(GPT, shapes={"ids": parse_shape("1x1..512")}, shape_opts={"ids": [[8]]})


@pytest.mark.parametrize("kwargs,fragments", [
    (dict(), ["input 'ids' dim 0 is symbolic ('batch')", "--dim batch=128 (one size)",
              "--dim batch=1..512 (a range)"]),
    (dict(dims={"batch": DimRange(1, 1)}), ["input 'ids' dim 1 is symbolic ('seq')"]),
    (dict(shapes={"ids": parse_shape("1x8"), "mask": parse_shape("2x8")}),
     ["input 'mask' dim 0", "'batch'", "gives 2", "gave 1"]),
    (dict(shapes={"ids": parse_shape("1x8")}, dims={"seq": DimRange(1, 16)}),
     ["input 'ids' dim 1", "'seq'", "gives 8", "--dim seq=1..16 gave 1..16"]),
    (dict(shapes={"ids": parse_shape("1x8x1")}), ["--shape gives 3 dimensions", "has 2"]),
    (dict(shapes={"idz": parse_shape("1")}), ["--shape names unknown input 'idz'",
                                              "model inputs: ids, mask"]),
    (dict(dims={"sequence": DimRange(1, 8)}), ["--dim names 'sequence'",
                                               "named dimensions: batch, seq"]),
    (dict(dim_opts={"sequence": [1]}), ["--dim-opt names 'sequence'"]),
])
def test_bad_bindings_are_one_line_errors(kwargs, fragments):
    with pytest.raises(ModelError) as info:
        resolve(GPT, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_a_file_size_cannot_be_rebound():
    with pytest.raises(ModelError, match=r"input 'x' dim 1: --shape gives 1..4, which does "
                                         r"not match the model's size 3"):
        resolve({"x": ["n", 3]}, shapes={"x": parse_shape("2x1..4")})
