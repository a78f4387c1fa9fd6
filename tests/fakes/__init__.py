"""Test doubles shared by the tests (and the benchmarks' baselines)."""
