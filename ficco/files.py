"""Where ficco's files live, and files that readers see whole.

Roots: the shipped data (models, model configs) in the checkout or, read-only, inside the package; what
ficco writes goes to ``$FICCO_MODEL_ROOT`` or the checkout, else to ``$XDG_DATA_HOME/ficco``
(docs/install.md). Atomic files are written beside their place, flushed, then renamed over it, so a reader
(or a crash) finds the old file or the new one, never a part of one::

    write_text_atomic(out / "manifest.json", text)
    with replacing(out / "noise.parquet") as tmp:  # for writers that want a path
        frame.to_parquet(tmp)
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ficco import CHECKOUT

SHIPPED = CHECKOUT or Path(__file__).resolve().parent
"""Where the shipped ``models/`` (the registry) and ``datasets/`` (model configs) lie: the checkout, or the
installed ``ficco`` package (read-only: site-packages may belong to root, and an upgrade replaces it)."""
SHIPPED_MODELS = SHIPPED / "models"
MODEL_ROOT_ENV = "FICCO_MODEL_ROOT"
"""The variable naming the model registry to read and write."""


def user_data_dir() -> Path:
    """``$XDG_DATA_HOME/ficco``, by default ``~/.local/share/ficco``: what an installed ficco writes."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "ficco"


def work_root() -> Path:
    """The folder commands write their outputs under by default (``datasets/<hardware>`` of ``bench``,
    ``runs/retrain/`` of ``retrain``): the checkout, else :func:`user_data_dir`."""
    return CHECKOUT or user_data_dir()


def model_root() -> Path:
    """The registry answers come from: ``$FICCO_MODEL_ROOT``; else the checkout's ``models/``; else the
    user's registry (``user_data_dir()/models``) once a training command has made one, else the
    shipped one."""
    if os.environ.get(MODEL_ROOT_ENV):
        return Path(os.environ[MODEL_ROOT_ENV])
    user = user_data_dir() / "models"
    return SHIPPED_MODELS if CHECKOUT or not user.is_dir() else user


def writable_model_root() -> Path:
    """The registry ``train`` and ``retrain`` write to: ``$FICCO_MODEL_ROOT``; else the checkout's
    ``models/``; else the user's registry, made on first use as a copy of the shipped one (its models stay
    the answers for their hardware until a better one is promoted beside them)."""
    if os.environ.get(MODEL_ROOT_ENV) or CHECKOUT:
        return model_root()
    user = user_data_dir() / "models"
    if not user.is_dir():
        user.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".models-", dir=user.parent))
        try:
            shutil.copytree(SHIPPED_MODELS, tmp, dirs_exist_ok=True)
            tmp.chmod(0o755)
            os.replace(tmp, user)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if not user.is_dir():  # else another process made it first
                raise
    return user


@contextmanager
def replacing(path: str | Path, *, mode: int | None = None) -> Iterator[Path]:
    """A temporary path in ``path``'s folder to write the new content to; on a clean exit it is flushed
    to disk (``os.fsync``) and renamed over ``path`` (``os.replace``, atomic within a file system); on an
    error it is removed and ``path`` is left as it was. The name is hidden and unique
    (``.<name>.<random>.tmp``), so concurrent writers do not collide. ``mode``: the new file's permission
    bits (default: what ``open`` gives, 0o666 less the umask)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` through :func:`replacing` (``mode``: the file's permission bits)."""
    with replacing(path, mode=mode) as tmp:
        tmp.write_text(text)
