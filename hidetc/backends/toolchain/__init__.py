"""Compiler invocation (gcc, later nvcc) with a content-addressed build cache."""
