"""Benchmarks: one command each, figures printed (never timed tests)."""
