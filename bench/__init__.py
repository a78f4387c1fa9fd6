"""Benchmarks: ``python -m bench SCENARIO [--quick] [--json]`` (see bench/README.md)."""
