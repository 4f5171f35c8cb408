"""The ``ficco bench`` spellings of the release before ``ficco dataset card`` and ``ficco fleet``, rewritten
to the new ones with a warning that names them; they go in the next release. The mapping: docs/cli.md.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

import typer

FLAGS = ("--card-only", "--relabel", "--include-moe", "--resume", "--share-nodes")
"""Old options without a value."""
VALUED = ("--ray", "--emit", "--shard", "--shards", "--max-retries", "--image", "--limit", "--nproc")
"""Old options with one value."""
FLEET = ("--shards", "--share-nodes", "--max-retries", "--image")
"""Old options that are now a fleet verb's own."""
JOB_ARRAY_ENV = ("SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX")
"""A job array task's variables: ``ficco bench`` in one measured its shard."""


def _split(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The old options of ``args`` (flags as ``""``) and the other arguments, in order."""
    old: dict[str, str] = {}
    kept: list[str] = []
    tokens = iter(args)
    for token in tokens:
        name, eq, value = token.partition("=")
        if name in FLAGS:
            old[name] = ""
        elif name in VALUED:
            old[name] = value if eq else next(tokens, "")
        else:
            kept.append(token)
    return old, kept


def rewrite(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``args`` of ``ficco`` with an old ``ficco bench`` spelling rewritten (a warning on stderr names the
    new command); any other command line as it is."""
    at = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    if at is None or args[at] != "bench":
        return list(args)
    old, kept = _split(args[at + 1 :])
    in_array = "--shard" not in old and any(name in env for name in JOB_ARRAY_ENV)
    if not old and not in_array:
        return list(args)
    if "--include-moe" in old and "--ops" not in {k.partition("=")[0] for k in kept}:
        kept += ["--ops", "all"]
    kept += ["--sample", old["--limit"]] if "--limit" in old else []
    fleet = [x for name in FLEET if name in old for x in (name, old[name]) if x]
    if "--card-only" in old or "--relabel" in old:
        out = next((kept[i + 1] for i, a in enumerate(kept[:-1]) if a == "--out"), None)
        new = ["dataset", "card", *([out] if out else []), *(["--relabel"] if "--relabel" in old else [])]
    elif "--ray" in old:
        new = ["fleet", "run", old["--ray"], *fleet, *kept]
    elif "--emit" in old:
        new = ["fleet", "emit", old["--emit"], *fleet, *kept]
    elif "--shard" in old or in_array:
        new = ["fleet", "shard", *(["--shard", old["--shard"]] if "--shard" in old else []), *kept]
    else:
        new = ["bench", *kept]
    said = ", ".join(old) or "a job array task's environment"
    typer.echo(
        f"warning: `ficco bench` with {said} is the spelling of the last release and goes in the next one; "
        f"running `ficco {shlex.join(new)}`",
        err=True,
    )
    return [*args[:at], *new]
