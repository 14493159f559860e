"""Benchmarks behind `make bench-*`, kept apart from the tests; see docs/benchmarks.md."""
