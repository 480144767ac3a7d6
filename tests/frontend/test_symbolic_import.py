"""Importing with ranges: the exporters' dynamic axes become symbolic sizes through the
whole graph (shape subgraphs folded to expressions), and at every size the symbolic
types are the static import's types at that size; what cannot be one expression over
the range is a one-line error naming the node."""
from __future__ import annotations

import pytest
from helpers.exporter_fixtures import DATA, RANGES

from hidetc.errors import ShapeError
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.dims import DimRange
from hidetc.graph.symbolic import SymDim


@pytest.mark.parametrize("stem", sorted(RANGES))
def test_symbolic_types_are_the_static_types_at_every_size(stem):
    ranges = RANGES[stem]
    graph = load_model(DATA / f"{stem}.onnx", dims=ranges)
    ranged = {k: v for k, v in ranges.items() if isinstance(v, str)}
    assert set(graph.symbols) == set(ranged)
    assert all(isinstance(graph.symbols[k], DimRange) for k in ranged)
    assert any(isinstance(d, SymDim) for o in graph.outputs for d in graph.types[o].shape)
    picks = [{k: r.lo for k, r in graph.symbols.items()},
             {k: r.hi for k, r in graph.symbols.items()},
             {k: min(r.hi, 7) for k, r in graph.symbols.items()}]
    for sizes in picks:
        static = load_model(DATA / f"{stem}.onnx", dims={**ranges, **sizes})
        assert not static.symbols
        common = set(static.types) & set(graph.types)
        assert set(static.outputs) <= common and len(common) > len(graph.inputs)
        for value in common:
            if value in static.constants:
                continue
            assert graph.types[value].at(sizes) == static.types[value], (value, sizes)


@pytest.mark.parametrize("stem,dims,fragments", [
    ("encoder_ts", {"batch": "1..4", "seq": "1..64"},
     ["node '/mha/Reshape_4' (Reshape)", "[7, 2*batch, 8]", "16*batch*seq"]),
    ("gpt_dynamo", {"batch": "1..4", "seq": "1..512"},
     ["(Slice)", "whether seq", "depends on the sizes (seq in 1..512)"]),
    ("lstm_ts", {"batch": 2, "seq": "1..8"}, ["node '/lstm/LSTM' (LSTM)", "seq"]),
])
def test_what_one_expression_cannot_say_is_a_one_line_error(stem, dims, fragments):
    """encoder_ts was traced with constant reshapes (seq 7 baked in); gpt's position
    table has 32 rows, so a longer seq changes the slice; the LSTM is unrolled over
    its sequence."""
    with pytest.raises(ShapeError) as info:
        load_model(DATA / f"{stem}.onnx", dims=dims)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{stem}.onnx: ")
    for fragment in fragments:
        assert fragment in message, message
