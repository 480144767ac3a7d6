"""Schedules: per-target kernel builders for graph tasks (templates and rules)."""
