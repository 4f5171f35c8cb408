"""The model store: the predictors being served, hot reload, and which model answers which hardware.

Requests read ``ModelStore.served`` once (a ``{hardware_id: ServedModel}`` mapping that is never
mutated) and use that snapshot throughout, so a reload never changes a model under a running request:
a reload builds the new mapping and swaps it in with one reference assignment.
"""

from __future__ import annotations

import asyncio
import filecmp
import functools
import importlib
import logging
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from ficco.features import DENSE_OPS, KNOWN_HARDWARE, MODES, HardwareProfile, Scenario, get_hardware
from ficco.features.hardware import NEW_PROFILE_HINT, PROFILE_FILE, did_you_mean, registered_profiles
from ficco.features.provenance import MEASURED, SIMULATED, ModelBackend, is_sim_id, model_backend, registry_id
from ficco.features.scenario import MAX_WORLD_SIZE, MIN_WORLD_SIZE, default_world_size
from ficco.service.cache import RecommendationCache
from ficco.service.core.micro_batch import MicroBatcher, predict_split
from ficco.service.errors import NoModelError, NotServedError, UnknownHardwareError

log = logging.getLogger(__name__)


class Predictor(Protocol):
    """What the service needs of ``training.predict.predictor.Predictor`` (a loaded model)."""

    version: str
    hardware_id: str
    card: dict

    def recommend(
        self, scenarios: Sequence[Scenario], mode: str = "eager", *, host_factor: float | None = None
    ) -> list[Any]: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ServedModel:
    """One loaded predictor with the hardware profile it was trained on and its answer cache."""

    predictor: Predictor
    profile: HardwareProfile
    """The profile scenarios are built on when this model answers."""
    cache: RecommendationCache
    """Answers of this model, keyed by scenario; dropped with the model on a reload."""
    batchers: Mapping[str, MicroBatcher]
    """Per execution mode: shares this model's prediction calls between concurrent single requests."""
    bulk: Executor
    """Threads a large list of scenarios is split over (``recommend_many``)."""
    bulk_threads: int = 1
    """How many chunks a large list is cut into."""

    @property
    def version(self) -> str:
        return self.predictor.version

    @property
    def backend(self) -> ModelBackend:
        """``measured`` or ``simulated`` (``features.provenance``), from the model's card."""
        return model_backend(self.predictor.card)

    @property
    def ops(self) -> tuple[str, ...]:
        """The ops this model has measured data for (``trained_ops``)."""
        return trained_ops(self.predictor)

    @property
    def world_sizes(self) -> tuple[int, ...]:
        """The world sizes this model was trained at (``measured_world_sizes``)."""
        return measured_world_sizes(self.predictor.card, self.profile)

    def unmeasured(self, op: str) -> str | None:
        """None when this model has measured data for ``op``; else the message saying it has not."""
        if op in self.ops:
            return None
        return f"no measured data for op {op!r} on {self.profile.id}; measured ops: {list(self.ops)}"

    def recommend_many(
        self, scenarios: Sequence[Scenario], mode: str, host_factor: float | None = None
    ) -> list[Any]:
        """The predictor's answers for ``scenarios`` run in ``mode`` on a machine of ``host_factor`` (None:
        the model's own); a large list is split over ``bulk_threads`` threads."""
        predict = functools.partial(self.predictor.recommend, mode=mode, host_factor=host_factor)
        return predict_split(predict, scenarios, self.bulk, parts=self.bulk_threads)


class Served(Mapping[str, ServedModel]):
    """What a store serves at one moment: ``{hardware id: ServedModel}``, never mutated (a reload builds a
    new one), and the custom hardware profiles registered beside the models
    (``features.hardware.register_profile``: ``<root>/<id>/hardware.json``), which make an id known before
    any model of it is."""

    __slots__ = ("_models", "profiles")

    def __init__(
        self,
        models: Mapping[str, ServedModel] | None = None,
        profiles: Mapping[str, HardwareProfile] | None = None,
    ) -> None:
        self._models = dict(models or {})
        self.profiles: Mapping[str, HardwareProfile] = dict(profiles or {})

    def __getitem__(self, hardware_id: str) -> ServedModel:
        return self._models[hardware_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def __repr__(self) -> str:
        return f"Served({self._models!r}, profiles={sorted(self.profiles)})"


@dataclass(frozen=True, kw_only=True, slots=True)
class Substitution:
    """Another hardware's model answers a request: for which, and how its hardware differs."""

    answered_hardware: str
    """The hardware id of the model that answers."""
    reason: str
    """Why, in one line (what ``hardware_substitution`` says)."""
    differs: dict[str, tuple[Any, Any]]
    """The profile figures that differ: field -> (requested hardware's, answering model's)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Resolution:
    """Which served model answers a request, at which world size, and why when it is not the requested
    hardware's own."""

    model: ServedModel
    requested: str
    """The hardware id the request named (or the default)."""
    world_size: int
    """The world size answered: the request's, or when it names none the requested hardware's GPU count."""
    substitution: Substitution | None
    """None when the requested hardware's own model answers; else which model does and why."""


def _same_die(a: HardwareProfile, b: HardwareProfile) -> bool:
    """True when two profiles have the same compute die (SM count and bf16 peak), e.g. H100 and H200."""
    return a.sm_count == b.sm_count and a.peak_bf16_tflops == b.peak_bf16_tflops


def known_profile(served: Mapping[str, ServedModel], hardware_id: str) -> HardwareProfile | None:
    """The profile a measured hardware id names: built-in, else a served model's (its own, or its simulated
    model's under the measured id), else a custom one registered beside the models (``Served.profiles``);
    None for an id nobody knows."""
    if hardware_id in KNOWN_HARDWARE:
        return KNOWN_HARDWARE[hardware_id]
    for model_id in (hardware_id, registry_id(hardware_id, SIMULATED)):
        model = served.get(model_id)
        if model is not None:
            return replace(model.profile, id=hardware_id)
    return served.profiles.get(hardware_id) if isinstance(served, Served) else None


def known_ids(served: Mapping[str, ServedModel]) -> list[str]:
    """Every hardware id a request may name: built-in, served (simulated ids included) and registered custom
    ones (``known_ids`` of every 404)."""
    registered = served.profiles if isinstance(served, Served) else {}
    return sorted(set(KNOWN_HARDWARE) | set(served) | set(registered))


def measured_world_sizes(card: Mapping[str, Any], profile: HardwareProfile) -> tuple[int, ...]:
    """The world sizes a model was trained at: its card's ``world_sizes``; for cards from before that
    field, every world size its hardware runs (2 to its GPU count, at most ``MAX_WORLD_SIZE``)."""
    recorded = card.get("world_sizes")
    if recorded:
        return tuple(int(w) for w in recorded)
    return tuple(range(MIN_WORLD_SIZE, min(MAX_WORLD_SIZE, profile.gpu_count) + 1))


def missing_model_line(served: Mapping[str, ServedModel], hardware_id: str, world_size: int, why: str) -> str:
    """One line for a (hardware, world size) no served model answers: ``why``, the measured (hardware,
    world size) pairs served, and the ways forward that run as printed: measure it, or ask a simulated model
    by its id (the one served, else the command that trains it), on a profile of the same GPU with enough
    GPUs when ``hardware_id`` has too few. An id of no known profile close to a known one is taken for a
    typo (no command); another may be a custom profile not registered here, which the commands then name
    conditionally."""
    pairs = sorted((hw, w) for hw, m in served.items() if m.backend == MEASURED for w in m.world_sizes)
    listed = ", ".join(f"({hw}, {w})" for hw, w in pairs) or "none"
    measured_id = registry_id(hardware_id, MEASURED)
    base = known_profile(served, measured_id)
    target = measured_id if base is None else base.id
    bigger: list[tuple[int, str]] = []
    if base is not None and world_size > base.gpu_count:
        why += f"; world_size={world_size} needs more GPUs than {base.id}'s gpu_count={base.gpu_count}"
        bigger = sorted(
            (p.gpu_count, p.id)
            for p in KNOWN_HARDWARE.values()
            if p.gpu_name == base.gpu_name and p.gpu_count >= world_size
        )
        if not bigger:
            why += f", and no built-in profile has {world_size} {base.gpu_name} GPUs"
        else:
            target = bigger[0][1]
    line = (
        f"no model answers hardware {hardware_id!r} at world_size={world_size}: {why}; measured (hardware, "
        f"world size) pairs served: {listed}."
    )
    if base is None and did_you_mean(measured_id, known_ids(served)):
        return f"{line} {NEW_PROFILE_HINT}"  # a typo of a known id: no command to run with it
    if base is None:
        ways = _ways(served, target, world_size)
        return (
            f"{line} If {target!r} is a custom profile registered with the models: {ways}. {NEW_PROFILE_HINT}"
        )
    if world_size > base.gpu_count and not bigger:
        return f"{line} {NEW_PROFILE_HINT}"
    return f"{line} {_ways(served, target, world_size, requested=hardware_id)}"


def _ways(served: Mapping[str, ServedModel], target: str, world_size: int, requested: str = "") -> str:
    """Measure ``target`` at ``world_size`` with ``ficco retrain``, or ask its simulated model (served, else
    trained first): the two ways forward of :func:`missing_model_line`."""
    sim_id = registry_id(target, SIMULATED)
    sim = served.get(sim_id)
    if sim is not None and world_size in sim.world_sizes and sim_id != requested:
        simulated = f"or ask the simulated model served for it: hardware {sim_id!r}"
    else:
        simulated = (
            f"or train a simulated one with `ficco retrain --backend sim --hardware {target} --tp "
            f"{world_size}`, then ask hardware {sim_id!r}"
        )
    return (
        f"Measure it with `ficco retrain --hardware {target} --tp {world_size}` on a machine of those GPUs, "
        f"{simulated} (its answers say model_backend=simulated)"
    )


def _substitutes(served: Mapping[str, ServedModel], requested: HardwareProfile) -> list[ServedModel]:
    """The served measured models that may answer for ``requested`` hardware: those of its compute die."""
    return [m for m in served.values() if m.backend == MEASURED and _same_die(m.profile, requested)]


def answered_world_sizes(served: Mapping[str, ServedModel], hardware_id: str) -> list[int]:
    """The world sizes a request for ``hardware_id`` is answered at: its own model's, and for a measured id
    those of the measured models of the same compute die (which answer by substitution)."""
    own = served.get(hardware_id)
    sizes = set(own.world_sizes) if own is not None else set()
    profile = known_profile(served, hardware_id)
    if profile is not None and not is_sim_id(hardware_id):
        sizes |= {w for m in _substitutes(served, profile) for w in m.world_sizes}
    return sorted(sizes)


def resolve_hardware(
    served: Mapping[str, ServedModel], hardware_id: str, world_size: int | None
) -> Resolution:
    """Pick the model that answers ``hardware_id`` at ``world_size`` (None: the hardware's GPU count).

    Its own model if loaded and trained at that world size; otherwise a loaded measured model of a profile
    with the same compute die, trained at it (same GPU name first, then the closest GPU count), with the
    reason (``h200x8`` at world size 2 is answered by the ``h200x2`` model); a simulated model answers only
    its own id. Raises ``NoModelError`` when no model is loaded, ``UnknownHardwareError`` for an id no
    profile has (built-in, served or registered), and ``NotServedError`` when the id is known but no model
    answers it at that world size (the one line of :func:`missing_model_line`).
    """
    if not served:
        raise NoModelError("no model is loaded yet; GET /readyz shows the last load error")
    own = served.get(hardware_id)
    requested = known_profile(served, registry_id(hardware_id, MEASURED))
    size = world_size if world_size is not None else default_world_size(requested or HardwareProfile())
    if own is not None and size in own.world_sizes:
        return Resolution(model=own, requested=hardware_id, world_size=size, substitution=None)
    if requested is None:
        known = known_ids(served)
        why = f"unknown hardware id {hardware_id!r}{did_you_mean(hardware_id, known)}; known ids are {known}"
        raise UnknownHardwareError(missing_model_line(served, hardware_id, size, why), known)
    fits = (
        []
        if is_sim_id(hardware_id)
        else [m for m in _substitutes(served, requested) if size in m.world_sizes]
    )
    if not fits:
        if own is not None:
            why = f"the {hardware_id} model was trained at world_size {list(own.world_sizes)} only"
        elif is_sim_id(hardware_id):
            why = f"no simulated model of {requested.id} is registered"
        else:
            why = (
                "no model is loaded for it, and no loaded measured model has the same GPU "
                f"({requested.sm_count} SMs, {requested.peak_bf16_tflops:g} bf16 TFLOP/s) and was trained at "
                f"world_size={size}"
            )
        sizes = answered_world_sizes(served, hardware_id)
        allowed = f"one of {sizes} on {hardware_id}" if sizes else f"none: no model answers {hardware_id}"
        if sizes:
            why += f"; {hardware_id} is answered at world_size {' or '.join(map(str, sizes))}"
        raise NotServedError(missing_model_line(served, hardware_id, size, why), allowed)
    best = min(
        fits,
        key=lambda m: (
            m.profile.gpu_name != requested.gpu_name,
            abs(m.profile.gpu_count - requested.gpu_count),
            m.profile.id,
        ),
    )
    used = best.profile
    why = (
        f"the {hardware_id!r} model was trained at world_size {list(own.world_sizes)} only"
        if own is not None
        else f"no model is loaded for {hardware_id!r}"
    )
    reason = (
        f"{why}; answered with the {used.id!r} model: "
        + ("same GPU" if used.gpu_name == requested.gpu_name else f"same compute die as {requested.gpu_name}")
        + f" ({used.gpu_name}, {used.sm_count} SMs)"
        + f" and world_size={size} fits its {used.gpu_count} GPUs"
    )
    if used.hbm_gbps != requested.hbm_gbps or used.link_gbps != requested.link_gbps:
        reason += (
            f"; its memory/link bandwidth ({used.hbm_gbps:g}/{used.link_gbps:g} GB/s) differs from "
            f"{hardware_id}'s ({requested.hbm_gbps:g}/{requested.link_gbps:g} GB/s)"
        )
    mine, theirs = requested.to_dict(), used.to_dict()
    differs = {k: (mine[k], theirs[k]) for k in mine if k != "id" and mine[k] != theirs[k]}
    substitution = Substitution(answered_hardware=used.id, reason=reason, differs=differs)
    return Resolution(model=best, requested=hardware_id, world_size=size, substitution=substitution)


def _same_files(a: Path, b: Path) -> bool:
    """True when folders ``a`` and ``b`` hold the same files with the same bytes."""
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    if not b.is_dir() or names != sorted(p.name for p in b.iterdir() if p.is_file()):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def trained_ops(predictor: Predictor) -> tuple[str, ...]:
    """The ops ``predictor`` has measured data for: its card's ``ops`` when present, else
    ``features.DENSE_OPS`` (what a model is taken to be trained on when its card does not list ``ops``).

    Other ops are refused, never extrapolated (a model with no MoE row has nothing to say about MoE).
    """
    ops = predictor.card.get("ops")
    return tuple(ops) if ops else DENSE_OPS


def set_threads(predictor: Predictor, threads: int) -> None:
    """Make ``predictor``'s estimators (``training.model.PairModel``) predict on ``threads`` threads."""
    for name in ("scorer", "ratio"):
        estimator = getattr(predictor, name, None)
        if estimator is not None:
            estimator.set_threads(threads)


def profile_of(predictor: Predictor) -> HardwareProfile:
    """The hardware profile a model was trained on: its card's ``hardware`` object, else the built-in id."""
    data = predictor.card.get("hardware")
    profile = (
        HardwareProfile.from_dict(data) if isinstance(data, dict) else get_hardware(predictor.hardware_id)
    )
    if profile.id != predictor.hardware_id:
        raise ValueError(
            f"the model card's hardware profile is {profile.id!r} but the model is registered under "
            f"{predictor.hardware_id!r}; it belongs in the registry's {profile.id}/ directory"
        )
    return profile


class ModelStore:
    """The predictors being served, one per registered hardware id, reloaded when a version is promoted.

    ``cache_size`` answers are cached per model; ``threads`` is the XGBoost thread count of each loaded
    predictor; ``bulk_threads`` the threads a large batch is split over. ``registry`` is a module with
    ``list_models(root)``, ``current_version(root, hw)`` and ``load_predictor(root, hw, version)``
    (default: ``training.predict.registry``).

    ``snapshot``: a directory each version's files are copied into and loaded from (a registry of its own,
    ``<snapshot>/<hw>/<version>/``), which the batch workers load from too (docs/service.md#readiness).
    """

    def __init__(
        self,
        root: Path,
        *,
        cache_size: int = 4096,
        threads: int = 1,
        bulk_threads: int = 2,
        registry: ModuleType | Any | None = None,
        snapshot: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self.snapshot = None if snapshot is None else Path(snapshot)
        self._copied: set[tuple[str, str]] = set()
        """(hardware id, version) copied into the snapshot and not failed to load since."""
        self.cache_size = cache_size
        self.threads = threads
        self.bulk_threads = bulk_threads
        self._registry = registry
        self._served = Served()
        self._failed: dict[str, str] = {}
        """hardware id -> the version whose load failed; polling does not retry it until CURRENT changes."""
        self._lock = threading.Lock()
        self._bulk = ThreadPoolExecutor(max_workers=bulk_threads, thread_name_prefix="ficco-bulk")
        """The threads large lists of scenarios are split over."""
        self._errors: dict[str, str] = {}
        """hardware id (or ``"*"`` for the registry itself) -> its latest load error, until it loads again."""

    @property
    def registry(self) -> Any:
        if self._registry is None:
            self._registry = importlib.import_module("ficco.training.predict.registry")
        return self._registry

    @property
    def last_reload_error(self) -> str | None:
        """The load errors not yet cleared by a successful load of the same hardware, or None."""
        return "; ".join(self._errors[key] for key in sorted(self._errors)) or None

    @property
    def versions(self) -> dict[str, str]:
        """``{hardware id: version}`` served now."""
        return {hw: model.version for hw, model in self._served.items()}

    @property
    def served(self) -> Served:
        """The current ``{hardware_id: ServedModel}`` snapshot (never mutated; replaced on reload), with the
        custom profiles registered beside the models."""
        return self._served

    def _swap(self, models: Mapping[str, ServedModel]) -> None:
        """Serve ``models`` from now on, with the custom profiles registered under the root."""
        self._served = Served(models, registered_profiles(self.root))  # the atomic swap

    def refresh(self, *, force: bool = False) -> dict[str, str]:
        """Load every registered hardware's current version that is not served yet; return outcomes.

        ``force`` reloads every current version, including ones served or failed before. The result maps
        hardware id to ``"loaded <version>"``, ``"unchanged <version>"`` or ``"failed <version>: <error>"``;
        a failed load leaves the previous model serving.
        """
        with self._lock:
            outcomes: dict[str, str] = {}
            try:
                hardware_ids = sorted(self.registry.list_models(self.root))
            except Exception as err:  # an unreadable registry must not stop the service
                self._record_error("*", f"cannot list models under {self.root}: {err}")
                return {}
            self._errors.pop("*", None)
            for hw in hardware_ids:
                try:
                    version = self.registry.current_version(self.root, hw)
                except Exception as err:
                    outcomes[hw] = self.public_path(f"failed: cannot read its CURRENT: {err}")
                    self._record_error(hw, f"{hw}: cannot read CURRENT under {self.root}: {err}")
                    continue
                if version is None:
                    continue
                served = self._served.get(hw)
                if not force and served is not None and served.version == version:
                    outcomes[hw] = f"unchanged {version}"
                    self._clear_error(hw)  # e.g. CURRENT rolled back to the version still serving
                    continue
                if not force and self._failed.get(hw) == version:
                    outcomes[hw] = f"failed {version} earlier; not retried until CURRENT changes"
                    continue
                outcomes[hw] = self._load(hw, version, verify=force)
            self._copy_profiles()
            self._swap(self._served)  # custom profiles registered since
            return outcomes

    def serve_versions(self, versions: Mapping[str, str]) -> None:
        """Serve exactly ``versions`` (``{hardware id: version}``, e.g. what another store serves), whatever
        ``CURRENT`` says: load each one not served at that version, drop hardware not listed.

        Raises ``NoModelError`` naming a version that fails to load (the models served before stay).
        """
        with self._lock:
            for hw, version in sorted(versions.items()):
                served = self._served.get(hw)
                if served is not None and served.version == version:
                    continue
                try:
                    model = self._build(hw, version)
                except Exception as err:
                    raise NoModelError(
                        self.public_path(f"{hw} model version {version} failed to load: {err}")
                    ) from None
                self._swap({**self._served, hw: model})
                log.info("serving %s model version %s", hw, version)
            self._swap({hw: m for hw, m in self._served.items() if hw in versions})

    @property
    def loads_from(self) -> Path:
        """The registry the models are loaded from: the snapshot when there is one, else ``root``."""
        return self.root if self.snapshot is None else self.snapshot

    def current_versions(self) -> dict[str, str]:
        """``{hardware id: version}`` that ``CURRENT`` names now, each copied into the snapshot if there is
        one (what a batch worker started now loads while this store loads the same); unreadable entries
        are left out (``refresh`` reports them)."""
        versions = {}
        with self._lock:
            try:
                hardware_ids = self.registry.list_models(self.root)
                self._copy_profiles()
            except Exception:
                return {}
            for hw in sorted(hardware_ids):
                try:
                    version = self.registry.current_version(self.root, hw)
                    if version is not None and self.snapshot is not None:
                        self._snapshot(hw, version)
                except Exception:
                    continue
                if version is not None:
                    versions[hw] = version
        return versions

    def _copy_profiles(self) -> None:
        """Copy the custom profiles registered under the root into the snapshot (if there is one), where the
        batch workers read them."""
        if self.snapshot is None:
            return
        for source in self.root.glob(f"*/{PROFILE_FILE}"):
            target = self.snapshot / source.parent.name / PROFILE_FILE
            try:
                if not target.is_file() or not filecmp.cmp(source, target, shallow=False):
                    target.parent.mkdir(exist_ok=True)
                    shutil.copyfile(source, target)
            except OSError as err:  # the workers then know the id only once a model of it is served
                log.warning("cannot copy the hardware profile %s for the batch workers: %s", source, err)

    def _snapshot(self, hw: str, version: str) -> None:
        """Copy ``hw``'s ``version`` into the snapshot (whole, then renamed into place) unless it was copied
        and has not failed to load or changed in the registry since (a served version's copy is replaced
        only by registry files that loaded: ``_build``'s ``verify``)."""
        assert self.snapshot is not None
        if (hw, version) in self._copied:
            return
        target = self.snapshot / hw / version
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=self.snapshot))
        try:
            shutil.copytree(self.root / hw / version, staging, dirs_exist_ok=True)
            target.parent.mkdir(exist_ok=True)
            shutil.rmtree(target, ignore_errors=True)  # a copy whose load failed (never a served one)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self._copied.add((hw, version))

    def _build(self, hw: str, version: str, *, verify: bool = False) -> ServedModel:
        """Load ``hw``'s ``version``, check that it answers, and wrap it; raises whatever loading raises.

        ``verify`` (a forced reload): first load the registry's own files, the bytes a restart would serve,
        so that a file damaged in place fails the reload instead of the next start; registry files that
        load but differ from the snapshot's copy replace it."""
        if verify and self.snapshot is not None:
            self.registry.load_predictor(self.root, hw, version)
            if not _same_files(self.root / hw / version, self.snapshot / hw / version):
                self._copied.discard((hw, version))
        if self.snapshot is not None:
            self._snapshot(hw, version)
        predictor = self.registry.load_predictor(self.loads_from, hw, version)
        set_threads(predictor, self.threads)
        profile = profile_of(predictor)
        predictor.recommend([Scenario(hardware=profile)])  # answers before it serves (and warms up)
        return ServedModel(
            predictor=predictor,
            profile=profile,
            cache=RecommendationCache(self.cache_size),
            batchers={
                mode: MicroBatcher(functools.partial(predictor.recommend, mode=mode)) for mode in MODES
            },
            bulk=self._bulk,
            bulk_threads=self.bulk_threads,
        )

    def _load(self, hw: str, version: str, *, verify: bool = False) -> str:
        """Load ``hw``'s ``version`` (``verify``: see ``_build``) and swap it in, pruning the snapshot; on
        any error keep the previous model."""
        try:
            model = self._build(hw, version, verify=verify)
        except Exception as err:  # corrupt or mismatched files: keep serving the previous model
            self._failed[hw] = version
            previous = self._served.get(hw)
            if previous is None or previous.version != version:
                self._copied.discard((hw, version))  # a retry copies the registry's files again
            keep = f"; still serving {previous.version}" if previous else "; no model serves it"
            self._record_error(hw, f"{hw} version {version} failed to load: {err}{keep}")
            return self.public_path(f"failed {version}: {err}")
        previous = self._served.get(hw)
        self._swap({**self._served, hw: model})
        self._clear_error(hw)
        log.info("serving %s model version %s", hw, version)
        self._prune(hw, {version} | ({previous.version} if previous else set()))
        return f"loaded {version}"

    def _prune(self, hw: str, keep: set[str]) -> None:
        """Remove from the snapshot every copy of ``hw``'s versions but ``keep`` (the one served now and the
        one before it, which a batch in flight may still name): replaced models do not pile up until
        shutdown."""
        if self.snapshot is None or not (self.snapshot / hw).is_dir():
            return
        for copy in (self.snapshot / hw).iterdir():
            if copy.is_dir() and copy.name not in keep:
                shutil.rmtree(copy, ignore_errors=True)
                self._copied.discard((hw, copy.name))
                log.info("snapshot: removed %s model version %s (replaced)", hw, copy.name)

    def _record_error(self, key: str, message: str) -> None:
        """Log ``message`` and keep it for /readyz with the registry's location hidden (``public_path``)."""
        log.error("model reload: %s", message)
        self._errors[key] = self.public_path(message)

    def _clear_error(self, hw: str) -> None:
        self._failed.pop(hw, None)
        if self._errors.pop(hw, None) is not None:
            log.info("%s: the last reload error is cleared (serving %s)", hw, self._served[hw].version)

    def public_path(self, text: str) -> str:
        """``text`` with the registry's absolute location replaced by ``$FICCO_MODEL_ROOT`` (shown to any
        client, it would tell them the server's file layout)."""
        roots = {
            str(p)
            for root in (self.root, self.snapshot)
            if root
            for p in (root.resolve(), root.absolute(), root)
        }
        for root in sorted(roots, key=len, reverse=True):
            text = text.replace(root, "$FICCO_MODEL_ROOT")
        return text

    def public_card(self, card: dict[str, Any]) -> dict[str, Any]:
        """``card`` (a model card, or the registry's ``{"version", "error"}`` for one it cannot read) with
        ``public_path`` applied to its error, and the ``model_backend`` and ``world_sizes`` the service
        answers with filled in where the card predates them (``model_backend``, ``measured_world_sizes``)."""
        if isinstance(card.get("error"), str):
            return {**card, "error": self.public_path(card["error"])}
        filled = {**card, "model_backend": model_backend(card)}
        if not card.get("world_sizes") and isinstance(card.get("hardware"), dict):
            try:
                profile = HardwareProfile.from_dict(card["hardware"])
            except (TypeError, ValueError):  # a card the store would not load either
                return filled
            filled["world_sizes"] = list(measured_world_sizes(card, profile))
        return filled

    def close(self) -> None:
        """Stop the threads large lists are split over once the predictions in flight finish."""
        self._bulk.shutdown(wait=False)

    async def watch(self, interval_s: float) -> None:
        """Every ``interval_s`` seconds, swap in newly promoted versions (see ``refresh``); never returns."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.refresh)
            except Exception:  # keep watching whatever happens
                log.exception("model reload poll failed")
