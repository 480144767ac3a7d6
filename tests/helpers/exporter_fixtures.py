"""The torch.onnx exporter fixtures of tests/data/exporters (models/exporters/
export_torch_fixtures.py) as the dynamic-shape tests bind them: `RANGES` gives, per
fixture stem, one `--dim` value per named dimension the exporter marked dynamic (a
range, or a single size where the graph fixes it: the LSTMs are unrolled over their
sequence; encoder_ts, traced with constant reshapes at seq 7, is left out -- ONNX
Runtime itself runs it at no other seq); `reference` runs ONNX Runtime on a fixture and
`assert_matches` compares with the f32 verification bound (norm-wise relative error
<= 1e-4; integers exact)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

DATA = Path(__file__).resolve().parents[1] / "data" / "exporters"
RTOL = 1e-4        # the f32 verification bound (norm-wise relative error)
RANGES = {"cnn_ts": {"batch": "1..32"}, "cnn_dynamo": {"batch": "1..32"},
          "cnn_tsfunc": {"batch": "1..32"}, "unet_ts": {"batch": "1..16"},
          "unet_dynamo": {"batch": "1..16"},
          "encoder_dynamo": {"batch": "1..4", "seq": "1..64"},
          "gpt_ts": {"batch": "1..4", "seq": "1..32"},
          "gpt_dynamo": {"batch": "1..4", "seq": "1..32"},
          "lstm_ts": {"batch": "1..8", "seq": 5}, "lstm_dynamo": {"batch": "1..8", "seq": 5}}


def reference(model: str | Path, feeds: dict) -> dict:
    """ONNX Runtime's outputs (name -> array) of `model` (a fixture stem or a path)."""
    path = model if isinstance(model, Path) else DATA / f"{model}.onnx"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def assert_matches(got: dict, ref: dict) -> None:
    """Same names, shapes and dtypes; floats within RTOL norm-wise, the rest exact."""
    assert set(got) == set(ref)
    for name, want in ref.items():
        have = got[name]
        assert have.shape == want.shape and have.dtype == want.dtype, name
        if want.dtype.kind == "f":
            err = np.linalg.norm((have - want).astype(np.float64).ravel())
            assert err <= RTOL * max(np.linalg.norm(want.astype(np.float64).ravel()), 1e-30), name
        else:
            np.testing.assert_array_equal(have, want, err_msg=name)
