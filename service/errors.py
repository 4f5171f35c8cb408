"""The service's errors and the one error-item shape every 422 uses.

The engine and the scoring code raise these (they know nothing of HTTP); ``service.main`` maps them to
status codes (422, 404, 503) and the commands print them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from ficco.service.schemas import ALLOWED

MAX_INPUT_CHARS = 200
"""Longest bad value echoed back in an error (longer ones are cut, so a bad 4 MiB body is not echoed)."""


class NoModelError(RuntimeError):
    """No model is loaded at all (empty registry, or every load failed)."""


class UnknownHardwareError(LookupError):
    """A hardware id no profile has (built-in, served or registered): 404 everywhere. ``known_ids`` lists the
    ids a request may name (``service.core.store.known_ids``), the same on every route."""

    def __init__(self, message: str, known_ids: list[str]) -> None:
        super().__init__(message)
        self.known_ids = known_ids


class NotServedError(LookupError):
    """A known hardware id that no served model answers at the world size asked: a 422 at that field
    (``world_size``, or ``tp``) everywhere. The message is one line naming what is served and the ways
    forward; ``allowed`` the world sizes the id is answered at."""

    def __init__(self, message: str, allowed: str) -> None:
        super().__init__(message)
        self.allowed = allowed

    def at(self, loc: Sequence[str | int], world_size: int) -> dict[str, Any]:
        """The error item of this refusal at ``loc`` (the world-size field of a request)."""
        return field_error(loc, world_size, str(self), "not_served", self.allowed)


def error_line(errors: Sequence[dict[str, Any]]) -> str:
    """Error items (:func:`field_error`) as one line, ``field: msg (got input)`` each (the input where the
    message does not name it already), ``; ``-separated: what ``ficco`` prints after ``error:``, an
    ``InvalidFieldsError`` says and ``ServiceError``'s message holds."""
    parts = []
    for e in errors:
        msg, value = str(e.get("msg")), e.get("input")
        got = f" (got {value!r})" if value is not None and "got " not in msg else ""
        parts.append(f"{e.get('field') or 'body'}: {msg}{got}")
    return "; ".join(parts)


class InvalidFieldsError(ValueError):
    """Request fields that break a rule checked past the schema (e.g. ``m`` divisible by ``world_size``).

    ``errors`` holds :func:`field_error` items.
    """

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(error_line(errors))
        self.errors = errors


def encodable(text: str) -> str:
    """``text`` with lone UTF-16 surrogates (valid JSON escapes, not encodable as UTF-8) as ``\\udXXX``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def short_input(value: Any) -> Any:
    """``value`` as JSON-safe and short: non-finite floats, bytes, long or nested values become strings.

    Strings lose lone surrogates (``encodable``), so echoing a bad value can never fail to encode.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    except (RecursionError, ValueError):  # nested too deeply to print, or a circular reference
        text = f"<a {type(value).__name__} nested too deeply to show>"
    text = encodable(text)
    return text if len(text) <= MAX_INPUT_CHARS else text[:MAX_INPUT_CHARS] + "..."


def field_error(
    loc: Sequence[str | int], value: Any, msg: str, type_: str = "value_error", allowed: str | None = None
) -> dict[str, Any]:
    """One error item: where (``loc`` and dotted ``field``), the bad value, the message and what is allowed.

    ``allowed`` defaults to the field's entry in ``schemas.ALLOWED``.
    """
    loc = list(loc)
    names = [str(part) for part in loc[1:]] if loc[:1] == ["body"] else [str(part) for part in loc]
    name = next((part for part in reversed(loc) if isinstance(part, str)), None)  # a list item: its list
    return {
        "loc": loc,
        "field": ".".join(names) or "body",
        "input": short_input(value),
        "msg": encodable(re.sub(r"^Value error, ", "", msg)),
        "type": type_,
        "allowed": allowed or ALLOWED.get(name),
    }


def rule_error(loc: Sequence[str | int], value: Any, msg: str) -> dict[str, Any]:
    """An error item for a value that breaks a rule across fields (``m`` divisible by ``world_size``, tokens
    a multiple of tp): its ``allowed`` is the rule the message states, not the field's own range (which the
    value may well lie in)."""
    rule = re.sub(r"^Scenario\.", "", re.sub(r"; got .*$", "", msg, flags=re.DOTALL))
    return field_error(loc, value, msg, allowed=rule)


def from_pydantic(error: dict[str, Any]) -> dict[str, Any]:
    """Convert one pydantic / FastAPI validation error to the service's error item.

    Three errors are re-worded: malformed JSON (FastAPI puts the character offset in ``loc``), a body
    that is not JSON at all (no JSON content type: FastAPI passes the raw bytes on) and a non-finite
    number (pydantic reports NaN as failing the bound it cannot be compared with).
    """
    loc, value = error.get("loc", ()), error.get("input")
    msg, kind = str(error.get("msg", "")), error.get("type", "")
    if kind == "json_invalid":
        position = loc[-1] if loc else None
        reason = (error.get("ctx") or {}).get("error", msg)
        where = f" at character position {position}" if isinstance(position, int) else ""
        return field_error(["body"], None, f"invalid JSON{where}: {reason}", kind)
    if isinstance(value, bytes) and list(loc) == ["body"]:
        return field_error(
            ["body"], value, "the body must be a JSON object sent with 'content-type: application/json'", kind
        )
    if isinstance(value, float) and not math.isfinite(value):
        return field_error(loc, value, f"must be a finite number; got {value}", "finite_number")
    return field_error(loc, value, msg, kind)


_FIELD = re.compile(r"^Scenario\.(\w+)")


def scenario_error(err: ValueError, loc: Sequence[str | int], values: dict[str, Any]) -> dict[str, Any]:
    """Turn a ``features.Scenario`` ValueError into an error item located at the field it names.

    Feature errors start with ``Scenario.<field>`` (features/_validate.py), which locates the field.
    """
    match = _FIELD.match(str(err))
    name = match.group(1) if match and match.group(1) in values else None
    if name is None:
        return rule_error(loc, values, str(err))
    return rule_error([*loc, name], values[name], str(err))
