"""Exported schedule tables: what a runtime loads at start-up instead of asking a model per shape.

One file per (hardware, world size, execution mode, dtype), e.g.
``op=tp_overlap,device_name=NVIDIA_H200,tp=2,mode=graph,dtype=bf16.json``: per (op, n, k) (MoE: experts,
top_k) an :class:`Entry` of one :class:`Track` per split class, each a sorted list of breakpoints with one
:class:`Range` each; a header names the model, its datasets and the hardware fingerprint. ``ficco export``
writes them (``training.export``), ``runtime.TableSource.load`` reads them; no xgboost needed. See
docs/tables.md.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ficco.features.schedule import FINER_SPLITS, Schedule, max_splits
from ficco.files import write_text_atomic

log = logging.getLogger(__name__)

FORMAT = "ficco-schedule-table"
"""The ``format`` field of every table file."""
FORMAT_VERSION = 2
"""The ``format_version`` this code writes and reads (2: one track per split class)."""
FINGERPRINT_KEYS: tuple[str, ...] = ("backend", "gpu_name", "gpu_count")
"""What a table's timings depend on that both a model card and a machine can state: measured or simulated,
the GPU model (an NVLink H200 and a PCIe ``H200 NVL`` differ) and count; versions are left out
(docs/tables.md)."""
BEST_SET_FLOOR = 0.01
"""A margin below this (1%) cannot be told from noise (the best set's floor, ``harness.labels``)."""


class FingerprintMismatch(ValueError):
    """A table was exported for another machine than the one loading it."""


def artifact_name(header: dict[str, Any]) -> str:
    """``device_name=...,tp=...,mode=...,dtype=...`` of an export's header (its ``device_name`` the GPU
    name, ``world_size``, ``mode``, ``dtype``): how the table files and the other exported files are named.
    The GPU name is written as vLLM writes it, spaces and dashes as underscores: ``NVIDIA_H100_80GB_HBM3``."""
    device = header["device_name"].replace(" ", "_").replace("-", "_")
    return f"device_name={device},tp={header['world_size']},mode={header['mode']},dtype={header['dtype']}"


def hardware_fingerprint(fields: dict[str, Any]) -> str:
    """``sha256:<16 hex>`` of ``fields``' :data:`FINGERPRINT_KEYS` (absent keys count as None)."""
    canonical = json.dumps({k: fields.get(k) for k in FINGERPRINT_KEYS}, sort_keys=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True, slots=True)
class Range:
    """What the model picks from one breakpoint up to the next, at the token counts of one split class."""

    schedule: str
    """Canonical schedule string (``serial/sm`` where the model's own fallback fired); it runs at every token
    count of its split class (:class:`Track`)."""
    predicted_speedup: float
    """Predicted ``t_serial / t_schedule`` at the range's first decided token count."""
    min_speedup: float
    """Lowest predicted speedup of the schedule over the range's decided token counts."""
    runner_up: str | None
    """The schedule of highest predicted speedup after the pick at the first token count (None: none)."""
    margin: float
    """Smallest predicted ``speedup(pick) / speedup(runner-up) - 1`` over the range's decided token counts
    (the time-ratio regressor's; negative where the ranker and the regressor disagree)."""
    confident: bool
    """``margin >= BEST_SET_FLOOR``: the runner-up is outside the model's best set everywhere in the range."""
    neighbours: int | None = None
    """Fewest measured neighbours (``training.predict.coverage``) over the range's decided token counts; None
    for a model that carries no coverage. A range lies wholly on or wholly off the measured map."""

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, kw_only=True, slots=True)
class Track:
    """The ranges of one (op, n, k) at the token counts of one split class: those whose split rows divide
    among the ranks into at most ``max_splits`` sub-chunks each (``features.schedule.max_splits``), where
    ``finer/sN`` runs exactly for ``N <= max_splits``."""

    max_splits: int
    """1, 2, 4 or 8 (``features.schedule.FINER_SPLITS``)."""
    breakpoints: tuple[int, ...]
    """Sorted token counts ``m`` where a range starts; the first is the class's smallest decided count."""
    ranges: tuple[Range, ...]
    """One per breakpoint."""

    def __post_init__(self) -> None:
        where = f"Track(max_splits={self.max_splits})"
        if self.max_splits not in (1, *FINER_SPLITS):
            raise ValueError(f"{where}: max_splits must be one of {[1, *FINER_SPLITS]}")
        if len(self.breakpoints) != len(self.ranges) or not self.breakpoints:
            raise ValueError(
                f"{where}: needs one range per breakpoint and at least one; got {len(self.breakpoints)} "
                f"breakpoints and {len(self.ranges)} ranges"
            )
        if list(self.breakpoints) != sorted(set(self.breakpoints)):
            raise ValueError(f"{where}: breakpoints must be strictly increasing; got {self.breakpoints}")
        for r in self.ranges:
            if Schedule.parse(r.schedule).splits > self.max_splits:
                raise ValueError(
                    f"{where}: {r.schedule} cannot run where the rows split {self.max_splits} ways"
                )

    def lookup(self, m: int) -> Range:
        """The range of the largest breakpoint ``<= m`` (the first range below the first breakpoint)."""
        return self.ranges[max(0, bisect.bisect_right(self.breakpoints, m) - 1)]

    def to_dict(self) -> dict[str, Any]:
        return {"max_splits": self.max_splits, "breakpoints": list(self.breakpoints),
                "ranges": [r.to_dict() for r in self.ranges]}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Track:
        return cls(max_splits=int(data["max_splits"]), breakpoints=tuple(int(b) for b in data["breakpoints"]),
                   ranges=tuple(Range(**r) for r in data["ranges"]))  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """The tracks of one (op, n, k, experts, top_k) over the token axis, one per split class."""

    op: str
    n: int
    k: int
    experts: int = 0
    top_k: int = 0
    tracks: tuple[Track, ...]
    """By ``max_splits``, largest first; a class no token count of this shape falls in has none."""
    _of_class: dict[int, Track] = field(init=False, repr=False, compare=False)
    """Split class -> its track, or (a class the table was not built for) the nearest coarser class's."""

    def __post_init__(self) -> None:
        splits = [t.max_splits for t in self.tracks]
        if not splits or splits != sorted(set(splits), reverse=True):
            raise ValueError(
                f"Entry {self.key}: needs tracks of distinct max_splits, largest first; got {splits}"
            )
        of_class = {c: next((t for t in self.tracks if t.max_splits <= c), self.tracks[-1])
                    for c in (1, *FINER_SPLITS)}  # fmt: skip
        object.__setattr__(self, "_of_class", of_class)

    @property
    def key(self) -> tuple[str, int, int, int, int]:
        return (self.op, self.n, self.k, self.experts, self.top_k)

    def track(self, m: int, world_size: int) -> Track:
        """The track of token count ``m`` at ``world_size``: its split class's, else (a class the table was
        not built for) the nearest coarser one's, whose schedules also run at ``m``."""
        return self._of_class[max_splits(m * self.top_k if self.top_k else m, world_size)]

    def lookup(self, m: int, world_size: int) -> Range:
        """The range that answers token count ``m`` at ``world_size``: its track's :meth:`Track.lookup`."""
        return self.track(m, world_size).lookup(m)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "n": self.n, "k": self.k, "experts": self.experts, "top_k": self.top_k,
            "tracks": [t.to_dict() for t in self.tracks],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        return cls(
            op=data["op"], n=int(data["n"]), k=int(data["k"]), experts=int(data.get("experts", 0)),
            top_k=int(data.get("top_k", 0)), tracks=tuple(Track.from_dict(t) for t in data["tracks"]),
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
        write_text_atomic(path, json.dumps(self.to_dict(), separators=(",", ":")) + "\n")
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
