"""Tensor-program IR: task mappings, the kernel-writing DSL, lowering passes."""
