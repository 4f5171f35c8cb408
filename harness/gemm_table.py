"""Measured GEMM times of one GPU model: the table the simulator reads its GEMM term from.

``benchmarks.gemm_table`` times, on one GPU, every GEMM shape the candidate schedules of the sweep plans
produce (the whole GEMM, a shard's, a finer piece's, the grouped expert GEMMs of the MoE ops), one shape per
bucket of half an octave in rows, n and k (:data:`RESOLUTION`), and writes ``gemm_tables/<gpu>.json`` beside
this module (package data). :meth:`GemmTable.lookup` answers a shape from its bucket's measurement, scaled
by an analytic model from the measured shape to the asked one; a bucket nobody measured takes the mean
measured-over-model ratio of its measured neighbours (one bucket away in each dimension), and a shape with
no measured neighbour gets NaN (the simulator's roofline then). See docs/simulator.md, "GEMM times".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from itertools import product
from pathlib import Path

import numpy as np

from ficco.features.routing import GROUPED_MIN_GEMMS

FORMAT = "ficco-gemm-table/1"
"""The table file's format tag; another is refused."""
TABLE_DIR = Path(__file__).resolve().with_name("gemm_tables")
"""Where the shipped tables lie (package data): ``<gpu model, lower case>.json``."""
RESOLUTION = 2
"""Buckets per octave of rows, n and k."""

_TILE_M, _TILE_N = 128, 256
"""Output tile assumed when counting waves (Hopper bf16 cuBLAS kernels)."""
_EFF, _WAVE_HALF, _K_HALF, _LAUNCH_US = 0.8, 0.04, 256.0, 4.0
"""The shape model's fixed constants: large-GEMM efficiency, waves at half of it, K at half of it, and the
device time of an empty kernel, us. Only ratios of the model between nearby shapes matter."""


def shape_us(
    groups: np.ndarray, rows: np.ndarray, n: np.ndarray, k: np.ndarray, rates: dict[str, float]
) -> np.ndarray:
    """Analytic device time of one kernel of ``groups`` GEMMs of ``rows`` x ``n`` x ``k`` (bf16), us: a
    launch plus the roofline (tile waves over ``rates["sm_count"]`` SMs, ``rates["peak_bf16_tflops"]``,
    ``rates["hbm_gbps"]``). The scale between a measured shape and a nearby asked one, and between GPUs."""
    g, r = np.asarray(groups, dtype=np.float64), np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    waves = g * np.ceil(r / _TILE_M) * np.ceil(n / _TILE_N) / rates["sm_count"]
    eff = _EFF * waves / (waves + _WAVE_HALF) * k / (k + _K_HALF)
    compute = 2.0 * g * r * n * k / (rates["peak_bf16_tflops"] * 1e6 * eff)
    memory = 2.0 * g * (r * k + k * n + r * n) / (rates["hbm_gbps"] * 1e3)
    return _LAUNCH_US + np.maximum(compute, memory)


def gpu_model(name: str) -> str:
    """The model in a GPU's name, lower case: ``NVIDIA H100 80GB HBM3`` -> ``h100``; the name as a slug
    where it holds none."""
    found = re.search(r"\b[A-Z]+\d{2,}[A-Z]*\b", name)
    return found.group(0).lower() if found else re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def bucket(values: np.ndarray) -> np.ndarray:
    """Bucket index of each value (rows, n or k): ``round(log2(v) * RESOLUTION)``, int64, same shape."""
    return np.rint(np.log2(np.maximum(np.asarray(values, dtype=np.float64), 1.0)) * RESOLUTION).astype(
        np.int64
    )


def grouped(groups: np.ndarray, n: np.ndarray, k: np.ndarray, dtype_bytes: np.ndarray) -> np.ndarray:
    """Whether the executor runs ``groups`` expert GEMMs as one grouped GEMM (``executor.experts``): at
    least :data:`GROUPED_MIN_GEMMS` of them, 2-byte elements, ``n`` and ``k`` multiples of 8. Bool array."""
    n, k = np.asarray(n), np.asarray(k)
    return (
        (np.asarray(groups) >= GROUPED_MIN_GEMMS)
        & (np.asarray(dtype_bytes) == 2)
        & (n % 8 == 0)
        & (k % 8 == 0)
    )


def expert_split(
    unit_rows: np.ndarray, rows: np.ndarray, world_size: np.ndarray, local_experts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(groups, rows per group)`` of a GEMM unit of ``unit_rows`` rows, float arrays. Dense ops
    (``local_experts`` 1): one group. MoE ops, ``rows`` the rank's routed rows: the whole GEMM (``unit_rows
    == rows``) runs every local expert over ``rows / experts`` rows; a unit of one source's block (or a piece
    of it, rows in local-expert order) covers the experts its rows reach, ``rows / (w * experts)`` rows each,
    at least one expert (docs/simulator.md)."""
    unit_rows, rows = np.asarray(unit_rows, dtype=np.float64), np.asarray(rows, dtype=np.float64)
    e = np.asarray(local_experts, dtype=np.float64)
    per_source = np.clip(np.rint(unit_rows * world_size * e / rows), 1.0, e)
    groups = np.where(unit_rows >= rows, e, per_source)
    return groups, unit_rows / groups


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class GemmTable:
    """One GPU model's measured GEMM times: ``dense`` rows ``(rows, n, k, us)`` (``torch.mm``), ``grouped``
    rows ``(groups, rows per group, n, k, us)`` (``torch._grouped_mm``), both float64 arrays; ``us`` is
    the device time of one call (CUDA-graph replays, median)."""

    gpu_name: str
    """The GPU the table was measured on, as ``torch.cuda.get_device_name`` gives it."""
    profile: dict[str, float]
    """That GPU's datasheet figures (``peak_bf16_tflops``, ``hbm_gbps``, ``sm_count``): the rates of the
    analytic model that carries the table to another GPU of the same architecture."""
    dense: np.ndarray
    grouped: np.ndarray
    source: dict = field(default_factory=dict)
    """How it was measured: software versions, date, method, budget, shapes planned and measured."""
    _index: dict = field(default_factory=dict, init=False, repr=False)
    _ratios: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for name, width in (("dense", 4), ("grouped", 5)):
            rows = np.asarray(getattr(self, name), dtype=np.float64).reshape(-1, width)
            if not np.all(np.isfinite(rows)) or np.any(rows <= 0):
                raise ValueError(f"GemmTable.{name} rows must be finite and > 0 ({self.gpu_name})")
            object.__setattr__(self, name, rows)
        for name, rows in (("dense", self.dense), ("grouped", self.grouped)):
            groups = rows[:, 0] if name == "grouped" else np.ones(len(rows))
            keys = _keys(groups, *rows[:, -4:-1].T)
            self._index[name] = dict(zip(map(tuple, keys.tolist()), range(len(rows)), strict=True))

    @property
    def model(self) -> str:
        """The GPU model (``h200``): the table's file name."""
        return gpu_model(self.gpu_name)

    def lookup(
        self,
        groups: np.ndarray,
        rows: np.ndarray,
        n: np.ndarray,
        k: np.ndarray,
        *,
        grouped_kernel: np.ndarray,
        rates: dict[str, float],
    ) -> np.ndarray:
        """Device time, us, of one kernel per query (``[N]`` arrays): a grouped GEMM of ``groups`` x ``rows``
        rows where ``grouped_kernel``, else one ``torch.mm`` of ``rows`` rows (``groups`` ignored). The
        bucket's measured over modelled time (:func:`shape_us` on this table's GPU), times the model of the
        query on the GPU of ``rates`` (the figures of :attr:`profile`; another GPU's carry the table to
        it). NaN: off the table."""
        q = [np.asarray(v, dtype=np.float64) for v in (groups, rows, n, k)]
        q[0] = np.where(grouped_kernel, q[0], 1.0)
        keys = _keys(*q)
        if not len(keys):
            return np.zeros(0)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        ratio = np.array([self._ratio(tuple(key)) for key in unique.tolist()])[inverse.reshape(-1)]
        return ratio * shape_us(*q, rates)

    def _ratio(self, key: tuple[int, ...]) -> float:
        """Measured over modelled time of the bucket ``key`` (groups, then the rows, n and k buckets);
        unmeasured, the mean log ratio of its measured neighbours, weighted ``1 / (1 + squared steps)``;
        NaN without one. Kept per key."""
        if key in self._ratios:
            return self._ratios[key]
        self._ratios[key] = value = self._neighbour_ratio(key)
        return value

    def _neighbour_ratio(self, key: tuple[int, ...]) -> float:
        """:meth:`_ratio` computed."""
        name, table = ("dense", self.dense) if key[0] == 1 else ("grouped", self.grouped)
        index = self._index[name]
        logs, weights = [], []
        for step in product((0, -1, 1), repeat=3):
            i = index.get((key[0], *(a + b for a, b in zip(key[1:], step, strict=True))))
            if i is None:
                continue
            row = table[i]
            shape = (1.0, *row[:3]) if name == "dense" else tuple(row[:4])
            log_ratio = float(np.log(row[-1] / shape_us(*(np.array([v]) for v in shape), self.profile)[0]))
            if not any(step):
                return float(np.exp(log_ratio))
            logs.append(log_ratio)
            weights.append(1.0 / (1.0 + sum(s * s for s in step)))
        return float(np.exp(np.average(logs, weights=weights))) if logs else float("nan")

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "gpu_name": self.gpu_name,
                "profile": self.profile,
                "source": self.source,
                "resolution": RESOLUTION,
                "dense": ["rows n k us", *[_row(r) for r in self.dense]],
                "grouped": ["groups rows n k us", *[_row(r) for r in self.grouped]],
            },
            indent=0,
        )

    @classmethod
    def from_json(cls, text: str, where: str = "GEMM table") -> GemmTable:
        """A table written by :meth:`to_json`; ValueError naming ``where`` for another format."""
        data = json.loads(text)
        if data.get("format") != FORMAT or data.get("resolution") != RESOLUTION:
            raise ValueError(
                f"{where}: format {data.get('format')!r} at resolution {data.get('resolution')!r}; this "
                f"ficco reads {FORMAT!r} at {RESOLUTION} (remake it with python -m benchmarks.gemm_table)"
            )

        def rows(name: str, width: int) -> np.ndarray:
            return np.array([[float(v) for v in r.split()] for r in data[name][1:]]).reshape(-1, width)

        return cls(
            gpu_name=data["gpu_name"],
            profile=data["profile"],
            dense=rows("dense", 4),
            grouped=rows("grouped", 5),
            source=data.get("source", {}),
        )


def _keys(groups: np.ndarray, rows: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Bucket keys ``[N, 4]``: groups as they are (1 for one GEMM), then rows, n and k bucketed."""
    return np.stack(
        [np.rint(np.asarray(groups, dtype=np.float64)).astype(np.int64), bucket(rows), bucket(n), bucket(k)],
        axis=1,
    )


def _row(values: np.ndarray) -> str:
    """One table row as text: whole numbers as they are, the time to 4 significant digits."""
    *shape, us = values.tolist()
    return " ".join([*(f"{v:g}" for v in shape), f"{us:.4g}"])


@cache
def table_for(gpu_name: str) -> GemmTable | None:
    """The shipped table of ``gpu_name``'s GPU model, else None."""
    path = TABLE_DIR / f"{gpu_model(gpu_name)}.json"
    return GemmTable.from_json(path.read_text(), str(path)) if path.is_file() else None


@cache
def shipped_tables() -> tuple[GemmTable, ...]:
    """Every shipped table, by file name."""
    return tuple(GemmTable.from_json(p.read_text(), str(p)) for p in sorted(TABLE_DIR.glob("*.json")))
