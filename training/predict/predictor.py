"""A loaded model that answers "which schedule for this scenario, in this execution mode?".

>>> from ficco.training.predict.registry import load_predictor                  # doctest: +SKIP
>>> predictor = load_predictor("models", "h200x2")                       # doctest: +SKIP
>>> [r.schedule for r in predictor.recommend([Scenario(m=1024)], mode="graph")]  # doctest: +SKIP
['serial/sm']

:meth:`Predictor.decide` takes the numpy fast path up to ``FAST_PATH_MAX_NODES`` (scenarios x the nodes of
their mode's forest), XGBoost's own prediction for larger batches; both give the same picks (docs/training.md,
"The fast path").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ficco.features import FEATURE_NAMES, MODES, HardwareProfile, Scenario, feature_matrix, get_hardware
from ficco.features.label_source import LABEL_VERSION
from ficco.features.launch_cost import TWIN_OF, check_host_factor, host_over_gpu
from ficco.features.provenance import MEASURED, ModelBackend, model_backend, registry_id
from ficco.training.predict.booster import NumpyBooster
from ficco.training.predict.coverage import Coverage
from ficco.training.predict.fastpath import SpecialisedForest
from ficco.training.predict.pairs import (
    DESCRIPTORS,
    HOST_FEATURE_NAME,
    LABEL_VERSION_NAME,
    PAIR_FEATURE_NAMES_OF,
    SCHEDULES,
    SERIAL_INDEX,
    check_modes,
    pair_matrix,
    valid_mask,
)
from ficco.training.predict.policy import ModePolicy, apply_policy

# answering needs no scikit-learn: a loaded model may be a training.predict.booster.SavedPairModel
if TYPE_CHECKING:
    from ficco.training.model import PairModel

_SCHEDULE_NAMES = np.asarray(SCHEDULES, dtype=object)
"""``SCHEDULES`` as an object array, to index with picks."""
FAST_PATH_MAX_NODES = 600_000
"""Most ``scenarios x nodes of their mode's forest`` the fast path walks (each scenario compares every node
once); beyond it XGBoost's own prediction, a fixed ~2 ms a call and then ~65 us a scenario, is faster. On the
h200x2 model (eager 77,500 nodes, graph 25,800) that is 7 eager or 23 graph scenarios; measured decisions,
numpy against XGBoost, one thread: eager 4 scenarios 2.3 / 2.7 ms, 8 4.0 / 3.4 ms, 32 12.0 / 5.4 ms; graph 8
1.6 / 3.7 ms, 32 4.6 / 5.6 ms, 256 34 / 23 ms. A model read without XGBoost always takes the fast path."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Recommendation:
    """The schedule to run for one scenario in one execution mode, and why."""

    schedule: str
    """Canonical schedule string to run (``serial/sm`` when the fallback fired)."""
    mode: str
    """Execution mode the recommendation is for: ``eager`` or ``graph`` (CUDA-graph replay)."""
    predicted_speedups: dict[str, float]
    """Predicted ``t_serial / t_schedule`` of every schedule valid for the scenario (serial/sm: 1.0)."""
    predicted_speedup: float
    """Predicted ``t_serial / t_schedule`` of ``schedule`` (1.0 for serial/sm)."""
    fallback: bool
    """True when the model's own pick was replaced by serial/sm."""
    fallback_reason: str | None
    """Why the fallback fired; None otherwise."""
    pick_reason: str | None
    """Why ``schedule`` is not the schedule of highest predicted speedup (the fallback, a tie within the
    model's noise band, or the ranker's order against the regressor's speedups); None when it is."""
    model_version: str
    """Registry version of the model that answered."""
    hardware_id: str
    """Hardware profile the model was trained for (``<id>-sim`` for a simulated model)."""
    model_backend: ModelBackend
    """``measured`` (trained on GPU measurements only) or ``simulated`` (``features.provenance``)."""
    host_factor: float
    """The host factor the eager answer is for (``features.launch_cost``; the model's training data's unless
    the caller gave its machine's)."""
    neighbours: int | None = None
    """Measured neighbours of the scenario (``training.predict.coverage``): how near the answer is to a
    measurement; None for a model that carries no coverage."""
    sim_fidelity: dict[str, Any] | None = None
    """A simulated model's card's ``sim_fidelity``: how far the simulator that made its training rows is from
    measurements (its own picks' held-out regret at the measured world sizes) and the guard against picks
    slower than serial; None for a measured model (docs/simulator.md)."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Decision:
    """Vectorised outcome of :meth:`Predictor.decide` for ``n`` scenario rows over the ``S`` schedules."""

    schedules: np.ndarray
    """Recommended schedule strings, ``[n]``."""
    final: np.ndarray
    """Recommended schedule column, int ``[n]``."""
    raw: np.ndarray
    """The model's own pick (lowest cost) before the policy (``training.predict.policy``), column ``[n]``."""
    speedup: np.ndarray
    """Predicted speedup over serial of the pick the fallback judged (``training.predict.policy.Picks``),
    ``[n]``."""
    fallback: np.ndarray
    """Where serial/sm replaced ``raw``, bool ``[n]``."""
    speedups: np.ndarray
    """Predicted speedup over serial of every schedule, ``[n, S]`` (NaN where it cannot run)."""
    host_factor: float | np.ndarray
    """The host factor the eager rows were answered for (``features.launch_cost``), or each row's ``[n]``."""


class Predictor:
    """The fitted pair model (``scorer``), the time-ratio regressor (``ratio``, the same object when the
    scorer is the regressor), sharing one feature schema; the decision policy (``training.predict.policy``:
    the guard, the /hp tie rule and the fallback, with each mode's noise band), the model card and
    ``coverage`` (the training rows' shapes for the answers' neighbour counts; None: not counted)."""

    def __init__(
        self,
        *,
        scorer: PairModel,
        ratio: PairModel,
        policy: ModePolicy,
        card: dict[str, Any],
        version: str,
        hardware_id: str,
        coverage: Coverage | None = None,
    ) -> None:
        self.scorer = scorer
        self.coverage = coverage
        self.ratio = ratio
        self.policy = policy
        self.card = card
        self.version = version
        self.hardware_id = hardware_id
        self.backend: ModelBackend = model_backend(card)
        """Whether the model was trained on measured or simulated rows (``features.provenance``)."""
        if scorer.feature_schema_ != ratio.feature_schema_:
            raise ValueError(
                f"the scorer and the ratio model must share a feature schema; got {scorer.feature_schema_!r} "
                f"and {ratio.feature_schema_!r}"
            )
        self.feature_schema = scorer.feature_schema_
        """The schema of both models' pairs."""
        self.host_factor = check_host_factor(card.get("host_factor", 1.0))
        """The host factor of the training data (``features.launch_cost``): eager answers are for a machine of
        this host speed unless the caller names its own (models registered before it was recorded: 1)."""
        boosters = [scorer.booster_] if ratio is scorer else [scorer.booster_, ratio.booster_]
        names = PAIR_FEATURE_NAMES_OF[self.feature_schema]
        tails = {m: [float(m == "graph")] for m in MODES}
        if LABEL_VERSION_NAME in names:  # fv4: answers are for the executor this code runs
            for tail in tails.values():
                tail.append(float(LABEL_VERSION))
        self._host_columns = None
        """fv3: the columns of ``features.launch_cost.host_over_gpu`` that eager pairs read, one per twin
        (schedules of equal launches share one, so their pruned trees can be shared); None before fv3."""
        linked = None
        if HOST_FEATURE_NAME in names:
            tails["graph"].append(0.0)  # graph mode: no host time
            self._host_columns, column_of = np.unique(TWIN_OF, return_inverse=True)
            linked = {"eager": (names.index(HOST_FEATURE_NAME), column_of)}
        self._fast = SpecialisedForest.compile(
            boosters, DESCRIPTORS, {m: np.array(t) for m, t in tails.items()}, len(FEATURE_NAMES),
            linked=linked,
        )  # fmt: skip

    def __repr__(self) -> str:
        return (
            f"Predictor(hardware_id={self.hardware_id!r}, version={self.version!r}, backend={self.backend!r})"
        )

    @property
    def profile(self) -> HardwareProfile:
        """The hardware profile the model was trained on: its card's ``hardware`` object (a simulated
        model's is named ``<id>-sim``), else the built-in profile of ``hardware_id``."""
        data = self.card.get("hardware")
        return HardwareProfile.from_dict(data) if isinstance(data, dict) else get_hardware(self.hardware_id)

    def _reference(
        self, X: np.ndarray, modes: np.ndarray, valid: np.ndarray, host_factor: float | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(cost, predicted log ratio) of every schedule ``[n, S]`` by XGBoost's own prediction."""
        Z, (rows, cols) = pair_matrix(X, modes, valid, schema=self.feature_schema, host_factor=host_factor)
        out = self.scorer.predict(Z)
        ratio = out if self.ratio is self.scorer else self.ratio.predict(Z)
        cost, log_ratio = np.full(valid.shape, np.inf), np.full(valid.shape, np.nan)
        cost[rows, cols] = out if self.scorer.objective == "ratio" else -out
        log_ratio[rows, cols] = ratio
        return cost, log_ratio

    def _fast_path(
        self, X: np.ndarray, modes: np.ndarray, valid: np.ndarray, host_factor: float | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(cost, predicted log ratio) of every schedule ``[n, S]`` by the specialised forest."""
        cost, log_ratio = np.empty(valid.shape), np.empty(valid.shape)
        present = set(modes.tolist())
        for mode in present:
            on = slice(None) if len(present) == 1 else modes == mode
            rows = X[on]
            if self._host_columns is not None and mode == "eager":
                factor = host_factor[on] if np.ndim(host_factor) else host_factor
                host = host_over_gpu(rows, factor)[:, self._host_columns]
                rows = np.concatenate([rows, host], axis=1)
            margins = self._fast.predict(rows.astype(np.float32, copy=False), mode)
            cost[on] = margins[:, :, 0] if self.scorer.objective == "ratio" else -margins[:, :, 0]
            log_ratio[on] = margins[:, :, -1]
        return np.where(valid, cost, np.inf), np.where(valid, log_ratio, np.nan)

    def decide(
        self,
        X: np.ndarray,
        modes: Sequence[str],
        *,
        host_factor: float | np.ndarray | None = None,
        fast: bool | None = None,
    ) -> Decision:
        """Picks, predicted speedups and fallbacks of feature rows ``X`` ``[n, F]`` in ``modes`` ``[n]`` on a
        machine of ``host_factor`` (None: the training data's; an array ``[n]``: each row's own, rows measured
        on several machines; eager answers only). ``fast``: True = the numpy fast path, False = XGBoost's own
        prediction, None = by batch size."""
        modes = check_modes(modes)
        if host_factor is None:
            host_factor = self.host_factor
        elif np.ndim(host_factor):
            host_factor = np.asarray(host_factor, dtype=np.float64)
            for factor in np.unique(host_factor):
                check_host_factor(factor)
        else:
            host_factor = check_host_factor(host_factor)
        valid = valid_mask(X)
        if fast is None:
            trees = self._fast.trees
            nodes = sum(int(np.count_nonzero(modes == m)) * len(t.feature) for m, t in trees.items())
            fast = nodes <= FAST_PATH_MAX_NODES or isinstance(self.scorer.booster_, NumpyBooster)
        cost, log_ratio = (self._fast_path if fast else self._reference)(X, modes, valid, host_factor)
        log_ratio[:, SERIAL_INDEX] = 0.0  # serial over serial, by definition
        final, raw, fallback, speedup = apply_policy(cost, log_ratio, self.policy, modes)
        speedups = np.exp(-log_ratio)
        return Decision(
            schedules=_SCHEDULE_NAMES[final], final=final, raw=raw, speedup=speedup,
            fallback=fallback, speedups=speedups, host_factor=host_factor,
        )  # fmt: skip

    def recommend(
        self, scenarios: Sequence[Scenario], mode: str = "eager", *, host_factor: float | None = None
    ) -> list[Recommendation]:
        """One :class:`Recommendation` per scenario, in order, for execution ``mode`` on a machine of
        ``host_factor`` (:meth:`decide`); ``ValueError`` for a scenario on hardware other than the model's (a
        ``<id>-sim`` model also answers ``<id>``), an unknown mode or a host factor out of range."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
        own = {self.hardware_id, registry_id(self.hardware_id, MEASURED)}  # a simulated model: its hardware's
        foreign = [s.key() for s in scenarios if s.hardware.id not in own]
        if foreign:
            raise ValueError(
                f"this model was trained for hardware {self.hardware_id!r}; {len(foreign)} scenario(s) are "
                f"on other hardware, e.g. {foreign[0]}. Load the model of that hardware (list them with "
                "ficco.training.predict.registry.list_models)"
            )
        d = self.decide(feature_matrix(scenarios), [mode] * len(scenarios), host_factor=host_factor)
        # Row by row: one tolist() of the whole [n, S] matrix is one native call holding the GIL (~80 ms
        # for 10,000 scenarios, measured), which a server's other threads would wait out.
        speedups, valid, policy = d.speedups, np.isfinite(d.speedups), self.policy.of(mode)
        rows = np.arange(len(scenarios))
        schedules, fallback = d.schedules.tolist(), d.fallback.tolist()
        picked = speedups[rows, d.final].tolist()
        raw_speedup = speedups[rows, d.raw]
        guarded = (raw_speedup < policy.slowest).tolist()  # the guard passed the ranker's first choice over
        top = np.where(valid, speedups, -np.inf).argmax(axis=1)
        behind = (speedups[rows, top] > speedups[rows, d.final]).tolist()
        fallback_reasons = [
            None if not fallback[i]
            else policy.guard_reason(SCHEDULES[d.raw[i]], raw_speedup[i]) if guarded[i]
            else policy.reason(d.speedup[i])
            for i in range(len(scenarios))
        ]  # fmt: skip
        near = (
            [None] * len(scenarios)
            if self.coverage is None
            else self.coverage.count(scenarios, mode).tolist()
        )
        return [
            Recommendation(
                schedule=schedules[i],
                mode=mode,
                predicted_speedups=_valid_speedups(speedups[i], valid[i]),
                predicted_speedup=picked[i],
                fallback=fallback[i],
                fallback_reason=fallback_reasons[i],
                pick_reason=(
                    (
                        fallback_reasons[i]
                        or self._ranking_reason(speedups[i], d.final[i], top[i], d.raw[i], mode)
                    )
                    if behind[i]
                    else None
                ),
                model_version=self.version,
                hardware_id=self.hardware_id,
                model_backend=self.backend,
                host_factor=d.host_factor,
                neighbours=near[i],
                sim_fidelity=self.card.get("sim_fidelity"),
            )
            for i in range(len(scenarios))
        ]

    def _ranking_reason(self, speedups: np.ndarray, pick: int, top: int, raw: int, mode: str) -> str:
        """Why the pick (column ``pick``) is not the column ``top`` of highest predicted speedup in one
        scenario's row ``speedups`` ``[S]`` (nor serial/sm, when that is predicted faster too): each gap
        within the noise band is a tie, and the ranker's order (its first choice: column ``raw``) decides,
        after the guard and the /hp tie rule (``training.predict.policy``)."""
        policy = self.policy.of(mode)
        band = policy.noise_band
        gaps = []
        for other in dict.fromkeys([int(top), SERIAL_INDEX]):
            gap = float(speedups[other] / speedups[pick] - 1.0)
            if gap > 0:
                where = "within the noise band: a tie" if gap <= band else "beyond the noise band"
                gaps.append(f"{SCHEDULES[other]} is predicted {gap:.2%} faster ({where})")
        ranker = (
            f"its {self.scorer.objective} ranker, which picks (it had the lower held-out loss under "
            "cross-validation)"
        )
        if speedups[raw] < policy.slowest:
            guard = policy.guard_reason(SCHEDULES[raw], float(speedups[raw]))
            order = f"{ranker}, orders {SCHEDULES[raw]} first, but {guard}; of the others it orders "
            order += f"{SCHEDULES[pick]} first"
        elif raw != pick:  # the /hp tie rule
            order = (
                f"{ranker}, orders {SCHEDULES[raw]} first, and a /hp schedule within the noise band of its "
                f"normal-priority twin gives way to it: {SCHEDULES[pick]}"
            )
        else:
            order = f"{ranker}, orders {SCHEDULES[pick]} first"
        return (
            f"{'; '.join(gaps)}. The model's noise band is {band:.2%} in {mode} mode (the run-to-run spread "
            f"of its training measurements); the speedups are its time-ratio regressor's, and {order}"
        )


def _valid_speedups(speedups: np.ndarray, valid: np.ndarray) -> dict[str, float]:
    """Schedule -> predicted speed-up of one scenario's row ``[S]``, valid schedules only."""
    return {s: v for s, v, ok in zip(SCHEDULES, speedups.tolist(), valid.tolist(), strict=True) if ok}
