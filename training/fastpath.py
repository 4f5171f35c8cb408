"""The fast inference path: XGBoost forests compiled into flat numpy arrays, every tree walked at once.

The reference path is ``xgboost.Booster.inplace_predict``; it costs a few hundred microseconds per call
whatever the batch, which dominates a single-scenario decision (about 30 pairs). Here the forest, read
from the booster's JSON dump, becomes one array per node field with the nodes of every tree numbered so
that a split's two children are adjacent (right = left + 1), and a leaf points to itself with an
infinite threshold. One step moves every (pair, tree) cursor one level down::

    node = left[node] + (x[pair, feature[node]] >= threshold[node])

and after ``max_depth`` steps every cursor rests on its leaf. ``tests/training/test_fastpath.py`` checks
that the picks equal the reference path's on a whole dataset; ``benchmarks/predict_fastpath.py`` times it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class CompiledForest:
    """``G`` forests (one per booster) of ``T`` trees and ``M`` nodes in all, walked together, for the
    margins ``[N, G]`` of float32 inputs ``[N, P]``."""

    roots: np.ndarray
    """Node id of each tree's root, intp ``[T]``."""
    feature: np.ndarray
    """Split feature of each node (0 for a leaf), intp ``[M]``."""
    threshold: np.ndarray
    """Split threshold (go right when ``x >= threshold``; +inf for a leaf), float32 ``[M]``."""
    left: np.ndarray
    """Left child of each node (the right child is ``left + 1``; a leaf: itself), intp ``[M]``."""
    value: np.ndarray
    """Leaf value of each node (0 for a split), float64 ``[M]``."""
    depth: int
    """Steps that bring every cursor to a leaf (the deepest leaf's depth)."""
    base_score: np.ndarray
    """Margin added to the sum of each forest's leaves, float64 ``[G]``."""
    starts: np.ndarray
    """Index of each forest's first tree, intp ``[G]`` (trees are stored forest by forest)."""

    @classmethod
    def from_boosters(cls, boosters: Sequence[Any]) -> CompiledForest:
        """Compile fitted ``xgboost.Booster`` objects with an identity link (``reg:squarederror``,
        ``rank:*``), one output column each.

        Raises ``ValueError`` for a booster of more than one output group or with categorical splits.
        """
        roots: list[int] = []
        feature: list[int] = []
        threshold: list[float] = []
        left: list[int] = []
        value: list[float] = []
        base, starts, depth = [], [], 0
        for booster in boosters:
            learner = json.loads(bytes(booster.save_raw("json")))["learner"]
            model = learner["gradient_booster"]["model"]
            if any(g != 0 for g in model["tree_info"]):
                raise ValueError("CompiledForest supports single-output boosters only; got a multi-class one")
            base.append(float(learner["learner_model_param"]["base_score"].strip("[]")))
            starts.append(len(roots))
            depth = max(depth, _add_trees(model["trees"], roots, feature, threshold, left, value))
        return cls(
            roots=np.asarray(roots, dtype=np.intp),
            feature=np.asarray(feature, dtype=np.intp),
            threshold=np.asarray(threshold, dtype=np.float32),
            left=np.asarray(left, dtype=np.intp),
            value=np.asarray(value, dtype=np.float64),
            depth=depth,
            base_score=np.asarray(base),
            starts=np.asarray(starts, dtype=np.intp),
        )

    def predict(self, Z: np.ndarray) -> np.ndarray:
        """Margins of pairs ``Z`` (float32 ``[N, P]``, no NaN) under each forest, float64 ``[N, G]``."""
        Z = np.ascontiguousarray(Z, dtype=np.float32)
        n, p = Z.shape
        if n == 0:
            return np.empty((0, len(self.starts)))
        flat = Z.reshape(-1)
        base = np.arange(0, n * p, p, dtype=np.intp)[:, None]
        node = np.broadcast_to(self.roots, (n, len(self.roots)))
        feature, threshold, left = self.feature, self.threshold, self.left
        for _ in range(self.depth):
            node = left[node] + (flat[base + feature[node]] >= threshold[node])
        return np.add.reduceat(self.value[node], self.starts, axis=1) + self.base_score


def _add_trees(
    trees: list[dict[str, Any]],
    roots: list[int],
    feature: list[int],
    threshold: list[float],
    left: list[int],
    value: list[float],
) -> int:
    """Append the nodes of XGBoost JSON ``trees`` to the flat lists; return the deepest tree's depth."""
    depth = 0
    for tree in trees:
        if tree.get("categories_nodes"):
            raise ValueError("CompiledForest does not support categorical splits")
        offset = len(feature)
        order, tree_depth = _renumber(tree["left_children"], tree["right_children"])
        depth = max(depth, tree_depth)
        roots.append(offset)
        new_id = {old: i for i, old in enumerate(order)}
        for old in order:
            l_child = tree["left_children"][old]
            if l_child == -1:
                feature.append(0)
                threshold.append(np.inf)
                left.append(offset + new_id[old])
                value.append(tree["split_conditions"][old])
            else:
                feature.append(tree["split_indices"][old])
                threshold.append(tree["split_conditions"][old])
                left.append(offset + new_id[l_child])
                value.append(0.0)
    return depth


def _renumber(left: list[int], right: list[int]) -> tuple[list[int], int]:
    """Breadth-first order of one tree's nodes with each split's children adjacent, and the tree's depth."""
    order, level, depth = [0], [0], 0
    while True:
        children = [c for n in level if left[n] != -1 for c in (left[n], right[n])]
        if not children:
            return order, depth
        order += children
        level = children
        depth += 1
