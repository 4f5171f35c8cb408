"""Every documented command (docs/cli.md) with the mistakes a user makes: bad paths, broken files, wrong
values, missing extras. Each gives exactly one ``error:`` line and no traceback, with exit status 2 for a bad
argument and 1 for a failure (docs/cli.md), and the commands the messages advise run as printed."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ficco import CHECKOUT
from ficco.cli import app

CONFIG = CHECKOUT / "tests" / "features" / "configs" / "Qwen3-8B.json"
DATASET = CHECKOUT / "datasets" / "h200x2-sim"
SCENARIO = "recommend --op ag_gemm --m 4096 --n 4096 --k 4096"
BAD = 2
FAILED = 1

CASES: list[tuple[str, int]] = [
    # recommend: values of the wrong type or range, unknown ids, bad files and registries
    ("recommend --op bad --m 4096 --n 4096 --k 4096", BAD),
    ("recommend --op ag_gemm --m abc --n 4096 --k 4096", BAD),
    ("recommend --op ag_gemm --m 0 --n 4096 --k 4096", BAD),
    ("recommend --op ag_gemm --m 3 --n 4096 --k 4096", BAD),
    ("recommend --op ag_gemm --n 4096 --k 4096", BAD),
    (f"{SCENARIO} --dtype fp8", BAD),
    (f"{SCENARIO} --world-size 9", BAD),  # the last release's spelling of --tp
    (f"{SCENARIO} --tp 8", BAD),
    (f"{SCENARIO} --hardware h200x8", BAD),  # 8 GPUs: world size 8, which no model answers
    (f"{SCENARIO} --hardware h2002", BAD),
    (f"{SCENARIO} --hardware {{missing}}.json", BAD),
    (f"{SCENARIO} --hardware {{broken}}", BAD),
    (f"{SCENARIO} --hardware {{list}}", BAD),
    (f"{SCENARIO} --model-root {{missing}}", BAD),
    (f"{SCENARIO} --model-root {{text}}", BAD),
    (f"{SCENARIO} --mode bad", BAD),
    (f"{SCENARIO} --host-factor 100", BAD),
    (f"{SCENARIO} --format bad", BAD),
    (f"{SCENARIO} --no-such-option", BAD),
    # score: paths, broken and unknown configs (refused per file: exit 1), bad settings (exit 2)
    ("score {missing}.json", BAD),
    ("score {broken}", FAILED),
    ("score {list}", FAILED),
    ("score {bert}", FAILED),
    ("score {empty}", FAILED),
    (f"score {CONFIG} --tokens abc", BAD),
    (f"score {CONFIG} --tokens 0", BAD),
    (f"score {CONFIG} --tp 9", BAD),
    (f"score {CONFIG} --dtype fp8", BAD),
    (f"score {CONFIG} --kv-layout bad", BAD),
    (f"score {CONFIG} --hardware h200X2", BAD),
    (f"score {CONFIG} --format xml", BAD),
    (f"score {CONFIG} --model-root {{missing}}", BAD),
    # serve: bad options and variables, a registry that is a file
    ("serve --port abc", BAD),
    ("serve --port 0 --prepare-only", BAD),
    ("serve --model-root {text} --prepare-only", BAD),
    ("serve --port {busy}", FAILED),  # in use: one line, before any model loads
    # bench: configs, outputs, values, shards, fleet
    ("bench --backend bad", BAD),
    ("bench --backend sim --configs {missing} --out {out}", BAD),
    ("bench --backend sim --configs {empty} --out {out}", BAD),
    ("bench --backend sim --configs {configs} --out {out}", BAD),
    ("bench --backend sim --tp 3 --out {out}", BAD),
    ("bench --backend sim --tokens abc --out {out}", BAD),
    ("bench --backend sim --hardware h2002 --out {out}", BAD),
    ("bench --backend sim --hardware {broken} --out {out}", BAD),
    ("bench --backend sim --out {text} --sample 1", BAD),
    ("bench --backend sim --modes bad --out {out}", BAD),
    ("bench --backend sim --ops all,bad --out {out}", BAD),
    ("bench --backend sim --calibrate-from {missing} --out {out} --sample 1", BAD),
    ("bench --backend sim --rounds 5 --max-rounds 4 --out {out}", BAD),
    # fleet: shards, Ray clusters, scheduler jobs, the sweep's options after the verb's
    ("fleet shard --shard 5/2 --backend sim --out {out}", BAD),
    ("fleet shard --backend sim --out {out}", BAD),  # no --shard and no job array
    ("fleet run bogus --backend sim --out {out} --sample 1", FAILED),
    ("fleet run 127.0.0.1:1 --backend sim --out {out} --sample 1", FAILED),
    ("fleet run --backend sim auto", BAD),  # the address goes first
    ("fleet emit k8s --backend sim --out {out}", BAD),  # no --shards
    ("fleet emit lsf --shards 2 --out {out}", BAD),
    ("fleet emit slurm --shards 2 --no-such-option --out {out}", BAD),
    # dataset card and gather, host-factor
    ("dataset card {missing}", BAD),
    ("dataset card", BAD),
    ("dataset compare {missing} {empty}", BAD),
    ("dataset compare {empty} {empty}", BAD),
    ("dataset compare {text} {empty}", BAD),
    ("dataset compare", BAD),
    (f"dataset compare {DATASET} {DATASET} --within 0.5", BAD),
    (f"dataset compare {DATASET} {DATASET} --format xml", BAD),
    (f"dataset compare {DATASET} {CHECKOUT}/datasets/h200x4-sim", BAD),
    ("dataset gather {missing} --out {out}", BAD),
    ("dataset gather {empty} --out {out}", BAD),
    ("dataset gather", BAD),
    ("host-factor --backend bad", BAD),
    ("host-factor --nproc 1", BAD),
    # training commands
    ("evaluate --dataset {missing}", BAD),
    ("evaluate --dataset {empty}", BAD),
    (f"evaluate --dataset {DATASET} --rescore {DATASET}", BAD),
    (f"evaluate --dataset {DATASET} --jobs 0", BAD),
    ("train --dataset {missing}", BAD),
    ("report --dataset {missing} --out {out}", BAD),
    # export: configs at a world size the hardware lacks, broken and unknown configs, bad shapes and values
    (f"export --tp 4 --config {CONFIG} --out {{out}}", BAD),
    ("export --config {broken} --out {out}", BAD),
    ("export --config {bert} --out {out}", BAD),
    ("export --config {list} --out {out}", BAD),
    ("export --config {missing} --out {out}", BAD),
    ("export --dataset {missing} --out {out}", BAD),
    ("export --shape bad --out {out}", BAD),
    ("export --shape nope:4096:4096 --out {out}", BAD),
    ("export --shape ag_gemm:4096:4096 --hardware h2002 --out {out}", BAD),
    ("export --shape ag_gemm:4096:4096 --format bad --out {out}", BAD),
    ("export --shape ag_gemm:4096:4096 --dtype bad --out {out}", BAD),
    ("export --shape ag_gemm:4096:4096 --out {text}", BAD),
    # results, retrain, version
    ("results --out {text}/results.md", BAD),
    ("retrain --hardware h2002 --backend sim", BAD),
    ("retrain --tp 3 --backend sim", BAD),
    ("retrain --tokens abc --backend sim", BAD),
    ("retrain --backend sim --configs {missing}", BAD),
    ("retrain", BAD),  # no GPUs here: names --backend sim
    ("version extra", BAD),
    ("no-such-command", BAD),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The files and folders the cases name: broken JSON, a JSON list, an unknown model type, an empty
    folder, a plain file where a folder is expected, a path that does not exist, a fresh output folder."""
    root = tmp_path_factory.mktemp("mistakes")
    configs = root / "configs"
    configs.mkdir()
    (configs / "bert.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    (root / "broken.json").write_text("{")
    (root / "list.json").write_text("[1]")
    (root / "text").write_text("not a folder")
    (root / "empty").mkdir()
    busy = socket.create_server(("127.0.0.1", 0))  # held for the module: a port in use
    yield {
        "busy": str(busy.getsockname()[1]),
        "broken": str(root / "broken.json"),
        "list": str(root / "list.json"),
        "bert": str(configs / "bert.json"),
        "configs": str(configs),
        "text": str(root / "text"),
        "empty": str(root / "empty"),
        "missing": str(root / "missing"),
        "out": str(root / "out"),
    }
    busy.close()


def _one_error_line(stderr: str, output: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in output, output
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.heavy
@pytest.mark.parametrize(("command", "code"), CASES, ids=[c for c, _ in CASES])
def test_a_mistake_is_one_error_line_with_the_documented_status(command, code, paths, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # nothing is written into the checkout
    monkeypatch.setenv("RAY_ADDRESS", "")
    done = CliRunner().invoke(app, shlex.split(command.format(**paths)))
    assert done.exception is None or isinstance(done.exception, SystemExit), done.output
    _one_error_line(done.stderr, done.output)
    assert done.exit_code == code, done.output


BLOCKER = """
import importlib.abc, importlib.util, sys
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda n, p=None: None if n.partition(".")[0] in blocked else find_spec(n, p)
sys.meta_path.insert(0, Block())
sys.argv = ["ficco", *sys.argv[2:]]
from ficco.cli import app
app()
"""
"""``python -c BLOCKER MODULES ARGS...``: ficco's command line with MODULES (comma-separated) uninstalled."""

MISSING = [  # (modules taken away, command, the extra the line names)
    ("pandas", "dataset gather {empty} --out {out}", "data"),
    ("pandas", "bench --backend sim --out {out}", "data"),
    ("tqdm", "bench --backend gloo --out {out}", "executor"),
    ("ray", "fleet run auto --backend sim --out {out}", "fleet"),
    ("pandas", "dataset card {empty}", "data"),
    ("pandas", "dataset compare {empty} {empty}", "data"),
    ("fastapi", "serve", "service"),
    ("sklearn", "export --shape ag_gemm:4096:4096 --out {out}", "train"),
    ("xgboost", "train --dataset {missing}", "train"),
    ("torch", "host-factor --backend gloo", "executor"),
]


@pytest.mark.parametrize(("modules", "command", "extra"), MISSING, ids=[c for _, c, _ in MISSING])
def test_a_missing_extra_is_one_line_naming_the_install_that_fits(modules, command, extra, paths, tmp_path):
    args = shlex.split(command.format(**paths))
    env = {"PYTHONPATH": str(CHECKOUT), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-c", BLOCKER, modules, *args]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    line = _one_error_line(done.stderr, done.stdout + done.stderr)
    assert done.returncode == FAILED, done.stderr
    # run from elsewhere than the checkout, with another pip first on PATH: the install names both (an extra
    # that brings torch, on a machine without nvidia-smi on PATH, installs torch's CPU wheel first)
    assert line.endswith(f"{sys.executable} -m pip install -e '{CHECKOUT}[{extra}]'` installs"), line
    if modules == "torch":
        assert "--index-url https://download.pytorch.org/whl/cpu && " in line, line


def _advised(message: str) -> list[list[str]]:
    """The ``ficco ...`` commands a message quotes in backticks, as argument lists."""
    return [shlex.split(c)[1:] for c in re.findall(r"`(ficco [^`]+)`", message)]


ADVICE = [  # mistakes whose messages advise commands
    f"{SCENARIO} --hardware h2002",
    f"{SCENARIO} --hardware h200X2",
    f"{SCENARIO} --world-size 3",
    f"{SCENARIO} --tp 8",
    f"{SCENARIO} --hardware h200x8",
    f"{SCENARIO} --hardware h200x4 --tp 8",
    f"{SCENARIO} --hardware h200x4-sim --tp 4",
    f"{SCENARIO} --hardware h100x8 --tp 8",
    f"{SCENARIO} --model-root {{empty}}",
    "export --shape ag_gemm:4096:4096 --hardware h2002 --out {out}",
    "export --shape ag_gemm:4096:4096 --hardware h100x4 --out {out}",
    "export --shape ag_gemm:4096:4096 --hardware h200x4-sim --out {out}",
]


@pytest.mark.heavy
def test_every_advised_command_runs_as_printed(paths, monkeypatch, tmp_path):
    """Each ``ficco`` command a message advises parses with the command line's own parser, and a retrain
    passes every check it makes before measuring (on a machine of enough GPUs, as the advice says)."""
    import typer.main

    from ficco.harness import launch
    from ficco.training import retrain

    monkeypatch.chdir(tmp_path)

    class Measuring(Exception):
        """Raised where the advised retrain would start to measure."""

    def measuring(*args, **kwargs):
        raise Measuring

    monkeypatch.setattr(retrain, "retrain", measuring)
    monkeypatch.setattr(launch, "gpu_names", lambda: ["Some GPU"] * 8)  # no model name: any profile fits
    group = typer.main.get_command(app)
    advised = []
    for mistake in ADVICE:
        done = CliRunner().invoke(app, shlex.split(mistake.format(**paths)))
        assert done.exit_code == BAD, done.output
        advised += _advised(_one_error_line(done.stderr, done.output))
    assert advised
    for args in advised:
        parent = group.make_context("ficco", args[:1])
        group.get_command(parent, args[0]).make_context(args[0], args[1:], parent=parent)  # raises if bad
        if args[0] == "retrain":
            done = CliRunner().invoke(app, [*args, "--model-root", str(tmp_path / "models")])
            assert isinstance(done.exception, Measuring), (args, done.output)


def test_the_advice_names_a_served_simulated_model_instead_of_training_it(client_with_sim):
    """Once ``h200x4-sim`` is served, asking ``h200x4`` at world size 4 points at it, not at training it."""
    error = client_with_sim.post(
        "/v1/recommend", json={"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096, "world_size": 4,
                               "hardware": "h200x4"}
    ).json()  # fmt: skip
    (item,) = error["detail"]
    message = item["msg"]
    assert item["field"] == "world_size" and item["type"] == "not_served"
    assert "hardware 'h200x4-sim'" in message and "retrain --backend sim" not in message, message


@pytest.fixture(scope="module")
def client_with_sim(tmp_path_factory):
    """The service answering from a registry of the shipped h200x2 model and a simulated h200x4 model
    (h200x2-sim's files registered under h200x4-sim: a model of 4 GPUs trained at world size 4)."""
    import shutil

    from fastapi.testclient import TestClient

    from ficco.service.core.config import Settings
    from ficco.service.main import create_app

    root = tmp_path_factory.mktemp("registry")
    shutil.copytree(CHECKOUT / "models" / "h200x2", root / "h200x2")
    sim = root / "h200x4-sim"
    shutil.copytree(CHECKOUT / "models" / "h200x2", sim)
    version = (sim / "CURRENT").read_text().strip()
    card_path = sim / version / "card.json"
    card = json.loads(card_path.read_text())
    card.update(hardware_id="h200x4-sim", model_backend="simulated", world_sizes=[4])
    card["hardware"] = {**card["hardware"], "id": "h200x4-sim", "gpu_count": 4}
    card_path.write_text(json.dumps(card))
    settings = Settings(MODEL_ROOT=Path(root), RELOAD_POLL_S=0)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.mark.heavy
@pytest.mark.parametrize("typo", ["h2002", "h200X2", "h20x2"])
def test_a_mistyped_hardware_id_gets_did_you_mean_and_no_command_to_run_with_it(typo, tmp_path):
    for command in (
        f"{SCENARIO} --hardware {typo}",
        f"export --shape ag_gemm:4096:4096 --hardware {typo} --out {tmp_path}",
    ):
        done = CliRunner().invoke(app, shlex.split(command))
        line = _one_error_line(done.stderr, done.output)
        assert "(did you mean 'h200x2'?)" in line and f"--hardware {typo}`" not in line, line
