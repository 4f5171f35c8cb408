"""Measured or simulated: where a model's training rows came from, and the registry id that follows.

Any row of the simulator (``sim``) or CPU processes (``gloo``) makes a model *simulated*, registered apart
under ``<hardware_id>-sim`` (``SIM_SUFFIX``), never promoted over nor served for the measured model. The one
home of the rule. See docs/models.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

ModelBackend = Literal["measured", "simulated"]
"""What a model was trained on: rows measured on GPUs, or (some) simulated rows."""
MEASURED: ModelBackend = "measured"
SIMULATED: ModelBackend = "simulated"
SIM_SUFFIX = "-sim"
"""Appended to a hardware id to name the registry entry of its simulated models (``h200x2-sim``)."""
MEASURED_ROW_BACKENDS = frozenset({"gpu"})
"""Dataset row backends (``harness.dataset``'s ``backend`` column) that count as measured."""


def rows_backend(backends: Iterable[str]) -> ModelBackend:
    """``measured`` when every row backend (a dataset's ``backend`` column values) is measured, else
    ``simulated`` (also for no rows at all: nothing was measured)."""
    found = set(backends)
    return MEASURED if found and found <= MEASURED_ROW_BACKENDS else SIMULATED


def model_backend(card: Mapping[str, Any]) -> ModelBackend:
    """A model card's backend: its ``model_backend`` field; for cards from before that field, the backends
    of its dataset's rows (``dataset.backends``); a card with neither is from the first, GPU-measured
    models and counts as measured."""
    recorded = card.get("model_backend")
    if recorded in (MEASURED, SIMULATED):
        return recorded
    backends = (card.get("dataset") or {}).get("backends")
    return MEASURED if backends is None else rows_backend(backends)


def is_sim_id(registry_id: str) -> bool:
    """Whether a registry id names simulated models (``h200x2-sim``)."""
    return registry_id.endswith(SIM_SUFFIX)


def registry_id(hardware_id: str, backend: ModelBackend) -> str:
    """Where models of ``hardware_id`` trained on ``backend`` rows are registered: the hardware id itself
    (measured) or it with ``SIM_SUFFIX`` (simulated)."""
    if is_sim_id(hardware_id):
        hardware_id = hardware_id[: -len(SIM_SUFFIX)]
    return hardware_id + (SIM_SUFFIX if backend == SIMULATED else "")


def backend_of_id(registry_id_: str) -> ModelBackend:
    """The backend the models under ``registry_id_`` must have."""
    return SIMULATED if is_sim_id(registry_id_) else MEASURED


DEFAULT_M_RANGE = (64, 65536)
"""The rows (``m``) a model card that records no ``m_range`` was trained on: every sweep before that field
was planned from the token counts 128 to 65,536 (``harness.plan.DEFAULT_TOKENS``), expert rows from 64."""
FAR_PAST = 2.0
"""How far past its trained ``m`` range (as a factor) a scenario gets a note that the answer extrapolates."""


def trained_m_range(card: Mapping[str, Any], op: str) -> tuple[int, int]:
    """(smallest, largest) ``m`` of ``op``'s training rows: the card's ``m_range``, else
    :data:`DEFAULT_M_RANGE`."""
    lo, hi = (card.get("m_range") or {}).get(op, DEFAULT_M_RANGE)
    return int(lo), int(hi)


def range_note(card: Mapping[str, Any], op: str, m: int) -> str | None:
    """A note when ``m`` lies more than :data:`FAR_PAST` times outside the ``m`` the model was trained on for
    ``op`` (its trees then answer as at the edge of their data); None within."""
    lo, hi = trained_m_range(card, op)
    if m > FAR_PAST * hi:
        return (
            f"m={m} is {m / hi:.3g}x the largest m the model was trained on for {op} ({hi}): the answer "
            "extrapolates past its training data"
        )
    if m * FAR_PAST < lo:
        return (
            f"m={m} is below the smallest m the model was trained on for {op} ({lo}): the answer "
            "extrapolates past its training data"
        )
    return None
