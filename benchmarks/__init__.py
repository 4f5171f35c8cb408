"""ficco's benchmark tools, run from the repository root as ``python -m benchmarks.<tool>``; finished studies
under ``benchmarks.studies`` (host studies under ``benchmarks.studies.host``)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository root (a source checkout: the benchmarks read its datasets and model configs)."""
