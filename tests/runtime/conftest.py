"""The runtime tests' fixtures: `fake`, the fake pycuda driver (`helpers.fake_cuda`)."""
from helpers.fake_cuda import fake  # noqa: F401
