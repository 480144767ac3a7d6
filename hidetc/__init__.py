"""hidetc: a deep-learning model compiler. ONNX in; a packaged, verified artifact out.

The Python API: `compile_model(model_path, out_dir, ...)` and `load(out_dir)`.
"""
__version__ = "0.1.0"

from hidetc.api import compile_model, load  # noqa: E402

__all__ = ["compile_model", "load", "__version__"]
