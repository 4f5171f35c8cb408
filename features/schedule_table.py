"""Exported schedule tables: what a runtime loads at start-up instead of asking a model per shape.

One file per (hardware, world size, execution mode, dtype), named the way vLLM and SGLang name their
per-device kernel tables (``E=8,N=14336,device_name=NVIDIA_H200.json``)::

    op=tp_overlap,device_name=NVIDIA_H200,tp=2,mode=graph,dtype=bf16.json

It holds, for every (op, n, k) (and, for MoE ops, experts and top_k), the sorted token counts ``m`` where
the model's pick changes (``breakpoints``) and one range per breakpoint: the schedule, its predicted
speedup over serial and a confidence (the margin over the runner-up schedule, and whether that margin is
outside the best set's 1% floor). A lookup of ``m`` returns the range of the largest breakpoint ``<= m``:
at every point of the export's token grid (``grid`` in the file) that is exactly what the model picks, and
between grid points it is the pick at the grid point below. Beside the tables: the model version, the
training datasets' content hashes, the hardware fingerprint of the measured machine and the format version.

``ficco export`` writes these files (``training.export``); ``runtime.TableSource.load`` reads them and
refuses a file whose fingerprint is not the loading machine's. Reading needs no xgboost.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ficco.files import write_text_atomic

log = logging.getLogger(__name__)

FORMAT = "ficco-schedule-table"
"""The ``format`` field of every table file."""
FORMAT_VERSION = 1
"""The ``format_version`` this code writes and reads."""
FINGERPRINT_KEYS: tuple[str, ...] = ("backend", "gpu_name", "gpu_count")
"""What a table's timings depend on that both a model card and a machine can state (``harness.fingerprint``
reads them with ``nvidia-smi``): measured on GPUs or simulated, the GPU model (an NVLink H200 and a PCIe
``H200 NVL`` differ here) and how many. Driver, CUDA and torch versions are left out, so an upgrade does not
orphan a table."""
BEST_SET_FLOOR = 0.01
"""A margin below this (1%) cannot be told from noise (the best set's floor, ``harness.labels``)."""


class FingerprintMismatch(ValueError):
    """A table was exported for another machine than the one loading it."""


def device_name(gpu_name: str) -> str:
    """The file-name form of a GPU name, as vLLM writes it: spaces and dashes become underscores
    (``NVIDIA H100 80GB HBM3`` -> ``NVIDIA_H100_80GB_HBM3``)."""
    return gpu_name.replace(" ", "_").replace("-", "_")


def artifact_name(header: dict[str, Any]) -> str:
    """``device_name=...,tp=...,mode=...,dtype=...`` of an export's header (its ``device_name`` the GPU
    name, ``world_size``, ``mode``, ``dtype``): how the table files and the other exported files are named."""
    return (
        f"device_name={device_name(header['device_name'])},tp={header['world_size']},"
        f"mode={header['mode']},dtype={header['dtype']}"
    )


def hardware_fingerprint(fields: dict[str, Any]) -> str:
    """``sha256:<16 hex>`` of ``fields``' :data:`FINGERPRINT_KEYS` (absent keys count as None)."""
    canonical = json.dumps({k: fields.get(k) for k in FINGERPRINT_KEYS}, sort_keys=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True, slots=True)
class Range:
    """What the model picks from one breakpoint up to the next."""

    schedule: str
    """Canonical schedule string (``serial/sm`` where the model's own fallback fired)."""
    predicted_speedup: float
    """Predicted ``t_serial / t_schedule`` at the range's first token count."""
    min_speedup: float
    """Lowest predicted speedup of the schedule over the range's grid points."""
    runner_up: str | None
    """The schedule of highest predicted speedup after the pick at the first token count (None: none)."""
    margin: float
    """Smallest predicted ``speedup(pick) / speedup(runner-up) - 1`` over the range's grid points (the
    time-ratio regressor's; negative where the ranker and the regressor disagree)."""
    confident: bool
    """``margin >= BEST_SET_FLOOR``: the runner-up is outside the model's best set everywhere in the range."""

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """The ranges of one (op, n, k, experts, top_k) over the token axis."""

    op: str
    n: int
    k: int
    experts: int = 0
    top_k: int = 0
    breakpoints: tuple[int, ...]
    """Sorted token counts ``m`` where a range starts; the first is the grid's smallest."""
    ranges: tuple[Range, ...]
    """One per breakpoint."""

    def __post_init__(self) -> None:
        if len(self.breakpoints) != len(self.ranges) or not self.breakpoints:
            raise ValueError(
                f"Entry {self.key}: needs one range per breakpoint and at least one; got "
                f"{len(self.breakpoints)} breakpoints and {len(self.ranges)} ranges"
            )
        if list(self.breakpoints) != sorted(set(self.breakpoints)):
            raise ValueError(
                f"Entry {self.key}: breakpoints must be strictly increasing; got {self.breakpoints}"
            )

    @property
    def key(self) -> tuple[str, int, int, int, int]:
        return (self.op, self.n, self.k, self.experts, self.top_k)

    def lookup(self, m: int) -> Range:
        """The range of the largest breakpoint ``<= m`` (the first range below the grid)."""
        return self.ranges[max(0, bisect.bisect_right(self.breakpoints, m) - 1)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "n": self.n, "k": self.k, "experts": self.experts, "top_k": self.top_k,
            "breakpoints": list(self.breakpoints), "ranges": [r.to_dict() for r in self.ranges],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        return cls(
            op=data["op"], n=int(data["n"]), k=int(data["k"]), experts=int(data.get("experts", 0)),
            top_k=int(data.get("top_k", 0)), breakpoints=tuple(int(b) for b in data["breakpoints"]),
            ranges=tuple(Range(**r) for r in data["ranges"]),
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class ScheduleTableFile:
    """One exported table (module docstring): its header and its entries by key."""

    header: dict[str, Any]
    """Everything but the entries: format, hardware, world size, mode, dtype, fingerprint, model, datasets,
    grid, whether simulated."""
    entries: dict[tuple[str, int, int, int, int], Entry]
    """By ``(op, n, k, experts, top_k)``."""

    @property
    def world_size(self) -> int:
        return int(self.header["world_size"])

    @property
    def mode(self) -> str:
        return str(self.header["mode"])

    @property
    def dtype(self) -> str:
        return str(self.header["dtype"])

    @property
    def fingerprint(self) -> str:
        return str(self.header["fingerprint"])

    @property
    def origin(self) -> str:
        model = self.header["model"]
        sim = " (simulated)" if self.header.get("simulated") else ""
        return f"table {model['hardware_id']}/{model['version']}{sim}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.header, "entries": [e.to_dict() for e in self.entries.values()]}

    def write(self, directory: str | Path) -> Path:
        """Write the table under ``directory`` by its file name; returns the path."""
        path = Path(directory) / f"op=tp_overlap,{artifact_name(self.header)}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<table>") -> ScheduleTableFile:
        """Validate the format fields and read the entries; ValueError naming ``source`` and the field."""
        if data.get("format") != FORMAT:
            raise ValueError(f"{source} is not a ficco schedule table (format {data.get('format')!r})")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{source} has format_version {data.get('format_version')!r}; this ficco reads "
                f"{FORMAT_VERSION}. Export it again with this ficco (`ficco export`)"
            )
        required = ("world_size", "mode", "dtype", "fingerprint", "model", "entries")
        missing = [k for k in required if k not in data]
        if missing:
            raise ValueError(f"{source} lacks the fields {missing}")
        entries = [Entry.from_dict(e) for e in data["entries"]]
        header = {k: v for k, v in data.items() if k != "entries"}
        return cls(header=header, entries={e.key: e for e in entries})

    @classmethod
    def read(cls, path: str | Path) -> ScheduleTableFile:
        return cls.from_dict(json.loads(Path(path).read_text()), str(path))

    def check_machine(self, machine: dict[str, Any], source: str = "the table") -> None:
        """Raise :class:`FingerprintMismatch` naming both fingerprints (and the differing fields) when
        ``machine`` (:data:`FINGERPRINT_KEYS`) is not the machine the table was exported for."""
        found = hardware_fingerprint(machine)
        if found == self.fingerprint:
            return
        recorded = self.header.get("fingerprint_fields", {})
        diffs = [
            f"{k}: {recorded.get(k)!r} in the table vs {machine.get(k)!r} here"
            for k in FINGERPRINT_KEYS
            if recorded.get(k) != machine.get(k)
        ]
        raise FingerprintMismatch(
            f"{source} was exported for hardware fingerprint {self.fingerprint}, but this machine's is "
            f"{found} ({'; '.join(diffs) or 'fields differ'}); its schedules were not measured here. "
            "Export a table from a model measured on this machine (`ficco export`)"
        )


def table_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Every table file of ``paths`` (files, or directories searched for ``op=tp_overlap,*.json``)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(p.glob("op=tp_overlap,*.json"))
        elif p.is_file():
            out.append(p)
        else:
            raise ValueError(f"{p} is neither a table file nor a directory")
    if not out:
        raise ValueError(f"no schedule table (op=tp_overlap,*.json) under {[str(p) for p in paths]}")
    return out
