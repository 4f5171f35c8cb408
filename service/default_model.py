"""Making sure the default model exists before the service starts (``ficco serve``).

When the registry holds no current model for ``FICCO_DEFAULT_HARDWARE``, the model is trained from the
shipped dataset ``<FICCO_DATASET_ROOT>/<hardware>`` with training's API (the same steps as
``ficco train --dataset DIR --promote``), registered and promoted, logging each step.
"""

from __future__ import annotations

import logging
import time

from ficco.service.core.config import Settings

log = logging.getLogger(__name__)


def ensure_default_model(settings: Settings) -> str:
    """Return the current version of the default hardware's model, training and promoting one if none.

    Raises ``FileNotFoundError`` when training is needed and the shipped dataset is missing, and
    ``ValueError`` when it is of other hardware or holds rows that were not measured on GPUs.
    """
    from ficco.training.predict.registry import current_version, promote

    hw, root = settings.DEFAULT_HARDWARE, settings.MODEL_ROOT
    version = current_version(root, hw)
    if version is not None:
        log.info("default model: %s version %s under %s", hw, version, root)
        return version
    dataset = settings.DATASET_ROOT / hw
    if not (dataset / "manifest.json").is_file():
        raise FileNotFoundError(
            f"the registry {root} has no current {hw} model and the shipped dataset {dataset} is missing "
            f"(no manifest.json); set FICCO_MODEL_ROOT to a registry with a model, or FICCO_DATASET_ROOT"
        )
    from ficco.features.provenance import MEASURED, rows_backend
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.train import register_trained, train_model

    log.info("no current %s model under %s: training one from %s (runs once)", hw, root, dataset)
    start = time.perf_counter()
    loaded = load_dataset_table(dataset)
    if loaded.hardware.id != hw:
        raise ValueError(f"the shipped dataset {dataset} was measured on {loaded.hardware.id!r}, not {hw!r}")
    if rows_backend(loaded.info["backends"]) != MEASURED:
        raise ValueError(
            f"the shipped dataset {dataset} holds rows of backends {loaded.info['backends']}, not GPU "
            f"measurements only; the default {hw} model is trained on measured rows (docs/models.md)"
        )
    trained = train_model(loaded.table, seed=0, progress=True)
    _, version = register_trained(root, trained, loaded, seed=0)
    promote(root, hw, version)
    log.info(
        "trained, registered and promoted %s version %s in %.1f s", hw, version, time.perf_counter() - start
    )
    return version
