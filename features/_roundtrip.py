"""The JSON round trip the vocabulary dataclasses share (``HardwareProfile``, ``Schedule``, ``Scenario``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Self

from ficco.features._validate import check_keys


class JsonRoundTrip:
    """``to_dict``/``from_dict`` by the dataclass's fields (an unknown key is refused, naming the class and
    the allowed keys) and ``to_json``/``from_json`` (sorted keys). A class whose fields need converting
    from JSON values overrides :meth:`_from_json_values`."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        check_keys(cls.__name__, data, (f.name for f in dataclasses.fields(cls)))
        return cls(**cls._from_json_values(data))

    @classmethod
    def _from_json_values(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments from checked JSON ``data`` (as they are, by default)."""
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))
