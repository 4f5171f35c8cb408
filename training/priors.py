"""Priors for a new machine: what other machines' measurements and the simulator know, as a model that the new
machine's own rows correct (docs/training.md, "A new machine: priors and the order of the sweep").

A :class:`Prior` predicts ``log(t / t_serial)`` of every (scenario, schedule, mode) pair on the target machine
before any of its rows is measured. It averages up to three components, each a time-ratio regressor:

- ``measured elsewhere``: fitted on other machines' measured rows (another world size, another GPU), read
  through the features (world size, shard sizes, roofline times) at the target's scenarios;
- ``simulated here``: fitted on the simulator's rows of the target machine;
- ``simulated here, corrected``: the simulated component plus a regressor of the simulator's error
  (measured minus simulated) on the other machines' scenarios, as if the simulator erred the same way here.

Each component answers only for the ops it has rows of. Their mean and their spread (the standard deviation
across components, how much the sources disagree) are distilled, on the pairs of the target's plan, into two
regressors: :attr:`Prior.mean` and :attr:`Prior.spread`.

:func:`fit_with_prior` then fits the target machine's rows on top of the prior. The candidates below are
fitted per grouped cross-validation fold of the target rows and, per mode, the (candidate, fallback threshold)
kept is the one leaning most on the new rows among those within one standard error of the lowest held-out
loss (:func:`_choose`), so the prior's weight is learned from the new rows and a wrong prior fades:

- ``prior``: the prior alone;
- ``prior+target``: an ``ndcg`` ranker boosted on the target rows from the prior's scores (XGBoost
  ``base_margin``: ``-PRIOR_SCALE`` x the prior's predicted log ratio), its trees and the prior's, scaled,
  merged into one booster; the time-ratio model is the prior plus residual trees fitted on the target rows;
- ``target``: the ranker and the time-ratio regressor of ``training.fit.CONFIG_GRID`` on the target rows
  alone (the prior ignored), from :data:`MIN_ALONE` target scenarios on.

The time-ratio model behind the fallback adds ``SPREAD_WEIGHT`` x the spread for the prior's candidates (a
pick the sources disagree on must promise more than ``min_gain`` under the pessimistic estimate), or not:
cross-validation chooses. The trees of the boosted candidates scale with the target rows measured
(:func:`scaled`). Every model is one XGBoost booster per file, as ``ficco train`` writes them: the service's
fast path and the registry's format are unchanged; the booster's ``ficco_prior`` attribute and the card
record what the prior was built from and the choice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ficco.features import FEATURE_SCHEMA_VERSION, MODES, SCHEDULES
from ficco.training.crossval import cv_folds, cv_groups
from ficco.training.dataset_table import DatasetTable
from ficco.training.fit import CONFIG_GRID, RATIO_CONFIG, TrainConfig, training_pairs
from ficco.training.metrics import pick_loss
from ficco.training.model import PAIR_FEATURE_NAMES, PairModel, pair_matrix, relevance_grades
from ficco.training.predict.policy import POLICY_GRID, DecisionPolicy, ModePolicy, apply_policy

COMPONENT_CONFIG = RATIO_CONFIG
"""Each component of a prior: the time-ratio regressor ``ficco train`` fits."""
DISTIL_CONFIG = TrainConfig(objective="ratio", max_depth=6, n_estimators=80, learning_rate=0.2)
"""The regressor the components' mean is distilled into, on the plan's pairs."""
SPREAD_CONFIG = DISTIL_CONFIG
"""The regressor the components' spread is distilled into."""
RANKER_CONFIG = next(c for c in CONFIG_GRID if c.objective == "ndcg")
"""The ranker boosted on the target rows from the prior's scores (the shipped ranker's settings)."""
PRIOR_SCALE = 10.0
"""Ranker score per unit of the prior's predicted log ratio in the ``prior+target`` base margin: the prior's
weight against the ranker's trees (an ``ndcg`` score moves by about 1 per grade of relevance)."""
SPREAD_WEIGHT = 0.5
"""Spreads added to the prior's predicted log ratio in the pessimistic time-ratio model of the fallback."""
PRIOR_POLICY = ModePolicy.uniform(DecisionPolicy(min_gain=0.02))
"""The fallback of the prior alone, before any target row can choose one: 2%, the slow-pick tolerance."""
FULL_TREES_AT = 100
"""Target scenarios from which the boosted candidates get their configuration's full number of trees."""
MIN_TREES = 10
"""Fewest trees a boosted candidate gets."""
MAX_FOLDS = 4
"""Most cross-validation folds over the target rows (each fits every boosted candidate once)."""
MIN_ALONE = 32
"""Target scenarios from which the new rows alone are a candidate beside a prior: from fewer, a model of them
alone lost to the prior at every budget replayed (``benchmarks/new_hardware.py``), and its held-out loss is
too noisy to tell."""
CANDIDATES = ("prior", "prior+target", "target")
"""What :func:`fit_with_prior` chooses between (ties: the earlier)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PriorSource:
    """One dataset a prior was built from, for the model card."""

    name: str
    """The dataset's name or path."""
    backend: str
    """``measured`` or ``simulated``."""
    hardware_id: str
    world_sizes: tuple[int, ...]
    n_scenarios: int

    @classmethod
    def of(cls, name: str, table: DatasetTable, simulated: bool) -> PriorSource:
        return cls(
            name=name,
            backend="simulated" if simulated else "measured",
            hardware_id=table.scenarios[0].hardware.id,
            world_sizes=tuple(sorted({s.world_size for s in table.scenarios})),
            n_scenarios=len(set(table.scenario_ids)),
        )


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Prior:
    """What is known of a machine before it is measured: the distilled mean and spread of the components'
    predicted ``log(t / t_serial)`` (docs/new-hardware.md, "Priors")."""

    hardware_id: str
    """The target machine's hardware id."""
    mean: PairModel
    """Time-ratio regressor: the components' mean predicted log ratio."""
    spread: PairModel | None
    """Time-ratio regressor of the components' standard deviation (None with one component)."""
    components: tuple[str, ...]
    """The components averaged (``measured elsewhere``, ``simulated here``, ``simulated here, corrected``)."""
    sources: tuple[PriorSource, ...]
    host_factor: float
    """The host factor the plan's pairs were built at (the simulated target's)."""

    def log_ratio(self, X: np.ndarray, modes: Sequence[str], host_factor: float) -> np.ndarray:
        """The prior's predicted ``log(t / t_serial)`` of every valid schedule of each scenario row,
        ``[n, S]`` (+inf: not valid)."""
        return _costs(self.mean, X, modes, host_factor)

    def uncertainty(self, X: np.ndarray, modes: Sequence[str], host_factor: float) -> np.ndarray:
        """The components' spread of every valid schedule as the distilled regressor predicts it (a few
        thousandths below 0 where the components agree), ``[n, S]`` (0 where not valid; all 0 with one
        component)."""
        if self.spread is None:
            return np.zeros((len(X), len(SCHEDULES)))
        out = _costs(self.spread, X, modes, host_factor)
        return np.where(np.isfinite(out), out, 0.0)

    def info(self) -> dict[str, Any]:
        """What a model card records of this prior."""
        return {
            "hardware_id": self.hardware_id,
            "components": list(self.components),
            "sources": [_source_dict(s) for s in self.sources],
            "host_factor": round(self.host_factor, 4),
            "simulated_rows": any(s.backend == "simulated" for s in self.sources),
        }

    def describe(self) -> str:
        """One line for logs: the sources by kind."""
        return ", ".join(
            f"{s.name} ({s.backend}, TP={'/'.join(map(str, s.world_sizes))})" for s in self.sources
        )

    def save(self, directory: str | Path) -> Path:
        """Write the prior's boosters and ``prior.json`` into ``directory`` (created); returns it."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self.mean.save_model(out / "mean.ubj")
        if self.spread is not None:
            self.spread.save_model(out / "spread.ubj")
        (out / "prior.json").write_text(json.dumps(self.info(), indent=1, sort_keys=True) + "\n")
        return out

    @classmethod
    def load(cls, directory: str | Path) -> Prior:
        """Read a prior :meth:`save` wrote; ``OSError`` or ``ValueError`` for a folder that holds none."""
        folder = Path(directory)
        info = json.loads((folder / "prior.json").read_text())
        spread = folder / "spread.ubj"
        return cls(
            hardware_id=info["hardware_id"],
            mean=PairModel.load_model(folder / "mean.ubj"),
            spread=PairModel.load_model(spread) if spread.is_file() else None,
            components=tuple(info["components"]),
            sources=tuple(
                PriorSource(**{**s, "world_sizes": tuple(s["world_sizes"])}) for s in info["sources"]
            ),
            host_factor=float(info["host_factor"]),
        )


def _source_dict(source: PriorSource) -> dict[str, Any]:
    return {
        "name": source.name,
        "backend": source.backend,
        "hardware_id": source.hardware_id,
        "world_sizes": list(source.world_sizes),
        "n_scenarios": source.n_scenarios,
    }


def _costs(model: PairModel, X: np.ndarray, modes: Sequence[str], host_factor: float) -> np.ndarray:
    """``model.cost`` of every valid schedule, ``[n, S]`` (+inf: not valid)."""
    Z, (rows, cols) = pair_matrix(X, modes, schema=model.feature_schema_, host_factor=host_factor)
    out = np.full((len(X), len(SCHEDULES)), np.inf)
    if len(Z):
        out[rows, cols] = model.cost(Z)
    return out


def _pairs(tables: Sequence[DatasetTable]) -> tuple[np.ndarray, np.ndarray]:
    """Every measured pair of ``tables`` (``training.fit.training_pairs``), concatenated: ``Z`` ``[N, P]``
    and ``y = log(t / t_serial)`` ``[N]``."""
    parts = [training_pairs(t)[:2] for t in tables]
    return np.concatenate([z for z, _ in parts]), np.concatenate([y for _, y in parts])


def _fit(config: TrainConfig, Z: np.ndarray, y: np.ndarray, *, seed: int, n_jobs: int) -> PairModel:
    return config.estimator(seed=seed, n_jobs=n_jobs).fit(Z, y)


def _sim_errors(
    measured: Sequence[DatasetTable], simulated: Sequence[DatasetTable]
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of ``measured`` whose (scenario, mode, schedule) ``simulated`` also holds, and the simulator's
    error there, ``log(t_measured / t_serial) - log(t_simulated / t_serial_simulated)``: ``Z`` ``[N, P]``,
    ``[N]`` (empty when nothing aligns)."""
    sim_rows = {
        (sid, mode): (table, i)
        for table in simulated
        for i, (sid, mode) in enumerate(zip(table.scenario_ids, table.modes, strict=True))
    }
    Zs, errors = [], []
    for table in measured:
        Z, y, rows = training_pairs(table)
        cols = pair_matrix(table.X, table.modes, valid=np.isfinite(table.times_ms))[1][1]
        sim = np.full(len(y), np.nan)
        for k, (r, c) in enumerate(zip(rows, cols, strict=True)):
            hit = sim_rows.get((table.scenario_ids[r], table.modes[r]))
            if hit is not None:
                s_table, i = hit
                sim[k] = np.log(s_table.times_ms[i, c] / s_table.serial_ms[i])
        ok = np.isfinite(sim)
        Zs.append(Z[ok])
        errors.append(y[ok] - sim[ok])
    if not Zs:
        return np.empty((0, len(PAIR_FEATURE_NAMES)), np.float32), np.empty(0)
    return np.concatenate(Zs), np.concatenate(errors)


def _ops(tables: Sequence[DatasetTable]) -> set[str]:
    return {s.op for t in tables for s in t.scenarios}


def build_prior(
    hardware_id: str,
    *,
    measured: Mapping[str, DatasetTable],
    simulated: Mapping[str, DatasetTable],
    plan_X: np.ndarray,
    plan_modes: Sequence[str],
    seed: int = 0,
    n_jobs: int = 1,
) -> Prior:
    """The prior of machine ``hardware_id`` from other machines' ``measured`` tables and the simulator's
    tables (name -> table), distilled on the plan's scenario rows ``plan_X`` ``[n, F]`` in ``plan_modes``
    ``[n]`` (the scenarios the new machine will be measured on and asked about; no labels are read).

    A simulated table whose scenarios are of ``hardware_id`` is the ``simulated here`` component; the others
    align with the measured tables (same scenario ids) for the simulator's error. ``ValueError`` when no
    table of any kind is given, or a measured table is of ``hardware_id`` (its rows are the target's)."""
    own = [name for name, t in measured.items() if t.scenarios[0].hardware.id == hardware_id]
    if own:
        raise ValueError(f"prior datasets must be of other machines than {hardware_id!r}; {own} are of it")
    here = {n: t for n, t in simulated.items() if t.scenarios[0].hardware.id == hardware_id}
    elsewhere = [t for t in simulated.values() if t.scenarios[0].hardware.id != hardware_id]
    if not measured and not here:
        raise ValueError(
            f"a prior of {hardware_id!r} needs measured datasets of other machines or simulated rows of "
            f"{hardware_id!r}; got neither"
        )
    host_factor = float(np.median([t.host_factor for t in here.values()])) if here else 1.0
    Zp, (rows, _) = pair_matrix(plan_X, plan_modes, host_factor=host_factor)
    plan_ops = np.array([_op_of(x) for x in plan_X], dtype=object)[rows]
    components: dict[str, tuple[np.ndarray, set[str]]] = {}
    if measured:
        model = _fit(COMPONENT_CONFIG, *_pairs(list(measured.values())), seed=seed, n_jobs=n_jobs)
        components["measured elsewhere"] = (model.predict(Zp), _ops(list(measured.values())))
    if here:
        model = _fit(COMPONENT_CONFIG, *_pairs(list(here.values())), seed=seed, n_jobs=n_jobs)
        simulated_here = model.predict(Zp)
        components["simulated here"] = (simulated_here, _ops(list(here.values())))
        Ze, errors = _sim_errors(list(measured.values()), elsewhere)
        if len(errors):
            correction = _fit(COMPONENT_CONFIG, Ze, errors, seed=seed, n_jobs=n_jobs)
            covered = _ops(list(here.values())) & {_op_of(z) for z in Ze[:, : plan_X.shape[1]]}
            components["simulated here, corrected"] = (simulated_here + correction.predict(Zp), covered)
    predictions = np.stack([p for p, _ in components.values()])  # [K, N]
    covers = np.stack([np.isin(plan_ops, sorted(ops)) for _, ops in components.values()])
    covers[:, ~covers.any(axis=0)] = True  # an op no component has rows of: every component's guess
    weights = covers / covers.sum(axis=0)
    mean = (weights * predictions).sum(axis=0)
    spread = np.sqrt((weights * (predictions - mean) ** 2).sum(axis=0))
    names = tuple(components)
    sources = tuple(
        [PriorSource.of(n, t, simulated=False) for n, t in measured.items()]
        + [PriorSource.of(n, t, simulated=True) for n, t in simulated.items()]
    )
    return Prior(
        hardware_id=hardware_id,
        mean=_tagged(_fit(DISTIL_CONFIG, Zp, mean, seed=seed, n_jobs=n_jobs), {"role": "prior mean"}),
        spread=(
            _tagged(_fit(SPREAD_CONFIG, Zp, spread, seed=seed, n_jobs=n_jobs), {"role": "prior spread"})
            if len(names) > 1
            else None
        ),
        components=names,
        sources=sources,
        host_factor=host_factor,
    )


_OP_COLUMNS = [PAIR_FEATURE_NAMES.index(f"op_{op}") for op in ("ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a")]


def _op_of(x: np.ndarray) -> str:
    """The op of a scenario feature row (its one-hot ``op_*`` columns)."""
    return ("ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a")[int(np.argmax(x[_OP_COLUMNS]))]


def _tagged(model: PairModel, info: dict[str, Any]) -> PairModel:
    """``model`` with ``info`` in its booster's ``ficco_prior`` attribute."""
    model.booster_.set_attr(ficco_prior=json.dumps(info, sort_keys=True))
    return model


def scaled(config: TrainConfig, n_scenarios: int) -> TrainConfig:
    """``config`` with its trees scaled to ``n_scenarios`` target scenarios: ``n_estimators`` times
    ``n_scenarios / FULL_TREES_AT``, between ``MIN_TREES`` and ``config.n_estimators``."""
    trees = round(config.n_estimators * min(1.0, n_scenarios / FULL_TREES_AT))
    return replace(config, n_estimators=int(min(config.n_estimators, max(MIN_TREES, trees))))


Scale = float | tuple[float, float]
"""A part's weight in :func:`merge_boosters`: one for every mode, or ``(eager, graph)``."""
_MODE_COLUMN = PAIR_FEATURE_NAMES.index("mode_graph")


def merge_boosters(parts: Sequence[tuple[Any, Scale]], objective: str) -> Any:
    """One ``xgboost.Booster`` whose margin is ``sum(scale * margin)`` over ``parts`` ``(booster, scale)``,
    in each mode the scale of that mode, under ``objective``'s learner (``ratio`` or ``ndcg``, one of the
    parts'). A part of one scale keeps its trees, each leaf times the scale; a part whose scale differs by
    mode gets each tree under a split on the pair's mode (``mode_graph``: eager left, graph right) with the
    two modes' scaled copies below it (a mode of scale 0: a zero leaf); the parts' base scores, scaled per
    mode, become one such tree. The parts must read the same pair columns under objectives of identity link
    (both are): a pair's margin is then exactly the scaled sum."""
    import xgboost as xgb

    documents = [json.loads(bytes(b.save_raw("json"))) for b, _ in parts]
    wanted = _XGB_OBJECTIVES[objective]
    out = next((d for d in documents if d["learner"]["objective"]["name"] == wanted), None)
    if out is None:
        raise ValueError(f"merge_boosters: no part is of objective {objective!r} ({wanted})")
    trees: list[dict[str, Any]] = []
    base = np.zeros(2)
    for document, (_, scale) in zip(documents, parts, strict=True):
        eager, graph = (scale, scale) if isinstance(scale, int | float) else scale
        base += np.array([eager, graph]) * _base_score(document)
        for tree in document["learner"]["gradient_booster"]["model"]["trees"]:
            if eager == graph:
                trees.append(_scaled(tree, eager, 0))
            elif eager or graph:
                trees.append(_gated(tree, eager, graph))
    if base.any():
        trees.append(_constant(*base))
    trees = [dict(t, id=i) for i, t in enumerate(trees)]
    model = out["learner"]["gradient_booster"]["model"]
    model["trees"] = trees
    model["tree_info"] = [0] * len(trees)
    model["gbtree_model_param"]["num_trees"] = str(len(trees))
    model["iteration_indptr"] = list(range(len(trees) + 1))
    out["learner"]["attributes"] = {}
    out["learner"]["learner_model_param"]["base_score"] = "[0E0]"
    booster = xgb.Booster()
    booster.load_model(bytearray(json.dumps(out).encode()))
    return booster


_NODE_FIELDS = ("left_children", "right_children", "parents", "split_indices", "split_conditions",
                "split_type", "default_left", "base_weights", "loss_changes", "sum_hessian")  # fmt: skip
"""The per-node arrays of an XGBoost JSON tree."""
_TREE_EXTRAS = {"categories": [], "categories_nodes": [], "categories_segments": [], "categories_sizes": []}
_NO_PARENT = 2147483647
"""The root's parent in XGBoost's JSON."""


def _scaled(tree: dict[str, Any], scale: float, offset: int, parent: int = _NO_PARENT) -> dict[str, Any]:
    """``tree`` with every leaf (and node weight) times ``scale``, its nodes renumbered from ``offset`` and
    its root's parent ``parent``."""
    leaf = np.asarray(tree["left_children"]) == -1
    out = dict(tree)
    out["base_weights"] = (np.asarray(tree["base_weights"], dtype=np.float64) * scale).tolist()
    conditions = np.asarray(tree["split_conditions"], dtype=np.float64)
    out["split_conditions"] = np.where(leaf, conditions * scale, conditions).tolist()
    for name in ("left_children", "right_children"):
        out[name] = [c + offset if c != -1 else -1 for c in tree[name]]
    out["parents"] = [parent] + [p + offset for p in tree["parents"][1:]]
    return out


def _gated(tree: dict[str, Any], eager: float, graph: float) -> dict[str, Any]:
    """A tree that splits on the pair's mode first and then is ``tree`` times ``eager`` (left) or times
    ``graph`` (right); a side of scale 0 is a zero leaf."""
    sides = []
    offset = 1
    for scale in (eager, graph):
        side = _scaled(tree, scale, offset, parent=0) if scale else _ZERO_LEAF
        sides.append(side)
        offset += len(side["left_children"])
    root = {"left_children": [1], "right_children": [1 + len(sides[0]["left_children"])],
            "parents": [_NO_PARENT], "split_indices": [_MODE_COLUMN], "split_conditions": [0.5],
            "split_type": [0], "default_left": [1], "base_weights": [0.0], "loss_changes": [0.0],
            "sum_hessian": [0.0]}  # fmt: skip
    out = dict(tree, **_TREE_EXTRAS)
    for name in _NODE_FIELDS:
        out[name] = root[name] + sides[0][name] + sides[1][name]
    out["tree_param"] = dict(tree["tree_param"], num_nodes=str(len(out["left_children"])), num_deleted="0")
    return out


_ZERO_LEAF = {"left_children": [-1], "right_children": [-1], "parents": [0], "split_indices": [0],
              "split_conditions": [0.0], "split_type": [0], "default_left": [0], "base_weights": [0.0],
              "loss_changes": [0.0], "sum_hessian": [0.0]}  # fmt: skip
"""A one-leaf subtree of value 0 under a gated tree's root."""


def _constant(eager: float, graph: float) -> dict[str, Any]:
    """A tree of value ``eager`` in eager mode and ``graph`` in graph mode."""
    return dict(
        _TREE_EXTRAS, left_children=[1, -1, -1], right_children=[2, -1, -1], parents=[_NO_PARENT, 0, 0],
        split_indices=[_MODE_COLUMN, 0, 0], split_conditions=[0.5, eager, graph], split_type=[0, 0, 0],
        default_left=[1, 0, 0], base_weights=[0.0, eager, graph], loss_changes=[0.0] * 3,
        sum_hessian=[0.0] * 3,
        tree_param={"num_deleted": "0", "num_feature": str(len(PAIR_FEATURE_NAMES)), "num_nodes": "3",
                    "size_leaf_vector": "1"},
    )  # fmt: skip


_XGB_OBJECTIVES = {"ratio": "reg:squarederror", "ndcg": "rank:ndcg"}
"""XGBoost's objective of each pair-model objective :func:`merge_boosters` writes."""


def _base_score(document: dict[str, Any]) -> float:
    text = document["learner"]["learner_model_param"]["base_score"]
    return float(json.loads(text)[0]) if text.startswith("[") else float(text)


def as_pair_model(
    booster: Any, config: TrainConfig, info: dict[str, Any], *, seed: int, n_jobs: int
) -> PairModel:
    """A fitted ``PairModel`` of ``config``'s objective around ``booster`` (merged trees), its attributes
    as ``PairModel.fit`` writes them plus ``ficco_prior`` (``info``, JSON)."""
    model = config.estimator(seed=seed, n_jobs=n_jobs)
    booster.feature_names = None
    booster.set_attr(
        ficco_estimator=type(model).__name__,
        ficco_params=json.dumps(model.get_params(), sort_keys=True),
        ficco_feature_schema=FEATURE_SCHEMA_VERSION,
        ficco_prior=json.dumps(info, sort_keys=True),
    )
    model.booster_ = booster
    model.feature_schema_ = FEATURE_SCHEMA_VERSION
    model.n_features_in_ = len(PAIR_FEATURE_NAMES)
    return model


def fit_margin(
    config: TrainConfig,
    Z: np.ndarray,
    y: np.ndarray,
    qid: np.ndarray,
    margin: np.ndarray,
    *,
    seed: int,
    n_jobs: int,
) -> Any:
    """An ``xgboost.Booster`` of ``config`` boosted from ``margin`` ``[N]`` (``base_margin``) on pairs ``Z``
    with targets ``y = log(t / t_serial)`` in queries ``qid`` (the rankers' relevance as ``PairModel``
    grades it), base score 0."""
    import xgboost as xgb

    if config.objective == "ratio":
        label, params = y, {"objective": "reg:squarederror"}
    else:
        label = relevance_grades(y, qid)
        params = {"objective": "rank:ndcg", "lambdarank_pair_method": "topk"}
    data = xgb.DMatrix(
        Z, label, qid=None if config.objective == "ratio" else qid, base_margin=margin, nthread=n_jobs
    )
    params |= {
        "max_depth": config.max_depth,
        "eta": config.learning_rate,
        "tree_method": "hist",
        "seed": seed,
        "nthread": n_jobs,
        "base_score": 0.0,
        "verbosity": 0,
    }
    return xgb.train(params, data, num_boost_round=config.n_estimators)


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class PriorFit:
    """What :func:`fit_with_prior` chose and fitted: the models a registry version holds."""

    scorer: PairModel
    """The model that picks: one booster, the prior's trees and the target rows' merged as each mode chose."""
    ratio: PairModel
    """The time-ratio model of the fallback: one booster, as chosen per mode."""
    policy: ModePolicy
    choice: dict[str, str]
    """Mode -> the candidate kept (:data:`CANDIDATES`, ``+spread`` when the fallback adds the spread)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What the card records: the prior, the choices, their weights, the cross-validated losses."""

    @property
    def label(self) -> str:
        """The choices in one line, e.g. ``eager: prior+spread, graph: prior+target``."""
        return ", ".join(f"{mode}: {c}" for mode, c in self.choice.items())

    @property
    def loss(self) -> float:
        """Mean held-out loss of the choices over the target rows (inf without target rows)."""
        return float(self.info.get("cv_loss_chosen", float("inf")))


@dataclass(frozen=True, kw_only=True, slots=True)
class _Candidate:
    name: str
    """One of :data:`CANDIDATES`."""
    spread: bool
    """Whether the fallback adds ``SPREAD_WEIGHT`` x the prior's spread."""

    @property
    def label(self) -> str:
        return self.name + ("+spread" if self.spread else "")


def _candidates(prior: Prior | None) -> tuple[_Candidate, ...]:
    """Every candidate of :func:`fit_with_prior` with ``prior``, in order of preference (ties)."""
    if prior is None:
        return (_Candidate(name="target", spread=False),)
    spreads = (True, False) if prior.spread is not None else (False,)
    return tuple(
        _Candidate(name=name, spread=spread)
        for name in CANDIDATES
        for spread in (spreads if name != "target" else (False,))
    )


class _Fitted:
    """The boosted candidates of ``names`` fitted on some target rows (``train``; None: none)."""

    def __init__(
        self, names: set[str], prior: Prior | None, train: DatasetTable | None, *, seed: int, n_jobs: int
    ) -> None:
        self.prior, self.seed, self.n_jobs = prior, seed, n_jobs
        n = 0 if train is None else len(set(train.scenario_ids))
        self.ranker_config, self.ratio_config = scaled(RANKER_CONFIG, n), scaled(RATIO_CONFIG, n)
        self.boosted: dict[str, tuple[Any, Any]] = {}
        """Candidate -> (ranker booster, time-ratio booster)."""
        if "target" in names:
            Z, y, qid = training_pairs(train)
            ranker = RANKER_CONFIG.estimator(seed=seed, n_jobs=n_jobs).fit(Z, y, qid=qid)
            ratio = RATIO_CONFIG.estimator(seed=seed, n_jobs=n_jobs).fit(Z, y)
            self.boosted["target"] = (ranker.booster_, ratio.booster_)
        if "prior+target" in names:
            Z, y, qid = training_pairs(train)
            base = prior.mean.predict(Z)
            ranker = fit_margin(self.ranker_config, Z, y, qid, -PRIOR_SCALE * base, seed=seed, n_jobs=n_jobs)
            residual = fit_margin(self.ratio_config, Z, y, qid, base, seed=seed, n_jobs=n_jobs)
            self.boosted["prior+target"] = (ranker, residual)

    def predict(self, name: str, table: DatasetTable) -> tuple[np.ndarray, np.ndarray, np.ndarray | float]:
        """(cost, predicted log ratio, spread) of candidate ``name`` on every valid schedule of ``table``'s
        rows, ``[n, S]``."""
        h = table.host_factor
        spread = self.prior.uncertainty(table.X, table.modes, h) if self.prior is not None else 0.0
        Z, (rows, cols) = pair_matrix(table.X, table.modes, host_factor=h)
        cost, ratio = (
            np.full((len(table), len(SCHEDULES)), np.inf),
            np.full((len(table), len(SCHEDULES)), np.inf),
        )
        if name == "target":
            ranker, regressor = self.boosted[name]
            cost[rows, cols] = -ranker.inplace_predict(Z)
            ratio[rows, cols] = regressor.inplace_predict(Z)
            return cost, ratio, spread
        base = self.prior.mean.predict(Z)
        if name == "prior":
            cost[rows, cols] = ratio[rows, cols] = base
            return cost, ratio, spread
        ranker, residual = self.boosted[name]
        cost[rows, cols] = PRIOR_SCALE * base - ranker.inplace_predict(Z)
        ratio[rows, cols] = base + residual.inplace_predict(Z)
        return cost, ratio, spread

    def models(self, choice: dict[str, _Candidate], info: dict[str, Any]) -> tuple[PairModel, PairModel]:
        """(scorer, ratio) as registry models, each one booster: every mode's chosen candidate, the prior's
        trees merged in (:func:`merge_boosters`)."""

        def per_mode(value: dict[str, float]) -> Scale:
            return (value["eager"], value["graph"])

        def weight(of: str, scale: float = 1.0, spread: bool | None = None) -> Scale:
            return per_mode({m: scale if c.name == of and (spread is None or c.spread == spread) else 0.0
                             for m, c in choice.items()})  # fmt: skip

        prior = self.prior
        mean = prior.mean.booster_ if prior is not None else None
        ratio_parts: list[tuple[Any, Scale]] = []
        scorer_parts: list[tuple[Any, Scale]] = []
        if prior is not None:
            uses_prior = per_mode({m: 0.0 if c.name == "target" else 1.0 for m, c in choice.items()})
            ratio_parts.append((mean, uses_prior))
            scorer_parts.append((mean, per_mode({m: 0.0 if c.name == "target" else -PRIOR_SCALE
                                                 for m, c in choice.items()})))  # fmt: skip
            if prior.spread is not None:
                ratio_parts.append((prior.spread.booster_, per_mode(
                    {m: SPREAD_WEIGHT if c.spread else 0.0 for m, c in choice.items()})))  # fmt: skip
        for name, (ranker, regressor) in self.boosted.items():
            scorer_parts.append((ranker, weight(name)))
            ratio_parts.append((regressor, weight(name)))
        ratio_parts = [(b, s) for b, s in ratio_parts if np.any(s)]
        scorer_parts = [(b, s) for b, s in scorer_parts if np.any(s)]
        kw = {"seed": self.seed, "n_jobs": self.n_jobs}
        ratio = as_pair_model(merge_boosters(ratio_parts, "ratio"), RATIO_CONFIG, info, **kw)
        if all(c.name == "prior" for c in choice.values()):
            scorer = as_pair_model(merge_boosters([(mean, 1.0)], "ratio"), RATIO_CONFIG, info, **kw)
        else:
            scorer = as_pair_model(merge_boosters(scorer_parts, "ndcg"), self.ranker_config, info, **kw)
        return scorer, ratio


def _target_folds(table: DatasetTable) -> np.ndarray:
    """Grouped folds of the target rows (``training.crossval``'s groups, at most :data:`MAX_FOLDS`); by
    scenario when the rows are of one group."""
    groups = cv_groups(table)
    if len(set(groups)) < 2:
        groups = table.scenario_ids
    return cv_folds(groups, max_folds=MAX_FOLDS)


def fit_with_prior(
    target: DatasetTable | None,
    prior: Prior | None,
    *,
    seed: int = 0,
    n_jobs: int = 1,
    policies: tuple[DecisionPolicy, ...] = POLICY_GRID,
) -> PriorFit:
    """Fit ``target``'s measured rows (None or empty: none yet) on top of ``prior`` (None: the target rows
    alone), choosing per mode the candidate and its fallback threshold of lowest mean held-out loss
    (``training.metrics.pick_loss``) under grouped cross-validation over the target rows (module docstring);
    a mode without target rows, or target rows of one scenario, keep the prior alone (with the spread, at
    :data:`PRIOR_POLICY`). ``ValueError`` with neither rows nor a prior, or with target rows of another
    machine than the prior's."""
    n_scenarios = 0 if target is None else len(set(target.scenario_ids))
    if prior is None and n_scenarios == 0:
        raise ValueError("fit_with_prior needs target rows or a prior; got neither")
    if prior is not None and n_scenarios and target.scenarios[0].hardware.id != prior.hardware_id:
        found = target.scenarios[0].hardware.id
        raise ValueError(f"the prior is of {prior.hardware_id!r} and the target rows of {found!r}")
    candidates = _candidates(prior)
    fallback = candidates[0]  # the prior alone (with its spread), or the target rows alone
    choice = {mode: fallback for mode in MODES}
    policy = {mode: (PRIOR_POLICY if prior is not None else ModePolicy()).of(mode) for mode in MODES}
    losses: dict[str, dict[str, float]] = {}
    folds = _target_folds(target) if n_scenarios > 1 else np.zeros(0, dtype=np.int64)
    if len(set(folds.tolist())) > 1:
        names = {c.name for c in candidates}
        held = {c.name: [np.zeros((len(target), len(SCHEDULES))) for _ in range(3)] for c in candidates}
        for fold in sorted(set(folds.tolist())):
            test = folds == fold
            fitted = _Fitted(names, prior, target.subset(~test), seed=seed, n_jobs=n_jobs)
            rows = target.subset(test)
            for name in names:
                for out, value in zip(held[name], fitted.predict(name, rows), strict=True):
                    out[test] = value
        loss = np.stack(
            [np.stack([_loss(target, *held[c.name], c.spread, p) for p in policies]) for c in candidates]
        )  # fmt: skip  [candidates, policies, rows]
        alone = prior is None or n_scenarios >= MIN_ALONE
        allowed = np.array([c.name != "target" or alone for c in candidates])
        for mode in sorted(set(target.modes.tolist())):
            c, p = _choose(loss[:, :, target.modes == mode], candidates, allowed)
            choice[mode], policy[mode] = candidates[c], policies[p]
            means = loss[:, :, target.modes == mode].mean(axis=2)
            losses[mode] = {
                cand.label: round(float(v), 6) for cand, v in zip(candidates, means.min(axis=1), strict=True)
            }
        chosen = np.concatenate([
            loss[candidates.index(choice[m]), policies.index(policy[m]), target.modes == m] for m in losses
        ])  # fmt: skip
    else:
        chosen = np.zeros(0)
    needed = {c.name for c in choice.values()}
    fitted = _Fitted(needed, prior, target if n_scenarios else None, seed=seed, n_jobs=n_jobs)
    info = {
        "prior": prior.info() if prior is not None else None,
        "n_target_scenarios": n_scenarios,
        "choice": {m: c.label for m, c in choice.items()},
        "prior_weight": {m: _PRIOR_WEIGHTS[c.name] for m, c in choice.items()},
        "spread_weight": {m: SPREAD_WEIGHT if c.spread else 0.0 for m, c in choice.items()},
        "trees": {"ranker": fitted.ranker_config.n_estimators, "ratio": fitted.ratio_config.n_estimators},
        "cv_loss": losses,
        "n_folds": len(set(folds.tolist())),
        **({"cv_loss_chosen": round(float(chosen.mean()), 6)} if len(chosen) else {}),
    }
    scorer, ratio = fitted.models(choice, info)
    return PriorFit(scorer=scorer, ratio=ratio, policy=ModePolicy(**policy), choice=info["choice"], info=info)


def _choose(loss: np.ndarray, candidates: tuple[_Candidate, ...], allowed: np.ndarray) -> tuple[int, int]:
    """The (candidate, policy) kept from one mode's held-out losses ``[candidates, policies, rows]`` among the
    ``allowed`` candidates (bool ``[candidates]``): of the options within one standard error (of the rows'
    paired differences) of the lowest mean loss, the one that leans most on the new rows (``target``, then
    ``prior+target``, then ``prior``), then the lowest loss. Many options make the lowest held-out loss
    optimistic; the rule keeps a prior only while it is clearly better than what the new rows say, so it
    fades as they accumulate."""
    n_policies = loss.shape[1]
    flat = np.where(np.repeat(allowed, n_policies)[:, None], loss.reshape(-1, loss.shape[-1]), np.inf)
    means = flat.mean(axis=1)
    best = int(np.argmin(means))
    with np.errstate(invalid="ignore"):
        se = np.nan_to_num((flat - flat[best]).std(axis=1), nan=np.inf) / np.sqrt(max(flat.shape[1], 1))
    close = np.flatnonzero(np.isfinite(means) & (means <= means[best] + se))
    lean = np.array([CANDIDATES.index(candidates[i // n_policies].name) for i in close])
    pick = close[np.lexsort((means[close], -lean))[0]]
    return int(pick // n_policies), int(pick % n_policies)


_PRIOR_WEIGHTS: dict[str, float | str] = {"prior": "prior alone", "prior+target": PRIOR_SCALE, "target": 0.0}
"""The prior's weight in each candidate, as the card records it."""


def _loss(
    table: DatasetTable,
    cost: np.ndarray,
    ratio: np.ndarray,
    spread: np.ndarray | float,
    with_spread: bool,
    policy: DecisionPolicy,
) -> np.ndarray:
    """``training.metrics.pick_loss`` of each row's held-out pick under ``policy`` in every mode, ``[n]``."""
    fallback_ratio = ratio + SPREAD_WEIGHT * spread if with_spread else ratio
    final = apply_policy(cost, fallback_ratio, ModePolicy.uniform(policy), table.modes)[0]
    return pick_loss(table.time_of(final)[0], table.best_ms, table.serial_ms)
