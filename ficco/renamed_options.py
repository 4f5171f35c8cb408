"""Options renamed so that one thing has one spelling in every command: ``--model-root`` (the registry root,
as ``$FICCO_MODEL_ROOT`` names it) and ``--tp`` (the world size). The last release's spellings still run,
once more, as the new ones with a warning naming them; they go in the next release (docs/cli.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import typer

RENAMED: dict[str, dict[str, str]] = {
    "train": {"--registry": "--model-root"},
    "report": {"--registry": "--model-root"},
    "retrain": {"--registry": "--model-root"},
    "export": {"--registry": "--model-root"},
    "recommend": {"--world-size": "--tp"},
}
"""Per command: the last release's spelling of an option -> its spelling now."""


def rewrite(args: Sequence[str]) -> list[str]:
    """``args`` of ``ficco`` with a renamed option of its command spelt the new way (a warning on stderr
    names both); any other command line as it is."""
    at = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    if at is None or args[at] not in RENAMED:
        return list(args)
    command, renamed = args[at], RENAMED[args[at]]
    out = list(args[: at + 1])
    for token in args[at + 1 :]:
        name, eq, value = token.partition("=")
        if name in renamed:
            typer.echo(
                f"warning: `ficco {command} {name}` is the last release's spelling of `{renamed[name]}`; it "
                "goes in the next release",
                err=True,
            )
            token = renamed[name] + eq + value
        out.append(token)
    return out
