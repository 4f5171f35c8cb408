"""The Dockerfile, read statically: sources exist, the command, no torch, non-root. ``make image`` builds and
runs it where a container engine exists; tests/ficco/test_packaging.py builds the wheel from its context."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

from ficco.cli import COMMAND_MODULES
from ficco.service.commands import SERVE_COMMAND
from ficco.service.core.config import Settings
from tests.conftest import dockerignore_rules, in_context

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        stages[-1].append(instruction)
    return stages


def _in_context(path: str) -> bool:
    """Whether ``path`` (relative to the repo) is in the build context under .dockerignore's rules."""
    return in_context(dockerignore_rules(ROOT / ".dockerignore"), path)


def test_dockerfile_is_multi_stage_slim_python():
    froms = [args for word, args in _instructions() if word == "FROM"]
    assert len(froms) >= 2
    assert all(f.split()[0] == "python:3.11-slim" for f in froms)


def test_dockerfile_copy_sources_exist():
    for stage in _stages():
        for word, args in stage:
            if word != "COPY" or "--from=" in args:
                continue
            *sources, _dest = [a for a in shlex.split(args) if not a.startswith("--")]
            for source in sources:
                assert (ROOT / source).exists(), f"COPY source {source} does not exist"


def test_build_context_holds_what_the_image_needs():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    code = {d for d in setuptools["package-dir"].values() if (ROOT / d / "__init__.py").is_file()}
    packages = code | {module.__name__.split(".")[1] for module in COMMAND_MODULES}
    hw = Settings().DEFAULT_HARDWARE
    for path in ["pyproject.toml", "README.md", *sorted(packages), f"models/{hw}/CURRENT"]:
        assert _in_context(path), f"{path} is excluded from the build context by .dockerignore"
        assert (ROOT / path).exists(), f"{path} is needed by the image but missing from the repository"
    for pattern in setuptools["package-data"]["ficco.datasets"]:
        assert _in_context(f"datasets/{pattern.split('/')[0]}"), pattern
    assert not _in_context(".venv") and not _in_context("tests") and not _in_context(f"datasets/{hw}")
    assert not _in_context("features/__pycache__/vector.cpython-311.pyc")


def test_the_wheel_ships_the_default_model():
    hw = Settings().DEFAULT_HARDWARE
    current = (ROOT / "models" / hw / "CURRENT").read_text().strip()
    assert (ROOT / "models" / hw / current / "card.json").is_file(), f"models/{hw}/CURRENT names {current}"


def test_dockerfile_runs_documented_command_as_non_root_with_healthcheck():
    final = _stages()[-1]
    cmd = [args for word, args in final if word == "CMD"]
    assert [json.loads(c) for c in cmd] == [list(SERVE_COMMAND)]
    assert " ".join(SERVE_COMMAND) in (ROOT / "service" / "commands.py").read_text()
    assert not [args for word, args in final if word == "ENTRYPOINT"]
    users = [args for word, args in final if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    healthcheck = " ".join(args for word, args in final if word == "HEALTHCHECK")
    assert "/readyz" in healthcheck and "8000" in healthcheck


def test_dockerfile_installs_service_extra_without_torch():
    runs = " ".join(args for word, args in _instructions() if word == "RUN")
    assert "torch" not in runs.lower()
    installs = re.findall(r"pip install (\S+)", runs)
    assert installs == ['".[service]"']
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo, seen = ["service"], set()
    requirements = list(extras["dependencies"])
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for req in extras["optional-dependencies"][extra]:
            nested = re.fullmatch(r"ficco\[(\w+)\]", req)
            if nested and nested.group(1) not in seen:
                todo.append(nested.group(1))
            elif not nested:
                requirements.append(req)
    assert not [r for r in requirements if r.lower().startswith("torch")], requirements


def test_healthcheck_probes_readiness_not_liveness():
    (check,) = [rest for word, rest in _instructions() if word == "HEALTHCHECK"]
    assert "/readyz" in check and "/healthz" not in check
