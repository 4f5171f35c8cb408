"""What produced a dataset's labels: the executor's label version, the settings that move a schedule's time,
the machine, measured or simulated. The one home of the label-version history.

Every change to the executor or the timing protocol that can move a schedule's measured time bumps
:data:`LABEL_VERSION` and adds a line to :data:`LABEL_VERSIONS`; the harness records the version in every
dataset's manifest (``protocol.label_version``), and datasets measured before it was recorded get theirs from
the protocol settings their manifests hold (:func:`label_version_of`). Training reads a
:class:`LabelSource` per dataset and never pools two sources silently (docs/training.md, "Label sources").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

LABEL_VERSION = 3
"""The executor's label version: what the executor and timing protocol of this code measure."""
LABEL_VERSIONS: dict[int, str] = {
    1: "first timing protocol: 5 to 24 interleaved rounds per scenario and mode (max_rounds=24), one "
    "copy-engine side stream per peer (serial/dma included), one torch.mm per expert",
    2: "timing protocol v3: up to 96 rounds, eager mode 3x the timed work (max_rounds=96, "
    "eager_timed_factor=3.0); executor as in 1",
    3: "executor 089bfea and 3955c91: the copy arrangement is a setting (copy_streams, default one "
    "stream; copies with no GEMM to overlap, serial/dma at 2 ranks among them, on the caller's stream), "
    "blocks of >= 8 expert GEMMs run as one grouped GEMM",
}
"""Label version -> what changed in it (the executor's and timing protocol's history)."""
ROUNDS_ONLY: frozenset[int] = frozenset({2})
"""Versions whose change was only how many rounds the timing protocol takes: their labels estimate the same
times as the version before, more steadily, so a repeat sweep of one pools into the other's labels."""


def same_times(a: int | str, b: int | str) -> bool:
    """Whether measured label versions ``a`` and ``b`` time the same thing (every version after the older
    one up to the newer changed only the round counts, :data:`ROUNDS_ONLY`)."""
    if not (isinstance(a, int) and isinstance(b, int)):
        return a == b
    return all(v in ROUNDS_ONLY for v in range(min(a, b) + 1, max(a, b) + 1))


PROTOCOL_BEFORE: dict[str, object] = {"pin": "share", "expert_gemms": "loop", "copy_streams": "per_peer"}
"""Protocol settings as datasets measured before they became settings were measured (a resume and a label
source compare with these): every rank's threads on an equal share of the CPUs, one ``torch.mm`` per expert,
one copy-engine side stream per peer."""

SIMULATED_BACKENDS = frozenset({"sim", "gloo"})
"""Row backends whose times are not GPU measurements (``features.provenance`` treats them as simulated)."""
SOURCE_SETTINGS: tuple[str, ...] = ("backend", "label_version", "gpu_name", "world_size")
"""The :class:`LabelSource` fields whose difference makes two datasets' labels different sources."""


def label_version_of(protocol: Mapping[str, Any]) -> int:
    """The label version of a dataset measured under ``protocol`` (its manifest's): the recorded
    ``label_version``, else the version whose settings it holds (copy arrangement recorded: 3; up to 96
    rounds: 2; else 1)."""
    if "label_version" in protocol:
        return int(protocol["label_version"])
    if "copy_streams" in protocol:
        return 3
    return 2 if int(protocol.get("max_rounds", 0)) >= 96 else 1


@dataclass(frozen=True, kw_only=True, slots=True)
class LabelSource:
    """Where one dataset's labels come from."""

    backend: str
    """Row backend: ``gpu`` (measured), ``sim`` (the simulator) or ``gloo`` (CPU processes)."""
    label_version: int | str
    """The executor's label version (:data:`LABEL_VERSIONS`) for measured rows; the simulator's model
    version (e.g. ``sim4``) for simulated ones."""
    gpu_name: str
    """The measuring machine's GPU (the hardware profile's for simulated rows)."""
    world_size: int
    """Ranks the scenarios ran on."""
    host_factor: float
    """The measuring machine's host factor (``features.dataset.host_factor_of``; 1.0 when not measurable)."""
    settings: dict[str, Any]
    """The protocol settings recorded beside the version (copy arrangement, expert GEMMs, rounds, ...)."""
    fingerprint: dict[str, Any]
    """The machine fingerprint of the manifest (driver, CUDA, torch, NCCL, interconnect)."""

    @property
    def measured(self) -> bool:
        return self.backend not in SIMULATED_BACKENDS

    def key(self) -> tuple[Any, ...]:
        """The fields of :data:`SOURCE_SETTINGS`: equal keys are one source."""
        return tuple(getattr(self, name) for name in SOURCE_SETTINGS)

    def differences(self, other: LabelSource) -> list[str]:
        """``name this vs other`` for each field of :data:`SOURCE_SETTINGS` and each protocol setting
        that differs (the protocol's only where the label versions differ too)."""
        out = [
            f"{name} {getattr(self, name)!r} vs {getattr(other, name)!r}"
            for name in SOURCE_SETTINGS
            if getattr(self, name) != getattr(other, name)
        ]
        if self.label_version != other.label_version:
            out += [
                f"{name} {self.settings.get(name)!r} vs {other.settings.get(name)!r}"
                for name in sorted(set(self.settings) | set(other.settings))
                if self.settings.get(name) != other.settings.get(name) and name != "modes"
            ]
        return out

    def describe(self) -> str:
        """One line: ``gpu v3 on NVIDIA H200 x2, host factor 1.36``."""
        kind = f"v{self.label_version}" if self.measured else str(self.label_version)
        machine = f"{self.gpu_name} x{self.world_size}"
        return f"{self.backend} {kind} on {machine}, host factor {self.host_factor:.3g}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def label_source(manifest: Mapping[str, Any], host_factor: float) -> LabelSource:
    """The :class:`LabelSource` of a dataset from its manifest (``features.dataset.read_manifest``) and
    its host factor."""
    protocol = dict(manifest.get("protocol") or {})
    fingerprint = dict(manifest.get("fingerprint") or {})
    backend = str(manifest.get("backend", fingerprint.get("backend", "gpu")))
    hardware = manifest.get("hardware") or {}
    if backend == "sim":
        version: int | str = str(fingerprint.get("sim_model", "sim"))
        settings = {"sim_constants": fingerprint.get("sim_constants")}
    else:
        version = label_version_of(protocol)
        settings = {k: v for k, v in (PROTOCOL_BEFORE | protocol).items() if k != "label_version"}
    return LabelSource(
        backend=backend,
        label_version=version,
        gpu_name=str(fingerprint.get("gpu_name") or hardware.get("gpu_name", "")),
        world_size=int(fingerprint.get("world_size") or hardware.get("gpu_count", 0)),
        host_factor=float(host_factor),
        settings=settings,
        fingerprint=fingerprint,
    )
