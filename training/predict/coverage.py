"""Where a model was measured: its training rows' shapes, and how many of them lie near a scenario.

A *measured neighbour* is a training row of the same op, mode, world size and dtype with ``m``, ``n`` and
``k`` each within :data:`NEIGHBOUR_FACTOR` (2) of the scenario's; fewer than the mode's
:data:`OFF_MAP_BELOW` puts an answer *off the measured map*. A model carries its coverage as
``coverage.npy`` (int32 ``[rows, 7]``, the columns of :data:`COLUMNS`), read with numpy alone. See
docs/models.md, "Where a model was measured", and docs/planner.md.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ficco.features import DTYPES, MODES, OPS, Scenario

COVERAGE_FILE = "coverage.npy"
"""The coverage file in a registered version's directory."""
COLUMNS: tuple[str, ...] = ("op", "mode", "world_size", "dtype", "m", "n", "k")
"""The columns of a coverage array: op (index in ``features.OPS``), mode (index in ``features.MODES``),
world size, dtype (index in ``features.DTYPES``), then m, n, k (``features.Scenario`` conventions)."""
NEIGHBOUR_FACTOR = 2
"""A training row is a neighbour when each of its m, n, k is within this factor of the scenario's."""
OFF_MAP_BELOW: dict[str, int] = {"eager": 0, "graph": 1}
"""Per mode, an answer with fewer measured neighbours than this is off the measured map: graph answers
without a neighbour; no eager answer (why: docs/planner.md, "Off the measured map")."""


def off_map(neighbours: int | None, mode: str) -> bool:
    """Whether an answer in ``mode`` with ``neighbours`` measured neighbours is off the measured map (None:
    unknown, not off)."""
    return neighbours is not None and neighbours < OFF_MAP_BELOW[mode]


def off_map_note(neighbours: int | None, mode: str) -> str:
    """`` (off the measured map: ...)`` for an answer off the map, else an empty string."""
    if not off_map(neighbours, mode):
        return ""
    return (
        f" (off the measured map: fewer than {OFF_MAP_BELOW[mode]} training rows of this op and mode within "
        f"{NEIGHBOUR_FACTOR}x in m, n and k)"
    )


_CHUNK = 2048
"""Scenarios compared with a group's rows at once (bounds the comparison arrays to a few MiB)."""


class Coverage:
    """The training rows' (op, mode, world size, dtype, m, n, k), grouped for counting neighbours."""

    def __init__(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows)
        if rows.ndim != 2 or rows.shape[1] != len(COLUMNS) or not np.issubdtype(rows.dtype, np.integer):
            raise ValueError(
                f"a coverage array is int [rows, {len(COLUMNS)}] (columns {list(COLUMNS)}); got "
                f"{rows.dtype} {list(rows.shape)}"
            )
        self.rows = rows.astype(np.int64)
        """int64 ``[N, 7]`` (:data:`COLUMNS`)."""
        self._groups: dict[tuple[int, ...], np.ndarray] = {}
        """(op, mode, world size, dtype) -> the group's m, n, k, int64 ``[3, N_g]``, by m."""
        self._by_m: dict[tuple[int, ...], list[int]] = {}
        """(op, mode, world size, dtype) -> the group's m, sorted, as a list (bisected per decision)."""
        keys = self.rows[:, :4]
        for key in {tuple(k) for k in keys.tolist()}:
            group = self.rows[(keys == key).all(axis=1), 4:]
            group = group[np.argsort(group[:, 0], kind="stable")].T.copy()
            self._groups[key], self._by_m[key] = group, group[0].tolist()

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def of(cls, scenarios: Sequence[Scenario], modes: Sequence[str]) -> Coverage:
        """The coverage of training rows: ``scenarios[i]`` measured in ``modes[i]``."""
        rows = [
            (OPS.index(s.op), MODES.index(mode), s.world_size, DTYPES.index(s.dtype), s.m, s.n, s.k)
            for s, mode in zip(scenarios, modes, strict=True)
        ]
        return cls(np.asarray(rows, dtype=np.int64).reshape(-1, len(COLUMNS)))

    def save(self, path: str | Path) -> None:
        """Write the rows as int32 ``.npy`` (no pickle)."""
        np.save(Path(path), self.rows.astype(np.int32), allow_pickle=False)

    @classmethod
    def load(cls, path: str | Path) -> Coverage:
        """Read a coverage file (ValueError naming it when it is not a coverage array)."""
        try:
            rows = np.load(Path(path), allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"{path} is not a coverage array: {err}") from None
        try:
            return cls(rows)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def count(self, scenarios: Sequence[Scenario], mode: str) -> np.ndarray:
        """Measured neighbours of each scenario in ``mode`` (module docstring), int64 ``[n]``."""
        out = np.zeros(len(scenarios), dtype=np.int64)
        if len(scenarios) == 1:  # one decision: no grouping
            s = scenarios[0]
            out[0] = self._count_one(self._key(s, mode), s.m, s.n, s.k)
            return out
        by_key: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(scenarios):
            by_key.setdefault(self._key(s, mode), []).append(i)
        for key, index in by_key.items():
            group = self._groups.get(key)
            if group is None:
                continue
            shapes = np.asarray([(scenarios[i].m, scenarios[i].n, scenarios[i].k) for i in index], np.int64)
            for start in range(0, len(index), _CHUNK):
                part = shapes[start : start + _CHUNK, :, None]  # [c, 3, 1] against [3, N_g]
                near = (group <= NEIGHBOUR_FACTOR * part) & (part <= NEIGHBOUR_FACTOR * group)
                out[index[start : start + _CHUNK]] = near.all(axis=1).sum(axis=1)
        return out

    def count_tokens(self, op: str, mode: str, world_size: int, dtype: str, n: int, k: int,
                     ms: np.ndarray) -> np.ndarray:  # fmt: skip
        """Measured neighbours of one (op, n, k) at every token count of ``ms`` (int ``[G]``), int64 ``[G]``:
        the rows near in n and k, counted by their m with two bisections per token count."""
        group = self._groups.get((OPS.index(op), MODES.index(mode), world_size, DTYPES.index(dtype)))
        ms = np.asarray(ms, dtype=np.int64)
        if group is None:
            return np.zeros(len(ms), dtype=np.int64)
        f = NEIGHBOUR_FACTOR
        near = (group[1] <= f * n) & (n <= f * group[1]) & (group[2] <= f * k) & (k <= f * group[2])
        rows_m = np.sort(group[0, near])
        low = np.searchsorted(rows_m, -(-ms // f), side="left")  # m' >= ceil(m / f)
        return np.searchsorted(rows_m, f * ms, side="right") - low

    def _count_one(self, key: tuple[int, ...], m: int, n: int, k: int) -> int:
        """One scenario's count: the rows within the factor in m (two bisections of the sorted m), then
        those of them within it in n and k."""
        by_m = self._by_m.get(key)
        if by_m is None:
            return 0
        f = NEIGHBOUR_FACTOR
        lo, hi = bisect.bisect_left(by_m, -(-m // f)), bisect.bisect_right(by_m, f * m)
        group = self._groups[key]
        gn, gk = group[1, lo:hi], group[2, lo:hi]
        return int(np.count_nonzero((gn <= f * n) & (gn >= -(-n // f)) & (gk <= f * k) & (gk >= -(-k // f))))

    @staticmethod
    def _key(s: Scenario, mode: str) -> tuple[int, ...]:
        return (OPS.index(s.op), MODES.index(mode), s.world_size, DTYPES.index(s.dtype))
