"""Files that readers see whole: written beside their place, flushed to disk, then renamed over it.

A reader (or a crash at any moment) finds the old file or the new one, never a part of one: the dataset's
manifest and plan while a sweep runs, the registry's ``CURRENT``, the benchmarks' results::

    write_text_atomic(out / "manifest.json", text)
    with replacing(out / "noise.parquet") as tmp:  # for writers that want a path
        frame.to_parquet(tmp)
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: str | Path, *, mode: int | None = None) -> Iterator[Path]:
    """A temporary path in ``path``'s folder to write the new content to; on a clean exit it is flushed
    to disk (``os.fsync``) and renamed over ``path`` (``os.replace``, atomic within a file system).

    On an error the temporary file is removed and ``path`` is left as it was. The temporary name is
    hidden and unique (``.<name>.<random>.tmp``), so concurrent writers do not write into each other's.
    ``mode`` sets the new file's permission bits; by default they are what ``open`` gives (0o666 less
    the umask).
    """
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
