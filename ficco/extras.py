"""What each ``ficco`` command needs beyond the core install, and the one line a missing piece gives.

The core (numpy, typer, pydantic) answers ``recommend``, ``score`` and ``version``; the extras of
pyproject.toml add the rest (docs/install.md). A command whose extra is missing stops before it starts with
one ``error:`` line naming the ``pip install`` that fits how ficco is installed (:func:`install_command`),
exit status 1; an import that fails later gives the same line instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DATA_MODULES = ("pandas", "pyarrow", "scipy", "matplotlib", "tqdm")
"""What reading and writing datasets needs (parquet, cards, plots, the simulator's fit, progress bars): the
``data`` extra, which ``train`` and ``executor`` include."""

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "service": ("fastapi", "uvicorn", "httpx", "prometheus_client", "swagger_ui_bundle"),
    "data": DATA_MODULES,
    "train": (*DATA_MODULES, "xgboost", "sklearn"),
    "executor": (*DATA_MODULES, "torch"),
    "fleet": ("ray", *DATA_MODULES),
}
"""The top-level modules each extra of pyproject.toml installs; a module several install is named by the
smallest (the first here) unless the command's own extra installs it."""

COMMAND_EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "serve": ("service", EXTRA_MODULES["service"]),
    "train": ("train", EXTRA_MODULES["train"]),
    "evaluate": ("train", EXTRA_MODULES["train"]),
    "report": ("train", EXTRA_MODULES["train"]),
    "retrain": ("train", EXTRA_MODULES["train"]),
    "export": ("train", EXTRA_MODULES["train"]),
    "bench": ("executor", DATA_MODULES),
    "fleet shard": ("executor", DATA_MODULES),
    "fleet run": ("fleet", EXTRA_MODULES["fleet"]),
    "fleet emit": ("data", DATA_MODULES),
    "dataset card": ("data", DATA_MODULES),
    "dataset compare": ("data", DATA_MODULES),
    "dataset gather": ("data", DATA_MODULES),
    "host-factor": ("executor", EXTRA_MODULES["executor"]),
}
"""Per command: the extra to install for it and the modules checked before it starts. ``bench`` and
``retrain`` simulate without torch (``--backend sim``); the torch a GPU sweep needs is reported when it is
first imported, before any rank starts. :func:`command_extra` adjusts this to the command's options."""


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""PyTorch's CPU wheel index (the Makefile's ``TORCH_CPU_INDEX``): where a machine without a GPU gets torch,
so that nothing pulls PyPI's CUDA build and its ``nvidia-*`` wheels (about 3 GB)."""


class MissingExtraError(RuntimeError):
    """An optional dependency is not installed; the message is the one line to print."""


def command_extra(
    command: str, options: Mapping[str, Any] | None = None
) -> tuple[str, tuple[str, ...]] | None:
    """(extra, modules checked before the start) of ``command`` run with ``options`` (its parsed options),
    None for a command of the core: ``bench --backend sim`` needs only ``data``."""
    backend = (options or {}).get("backend")
    if command == "bench" and str(getattr(backend, "value", backend)) == "sim":
        return ("data", DATA_MODULES)
    return COMMAND_EXTRAS.get(command)


def torch_requirement() -> str:
    """The torch requirement of the extras that bring torch (``executor``), e.g. ``torch<2.14,>=2.5``: from
    the installed distribution's metadata, else the checkout's ``pyproject.toml``, else ``torch``."""
    from importlib import metadata

    extras = [extra for extra, modules in EXTRA_MODULES.items() if "torch" in modules]
    try:
        requires = metadata.requires("ficco") or []
    except metadata.PackageNotFoundError:
        requires = []
    found = [r.split(";")[0].strip() for r in requires if any(f'extra == "{e}"' in r for e in extras)]
    if not found:
        import tomllib

        from ficco import CHECKOUT

        if CHECKOUT is not None:
            optional = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"][
                "optional-dependencies"
            ]
            found = [r for extra in extras for r in optional[extra]]
    return next((r for r in found if re.match(r"torch(?![\w.-])", r)), "torch")


def install_command(extra: str) -> str:
    """The ``pip install`` that adds ``extra`` to this ficco: ``pip install -e '<checkout>[extra]'`` (``.``
    when run from the checkout) for a source checkout, ``pip install 'ficco[extra]'`` for an installed
    one; with ``<this python> -m pip`` when the ``pip`` on PATH is not this environment's. An extra that
    brings torch, on a machine without a GPU (no ``nvidia-smi``) and without torch, first installs torch's
    CPU build from :data:`TORCH_CPU_INDEX` (as ``make test`` does), which the extra then keeps."""
    from ficco import CHECKOUT

    if CHECKOUT is not None:
        here = Path.cwd().resolve() == CHECKOUT.resolve()
        target = f"-e '{'.' if here else CHECKOUT}[{extra}]'"
    else:
        target = f"'ficco[{extra}]'"
    pip = shutil.which("pip")
    same_env = pip is not None and Path(pip).parent == Path(sys.executable).parent
    pip = "pip" if same_env else f"{sys.executable} -m pip"
    command = f"{pip} install {target}"
    cpu_only = shutil.which("nvidia-smi") is None and importlib.util.find_spec("torch") is None
    if "torch" in EXTRA_MODULES.get(extra, ()) and cpu_only:
        return f"{pip} install '{torch_requirement()}' --index-url {TORCH_CPU_INDEX} && {command}"
    return command


def missing_message(command: str | None, module: str, options: Mapping[str, Any] | None = None) -> str | None:
    """``ficco <command> needs <module>, which `pip install ...[<extra>]` installs``: the command's extra
    when it installs ``module``, else the first extra that does; None when none does (a broken
    installation, not a missing extra)."""
    extras = [e for e, modules in EXTRA_MODULES.items() if module in modules]
    if not extras:
        return None
    own = command_extra(command or "", options)
    extra = own[0] if own and own[0] in extras else extras[0]
    who = f"ficco {command}" if command else "ficco"
    return f"{who} needs {module}, which `{install_command(extra)}` installs"


def require(command: str, options: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`MissingExtraError` naming the first module ``command`` run with ``options`` starts
    with (:func:`command_extra`) that is not installed."""
    own = command_extra(command, options)
    for module in own[1] if own else ():
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(missing_message(command, module, options))


def require_modules(modules: tuple[str, ...]) -> None:
    """Raise ``ModuleNotFoundError`` for the first of ``modules`` not installed, before work that would need
    it starts elsewhere (the ranks of a torchrun job): the command then gives its one line (``ficco.cli``)
    instead of every rank crashing."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
