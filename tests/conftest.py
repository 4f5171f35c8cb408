"""Fixtures shared across test folders: the Docker build context (.dockerignore's rules) and the wheel built
from exactly that context, once per session."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _pattern(text: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over '/'-separated paths (Go's filepath.Match plus ``**``)."""
    out, i = "", 0
    while i < len(text):
        if text.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif text.startswith("**", i):
            out, i = out + ".*", i + 2
        elif text[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif text[i] == "?":
            out, i = out + "[^/]", i + 1
        elif text[i] == "[":
            end = text.index("]", i + 1)
            out, i = out + "[" + text[i + 1 : end].replace("!", "^", 1) + "]", end + 1
        elif text[i] == "\\" and i + 1 < len(text):
            out, i = out + re.escape(text[i + 1]), i + 2
        else:
            out, i = out + re.escape(text[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_rules(path: Path) -> list[tuple[re.Pattern[str], bool]]:
    """(pattern, excludes) of each rule of a .dockerignore file, in order."""
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        text = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((_pattern(text), not keep))
    return rules


def in_context(rules: list[tuple[re.Pattern[str], bool]], path: str) -> bool:
    """Whether the file or folder ``path`` (relative, '/'-separated) is sent to the builder: the last rule
    matching it or one of its parent folders decides, as Docker's pattern matcher does."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for pattern, excludes in rules:
        if any(pattern.match(p) for p in prefixes):
            excluded = excludes
    return not excluded


def build_context(root: Path) -> list[str]:
    """The files under ``root`` its .dockerignore lets into a Docker build context, relative, sorted."""
    rules = dockerignore_rules(root / ".dockerignore")
    reincluded = [p.pattern for p, excludes in rules if not excludes]
    out = []
    for folder, dirs, files in os.walk(root):
        rel = Path(folder).relative_to(root).as_posix()
        rel = "" if rel == "." else rel + "/"
        # a folder that is out and that no re-inclusion can reach inside is not walked (.venv, datasets/)
        dirs[:] = [
            d for d in dirs
            if in_context(rules, rel + d) or any(p.startswith(re.escape(rel + d)) for p in reincluded)
        ]  # fmt: skip
        out += [rel + f for f in files if in_context(rules, rel + f)]
    return sorted(out)


@pytest.fixture(scope="session")
def context_copy(tmp_path_factory) -> Path:
    """A folder holding exactly the files of the repository's Docker build context."""
    dest = tmp_path_factory.mktemp("context")
    for rel in build_context(REPO_ROOT):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / rel, dest / rel)
    return dest


@pytest.fixture(scope="session")
def built_wheel(context_copy, tmp_path_factory) -> tuple[Path, str]:
    """The wheel built from the Docker build context, and the build's output. Offline and fast: no build
    isolation (this environment's setuptools, which the [build-system] pins), no dependencies."""
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run(
        [*command, "-w", str(out), str(context_copy)], cwd=context_copy, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("ficco-*.whl")
    return wheel, done.stdout + done.stderr
