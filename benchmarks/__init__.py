"""Benchmark harness: ``python -m benchmarks.run [NAME ...]`` (see run.py)."""
