"""ONNX frontend: `load_model(path)` and `import_model(proto)` produce a `Graph`."""
from hidetc.frontend.onnx.importer import OPSET_RANGE, import_model, load_model

__all__ = ["OPSET_RANGE", "import_model", "load_model"]
