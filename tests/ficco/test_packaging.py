"""The wheel as users install it, built once from exactly the Docker build context (tests/conftest.py):
what it holds, that it builds without warnings, and each extra installed alone into a fresh virtual
environment (pip's cache reused) running its commands from another directory, a missing extra giving its
one line.

Cost: one venv per extra, made on first use (:data:`INSTALLED` says which are installed from the index and
which see this environment's distributions); docs/install.md gives the time measured on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from importlib.metadata import distribution as metadata_of
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ficco.harness.sim import SIM_MODEL_VERSION

pytestmark = pytest.mark.packaging

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_IDS = ("h200x2", "h200x4", "h200x8-sim", "h100x8-sim")
"""The registry ids whose models the package ships (pyproject's package-data, .dockerignore): the
measured 2- and 4-GPU models and the simulated 8-GPU ones for machines nobody here has measured."""
RECOMMEND = ("recommend", "--op", "ag_gemm", "--m", "16384", "--n", "14336", "--k", "4096")


def _current(hardware_id: str) -> str:
    return (REPO_ROOT / "models" / hardware_id / "CURRENT").read_text().strip()


MISSING = {  # command line -> the extra its one line names
    ("serve",): "service",
    ("train", "--dataset", "x"): "train",
    ("report", "--dataset", "x", "--out", "x"): "train",
    ("bench", "--backend", "sim"): "data",  # the simulator needs no torch
    ("host-factor",): "executor",
}


def _run(*command: object, cwd: Path, env: dict[str, str] | None = None, check: bool = True):
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=540
    )
    if check:
        assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done


INSTALLED = ("core",)
"""Extras pip installs for real, resolved from the index (files from pip's cache). The others (service:
0.3 GB, train: 0.7 GB, executor: 1.5 GB with torch; 50 s, 85 s and 154 s to install on 2 busy cores) see
the distributions their requirements name, transitively, linked from this environment instead: the same
check that what they declare is enough, in seconds. FICCO_PACKAGING_INSTALL_ALL=1 installs every extra."""


def _required(requirements: list[str], extras: set[str]) -> list[Requirement]:
    """The requirements that apply with ``extras`` requested (markers evaluated here)."""
    return [
        r for r in map(Requirement, requirements)
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras | {""})
    ]  # fmt: skip


def _closure(wheel: Path, extra: str) -> set[str]:
    """Names of the distributions ``ficco[extra]`` needs, transitively, as this environment holds them."""
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read("ficco-0.1.0.dist-info/METADATA").decode()
    own = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    extras = {extra}
    while True:  # ficco[train] names ficco[data]
        nested = {e for r in _required(own, extras) if canonicalize_name(r.name) == "ficco" for e in r.extras}
        if nested <= extras:
            break
        extras |= nested
    todo = [r for r in _required(own, extras) if canonicalize_name(r.name) != "ficco"]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        todo += _required(metadata_of(name).requires or [], set(requirement.extras))
    return seen


def _link_distributions(names: set[str], folder: Path) -> None:
    """Symlink into ``folder`` every top-level file and folder of the distributions ``names``."""
    folder.mkdir()
    for name in names:
        dist = metadata_of(name)
        for top in {f.parts[0] for f in dist.files or ()} - {".."}:
            if not (folder / top).exists():
                (folder / top).symlink_to(dist.locate_file(top))


@pytest.fixture(scope="session")
def venv(built_wheel, tmp_path_factory) -> Callable[[str], Path]:
    """``venv(extra)``: the ``bin`` folder of a fresh virtual environment holding the wheel with ``extra``
    ("core": none) and what it requires (:data:`INSTALLED`), made on first use."""
    wheel, _ = built_wheel
    made: dict[str, Path] = {}

    def get(extra: str) -> Path:
        if extra not in made:
            root = tmp_path_factory.mktemp(f"venv-{extra}")
            _run(sys.executable, "-m", "venv", "--without-pip", root, cwd=root)
            python = root / "bin" / "python"
            pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q"]
            if extra in INSTALLED or os.environ.get("FICCO_PACKAGING_INSTALL_ALL") == "1":
                _run(*pip, wheel if extra == "core" else f"{wheel}[{extra}]", cwd=root)
            else:
                _link_distributions(_closure(wheel, extra), root / "linked")
                purelib = _run(
                    python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root
                )
                Path(purelib.stdout.strip(), "linked.pth").write_text(f"{root / 'linked'}\n")
                _run(*pip, "--no-deps", wheel, cwd=root)
                _run(sys.executable, "-m", "pip", "--python", python, "check", cwd=root)  # nothing missing
            made[extra] = root / "bin"
        return made[extra]

    return get


@pytest.fixture
def user_env(tmp_path) -> dict[str, str]:
    """This environment without the checkout or a chosen registry, writing into a fresh user data folder."""
    drop = ("PYTHONPATH", "FICCO_MODEL_ROOT", "FICCO_DATASET_ROOT", "FICCO_PORT", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "XDG_DATA_HOME": str(tmp_path / "data")}


def _site(bin_dir: Path, cwd: Path, env: dict[str, str]) -> Path:
    """The installed ``ficco`` package folder of a venv."""
    out = _run(bin_dir / "python", "-c", "import ficco; print(ficco.__file__)", cwd=cwd, env=env).stdout
    return Path(out.strip()).parent


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def _assert_one_line(done: subprocess.CompletedProcess, extra: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert f"pip install 'ficco[{extra}]'" in lines[0] and lines[0].startswith("error: ficco "), lines[0]


def test_wheel_holds_only_ficco_with_its_model_and_configs(built_wheel):
    wheel, _ = built_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/")[0] for n in names} == {"ficco", "ficco-0.1.0.dist-info"}
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, folder in setuptools["package-dir"].items():
        if (REPO_ROOT / folder / "__init__.py").is_file():
            assert f"{package.replace('.', '/')}/__init__.py" in names, folder
    assert "ficco/runtime/layers.py" in names and "ficco/service/core/config.py" in names
    for hw in SHIPPED_IDS:
        folder = REPO_ROOT / "models" / hw / _current(hw)
        files = [p.relative_to(folder) for p in folder.rglob("*") if p.is_file()]
        shipped = {f"ficco/models/{hw}/{_current(hw)}/{p}" for p in files}
        assert any("/tables/" in name for name in shipped), hw  # the grid tables the service serves unbuilt
        assert f"ficco/models/{hw}/CURRENT" in names and shipped and shipped <= names, hw
    assert "ficco/harness/gemm_tables/h200.json" in names  # the simulator's GEMM table
    configs = (REPO_ROOT / "datasets" / "model_configs").iterdir()
    assert {f"ficco/datasets/model_configs/{p.name}" for p in configs} <= names
    assert not [n for n in names if n.endswith(".parquet") or "/tests/" in n or "__pycache__" in n]


def test_only_the_shipped_model_goes_into_the_wheel_and_the_image(context_copy, tmp_path):
    """pyproject's package-data and .dockerignore name the shipped registry file by file (CURRENT's version):
    a model trained into the checkout's models/ (a simulated one, another version) reaches neither."""
    import shutil

    from tests.conftest import dockerignore_rules, in_context

    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert data["ficco.models"] == [
        f
        for hw in SHIPPED_IDS
        for f in (f"{hw}/CURRENT", f"{hw}/{_current(hw)}/*", f"{hw}/{_current(hw)}/tables/*")
    ]
    rules = dockerignore_rules(REPO_ROOT / ".dockerignore")
    for hw in SHIPPED_IDS:
        assert in_context(rules, f"models/{hw}/{_current(hw)}/model.ubj") and in_context(
            rules, f"models/{hw}/CURRENT"
        )
        assert in_context(rules, f"models/{hw}/{_current(hw)}/tables/op=tp_overlap,x.json.gz")
    for trained in ("models/h200x2-sim/v1/model.ubj", "models/h200x2/20990101T000000Z-0/card.json"):
        assert not in_context(rules, trained), trained
    checkout = tmp_path / "checkout"
    shutil.copytree(context_copy, checkout)
    for trained in ("h200x2-sim/v1", "h200x2/20990101T000000Z-0"):
        (checkout / "models" / trained).mkdir(parents=True)
        (checkout / "models" / trained / "card.json").write_text("{}")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    _run(*command, "-w", tmp_path / "wheel", checkout, cwd=checkout)
    (wheel,) = (tmp_path / "wheel").glob("ficco-*.whl")
    models = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("ficco/models/")}
    assert {n.split("/")[3] for n in models if n.count("/") > 3} == {_current(hw) for hw in SHIPPED_IDS}
    assert {f"ficco/models/{hw}/CURRENT" for hw in SHIPPED_IDS} <= models


def test_wheel_builds_without_warnings(built_wheel):
    _, output = built_wheel
    assert "Warning" not in output and "warning:" not in output.lower(), output


@pytest.mark.heavy
def test_core_install_answers_from_any_directory_and_names_the_missing_extras(venv, tmp_path, user_env):
    bin_dir = venv("core")
    done = _run(bin_dir / "python", "-c", "import xgboost", cwd=tmp_path, env=user_env, check=False)
    assert done.returncode != 0, "the core install must not bring XGBoost"
    out = _run(bin_dir / "ficco", *RECOMMEND, cwd=tmp_path, env=user_env).stdout
    assert "schedule:" in out and "(h200x2" in out
    four = ("--hardware", "h200x4", "--tp", "4")
    out = _run(bin_dir / "ficco", *RECOMMEND, *four, cwd=tmp_path, env=user_env).stdout
    assert f"model version {_current('h200x4')} (h200x4, measured), world_size 4" in out
    configs = _site(bin_dir, tmp_path, user_env) / "datasets" / "model_configs"
    out = _run(bin_dir / "ficco", "score", configs / "Llama-3.1-8B.json", "--format", "json", cwd=tmp_path,
               env=user_env).stdout  # fmt: skip
    assert "Llama-3.1-8B" in out and "model_version" in out
    mixtral = configs / "Mixtral-8x7B-v0.1.json"
    out = _run(
        bin_dir / "ficco", "score", mixtral, *four, "--format", "json", cwd=tmp_path, env=user_env
    ).stdout
    pairs = [p for entry in json.loads(out)["data"] for p in entry["pairs"]]
    assert {p["scenario"]["op"] for p in pairs} == {"ag_gemm", "gemm_rs", "a2a_gemm", "gemm_a2a"}
    assert all(p["measured"] for p in pairs), "every op of the MoE layer is scored at TP=4"
    # machines nobody measured: the shipped simulated models answer at 8 ranks, marked so, with their fidelity
    eight = ["--hardware", "h200x8-sim", "--world-size", "8", "--format", "json"]
    sim = json.loads(_run(bin_dir / "ficco", *RECOMMEND, *eight, cwd=tmp_path, env=user_env).stdout)
    assert sim["model_backend"] == "simulated" and sim["sim_fidelity"]["measured_world_sizes"] == [2, 4]
    seventy = configs / "Llama-3.1-70B.json"
    scored = _run(bin_dir / "ficco", "score", seventy, "--tp", "8", "--hardware", "h100x8-sim", cwd=tmp_path,
                  env=user_env).stdout  # fmt: skip
    assert "(h100x8-sim, simulated)" in scored and f"fidelity ({SIM_MODEL_VERSION})" in scored
    refused = _run(bin_dir / "ficco", *RECOMMEND, "--hardware", "h200x8", "--world-size", "8", cwd=tmp_path,
                   env=user_env, check=False)  # fmt: skip
    assert refused.returncode != 0 and "h200x8-sim" in refused.stderr + refused.stdout
    for command, extra in MISSING.items():
        _assert_one_line(_run(bin_dir / "ficco", *command, cwd=tmp_path, env=user_env, check=False), extra)
    results = _run(
        bin_dir / "ficco", "results", "--out", tmp_path / "r.md", cwd=tmp_path, env=user_env, check=False
    )
    assert results.returncode == 1 and results.stderr.count("error:") == 1, results.stderr  # no checkout
    assert "Traceback" not in results.stderr and not (tmp_path / "r.md").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(port: int, process: subprocess.Popen, timeout_s: float = 120.0) -> int:
    """The status of ``GET /readyz`` once it is 200, or its last answer at ``timeout_s`` (the server may
    start slowly on a busy machine, and answers 503 until its batch workers are warm)."""
    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as err:
            status = err.code
        except OSError:
            pass
        time.sleep(0.3)
    if status is None:
        raise AssertionError(f"ficco serve did not answer on port {port} within {timeout_s} s")
    return status


@pytest.mark.heavy
def test_service_extra_serves_the_shipped_model_on_the_port_asked(venv, tmp_path, user_env):
    """The wheel of the Docker build context, with [service] only, serves from /tmp (FICCO_PORT), the
    h200x4 table at TP=4 too, with an ETag that a revalidation answers 304 (the table built on request)."""
    bin_dir = venv("service")
    port = _free_port()
    env = {**user_env, "FICCO_PORT": str(port), "FICCO_TABLE_PREFETCH": "0"}
    with subprocess.Popen(
        [bin_dir / "ficco", "serve"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    ) as server:  # fmt: skip
        try:
            assert _ready(port, server) == 200
            url = f"http://127.0.0.1:{port}/v1/tables/h200x4?tp=4"
            with urllib.request.urlopen(url, timeout=300) as response:  # a grid table: tens of s of CPU
                table, etag = json.loads(response.read()), response.headers["ETag"]
            assert response.status == 200 and etag and table["world_size"] == 4
            assert table["model"]["version"] == _current("h200x4") and not table["simulated"]
            again = urllib.request.Request(url, headers={"If-None-Match": etag})
            with pytest.raises(urllib.error.HTTPError) as not_modified:  # urllib raises on a 304
                urllib.request.urlopen(again, timeout=30)
            assert not_modified.value.code == 304
        finally:
            server.terminate()
            server.wait(timeout=30)
    train = _run(bin_dir / "ficco", "train", "--dataset", "x", cwd=tmp_path, env=user_env, check=False)
    _assert_one_line(train, "train")


def _small_dataset(source: Path, dest: Path, *, every: int) -> Path:
    """Every ``every``-th scenario of dataset ``source`` (its parts read together), as a one-part dataset in
    ``dest`` (training on a quarter of datasets/h200x2-sim takes a quarter of the time)."""
    import pandas as pd

    manifest = json.loads((source / "manifest.json").read_text())
    frame = pd.concat([pd.read_parquet(source / p["file"]) for p in manifest["parts"]], ignore_index=True)
    keep = sorted(frame["scenario_id"].unique())[::every]
    frame = frame[frame["scenario_id"].isin(keep)]
    part = {**manifest["parts"][0], "rows": len(frame), "scenarios": len(keep)}
    (dest / "parts").mkdir(parents=True)
    frame.to_parquet(dest / part["file"], index=False)
    (dest / "plan.json").write_bytes((source / "plan.json").read_bytes())
    finished = [s for s in manifest["finished"] if s in set(keep)]
    manifest = {**manifest, "parts": [part], "rows": len(frame), "finished": finished}
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


@pytest.mark.heavy
def test_train_extra_registers_into_the_user_registry_not_site_packages(venv, tmp_path, user_env):
    bin_dir = venv("train")
    shipped = _site(bin_dir, tmp_path, user_env) / "models"
    before = _tree_hash(shipped)
    dataset = _small_dataset(REPO_ROOT / "datasets" / "h200x2-sim", tmp_path / "small", every=4)
    _run(bin_dir / "ficco", "train", "--dataset", dataset, "--promote", cwd=tmp_path, env=user_env)
    assert _tree_hash(shipped) == before, "train --promote wrote into the installed package"
    user = Path(user_env["XDG_DATA_HOME"]) / "ficco" / "models"
    cards = {p.parent.relative_to(user) for p in user.glob("*/*/card.json")}
    (new,) = cards - {p.parent.relative_to(shipped) for p in shipped.glob("*/*/card.json")}
    model_id, version = new.parts  # h200x2, or h200x2-sim where simulated models are registered apart
    assert (user / model_id / "CURRENT").read_text().strip() == version
    out = _run(bin_dir / "ficco", *RECOMMEND, "--hardware", model_id, cwd=tmp_path, env=user_env).stdout
    assert version in out  # the answer comes from the user's registry
    host_factor = _run(bin_dir / "ficco", "host-factor", cwd=tmp_path, env=user_env, check=False)
    _assert_one_line(host_factor, "executor")


@pytest.mark.heavy
def test_executor_extra_benches_into_the_user_folder(venv, tmp_path, user_env):
    """``ficco bench`` with [executor] alone (tqdm, pandas, torch): two gloo ranks, two tiny scenarios."""
    bin_dir = venv("executor")
    configs = tmp_path / "configs"
    configs.mkdir()
    tiny = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 1, "model_type": "llama"}  # fmt: skip
    (configs / "Tiny.json").write_text(json.dumps(tiny))
    bench = ["bench", "--backend", "gloo", "--configs", configs, "--tokens", "128", "--grid", "0"]
    bench += ["--sample", "2", "--modes", "eager", "--rounds", "2", "--max-rounds", "3", "--timed-ms", "1e6"]
    _run(bin_dir / "ficco", *bench, cwd=tmp_path, env=user_env)
    out = Path(user_env["XDG_DATA_HOME"]) / "ficco" / "datasets" / "h200x2-gloo"
    assert (out / "manifest.json").is_file() and (out / "card.md").is_file()
    _assert_one_line(_run(bin_dir / "ficco", "serve", cwd=tmp_path, env=user_env, check=False), "service")
