"""Lowering passes over tensor programs, one per file; the order is in tir/pipeline.py."""
