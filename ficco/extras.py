"""What each ``ficco`` command needs beyond the core install, and the one line a missing piece gives.

The core (numpy, typer, pydantic) answers ``recommend``, ``score`` and ``version``. The extras of
pyproject.toml add the rest::

    pip install 'ficco[service]'    # ficco serve
    pip install 'ficco[train]'      # ficco train, evaluate, report, retrain --backend sim
    pip install 'ficco[executor]'   # ficco bench, host-factor (torch; the GPU machine's image brings its own)

A command whose extra is missing stops before it starts with ``error: ficco bench needs tqdm, which
`pip install 'ficco[executor]'` installs`` and exit status 1, and an import that fails later (a code path
the table does not foresee) gives the same line instead of a traceback.
"""

from __future__ import annotations

import importlib.util

DATA_MODULES = ("pandas", "pyarrow", "scipy", "matplotlib", "tqdm")
"""What reading and writing datasets needs (parquet, cards, plots, the simulator's fit, progress bars); the
``train`` and ``executor`` extras both install it."""

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "service": ("fastapi", "uvicorn", "httpx", "prometheus_client", "swagger_ui_bundle"),
    "train": (*DATA_MODULES, "xgboost", "sklearn"),
    "executor": (*DATA_MODULES, "torch"),
}
"""The top-level modules each extra of pyproject.toml installs."""

COMMAND_EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "serve": ("service", EXTRA_MODULES["service"]),
    "train": ("train", EXTRA_MODULES["train"]),
    "evaluate": ("train", EXTRA_MODULES["train"]),
    "report": ("train", EXTRA_MODULES["train"]),
    "retrain": ("train", EXTRA_MODULES["train"]),
    "export": ("train", EXTRA_MODULES["train"]),
    "bench": ("executor", DATA_MODULES),
    "host-factor": ("executor", EXTRA_MODULES["executor"]),
}
"""Per command: the extra to install for it and the modules checked before it starts. ``bench`` and
``retrain`` simulate without torch (``--backend sim``); the torch a GPU sweep needs is reported when it is
first imported, before any rank starts."""


class MissingExtraError(RuntimeError):
    """An optional dependency is not installed; the message is the one line to print."""


def missing_message(command: str | None, module: str) -> str | None:
    """``ficco <command> needs <module>, which `pip install 'ficco[<extra>]'` installs``: the command's extra
    when it installs ``module``, else the first extra that does; None when none does (a broken
    installation, not a missing extra)."""
    own = COMMAND_EXTRAS.get(command or "", (None, ()))[0]
    extras = [e for e, modules in EXTRA_MODULES.items() if module in modules]
    if own in extras:
        extras = [own]
    if not extras:
        return None
    who = f"ficco {command}" if command else "ficco"
    return f"{who} needs {module}, which `pip install 'ficco[{extras[0]}]'` installs"


def require(command: str) -> None:
    """Raise :class:`MissingExtraError` naming the first module ``command`` starts with
    (:data:`COMMAND_EXTRAS`) that is not installed."""
    for module in COMMAND_EXTRAS.get(command, (None, ()))[1]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(missing_message(command, module))


def require_modules(modules: tuple[str, ...]) -> None:
    """Raise ``ModuleNotFoundError`` for the first of ``modules`` not installed, before work that would need
    it starts elsewhere (the ranks of a torchrun job): the command then gives its one line (``ficco.cli``)
    instead of every rank crashing."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
