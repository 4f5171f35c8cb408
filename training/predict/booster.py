"""A saved pair model read and evaluated with numpy alone, so that answering needs no XGBoost.

:func:`read_ubjson` decodes the UBJSON ``PairModel.save_model`` writes; :class:`NumpyBooster` offers the part
of ``xgboost.Booster`` answering uses (``save_raw("json")``, ``inplace_predict``, ``attr``, ``set_param``);
:func:`load_pair_model` picks the booster by what is installed, with the same answers either way.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from os import PathLike
from typing import Any

import numpy as np

from ficco.training.predict.fastpath import CHUNK_CURSORS, FlatTrees, booster_trees, prune, xgboost_sum
from ficco.training.predict.pairs import PAIR_FEATURE_NAMES_OF, check_Z, saved_pair_params

_NUMBERS = {b"i": ">b", b"U": ">B", b"I": ">h", b"l": ">i", b"L": ">q", b"d": ">f", b"D": ">d"}
"""UBJSON's number markers and their big-endian ``struct`` formats."""
_CONTAINER_END = {b"[": b"]", b"{": b"}"}


class _Reader:
    """A cursor over UBJSON bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def marker(self) -> bytes:
        if self.pos >= len(self.data):
            raise ValueError(f"UBJSON ends early at byte {self.pos}")
        self.pos += 1
        return self.data[self.pos - 1 : self.pos]

    def value(self, marker: bytes) -> Any:
        if marker in _NUMBERS:
            fmt = _NUMBERS[marker]
            (out,) = struct.unpack_from(fmt, self.data, self.pos)
            self.pos += struct.calcsize(fmt)
            return out
        if marker in (b"S", b"H"):
            text = self.text()
            return text if marker == b"S" else float(text)
        if marker == b"C":
            return self.text(1)
        if marker in _CONTAINER_END:
            return self.container(marker)
        simple = {b"Z": None, b"T": True, b"F": False}
        if marker in simple:
            return simple[marker]
        raise ValueError(f"unknown UBJSON marker {marker!r} at byte {self.pos - 1}")

    def text(self, length: int | None = None) -> str:
        length = self.value(self.marker()) if length is None else length
        self.pos += length
        return self.data[self.pos - length : self.pos].decode()

    def container(self, opening: bytes) -> list[Any] | dict[str, Any]:
        kind = count = None
        if self.data[self.pos : self.pos + 1] == b"$":
            self.pos += 1
            kind = self.marker()
        if self.data[self.pos : self.pos + 1] == b"#":
            self.pos += 1
            count = self.value(self.marker())
        if opening == b"[" and kind in _NUMBERS and count is not None:
            return self.numbers(kind, count)
        items: list[Any] = []
        while count is None or len(items) < count:
            if count is None and self.data[self.pos : self.pos + 1] == _CONTAINER_END[opening]:
                self.pos += 1
                break
            key = self.text() if opening == b"{" else None
            item = self.value(kind or self.marker())
            items.append(item if key is None else (key, item))
        return dict(items) if opening == b"{" else items

    def numbers(self, kind: bytes, count: int) -> list[Any]:
        """A typed array: floats as the decimal XGBoost's JSON writes (the shortest that reads back to the
        same float32), so the numbers equal ``json.loads(Booster.save_raw("json"))``'s."""
        array = np.frombuffer(self.data, np.dtype(_NUMBERS[kind]), count, self.pos)
        self.pos += array.nbytes
        if kind == b"d":
            return array.astype(np.float32).astype(str).astype(np.float64).tolist()
        return array.tolist()


def read_ubjson(data: bytes) -> Any:
    """The value UBJSON ``data`` encodes (objects as dicts, arrays as lists); ValueError if malformed."""
    reader = _Reader(bytes(data))
    try:
        out = reader.value(reader.marker())
    except (struct.error, UnicodeDecodeError, IndexError) as err:
        raise ValueError(f"malformed UBJSON at byte {reader.pos}: {err}") from None
    return out


class NumpyBooster:
    """The document of a saved XGBoost booster, with the inference part of ``xgboost.Booster``'s API."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.trees, self.base_score = booster_trees(self)
        self._flat: FlatTrees | None = None

    @classmethod
    def load(cls, path: str | PathLike) -> NumpyBooster:
        """Read a ``.ubj`` (UBJSON) model file XGBoost wrote; ValueError if it is not one."""
        with open(path, "rb") as f:
            document = read_ubjson(f.read())
        if not isinstance(document, dict) or "learner" not in document:
            raise ValueError(f"{path} is not an XGBoost model file")
        return cls(document)

    def save_raw(self, raw_format: str = "json") -> bytes:
        """The model as JSON bytes (the only format this reader writes)."""
        if raw_format != "json":
            raise ValueError(f"a NumpyBooster saves raw_format 'json' only; got {raw_format!r}")
        return json.dumps(self.document).encode()

    def attr(self, key: str) -> str | None:
        """A booster attribute (``ficco_estimator``, ``ficco_params``, ``ficco_feature_schema``)."""
        return self.document["learner"].get("attributes", {}).get(key)

    def set_param(self, params: dict[str, Any]) -> None:
        """Accepted and ignored: a numpy walk has no thread setting (``nthread``)."""

    def inplace_predict(self, Z: np.ndarray) -> np.ndarray:
        """Margins of pair rows ``Z`` ``[N, n_features]``: every tree walked, added to the base score in tree
        order as XGBoost adds them (``fastpath.xgboost_sum``); float64 ``[N]``."""
        if self._flat is None:  # the base score first, as a tree of one leaf: XGBoost adds it first
            trees = [("leaf", self.base_score), *(prune(tree, {}) for tree in self.trees)]
            self._flat = FlatTrees.from_trees(trees)
        Z = np.asarray(Z, dtype=np.float32)
        step = max(1, CHUNK_CURSORS // len(self._flat.roots))
        out = [self._margins(Z[i : i + step]) for i in range(0, len(Z), step)]
        return np.concatenate([*out, np.empty(0)]).astype(np.float64)

    def _margins(self, Z: np.ndarray) -> np.ndarray:
        """:meth:`inplace_predict` of a few rows: float32 ``[N]``."""
        terms = self._flat.leaves(Z).T  # [1 + T, N]: the base score and each tree's leaf, a row's in a column
        return xgboost_sum(np.ascontiguousarray(terms)[None])[0]


class SavedPairModel:
    """A ``PairModel`` read from its file for answering, without scikit-learn: the objective, feature schema
    and parameters it was saved with, and its booster (``xgboost.Booster`` or :class:`NumpyBooster`)."""

    def __init__(self, booster: Any, source: str) -> None:
        params, schema = saved_pair_params(booster, source)
        self.params: dict[str, Any] = params
        self.objective: str = self.params["objective"]
        self.n_estimators: int = self.params["n_estimators"]
        self.booster_ = booster
        self.feature_schema_ = schema
        self.n_features_in_ = len(PAIR_FEATURE_NAMES_OF[schema])

    def set_threads(self, threads: int) -> None:
        """Predict on ``threads`` CPU threads from now on (XGBoost's ``nthread``; the numpy walk has one)."""
        self.booster_.set_param({"nthread": threads})

    def predict(self, Z: Any) -> np.ndarray:
        """Raw outputs of pairs ``Z`` ``[N, n_features_in_]`` (``PairModel.predict``), float64 ``[N]``."""
        Z = check_Z(Z, self.n_features_in_, self.feature_schema_)
        return self.booster_.inplace_predict(Z) if len(Z) else np.empty(0)

    def cost(self, Z: Any) -> np.ndarray:
        """Lower is faster, float64 ``[N]``: the predicted log ratio, or the negated rank score."""
        out = self.predict(Z)
        return out if self.objective == "ratio" else -out


def load_pair_model(path: str | PathLike) -> Any:
    """The pair model saved at ``path``: a ``training.model.PairModel`` with scikit-learn and XGBoost, else a
    :class:`SavedPairModel` on XGBoost's booster (docs/training.md, "The fast path") or, without XGBoost, on
    a :class:`NumpyBooster`. ``ValueError`` (or XGBoost's error) for a file that is not a PairModel,
    ``FeatureSchemaError`` for another feature schema."""
    if importlib.util.find_spec("xgboost") is None:
        return SavedPairModel(NumpyBooster.load(path), str(path))
    if importlib.util.find_spec("sklearn") is not None:
        from ficco.training.model import PairModel

        return PairModel.load_model(path)
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(str(path))
    return SavedPairModel(booster, str(path))
