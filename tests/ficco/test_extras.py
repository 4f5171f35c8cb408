"""A missing extra is one line naming the pip install to run (exit 1), and an installed ficco reads the
shipped registry but writes into the user's data folder (ficco/extras.py, ficco/files.py)."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
from typer.testing import CliRunner

import ficco
from ficco import extras, files
from ficco.cli import app
from ficco.extras import install_command, missing_message


@pytest.mark.parametrize(
    ("command", "options", "module", "extra"),
    [
        ("serve", {}, "uvicorn", "service"),
        ("bench", {}, "tqdm", "executor"),
        ("bench", {}, "torch", "executor"),
        ("bench", {"backend": "sim"}, "pandas", "data"),  # the simulator needs no torch
        ("bench", {"backend": "sim", "ray": "auto"}, "ray", "fleet"),
        ("dataset gather", {}, "pyarrow", "data"),
        ("retrain", {}, "torch", "executor"),  # a GPU retrain measures with the executor
        ("retrain", {}, "xgboost", "train"),
        ("train", {}, "pandas", "train"),
        ("recommend", {}, "fastapi", "service"),
    ],
)
def test_missing_message_names_the_extra(command, options, module, extra):
    assert missing_message(command, module, options) == (
        f"ficco {command} needs {module}, which `{install_command(extra)}` installs"
    )


def test_the_install_command_fits_how_ficco_is_installed(monkeypatch, tmp_path):
    """A checkout installs editable (``.`` from its root, its path elsewhere), an installed ficco by name;
    ``pip`` alone only when the pip on PATH is this environment's."""
    checkout = ficco.CHECKOUT
    pip = tmp_path / "bin" / "pip"
    pip.parent.mkdir()
    monkeypatch.setattr(extras.shutil, "which", lambda name: str(pip))
    monkeypatch.setattr(extras.sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.chdir(checkout)
    assert install_command("train") == "pip install -e '.[train]'"
    monkeypatch.chdir(tmp_path)
    assert install_command("train") == f"pip install -e '{checkout}[train]'"
    monkeypatch.setattr(ficco, "CHECKOUT", None)
    assert install_command("data") == "pip install 'ficco[data]'"
    monkeypatch.setattr(extras.sys, "executable", "/elsewhere/bin/python3")
    assert install_command("data") == "/elsewhere/bin/python3 -m pip install 'ficco[data]'"


def test_without_a_gpu_an_extra_that_brings_torch_installs_torchs_cpu_build_first(monkeypatch, tmp_path):
    """Where no ``nvidia-smi`` is found and torch is not installed, the advice for ``[executor]`` (what
    ``host-factor`` and ``bench`` need) installs the extra's torch pin from PyTorch's CPU wheel index first,
    as ``make test`` does, so that pip pulls no CUDA wheel; with a GPU it does not."""
    import tomllib

    pip = tmp_path / "bin" / "pip"
    pip.parent.mkdir()
    gpu = [False]
    monkeypatch.setattr(extras.shutil, "which", lambda name: str(pip) if name == "pip" or gpu[0] else None)
    monkeypatch.setattr(extras.sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.chdir(ficco.CHECKOUT)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "torch" else find_spec(n, *a))
    pins = tomllib.loads((ficco.CHECKOUT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [r for r in pins["executor"] if r.startswith("torch")]
    specifiers = lambda r: set(r.replace(" ", "").removeprefix("torch").split(","))  # noqa: E731
    assert specifiers(extras.torch_requirement()) == specifiers(pin)  # metadata may reorder them
    cpu = f"pip install '{extras.torch_requirement()}' --index-url {extras.TORCH_CPU_INDEX}"
    assert install_command("executor") == f"{cpu} && pip install -e '.[executor]'"
    assert install_command("service") == "pip install -e '.[service]'"  # no torch in it
    assert missing_message("host-factor", "torch") == (
        f"ficco host-factor needs torch, which `{cpu} && pip install -e '.[executor]'` installs"
    )
    gpu[0] = True
    assert install_command("executor") == "pip install -e '.[executor]'"


def test_a_module_no_extra_installs_is_not_hidden():
    assert missing_message("serve", "no_such_module") is None


@pytest.fixture
def without(monkeypatch):
    """``without(*modules)``: make those modules look uninstalled to ``importlib.util.find_spec``."""

    def hide(*modules: str) -> None:
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name in modules else find_spec(name, *a)
        )

    return hide


def test_a_command_without_its_extra_prints_one_line(without):
    without("fastapi")
    done = CliRunner().invoke(app, ["serve"])
    assert done.exit_code == 1
    assert done.output == f"error: ficco serve needs fastapi, which `{install_command('service')}` installs\n"


def test_bench_without_torch_stops_before_any_rank_and_advises_no_resume(without, tmp_path):
    """The sweep's ranks import torch, tqdm and pandas; a missing one is found before torchrun starts."""
    configs = tmp_path / "configs"
    configs.mkdir()
    tiny = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 1, "model_type": "llama"}  # fmt: skip
    (configs / "Tiny.json").write_text(json.dumps(tiny))
    without("torch")
    args = ["bench", "--backend", "gloo", "--configs", configs, "--tokens", "128", "--grid", "0"]
    done = CliRunner().invoke(app, [*map(str, args), "--out", str(tmp_path / "out")])
    assert done.exit_code == 1, done.output
    assert done.output.splitlines()[-1] == (
        f"error: ficco bench needs torch, which `{install_command('executor')}` installs"
    )
    assert "--resume" not in done.output


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """ficco as a wheel installs it: no checkout, the shipped registry (a copy) read-only in the package."""
    shipped = tmp_path / "site-packages" / "ficco" / "models"
    shutil.copytree(files.SHIPPED_MODELS / "h200x2", shipped / "h200x2")
    monkeypatch.setattr(files, "CHECKOUT", None)
    monkeypatch.setattr(files, "SHIPPED_MODELS", shipped)
    monkeypatch.delenv("FICCO_MODEL_ROOT", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return shipped


def test_installed_ficco_reads_the_shipped_registry_and_writes_a_copy_in_the_user_folder(installed, tmp_path):
    assert files.model_root() == installed
    user = files.writable_model_root()
    assert user == tmp_path / "data" / "ficco" / "models" != installed
    assert (user / "h200x2" / "CURRENT").read_text() == (installed / "h200x2" / "CURRENT").read_text()
    assert files.model_root() == user  # from now on the answers come from the user's registry
    assert files.work_root() == tmp_path / "data" / "ficco"


def test_the_environment_names_the_registry(installed, monkeypatch, tmp_path):
    monkeypatch.setenv("FICCO_MODEL_ROOT", str(tmp_path / "mine"))
    assert files.model_root() == files.writable_model_root() == tmp_path / "mine"
    assert not (tmp_path / "data").exists()


def test_a_checkout_reads_and_writes_its_own_models(monkeypatch):
    monkeypatch.delenv("FICCO_MODEL_ROOT", raising=False)
    assert files.CHECKOUT is not None
    assert files.model_root() == files.writable_model_root() == files.CHECKOUT / "models"
