"""The model registry: versioned models per hardware profile on disk, and the current one of each.

``<root>/<hardware_id>/<version>/`` holds a model's files and card, ``<root>/<hardware_id>/CURRENT`` names
the promoted version; both are written atomically. Simulated models live under ``<hardware_id>-sim`` and
are never promoted over measured ones. See docs/models.md.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ficco import __version__
from ficco.features import FEATURE_NAMES
from ficco.features.hardware import KNOWN_HARDWARE, NEW_PROFILE_HINT, did_you_mean, registered_profile
from ficco.features.provenance import (
    MEASURED,
    SIMULATED,
    backend_of_id,
    is_sim_id,
    model_backend,
    registry_id,
)
from ficco.files import model_root, write_text_atomic
from ficco.training.predict.booster import load_pair_model
from ficco.training.predict.coverage import COVERAGE_FILE, Coverage
from ficco.training.predict.pairs import PAIR_FEATURE_NAMES_OF, FeatureSchemaError, check_feature_schema
from ficco.training.predict.policy import ModePolicy
from ficco.training.predict.predictor import Predictor

# answering needs no scikit-learn: a loaded model may be a training.predict.booster.SavedPairModel
if TYPE_CHECKING:
    from ficco.training.model import PairModel

log = logging.getLogger(__name__)

MODEL_FILE = "model.ubj"
RATIO_FILE = "ratio.ubj"
CARD_FILE = "card.json"
CURRENT_FILE = "CURRENT"
_TRAIN_HINT = "train one with `ficco train --dataset DIR --promote`"


class ModelLoadError(RuntimeError):
    """A model cannot be loaded: missing, corrupt, or trained on another feature schema."""


def default_model_root() -> Path:
    """The registry answers come from (``ficco.files.model_root``): ``$FICCO_MODEL_ROOT``, else the
    checkout's ``models/``, else the user's registry or the shipped one of an installed ficco."""
    return model_root()


def _versions(hw_dir: Path) -> list[str]:
    """Registered versions under one hardware directory, oldest first (names sort by time)."""
    if not hw_dir.is_dir():
        return []
    return sorted(p.name for p in hw_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def _software() -> dict[str, str]:
    import xgboost

    return {"ficco": __version__, "xgboost": xgboost.__version__, "numpy": np.__version__,
            "python": platform.python_version()}  # fmt: skip


def register(
    root: str | Path,
    hardware_id: str,
    *,
    scorer: PairModel,
    ratio: PairModel,
    policy: ModePolicy,
    dataset_hash: str,
    info: dict[str, Any],
    coverage: Coverage | None = None,
    created_at: datetime | None = None,
) -> str:
    """Write a new version of ``hardware_id``'s model and return its version string (not promoted).

    ``info`` (dataset, metrics, hyper-parameters, ...) goes into the card beside the fields the registry
    fills in. ``ratio`` is ``scorer`` itself when the picker is the time-ratio regressor (one file then);
    ``coverage`` is written beside the model files. ValueError when the card's ``model_backend`` (given, or
    from ``info["dataset"]["backends"]``) is not ``hardware_id``'s (``features.provenance``).
    """
    backend = model_backend(info)
    _check_backend(hardware_id, backend, "register")
    created_at = created_at or datetime.now(UTC)
    hw_dir = Path(root) / hardware_id
    hw_dir.mkdir(parents=True, exist_ok=True)
    base = f"{created_at:%Y%m%dT%H%M%SZ}-{dataset_hash[:8]}"
    version, n = base, 1
    while (hw_dir / version).exists():
        n += 1
        version = f"{base}-{n}"
    card = {
        **info,
        "version": version,
        "hardware_id": hardware_id,
        "model_backend": backend,
        "created_at": created_at.isoformat(timespec="seconds"),
        "dataset_hash": dataset_hash,
        "feature_schema_version": scorer.feature_schema_,
        "feature_names": list(FEATURE_NAMES),
        "pair_feature_names": list(PAIR_FEATURE_NAMES_OF[scorer.feature_schema_]),
        "objective": scorer.objective,
        "policy": policy.to_dict(),
        "files": {"scorer": MODEL_FILE, "ratio": MODEL_FILE if ratio is scorer else RATIO_FILE},
        **({"coverage": {"file": COVERAGE_FILE, "rows": len(coverage)}} if coverage is not None else {}),
        "software": {**info.get("software", {}), **_software()},
    }
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=hw_dir))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a service running as another user must read it
        scorer.save_model(tmp / MODEL_FILE)
        if ratio is not scorer:
            ratio.save_model(tmp / RATIO_FILE)
        if coverage is not None:
            coverage.save(tmp / COVERAGE_FILE)
        (tmp / CARD_FILE).write_text(json.dumps(card, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, hw_dir / version)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return version


def _check_backend(hardware_id: str, backend: str, action: str) -> None:
    """ValueError when a model of ``backend`` does not belong under ``hardware_id``."""
    expected = backend_of_id(hardware_id)
    if backend != expected:
        raise ValueError(
            f"cannot {action} a {backend} model under {hardware_id!r}: that id holds {expected} models only; "
            f"{backend} models of this hardware belong under {registry_id(hardware_id, backend)!r}"
        )


def promote(root: str | Path, hardware_id: str, version: str) -> None:
    """Make ``version`` the current model of ``hardware_id`` (atomically); ValueError for a version not
    registered there, or whose card's backend is not ``hardware_id``'s."""
    hw_dir = Path(root) / hardware_id
    if not (hw_dir / version / CARD_FILE).is_file():
        raise ValueError(
            f"cannot promote {hardware_id}/{version}: no such registered version under {root}; "
            f"versions are {_versions(hw_dir)}"
        )
    try:
        card = _read_card(hw_dir / version)
    except ModelLoadError as err:
        raise ValueError(f"cannot promote {hardware_id}/{version}: {err}") from None
    _check_backend(hardware_id, model_backend(card), "promote")
    # world-readable, like the version folder above: a service running as another user must read it
    write_text_atomic(hw_dir / CURRENT_FILE, version + "\n", mode=0o644)
    log.info("promoted %s/%s to current in %s", hardware_id, version, root)


def current_version(root: str | Path, hardware_id: str) -> str | None:
    """The current version of ``hardware_id``'s model, or None if none was promoted."""
    path = Path(root) / hardware_id / CURRENT_FILE
    if not path.is_file():
        return None
    return path.read_text().strip() or None


def current_card(root: str | Path, hardware_id: str) -> dict[str, Any] | None:
    """The card of ``hardware_id``'s current model, or None if none was promoted."""
    version = current_version(root, hardware_id)
    return None if version is None else _read_card(Path(root) / hardware_id / version)


def list_models(root: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Every registered model: hardware id -> cards, oldest first (``{"version", "error"}`` for an
    unreadable card)."""
    root = Path(root)
    out: dict[str, list[dict[str, Any]]] = {}
    if not root.is_dir():
        return out
    for hw_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        cards = []
        for version in _versions(hw_dir):
            try:
                cards.append(_read_card(hw_dir / version))
            except ModelLoadError as err:
                cards.append({"version": version, "error": str(err)})
        out[hw_dir.name] = cards
    return out


def _read_card(version_dir: Path) -> dict[str, Any]:
    path = version_dir / CARD_FILE
    try:
        card = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(
            f"model {version_dir} has no {CARD_FILE}; it is incomplete, {_TRAIN_HINT}"
        ) from None
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"model card {path} is corrupt ({err}); {_TRAIN_HINT}") from None
    required = ("version", "feature_schema_version", "objective", "policy", "files")
    missing = [k for k in required if k not in card] if isinstance(card, dict) else list(required)
    if missing:
        raise ModelLoadError(f"model card {path} is corrupt: it lacks {missing}; {_TRAIN_HINT}")
    return card


def add_coverage(root: str | Path, hardware_id: str, version: str | None = None) -> Path:
    """Write ``coverage.npy`` (``training.predict.coverage``) into a registered version (None: the current
    one) from the datasets its card names, read from the working directory; the file written. ValueError when
    they are missing or their content hash is not the card's (they changed since the model was trained).
    The model files and the card stay as they are: no prediction changes (docs/models.md).
    """
    from ficco.training.dataset_table import load_trained_on, trained_on

    version = version or current_version(root, hardware_id)
    directory = Path(root) / hardware_id / str(version)
    card = _read_card(directory)
    data = card.get("dataset", {})
    paths = trained_on(data)[0]
    missing = [p for p in paths if not Path(p).exists()]
    if not paths or missing:
        absent = missing or "none named"
        raise ValueError(
            f"model {hardware_id}/{version}: its training datasets {paths} are not here ({absent}); run from "
            "the directory its card's paths are relative to"
        )
    loaded = load_trained_on(data)
    expected = data.get("hash", card.get("dataset_hash"))
    if loaded.hash != expected:
        raise ValueError(
            f"the datasets {paths} hash to {loaded.hash}, not the card's {expected}: they changed since the "
            "model was trained, so they do not say where it was measured"
        )
    path = directory / COVERAGE_FILE
    Coverage.of(loaded.table.scenarios, loaded.table.modes).save(path)
    return path


def load_predictor(root: str | Path, hardware_id: str, version: str | None = None) -> Predictor:
    """Load ``hardware_id``'s model ``version`` (None: the current one) as a :class:`Predictor`, of any
    schema in ``features.FEATURE_SCHEMAS``; :class:`ModelLoadError` saying what to do for a missing model, a
    corrupt card or model file, or a feature schema this code does not compute."""
    root = Path(root)
    hw_dir = root / hardware_id
    versions = _versions(hw_dir)
    if not versions:
        known = sorted(list_models(root))
        base = registry_id(hardware_id, MEASURED)
        if base in KNOWN_HARDWARE or registered_profile(root, base) is not None:
            retrain = "--backend sim " if is_sim_id(hardware_id) else ""
            how = (
                f"{_TRAIN_HINT} on a dataset of that hardware, or `ficco retrain {retrain}--hardware {base}`"
            )
            sim_id = registry_id(base, SIMULATED)
            if not is_sim_id(hardware_id) and sim_id in known:
                how += f"; a simulated model of it is registered: ask hardware {sim_id!r} (marked simulated)"
        else:
            close = did_you_mean(hardware_id, [*known, *KNOWN_HARDWARE])
            how = f"{hardware_id!r} is no known hardware id{close}. {NEW_PROFILE_HINT}"
        raise ModelLoadError(
            f"no model for hardware {hardware_id!r} under {root} (models exist for {known}); {how}"
        )
    if version is None:
        version = current_version(root, hardware_id)
        if version is None:
            raise ModelLoadError(
                f"no current model for hardware {hardware_id!r} under {root}: none was promoted; versions "
                f"are {versions}. Promote one (training.predict.registry.promote) or {_TRAIN_HINT}"
            )
    if version not in versions:
        raise ModelLoadError(f"no model {hardware_id}/{version} under {root}; versions are {versions}")
    version_dir = hw_dir / version
    card = _read_card(version_dir)
    source = f"model {hardware_id}/{version}"
    try:
        check_feature_schema(card["feature_schema_version"], source, hardware_id=hardware_id)
        scorer = load_pair_model(version_dir / card["files"]["scorer"])
        same = card["files"]["ratio"] == card["files"]["scorer"]
        ratio = scorer if same else load_pair_model(version_dir / card["files"]["ratio"])
        policy = ModePolicy.from_card(card)
        coverage_file = version_dir / COVERAGE_FILE
        coverage = Coverage.load(coverage_file) if coverage_file.is_file() else None
    except FeatureSchemaError as err:
        raise ModelLoadError(str(err)) from None
    except Exception as err:  # XGBoostError, OSError, ValueError, TypeError: all mean a damaged model
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(
            f"{source} under {root} is corrupt: {first_line}. Re-register it, or promote another version "
            f"({versions}); {_TRAIN_HINT}"
        ) from None
    schemas = {card["feature_schema_version"], scorer.feature_schema_, ratio.feature_schema_}
    if len(schemas) > 1:
        raise ModelLoadError(
            f"{source}: {CARD_FILE} says feature schema {card['feature_schema_version']!r} but its model "
            f"files were trained on {scorer.feature_schema_!r} (scorer) and {ratio.feature_schema_!r} "
            f"(ratio); the files do not belong together. {_TRAIN_HINT}"
        )
    if scorer.objective != card["objective"] or ratio.objective != "ratio":
        raise ModelLoadError(
            f"{source}: {MODEL_FILE} is a {scorer.objective!r} model and the ratio file a "
            f"{ratio.objective!r} one, but {CARD_FILE} says {card['objective']!r}; the files do not belong "
            f"together. {_TRAIN_HINT}"
        )
    return Predictor(
        scorer=scorer, ratio=ratio, policy=policy, card=card, version=version,
        hardware_id=hardware_id, coverage=coverage,
    )  # fmt: skip
