"""The runtime tests' fixtures: `fake`, the fake pycuda driver (`helpers.fake_cuda`); `fake_so`,
`lib` and `cuda`, the C runtime against the fake CUDA driver (`helpers.c_runtime_cuda`)."""
from helpers.c_runtime_cuda import cuda, fake_so, lib  # noqa: F401
from helpers.fake_cuda import fake  # noqa: F401
