"""The sweep: every candidate schedule of every planned scenario, written so that a crash loses nothing
(append-only parts, then the manifest that lists them); and the independent re-measure of some of them
(``run_noise``) that the card's noise numbers come from. See docs/protocol.md, "Writing" and "Noise".
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.features import HardwareProfile, Scenario, candidates
from ficco.features.dataset import FORMAT, MANIFEST, NOISE, PLAN, load_noise, read_manifest, rows_frame
from ficco.features.fingerprint import fingerprint_differences
from ficco.features.hardware import check_gpu_model
from ficco.features.label_source import PROTOCOL_BEFORE, label_version_of
from ficco.harness.backend import Backend, Measurement, ScenarioResult
from ficco.harness.dataset import result_rows, write_json_atomic, write_parquet_atomic
from ficco.harness.fleet.shards import provenance
from ficco.harness.labels import label_result
from ficco.harness.plan import Plan, evenly_spaced

if TYPE_CHECKING:
    import pandas as pd

FLUSH_SECONDS = 10.0
"""Seconds of measurements buffered before a part is written (the most a crash can lose)."""
MAX_FAILING_START = 3
"""A sweep whose first this-many scenarios all raise in ``measure`` stops (the backend is broken)."""


class FingerprintMismatch(ValueError):
    """Resuming a dataset on a machine or software stack other than the one that measured it."""


def run_sweep(
    plan: Sequence[tuple[str, Scenario]],
    backend: Backend,
    out_dir: str | Path,
    *,
    progress: bool = True,
    flush_seconds: float = FLUSH_SECONDS,
    deadline: float | None = None,
) -> Path:
    """Measure every candidate schedule of every scenario of ``plan`` not yet in ``out_dir``, starting none
    after ``deadline`` (``time.time()`` seconds); returns ``out_dir``. Raises ``FingerprintMismatch`` naming
    the differing keys when ``out_dir`` was measured with another fingerprint or protocol, ``ValueError`` for
    a plan mixing hardware profiles or of a profile of other GPUs than the backend's."""
    out = Path(out_dir)
    writer = backend.rank == 0
    manifest = _open_manifest(out, backend, _plan_hardware(plan), writer)
    if writer and isinstance(plan, Plan):
        write_json_atomic(out / PLAN, json.loads(plan.to_json()))
    unique = _unique(plan)
    finished = set(manifest["finished"])
    todo = [(f, s) for f, s in unique if s.key() not in finished]
    _log(writer, f"{out}: {len(unique) - len(todo)} of {len(unique)} scenarios already measured")
    metadata = provenance(plan, manifest["fingerprint"]) if writer else None
    sink = _PartSink(out, manifest, writer, flush_seconds, metadata)
    _measure_all(todo, backend, sink, progress and writer, len(unique), "bench", deadline)
    sink.flush()
    return out


def run_noise(
    plan: Sequence[tuple[str, Scenario]],
    backend: Backend,
    out_dir: str | Path,
    count: int,
    *,
    order_seed: int = 1,
    progress: bool = True,
    flush_seconds: float = FLUSH_SECONDS,
    deadline: float | None = None,
) -> Path:
    """Top ``noise.parquet`` up to ``count`` re-measured scenarios of the finished sweep in ``out_dir``,
    spread evenly over the plan and visited in an order shuffled by ``order_seed``. Raises ``ValueError``
    when ``out_dir`` holds no sweep; otherwise as ``run_sweep``."""
    import numpy as np

    out = Path(out_dir)
    manifest = read_manifest(out)
    if manifest is None:
        raise ValueError(f"{out} holds no sweep to re-measure: run the sweep first")
    _open_manifest(out, backend, _plan_hardware(plan), writer=False, same_seed=False)  # checks it
    noise = load_noise(out)
    noise = rows_frame([]) if noise is None else noise
    have = set(noise["scenario_id"])
    unique = _unique(plan)
    plan_ids = [s.key() for _, s in unique]
    finished = set(manifest["finished"])
    targets = [sid for sid in remeasure_targets(plan_ids, finished, count) if sid not in have]
    spare = [sid for sid in plan_ids if sid in finished and sid not in have and sid not in targets]
    chosen = (targets + spare)[: max(count - len(have), 0)]
    order = np.random.default_rng(order_seed).permutation(len(chosen))
    by_id = {s.key(): (f, s) for f, s in unique}
    todo = [by_id[chosen[i]] for i in order]
    sink = _NoiseSink(out, noise, backend.rank == 0, flush_seconds)
    _measure_all(todo, backend, sink, progress and backend.rank == 0, len(todo), "noise", deadline)
    sink.flush()
    return out


def _unique(plan: Sequence[tuple[str, Scenario]]) -> list[tuple[str, Scenario]]:
    """The plan's scenarios, each once (under its first family), in plan order."""
    first: dict[str, tuple[str, Scenario]] = {}
    for family, scenario in plan:
        first.setdefault(scenario.key(), (family, scenario))
    return list(first.values())


def _log(writer: bool, text: str) -> None:
    if writer:
        print(text, file=sys.stderr, flush=True)


def _plan_hardware(plan: Sequence[tuple[str, Scenario]]) -> HardwareProfile | None:
    ids = {s.hardware.id for _, s in plan}
    if len(ids) > 1:
        raise ValueError(f"a plan must use one hardware profile; got {sorted(ids)}")
    return plan[0][1].hardware if plan else None


def _open_manifest(
    out: Path, backend: Backend, hardware: HardwareProfile | None, writer: bool, *, same_seed: bool = True
) -> dict:
    """The existing manifest (after checking fingerprint and hardware) or a new one (written by rank 0).
    ``same_seed=False`` (the re-measure) lets the fingerprint's ``seed`` differ."""
    fingerprint = backend.fingerprint()
    if hardware is not None and "gpu_name" in fingerprint:
        check_gpu_model(hardware, fingerprint["gpu_name"])
    protocol = backend.protocol()
    manifest = read_manifest(out)
    if manifest is not None:
        diff = [
            d
            for d in fingerprint_differences(manifest["fingerprint"], fingerprint)
            if same_seed or not d.startswith("seed:")
        ]
        recorded = PROTOCOL_BEFORE | manifest["protocol"]
        if "label_version" in protocol:  # measured before the version was recorded: the one its settings give
            recorded["label_version"] = label_version_of(manifest["protocol"])
        diff += [
            f"protocol {key}: dataset {recorded.get(key)!r}, now {value!r}"
            for key, value in protocol.items()
            if recorded.get(key) != value
        ]
        if diff:
            raise FingerprintMismatch(
                f"refusing to resume {out}: it was measured with a different fingerprint or protocol.\n  "
                + "\n  ".join(diff)
                + "\nStart a new dataset with another --out directory."
            )
        if hardware is not None and manifest["hardware"]["id"] != hardware.id:
            raise ValueError(
                f"refusing to resume {out}: it holds hardware {manifest['hardware']['id']!r}, the plan "
                f"targets {hardware.id!r}"
            )
        return manifest
    if hardware is None:
        raise ValueError(f"{out} has no dataset yet and the plan is empty: nothing to measure")
    now = _now()
    manifest = {
        "format": FORMAT,
        "backend": backend.name,
        "hardware": hardware.to_dict(),
        "fingerprint": fingerprint,
        "protocol": protocol,
        "created": now,
        "updated": now,
        "parts": [],
        "finished": [],
        "rows": 0,
        "seconds": 0.0,
    }
    if writer:
        (out / "parts").mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / MANIFEST, manifest)
    return manifest


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _measure_one(backend: Backend, scenario: Scenario) -> ScenarioResult:
    """``backend.measure`` over every candidate, labelled with best sets (``harness.labels``); an
    exception marks every schedule failed."""
    schedules = candidates(scenario)
    try:
        return label_result(backend.measure(scenario, schedules))
    except Exception as err:  # the backend broke on this scenario: record it, keep the sweep going
        error = f"{type(err).__name__}: {err}".splitlines()[0][:500]
        return ScenarioResult(
            measurements=[
                Measurement(schedule=str(s), mode=mode, ok=False, error=error)
                for mode in backend.modes
                for s in schedules
            ]
        )


def _measure_all(
    todo: list[tuple[str, Scenario]],
    backend: Backend,
    sink: _Sink,
    progress: bool,
    total: int,
    desc: str,
    deadline: float | None = None,
) -> None:
    """Measure ``todo`` in order, handing each scenario's rows to ``sink.add``; stop before a scenario
    once every rank agrees the ``deadline`` has passed."""
    from tqdm import tqdm

    if todo:
        _log(progress, f"warming up on {todo[0][1].key()} (untimed)")
        try:
            backend.warm_up(todo[0][1], candidates(todo[0][1]))
        except Exception as err:  # the scenario's own measurement records what is wrong with it
            _log(progress, f"warm-up failed ({type(err).__name__}: {err}); measuring anyway")
    bar = tqdm(total=total, initial=total - len(todo), desc=desc, unit="scenario", disable=not progress)
    failing = 0
    try:
        for i, (family, scenario) in enumerate(todo):
            if deadline is not None and backend.agree(time.time() >= deadline):
                _log(progress, f"{desc}: time budget reached after {i} of {len(todo)} scenarios")
                break
            start = time.perf_counter()
            result = _measure_one(backend, scenario)
            rows = result_rows(family, scenario, result, backend.name)
            failing = failing + 1 if not any(r["ok"] for r in rows) else 0
            if failing == i + 1 and failing >= MAX_FAILING_START:
                raise RuntimeError(
                    f"the {backend.name} backend failed every schedule of the first {failing} scenarios; "
                    f"last error: {rows[0]['error']}"
                )
            sink.add(scenario.key(), rows, time.perf_counter() - start)
            bar.update(1)
            bar.set_postfix(rows=sink.rows_written + len(sink.rows), refresh=False)
    finally:
        bar.close()


class _Sink:
    """Buffers measured rows and writes them about every ``flush_seconds`` (rank 0 only)."""

    def __init__(self, out: Path, writer: bool, flush_seconds: float, rows_written: int) -> None:
        self.out, self.writer, self.flush_seconds = out, writer, flush_seconds
        self.rows: list[dict[str, Any]] = []
        self.ids: list[str] = []
        self.seconds = 0.0
        self.last_flush = time.monotonic()
        self.rows_written = rows_written

    def add(self, scenario_id: str, rows: list[dict[str, Any]], seconds: float) -> None:
        self.rows += rows
        self.ids.append(scenario_id)
        self.seconds += seconds
        if time.monotonic() - self.last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        if self.ids and self.writer:
            self._write()
        self.rows_written += len(self.rows)
        self.rows, self.ids, self.seconds = [], [], 0.0
        self.last_flush = time.monotonic()

    def _write(self) -> None:
        raise NotImplementedError


class _PartSink(_Sink):
    """Each flush: a new part (its metadata: the sweep's provenance), then the manifest listing it."""

    def __init__(
        self, out: Path, manifest: dict, writer: bool, flush_seconds: float, metadata: dict | None
    ) -> None:
        super().__init__(out, writer, flush_seconds, manifest["rows"])
        self.manifest, self.metadata = manifest, metadata

    def _write(self) -> None:
        m = self.manifest
        name = f"parts/part-{len(m['parts']):05d}.parquet"
        write_parquet_atomic(self.out / name, rows_frame(self.rows), self.metadata)
        m["parts"].append({"file": name, "rows": len(self.rows), "scenarios": len(self.ids)})
        m["finished"] += self.ids
        m["rows"] += len(self.rows)
        m["seconds"] = round(m["seconds"] + self.seconds, 3)
        m["updated"] = _now()
        write_json_atomic(self.out / MANIFEST, m)


class _NoiseSink(_Sink):
    """Each flush rewrites ``noise.parquet`` whole (so a crash cannot leave a duplicate behind)."""

    def __init__(self, out: Path, existing: pd.DataFrame, writer: bool, flush_seconds: float) -> None:
        super().__init__(out, writer, flush_seconds, len(existing))
        self.existing = existing

    def _write(self) -> None:
        import pandas as pd

        self.existing = pd.concat([self.existing, rows_frame(self.rows)], ignore_index=True)
        write_parquet_atomic(self.out / NOISE, self.existing)


def remeasure_targets(plan_ids: Sequence[str], finished: set[str], count: int) -> list[str]:
    """``count`` finished scenario ids spread evenly over the plan order (all of them if fewer)."""
    return evenly_spaced([sid for sid in plan_ids if sid in finished], count)
