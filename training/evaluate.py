"""Evaluation on unseen scenarios against the noise ceiling: the JSON behind ``ficco evaluate --json``.

Per execution mode, the model, the baselines, the peer rules and the noise ceiling scored on held-out rows
of every split (``family_holdout``, ``region_holdout``, ``transfer``, ``rescored``). See docs/training.md.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ficco.features import MODES
from ficco.training.baselines import FIXED, PEER_RULES, baseline_picks, serial_or_async_tp
from ficco.training.crossval import Choice, CrossValidation, cross_validate, region_holdout
from ficco.training.dataset_table import DatasetTable
from ficco.training.fit import CONFIG_GRID, TrainConfig, fit_pair_model, ratio_config
from ficco.training.metrics import score, score_times
from ficco.training.model import pair_costs
from ficco.training.predict.policy import POLICY_GRID, DecisionPolicy, ModePolicy, apply_policy

log = logging.getLogger(__name__)

BASELINE_NOTES: dict[str, str] = {
    "always_serial": f"always {FIXED['always_serial']} (no overlap)",
    "always_shard_dma": f"always {FIXED['always_shard_dma']}: shard-level overlap on the copy engines",
    "always_shard_sm": f"always {FIXED['always_shard_sm']}: shard-level overlap with NCCL kernels",
    "best_fixed": "the one schedule of lowest loss on the training folds",
    "size_heuristic": "three-tier size-threshold rule after the FiCCO paper, thresholds fit on the training "
    "folds (training/baselines.py)",
    "always_async_tp": "PyTorch async-TP (torch.compile's micro-pipeline pass) on every pair: the dataset's "
    "async_tp_ms",
    "vllm_sp_rule": "vLLM's sequence-parallelism rule "
    "(vllm/compilation/passes/fusion/sequence_parallelism.py): serial below hidden 8192 on Hopper and "
    "below SP_MIN_PER_GPU_SIZE_MB * tp * MiB / (hidden * elem_bytes) "
    "tokens, PyTorch async-TP above; hidden = k (all-gather) or n (reduce-scatter)",
    "pytorch_autoheuristic": "PyTorch PR #176943's fuse/no-fuse tree (m*n > 403M never; m*n <= 14M only if "
    "m*k > 26M; else fuse), fused = PyTorch async-TP, else serial",
    "ficco_async_tp_threshold": "ficco's model restricted to serial or PyTorch async-TP: a regressor of "
    "log(async_tp_ms / serial) fitted on the training folds (both modes), async-TP where it predicts a gain "
    "of at least its mode's min_gain (chosen by grouped CV within the training folds)",
    "oracle_serial_or_async_tp": "per scenario the faster of serial/sm and PyTorch async-TP: the best any "
    "serial-or-async-TP rule can do",
    "model_on_async_tp_rows": "the model's picks scored on the rows that measured async-TP (those the peer "
    "rules are scored on)",
    "ceiling": "noise ceiling: the independent re-measure's fastest schedules scored against the sweep "
    "(re-measured scenarios only)",
    "first_sweep_best": "rescored only: the training sweep's fastest schedules scored against the "
    "independent sweep",
    "model_at_training_host_factor": "transfer only, when the transfer dataset's machine has another host "
    "factor (features.launch_cost): the model asked at the training data's host factor instead of the test "
    "machine's own",
}


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Evaluation:
    """The outcome of :func:`evaluate`."""

    summary: dict[str, Any]
    """The JSON object (``modes`` -> splits -> pickers -> metrics, the cross-validated choice)."""
    cv: CrossValidation
    """Held-out picks of the model and the cross-validated choice."""
    regrets: dict[str, dict[str, np.ndarray]]
    """Family-holdout regret ``t / t_best - 1`` of each picker, per mode (for the report's CDF plot)."""


def held_out_baselines(table: DatasetTable, folds: np.ndarray) -> dict[str, np.ndarray]:
    """Every pick baseline, each fold's fitted on the other folds of the same mode and op group (dense or
    MoE: a fixed schedule or size rule is the baseline of one kind of op): name -> ``[n]``."""
    out: dict[str, np.ndarray] = {}
    groups = table.op_groups
    for mode, group in sorted(set(zip(table.modes, groups, strict=True))):
        cell = (table.modes == mode) & (groups == group)
        for fold in sorted(set(folds.tolist())):
            test = (folds == fold) & cell
            train = (folds != fold) & cell
            if not test.any() or not train.any():
                continue
            for name, picks in baseline_picks(table.subset(train), table.subset(test)).items():
                out.setdefault(name, np.zeros(len(table), dtype=np.int64))[test] = picks
    return out


def serial_or_async_tp_score(
    table: DatasetTable, fused: np.ndarray
) -> tuple[dict[str, Any], np.ndarray] | None:
    """Metrics and regrets ``[n']`` of choosing PyTorch async-TP where ``fused`` (bool ``[n]``) and serial/sm
    elsewhere, over the rows that measured async-TP (None if none); a time no slower than the best (the best
    set's slowest) counts as top1 (in the best set)."""
    has = np.isfinite(table.async_tp_ms)
    if not has.any():
        return None
    sub = table.subset(has)
    t = np.where(fused[has], sub.async_tp_ms, sub.serial_ms)
    best_set_edge = np.nanmax(np.where(sub.in_best, sub.times_ms, np.nan), axis=1, initial=0.0)
    edge = np.maximum(best_set_edge, sub.best_ms)
    return score_times(sub, t, top1=t <= sub.best_ms, in_best=t <= edge), t / sub.best_ms - 1.0


def async_tp_score(table: DatasetTable) -> tuple[dict[str, Any], np.ndarray] | None:
    """:func:`serial_or_async_tp_score` of always PyTorch async-TP."""
    return serial_or_async_tp_score(table, np.ones(len(table), dtype=bool))


def held_out_peer_rules(table: DatasetTable, folds: np.ndarray, *, seed: int) -> dict[str, np.ndarray]:
    """Every peer rule on every row, ficco's fitted per fold on the other folds' rows (both modes: the mode
    is one of its features): name -> bool ``[n]``, True = async-TP."""
    out = {name: np.zeros(len(table), dtype=bool) for name in PEER_RULES}
    for fold in sorted(set(folds.tolist())):
        test = folds == fold
        for name, fused in serial_or_async_tp(table.subset(~test), table.subset(test), seed=seed).items():
            out[name][test] = fused
    return out


def ceiling_picks(table: DatasetTable, noise: DatasetTable) -> tuple[np.ndarray, np.ndarray]:
    """The re-measure's fastest schedule of each of ``table``'s rows it re-measured: (rows of ``table``
    ``[n']``, schedule columns ``[n']``)."""
    rows, other = aligned_rows(table, noise)
    return rows, noise.best[other]


def noise_bands(table: DatasetTable, noise: DatasetTable | None) -> dict[str, float]:
    """Each mode's noise band (``training.predict.policy``): the geometric-mean regret of the noise ceiling
    (:func:`ceiling_picks`) over that mode's re-measured rows; a mode without any is left out (its policy
    keeps ``DEFAULT_NOISE_BAND``)."""
    if noise is None:
        return {}
    out = {}
    for mode in sorted(set(table.modes.tolist())):
        sub = table.subset(table.modes == mode)
        rows, cols = ceiling_picks(sub, noise)
        if len(rows):
            out[mode] = max(0.0, float(score(sub.subset(rows), cols)["geomean_regret"]))
    return out


def aligned_rows(table: DatasetTable, other: DatasetTable) -> tuple[np.ndarray, np.ndarray]:
    """The (scenario, mode) rows both tables hold: (rows of ``table`` ``[n']``, the same rows of ``other``
    ``[n']``)."""
    index = {(s, m): i for i, (s, m) in enumerate(zip(other.scenario_ids, other.modes, strict=True))}
    pairs = [
        (i, index.get((s, m))) for i, (s, m) in enumerate(zip(table.scenario_ids, table.modes, strict=True))
    ]
    pairs = [(i, j) for i, j in pairs if j is not None]
    return np.array([i for i, _ in pairs], dtype=np.int64), np.array([j for _, j in pairs], dtype=np.int64)


def rescored_summary(
    table: DatasetTable, picks: dict[str, np.ndarray], rescore: DatasetTable
) -> dict[str, Any]:
    """Every picker's picks on ``table``'s rows (one mode) scored against ``rescore``'s labels of the same
    (scenario, mode), and ``first_sweep_best``; ``{}`` when the tables share no row."""
    rows, other = aligned_rows(table, rescore)
    if not len(rows):
        return {}
    sub = rescore.subset(other)
    out = {name: score(sub, p[rows]) for name, p in picks.items()}
    out["first_sweep_best"] = score(sub, table.best[rows])
    return out


def pickers_summary(
    table: DatasetTable,
    picks: dict[str, np.ndarray],
    noise: DatasetTable | None,
    peers: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Metrics of every picker (``model``, baselines, ``always_async_tp``, the serial-or-async-TP ``peers``
    (name -> bool ``[n]``, True = async-TP) with ``model_on_async_tp_rows``, ``ceiling``) on ``table``, and
    their regrets ``t / t_best - 1``."""
    out: dict[str, Any] = {}
    regrets: dict[str, np.ndarray] = {}
    for name, p in picks.items():
        out[name] = score(table, p)
        regrets[name] = table.time_of(p)[0] / table.best_ms - 1.0
    async_tp = async_tp_score(table)
    if async_tp is not None:
        out["always_async_tp"], regrets["always_async_tp"] = async_tp
        for name, fused in (peers or {}).items():
            out[name], regrets[name] = serial_or_async_tp_score(table, fused)
        if peers:
            has = np.isfinite(table.async_tp_ms)
            out["model_on_async_tp_rows"] = score(table.subset(has), picks["model"][has])
    if noise is not None:
        rows, cols = ceiling_picks(table, noise)
        if len(rows):
            sub = table.subset(rows)
            out["ceiling"] = score(sub, cols)
            out["model_on_ceiling_rows"] = score(sub, picks["model"][rows])
            regrets["ceiling"] = sub.time_of(cols)[0] / sub.best_ms - 1.0
    return out, regrets


def by_op_group(
    table: DatasetTable,
    picks: dict[str, np.ndarray],
    noise: DatasetTable | None,
    peers: dict[str, np.ndarray] | None = None,
) -> dict[str, dict[str, Any]]:
    """:func:`pickers_summary` of the dense rows and of the MoE rows apart, when ``table`` has both (else
    ``{}``): op group -> picker -> metrics, None for a picker with no score on that group (always async-TP
    on MoE rows: PyTorch has no all-to-all pass, so the dataset has no time for it)."""
    groups = table.op_groups
    if len(set(groups)) < 2:
        return {}
    out = {
        group: pickers_summary(
            table.subset(groups == group),
            {name: p[groups == group] for name, p in picks.items()},
            noise,
            {name: f[groups == group] for name, f in (peers or {}).items()},
        )[0]
        for group in sorted(set(groups))
    }
    names = dict.fromkeys(name for summary in out.values() for name in summary)
    return {group: {name: summary.get(name) for name in names} for group, summary in out.items()}


def fit_and_pick(
    train: DatasetTable,
    test: DatasetTable,
    choice: Choice,
    *,
    seed: int,
    n_jobs: int,
    host_factors: Sequence[float | np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Fit the chosen model (and the time-ratio regressor) on ``train``; recommended columns of ``test``
    ``[n]``, one array per host factor of ``host_factors`` (one machine's or each row's; default: ``test``'s
    own rows' alone)."""
    model = fit_pair_model(train, choice.config, seed=seed, n_jobs=n_jobs)
    same = choice.config == ratio_config(choice.config)
    ratio_model = (
        model if same else fit_pair_model(train, ratio_config(choice.config), seed=seed, n_jobs=n_jobs)
    )
    picks = []
    for factor in host_factors or [test.host_factors]:
        versions = test.label_versions
        cost = pair_costs(model, test.X, test.modes, factor, versions)
        ratio = (
            cost if ratio_model is model else pair_costs(ratio_model, test.X, test.modes, factor, versions)
        )
        picks.append(apply_policy(cost, ratio, choice.policy, test.modes)[0])
    return picks


def split_summary(
    train: DatasetTable,
    test: DatasetTable,
    choice: Choice,
    noise: DatasetTable | None,
    *,
    seed: int,
    n_jobs: int,
) -> dict[str, Any]:
    """Per mode of ``test``: every picker trained on ``train`` (baselines: :func:`split_baselines`). When
    the two tables' host factors differ (another machine), ``model`` predicts at ``test``'s own and
    ``model_at_training_host_factor`` at ``train``'s: what knowing the machine's host speed is worth."""
    factors: list[float | np.ndarray] = [test.host_factors]
    if not np.isclose(test.host_factor, train.host_factor):
        factors.append(train.host_factor)
    picks = dict(zip(["model", "model_at_training_host_factor"], fit_and_pick(
        train, test, choice, seed=seed, n_jobs=n_jobs, host_factors=factors), strict=False))  # fmt: skip
    out = {}
    peers = serial_or_async_tp(train, test, seed=seed)
    for mode in sorted(set(test.modes)):
        on = test.modes == mode
        held = test.subset(on)
        mine = {name: p[on] for name, p in picks.items()}
        theirs = {name: fused[on] for name, fused in peers.items()}
        out[mode] = pickers_summary(held, {**mine, **split_baselines(train, held)}, noise, theirs)[0]
    return out


def split_baselines(train: DatasetTable, test: DatasetTable) -> dict[str, np.ndarray]:
    """Every pick baseline of ``test``'s rows (one mode), each row's fitted on ``train``'s rows of its mode
    and op group, as :func:`held_out_baselines` fits them per fold: name -> ``[n]``; ``{}`` when some op
    group of ``test`` has no training rows of that mode."""
    out: dict[str, np.ndarray] = {}
    groups = test.op_groups
    for group in sorted(set(groups)):
        cell = np.isin(train.modes, test.modes) & (train.op_groups == group)
        if not cell.any():
            return {}
        here = groups == group
        for name, picks in baseline_picks(train.subset(cell), test.subset(here)).items():
            out.setdefault(name, np.zeros(len(test), dtype=np.int64))[here] = picks
    return out


def unseen(test: DatasetTable, train: DatasetTable) -> tuple[DatasetTable, int]:
    """``test``'s rows whose scenario ``train`` does not hold (a transfer test scores scenarios the model has
    not seen; a dataset of other families may still share shapes with the training data), and how many of
    ``test``'s scenarios were left out for it; raises ``ValueError`` when none is left."""
    fresh = ~np.isin(test.scenario_ids, train.scenario_ids)
    shared = len(set(test.scenario_ids[~fresh]))
    if not fresh.any():
        raise ValueError(f"every scenario of the transfer dataset ({shared}) is in the training data")
    if shared:
        log.info("transfer: %d scenarios are in the training data too and are left out", shared)
    return test.subset(fresh), shared


def per_family(table: DatasetTable, picks: np.ndarray) -> dict[str, dict[str, Any]]:
    """Metrics of ``picks`` on each family's rows."""
    return {
        f: score(table.subset(table.families == f), picks[table.families == f])
        for f in sorted(set(table.families))
    }


def evaluate(
    table: DatasetTable,
    *,
    noise: DatasetTable | None = None,
    transfer: DatasetTable | None = None,
    transfer_noise: DatasetTable | None = None,
    rescore: DatasetTable | None = None,
    seed: int = 0,
    n_jobs: int = 1,
    configs: tuple[TrainConfig, ...] = CONFIG_GRID,
    policies: tuple[DecisionPolicy, ...] = POLICY_GRID,
    progress: bool = False,
    policy: ModePolicy | None = None,
) -> Evaluation:
    """Cross-validate; score the model, the baselines and the ceiling per mode on every split (the transfer
    split's ceiling from ``transfer_noise``, the transfer dataset's re-measure); with ``rescore``, the
    family-holdout picks also against that independent sweep's labels (``rescored``). ``policy``: decide
    under it rather than choose one (``training.crossval.cross_validate``)."""
    cv = cross_validate(
        table, configs=configs, policies=policies, seed=seed, n_jobs=n_jobs, progress=progress, policy=policy,
        bands=noise_bands(table, noise),
    )  # fmt: skip
    scored = table.is_target
    target, folds = table.subset(scored), cv.folds[scored]
    baselines = held_out_baselines(target, folds)
    peers = held_out_peer_rules(target, folds, seed=seed)
    region = region_holdout(table)
    region_split = split_summary(
        table.subset(~region), table.subset(region & scored), cv.choice, noise, seed=seed, n_jobs=n_jobs
    )
    transfer_split, transfer_counts = None, None
    if transfer is not None:
        transfer, shared = unseen(transfer, table)
        transfer_split = split_summary(table, transfer, cv.choice, transfer_noise, seed=seed, n_jobs=n_jobs)
        transfer_counts = {
            "host_factor": {"training": table.host_factor, "transfer": transfer.host_factor},
            "n_scenarios": len(set(transfer.scenario_ids)),
            "n_dropped_shared_with_training": shared,
            "n_noise_scenarios": 0 if transfer_noise is None else len(set(transfer_noise.scenario_ids)),
        }
    modes: dict[str, Any] = {}
    regrets: dict[str, dict[str, np.ndarray]] = {}
    final, raw, fallbacks = cv.final[scored], cv.raw[scored], cv.fallback[scored]
    for mode in [m for m in MODES if m in set(target.modes)]:
        on = target.modes == mode
        sub = target.subset(on)
        picks = {"model": final[on], **{name: p[on] for name, p in baselines.items()}}
        mine = {name: fused[on] for name, fused in peers.items()}
        family_holdout, regrets[mode] = pickers_summary(sub, picks, noise, mine)
        grouped = by_op_group(sub, picks, noise, mine)
        fallback = fallbacks[on]
        modes[mode] = {
            "family_holdout": family_holdout,
            **({"family_holdout_by_op_group": grouped} if grouped else {}),
            "region_holdout": region_split.get(mode, {}),
            **({"transfer": transfer_split.get(mode, {})} if transfer_split is not None else {}),
            **({"rescored": rescored_summary(sub, picks, rescore)} if rescore is not None else {}),
            "per_family": per_family(sub, final[on]),
            "fallback": {"n_fallbacks": int(fallback.sum()), "without_fallback": score(sub, raw[on])},
        }
        ceiling = family_holdout.get("ceiling", {}).get("geomean_regret")
        model = family_holdout["model"]["geomean_regret"]
        log.info("%s family holdout: model geomean regret %.4f, ceiling %s", mode, model, ceiling)
    summary = {
        "modes": modes,
        "pickers": BASELINE_NOTES,
        "cv": {
            "groups": {g: int(np.sum(cv.groups[scored] == g)) for g in sorted(set(cv.groups[scored]))},
            "folds": {g: int(f) for g, f in sorted(set(zip(cv.groups[scored], folds, strict=True)))},
            "n_folds": len(set(folds.tolist())),
            "splitter": "sklearn.model_selection.GroupKFold over model families and grid quartiles",
            "selection": "per fold, the config and fallback threshold of lowest loss on the other folds' "
            "held-out predictions (training/crossval.py)",
            "config": cv.choice.config.to_dict(),
            "policy": cv.choice.policy.to_dict(),
            "config_loss": cv.config_loss,
            "seed": seed,
        },
        "region_split": "train on GEMM FLOPs below the 75th percentile, test on the largest quarter",
        **({"transfer_split": transfer_counts} if transfer_counts is not None else {}),
    }
    return Evaluation(summary=rounded(summary), cv=cv, regrets=regrets)


def rounded(value: Any, digits: int = 6) -> Any:
    """``value`` with every float rounded to ``digits`` decimals, recursively (stable JSON diffs)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v, digits) for v in value]
    return value
