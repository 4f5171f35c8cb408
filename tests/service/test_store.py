"""The model store: hardware resolution, the answer cache, polling for promotions, reloads under load."""

from __future__ import annotations

import json
import shutil
import threading

import pytest

from ficco.features import get_hardware
from ficco.service.cache import RecommendationCache
from ficco.service.core.store import ModelStore, resolve_hardware
from ficco.service.errors import NoModelError, NotServedError, UnknownHardwareError
from ficco.training.predict import registry
from ficco.training.predict.registry import current_version, list_models, promote

HARDWARE = "h200x2"


@pytest.fixture(scope="module")
def two_hw_store(tmp_path_factory, train):
    """A store serving h200x2 and h100x8 models."""
    root = tmp_path_factory.mktemp("two-hw")
    train(root, "h200x2")
    train(root, "h100x8")
    store = ModelStore(root)
    store.refresh()
    return store


def test_resolve_hardware_exact_match_has_no_substitution(two_hw_store):
    resolution = resolve_hardware(two_hw_store.served, "h100x8", 8)
    assert (resolution.model.profile.id, resolution.substitution) == ("h100x8", None)


def test_resolve_hardware_prefers_same_gpu_then_closest_count(two_hw_store):
    assert resolve_hardware(two_hw_store.served, "h100x4", 2).model.profile.id == "h100x8"
    assert resolve_hardware(two_hw_store.served, "h200x8", 2).model.profile.id == "h200x2"
    resolution = resolve_hardware(two_hw_store.served, "h200x8", 4)
    assert resolution.model.profile.id == "h100x8"
    assert "same compute die as NVIDIA H200" in resolution.substitution.reason
    assert resolution.substitution.differs["gpu_name"] == ("NVIDIA H200", "NVIDIA H100 80GB HBM3")


def test_resolve_hardware_errors(two_hw_store):
    with pytest.raises(UnknownHardwareError, match="unknown hardware id 'v100'") as err:
        resolve_hardware(two_hw_store.served, "v100", 2)
    assert "mi300xx8" in err.value.known_ids
    with pytest.raises(NotServedError, match="same GPU") as refused:
        resolve_hardware(two_hw_store.served, "mi300xx8", 2)
    assert refused.value.allowed == "none: no model answers mi300xx8"
    with pytest.raises(NoModelError):
        resolve_hardware({}, "h200x2", 2)


def test_store_profile_comes_from_card(two_hw_store):
    assert two_hw_store.served["h100x8"].profile == get_hardware("h100x8")


def test_store_predicts_single_threaded(two_hw_store):
    predictor = two_hw_store.served["h200x2"].predictor
    for booster in (predictor.scorer.booster_, predictor.ratio.booster_):
        assert json.loads(booster.save_config())["learner"]["generic_param"]["nthread"] == "1"


def test_cache_evicts_least_recently_used():
    cache = RecommendationCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)
    off = RecommendationCache(0)
    off.put("a", 1)
    assert off.get("a") is None


class _BreakableRegistry:
    """ficco.training.predict.registry, whose ``list_models`` raises once ``broken`` is set."""

    broken = False

    def __getattr__(self, name):
        return getattr(registry, name)

    def list_models(self, root):
        if self.broken:
            raise PermissionError(f"cannot read {root}")
        return registry.list_models(root)


def test_refresh_unreadable_registry_keeps_serving(model_root):
    store = ModelStore(model_root, registry=_BreakableRegistry())
    store.refresh()
    before = dict(store.served)
    store.registry.broken = True
    assert store.refresh() == {}
    assert store.served == before
    assert "cannot list models" in store.last_reload_error


def _other(root) -> str:
    current = current_version(root, HARDWARE)
    return next(c["version"] for c in list_models(root)[HARDWARE] if c["version"] != current)


def test_watcher_swaps_in_promoted_version(model_root, start, wait_for):
    new = _other(model_root)
    with start(model_root, RELOAD_POLL_S=0.05) as client:
        promote(model_root, HARDWARE, new)
        assert wait_for(lambda: client.get("/readyz").json()["serving"][HARDWARE] == new, timeout_s=20.0)


def test_watcher_does_not_retry_a_failed_version_every_poll(model_root, start, damage, wait_for):
    old, new = current_version(model_root, HARDWARE), _other(model_root)
    damage(model_root / HARDWARE / new, "corrupt")
    with start(model_root, RELOAD_POLL_S=0.05) as client:
        promote(model_root, HARDWARE, new)
        assert wait_for(lambda: client.get("/readyz").json()["last_reload_error"] is not None, timeout_s=20.0)
        store = client.app.state.store
        assert store.refresh() == {HARDWARE: f"failed {new} earlier; not retried until CURRENT changes"}
        assert client.get("/readyz").json()["serving"] == {HARDWARE: old}


def test_no_request_fails_during_reloads(model_root, start):
    versions = [current_version(model_root, HARDWARE), _other(model_root)]
    failures: list[str] = []
    seen: set[str] = set()
    stop = threading.Event()

    def ask(client, worker: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1  # a new shape each time: every request reaches the model, not the cache
            body = {"op": "gemm_rs", "m": 2 * (worker * 100_000 + i), "n": 4096, "k": 4096}
            response = client.post("/v1/recommend", json=body)
            if response.status_code != 200:
                failures.append(f"{response.status_code}: {response.text}")
            else:
                seen.add(response.json()["model_version"])

    with start(model_root, RELOAD_POLL_S=0.01) as client:
        workers = [threading.Thread(target=ask, args=(client, w)) for w in range(4)]
        for w in workers:
            w.start()
        store = client.app.state.store
        for flip in range(20):
            promote(model_root, HARDWARE, versions[flip % 2])
            store.refresh(force=True)
        stop.set()
        for w in workers:
            w.join()
    assert failures == []
    assert seen == set(versions)


def test_errors_are_kept_per_hardware(model_root):
    shutil.copytree(model_root / HARDWARE, model_root / "h100x8")  # an h200x2 model filed as h100x8
    store = ModelStore(model_root)
    outcomes = store.refresh()
    assert outcomes[HARDWARE].startswith("loaded") and outcomes["h100x8"].startswith("failed")
    assert (
        "hardware profile is 'h200x2' but the model is registered under 'h100x8'" in store.last_reload_error
    )
    promote(model_root, HARDWARE, _other(model_root))
    assert store.refresh()[HARDWARE].startswith("loaded")
    assert store.last_reload_error.startswith("h100x8 version")
    assert set(store.served) == {HARDWARE}


def test_serve_versions_loads_exactly_the_named_versions(model_root, train):
    old, new = current_version(model_root, HARDWARE), _other(model_root)
    train(model_root, "h100x8")
    store = ModelStore(model_root)
    store.serve_versions({HARDWARE: new})  # not CURRENT: the version named
    assert {hw: m.version for hw, m in store.served.items()} == {HARDWARE: new}
    store.serve_versions({HARDWARE: old, "h100x8": current_version(model_root, "h100x8")})
    assert store.served[HARDWARE].version == old and set(store.served) == {HARDWARE, "h100x8"}
    kept = store.served[HARDWARE]
    store.serve_versions({HARDWARE: old})  # served already: kept as is; h100x8 is dropped
    assert store.served[HARDWARE] is kept and set(store.served) == {HARDWARE}
    with pytest.raises(
        NoModelError, match=rf"{HARDWARE} model version nope failed to load: .*no model"
    ) as err:
        store.serve_versions({HARDWARE: "nope"})
    assert str(model_root) not in str(err.value)  # the registry's location is not shown to clients
    assert store.served[HARDWARE] is kept


def _made(folder):
    folder.mkdir()
    return folder


def test_a_forced_reload_fails_on_a_model_file_damaged_in_place(model_root, damage, tmp_path):
    """The snapshot still holds good bytes, but a restart would load the registry's: the forced reload
    reports the failure now and keeps serving the loaded model."""
    served = current_version(model_root, HARDWARE)
    store = ModelStore(model_root, snapshot=_made(tmp_path / "snapshot"))
    store.refresh()
    damage(model_root / HARDWARE / served, "corrupt")
    outcome = store.refresh(force=True)[HARDWARE]
    assert outcome.startswith(f"failed {served}"), outcome
    assert store.served[HARDWARE].version == served and f"still serving {served}" in store.last_reload_error
    assert store.refresh(force=True)[HARDWARE].startswith("failed")  # every forced reload checks again


def test_a_forced_reload_copies_changed_registry_files_that_load(model_root, tmp_path):
    served = current_version(model_root, HARDWARE)
    store = ModelStore(model_root, snapshot=_made(tmp_path / "snapshot"))
    store.refresh()
    card = model_root / HARDWARE / served / "card.json"
    card.write_text(card.read_text() + "\n")  # same content to JSON, other bytes
    assert store.refresh(force=True)[HARDWARE] == f"loaded {served}"
    assert (tmp_path / "snapshot" / HARDWARE / served / "card.json").read_bytes() == card.read_bytes()


def test_replaced_models_leave_the_snapshot_when_replaced(model_root, train, tmp_path):
    """The snapshot keeps the served version and the one before it (a batch in flight may name it)."""
    first, second = current_version(model_root, HARDWARE), _other(model_root)
    snapshot = _made(tmp_path / "snapshot")
    store = ModelStore(model_root, snapshot=snapshot)
    store.refresh()
    promote(model_root, HARDWARE, second)
    store.refresh()
    assert {p.name for p in (snapshot / HARDWARE).iterdir()} == {first, second}
    third = train(model_root, HARDWARE, seed=2)
    store.refresh()
    assert store.served[HARDWARE].version == third
    assert {p.name for p in (snapshot / HARDWARE).iterdir()} == {second, third}
