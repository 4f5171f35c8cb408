"""Invalid settings give one ``error:`` line and exit 2; commands that do not use a setting ignore it;
every command finds the same registry from any directory (issue 15 items 4 and 7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ficco.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["serve", "--port", "70000", "--prepare-only"], {}, "--port"),
        (["serve", "--prepare-only"], {"FICCO_PORT": "abc"}, "FICCO_PORT"),
        (["serve", "--prepare-only"], {"FICCO_RELOAD_TOKEN": "short"}, "FICCO_RELOAD_TOKEN"),
    ],
)
def test_invalid_setting_is_one_error_line_exit_2(args, env, names, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and names in lines[0], result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("env", [{"FICCO_PORT": "abc"}, {"FICCO_RELOAD_TOKEN": "short"}])
def test_server_settings_do_not_break_offline_commands(env, registry_root, monkeypatch):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = ["recommend", "--op", "ag_gemm", "--m", "64", "--n", "64", "--k", "64"]
    result = runner.invoke(app, [*args, "--model-root", str(registry_root)])
    assert result.exit_code == 0, result.output


def test_default_registry_is_the_repositorys_from_any_directory(tmp_path, monkeypatch):
    from ficco.service.core.config import ModelSettings
    from ficco.training.predict.registry import default_model_root

    monkeypatch.delenv("FICCO_MODEL_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_model_root() == ModelSettings().MODEL_ROOT
    assert ModelSettings().MODEL_ROOT.is_absolute()


def test_importing_the_app_module_with_a_bad_variable_does_not_crash():
    env = {"FICCO_PORT": "abc", "PATH": "/usr/bin:/bin"}
    code = "import ficco.service.main, ficco.service.commands"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
