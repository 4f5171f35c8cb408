"""Runtimes execute ficco's recommendations: tensor-parallel layers with autograd and CUDA-graph support,
and a planner that asks a local model or the service once per shape (usage: docs/planner.md).

``schedules=`` (the layers, ``runtime.tp``'s styles, ``runtime.compile.enable``) takes anything
:func:`as_planner` takes. Imports ``features``, ``executor`` and ``training``; ``ServiceSource`` takes a
``service.client.ServiceClient`` built by the caller; nothing else in ficco imports ``runtime``.

The names below are imported from their modules on first use (PEP 562), so that reading schedule tables
(``from ficco.runtime import TableSource``, ``runtime.sources``) imports neither torch nor the executor.
"""

import importlib
from typing import Any

_HOMES: dict[str, str] = {
    "GraphedCall": "graphs",
    "ColumnParallelLinear": "layers",
    "RowParallelLinear": "layers",
    "apply_ops": "layers",
    "OverlapOps": "overlap",
    "PlannedOps": "overlap",
    "Decision": "planner",
    "OpKey": "planner",
    "OpRequest": "planner",
    "OpShape": "planner",
    "Planner": "planner",
    "Schedules": "planner",
    "as_planner": "planner",
    "Answer": "sources",
    "FixedSource": "sources",
    "FunctionSource": "sources",
    "PredictorSource": "sources",
    "ServiceSource": "sources",
    "TableSource": "sources",
    "Verdict": "verify",
    "verify_plan": "verify",
}
"""Each public name and the module of ``ficco.runtime`` it lives in."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """A public name, imported from its module (:data:`_HOMES`) on first use."""
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
