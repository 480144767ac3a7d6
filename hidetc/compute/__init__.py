"""Operator definitions as tensor-program expressions: what each output element is.

Kept apart from the schedules (templates) that decide how the elements are computed, so
one definition serves every template, and fusion can substitute a producer's definition
for a consumer's load.
"""
