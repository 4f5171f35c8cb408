"""Dataset tables joined, for the studies that add rows to a dataset (``benchmarks.studies.coverage_curve``,
``benchmarks.studies.off_map``)."""

from __future__ import annotations

import numpy as np

from ficco.training.dataset_table import DatasetTable


def concat_tables(*tables: DatasetTable) -> DatasetTable:
    """The rows of ``tables`` in order as one table (the first's host factor; what was dropped, summed)."""
    first = tables[0]
    dropped: dict[str, int] = {}
    for t in tables:
        for reason, count in t.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + count
    return DatasetTable(
        scenario_ids=np.concatenate([t.scenario_ids for t in tables]),
        modes=np.concatenate([t.modes for t in tables]),
        families=np.concatenate([t.families for t in tables]),
        scenarios=tuple(s for t in tables for s in t.scenarios),
        X=np.concatenate([t.X for t in tables]),
        times_ms=np.concatenate([t.times_ms for t in tables]),
        in_best=np.concatenate([t.in_best for t in tables]),
        async_tp_ms=np.concatenate([t.async_tp_ms for t in tables]),
        dropped=dropped,
        host_factor=first.host_factor,
    )
