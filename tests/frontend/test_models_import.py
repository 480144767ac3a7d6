"""The benchmark models (tiny variants) import with static shapes everywhere and the
numpy reference matches ONNX Runtime on them."""
import numpy as np
import onnxruntime as ort
import pytest

import models
from hidetc.frontend import import_model
from hidetc.graph.reference import run_graph


@pytest.mark.parametrize("name", sorted(models.REGISTRY))
def test_tiny_model_matches_onnxruntime(name):
    proto = models.build(name, tiny=True)
    feeds = models.sample_inputs(proto)
    graph = import_model(proto, source=f"{name}.onnx")
    assert all(out in graph.types for node in graph.nodes for out in node.outputs if out)
    ours = run_graph(graph, feeds)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for (key, a), b in zip(ours.items(), session.run(None, feeds)):
        assert a.shape == b.shape and a.dtype == b.dtype, key
        scale = float(np.max(np.abs(b))) or 1.0
        assert float(np.max(np.abs(a - b))) <= 1e-5 * scale, key
