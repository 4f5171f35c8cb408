"""Fixtures for the service tests: a session registry with a real small model, apps and clients over it.

The model is trained with training's API on simulated times (``harness.sim``) of a few hundred h200x2
scenarios, small enough to fit in about a second. Tests that change the registry (reload) get their own
copy of it (``model_root``). Helpers reach tests as fixtures only, whatever pytest's import mode.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from ficco.features import DENSE_OPS, MOE_OPS, Scenario, candidates, feature_matrix, get_hardware

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
from fastapi.testclient import TestClient  # noqa: E402  (after the filter: the import warns)

from ficco.service.core.config import Settings  # noqa: E402
from ficco.service.main import create_app  # noqa: E402

HARDWARE = "h200x2"


def sim_table(
    hardware_id: str, *, n: int = 300, seed: int = 0, ops: tuple[str, ...] = DENSE_OPS, world_size: int = 2,
    profile=None,
):  # fmt: skip
    """A ``training.dataset_table.DatasetTable`` of ``n`` random scenarios of ``ops`` at ``world_size`` ranks,
    timed by the simulator (MoE ones with 8 experts, 2 per token) on the built-in ``hardware_id`` (or the
    ``HardwareProfile`` ``profile``)."""
    from ficco.harness.sim import SimBackend
    from ficco.training.dataset_table import DatasetTable
    from ficco.training.model import SCHEDULES

    hw = profile or get_hardware(hardware_id)
    sim = SimBackend(hw)
    rng = np.random.default_rng(seed)
    scenarios, times = [], []
    while len(scenarios) < n:
        op = ops[int(rng.integers(len(ops)))]
        s = Scenario(
            op=op,
            m=world_size * int(rng.choice([3, 64, 256, 1024, 4096, 16384])),
            n=int(128 * rng.integers(4, 129)),
            k=int(128 * rng.integers(4, 129)),
            hardware=hw,
            world_size=world_size,
            **({"experts": 8, "top_k": 2} if op in MOE_OPS else {}),
        )
        row = np.full(len(SCHEDULES), np.nan)
        schedules = candidates(s)
        row[[SCHEDULES.index(str(c)) for c in schedules]] = sim.schedule_ms(s, schedules)
        scenarios.append(s)
        times.append(row)
    times = np.asarray(times)
    return DatasetTable(
        scenario_ids=np.asarray([s.key() for s in scenarios], dtype=object),
        modes=np.asarray(["eager"] * n, dtype=object),
        families=np.asarray(["grid"] * n, dtype=object),
        scenarios=tuple(scenarios),
        X=feature_matrix(scenarios),
        times_ms=times,
        in_best=times <= 1.01 * np.nanmin(times, axis=1, keepdims=True),
        async_tp_ms=np.full(n, np.nan),
    )


def train_version(
    root: Path,
    hardware_id: str,
    *,
    seed: int = 0,
    promote: bool = True,
    ops: tuple[str, ...] | None = None,
    world_size: int | None = None,
    profile=None,
) -> str:
    """Fit a small pair model on simulated times of ``ops`` (default: the dense pair, and a card without
    ``ops``, as the first models had) at ``world_size`` ranks (default 2, and a card without
    ``world_sizes``, as the first models had), register it under ``root``; the version. A
    ``<hardware>-sim`` id gets a simulated model's card (backends ``sim``, its world size); ``profile``: a
    custom ``HardwareProfile`` of the id without ``-sim`` (default: the built-in one)."""
    import dataclasses

    from ficco.features.provenance import MEASURED, is_sim_id, registry_id
    from ficco.training.fit import TrainConfig, fit_pair_model
    from ficco.training.predict.coverage import Coverage
    from ficco.training.predict.policy import DecisionPolicy, ModePolicy
    from ficco.training.predict.registry import promote as promote_version
    from ficco.training.predict.registry import register

    base = registry_id(hardware_id, MEASURED)
    profile = profile or get_hardware(base)
    table = sim_table(base, seed=seed, ops=ops or DENSE_OPS, world_size=world_size or 2, profile=profile)
    model = fit_pair_model(table, TrainConfig(max_depth=3, n_estimators=20), seed=seed, n_jobs=1)
    simulated = (
        {"dataset": {"backends": ["sim"], "path": "simulated"}, "world_sizes": [world_size or 2]}
        if is_sim_id(hardware_id)
        else {}
    )
    version = register(
        root,
        hardware_id,
        scorer=model,
        ratio=model,
        policy=ModePolicy.uniform(DecisionPolicy(min_gain=0.01)),
        dataset_hash=f"sim{seed:013d}",
        coverage=Coverage.of(table.scenarios, table.modes),
        info={
            "hardware": dataclasses.replace(profile, id=hardware_id).to_dict(),
            "metrics": {"seed": seed},
            **({"ops": sorted(ops)} if ops else {}),
            **({"world_sizes": [world_size]} if world_size else {}),
            **simulated,
        },
    )
    if promote:
        promote_version(root, hardware_id, version)
    return version


def make_settings(root: Path, **overrides) -> Settings:
    """Test settings: the given registry, no polling, no table prefetch and no per-client table rate unless
    asked (every test's requests come from one address), no reload token unless given."""
    base = {
        "MODEL_ROOT": root,
        "RELOAD_POLL_S": 0,
        "RELOAD_TOKEN": None,
        "TABLE_PREFETCH": False,
        "TABLE_REQUESTS_PER_S": 0,
    }
    return Settings(**{**base, **overrides})


@contextlib.contextmanager
def started(root: Path, **overrides) -> Iterator[TestClient]:
    """A client of a started app (lifespan run) over registry ``root`` with ``make_settings`` overrides."""
    with TestClient(create_app(make_settings(root, **overrides))) as client:
        yield client


def damage_model(version_dir: Path, how: str) -> None:
    """Break a registered version: ``corrupt`` (a classifier file XGBoost cannot parse) or ``schema`` (a
    card claiming a feature schema this code does not compute)."""
    if how == "corrupt":
        (version_dir / "model.ubj").write_bytes(b"not an xgboost model")
        return
    card_path = version_dir / "card.json"
    card = json.loads(card_path.read_text())
    card["feature_schema_version"] = "fv0"
    card_path.write_text(json.dumps(card))


@pytest.fixture(scope="session")
def registry_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry with one promoted h200x2 model and a second, unpromoted h200x2 version."""
    root = tmp_path_factory.mktemp("models")
    train_version(root, HARDWARE, seed=0)
    train_version(root, HARDWARE, seed=1, promote=False)
    return root


@pytest.fixture
def model_root(registry_root: Path, tmp_path: Path) -> Path:
    """A private copy of the session registry, for tests that change it."""
    return Path(shutil.copytree(registry_root, tmp_path / "models"))


@pytest.fixture(scope="session")
def train() -> Callable[..., str]:
    """``train(root, hardware_id, seed=0, promote=True)``: register a small model; see ``train_version``."""
    return train_version


@pytest.fixture(scope="session")
def damage() -> Callable[[Path, str], None]:
    """``damage(version_dir, "corrupt" | "schema")``: see ``damage_model``."""
    return damage_model


@pytest.fixture(scope="session")
def settings_for() -> Callable[..., Settings]:
    """``settings_for(root, **overrides)``: test settings; see ``make_settings``."""
    return make_settings


@pytest.fixture(scope="session")
def start():
    """``start(root, **settings)``: a context manager giving a client of a started app (see ``started``)."""
    return started


@pytest.fixture(scope="session")
def session_client(registry_root: Path) -> Iterator[TestClient]:
    """One started app over the session registry, for read-only tests (batch limit 50, to test it cheaply)."""
    with started(registry_root, MAX_BATCH=50) as client:
        yield client


@pytest.fixture
def client(session_client: TestClient) -> TestClient:
    return session_client


class ForwardingTransport(httpx.BaseTransport):
    """An ``httpx`` transport that hands every request (path and query) to a started app's TestClient."""

    def __init__(self, app_client: TestClient) -> None:
        self.app_client = app_client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.app_client.request(
            request.method,
            request.url.raw_path.decode(),
            content=request.read(),
            headers=dict(request.headers),
        )
        return httpx.Response(response.status_code, content=response.content, headers=response.headers)


@pytest.fixture(scope="session")
def service_client() -> Callable[[TestClient], object]:
    """``service_client(app_client)``: a ``ServiceClient`` whose requests reach that started app (no retry
    waits)."""
    from ficco.service.client import ServiceClient

    def make(app_client: TestClient) -> ServiceClient:
        return ServiceClient(
            "http://service", transport=ForwardingTransport(app_client), sleep=lambda s: None
        )

    return make


@pytest.fixture
def wait_for() -> Callable[..., bool]:
    """``wait_for(predicate, timeout_s=30.0)``: poll ``predicate`` until it holds (True) or ``timeout_s``
    passes (False); a generous deadline, not a timing assertion."""

    def wait(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return False

    return wait
