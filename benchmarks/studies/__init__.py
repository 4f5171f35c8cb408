"""Finished studies whose results are committed under ``benchmarks/results/`` and cited by the docs."""
