"""Benchmarks: `python -m bench.NAME` prints a readable table and, as its last line, one JSON object."""
