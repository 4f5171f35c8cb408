"""The fast inference path: XGBoost forests compiled into flat numpy arrays, every tree walked at once.

Each (schedule, mode) prunes the forests to trees over the scenario features; the distinct trees are walked
(row by row, or every (scenario, tree) cursor a level per step, whichever is cheaper for the forest) and
their leaves added in tree order as XGBoost adds them, giving bitwise the margins of
``xgboost.Booster.inplace_predict`` (``tests/training/test_fastpath.py``). See docs/training.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CHUNK_CURSORS = 1_000_000
"""Most (row, tree) cursors walked at once: a batch of 10,000 scenarios over 2,000 distinct trees walks in
chunks of 500 rows (about 30 MB of cursors and leaf values each)."""
ROW_WALK_NODES_PER_STEP = 3.5
""":meth:`FlatTrees.leaves` walks row by row (every node compared once a row) where the trees have fewer nodes
than this many times their count times their depth, and else moves every (row, tree) cursor together (four
gathers a level): measured on one core, a node costs the row walk about 4.3 ns and a cursor step the other
about 15 ns. On the h200x2 model the specialised forests walk row by row (eager: 77,500 nodes over 4,973
trees, 310-370 against 420-740 us a row for 2 to 256 rows), an unspecialised booster by cursors (9,000 nodes
over 100 trees: 39 against 7-12 us a row)."""
Tree = tuple
"""A tree as nested tuples: ``("leaf", value)`` or ``(feature, threshold, left, right)`` (hashable)."""


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class FlatTrees:
    """``U`` trees of ``M`` nodes in all, in flat arrays, walked together."""

    roots: np.ndarray
    """Node id of each tree's root, intp ``[U]``."""
    feature: np.ndarray
    """Split feature of each node (0 for a leaf), intp ``[M]``."""
    threshold: np.ndarray
    """Split threshold (go right when ``x >= threshold``; +inf for a leaf), float32 ``[M]``."""
    left: np.ndarray
    """Left child of each node (the right child is ``left + 1``; a leaf: itself), intp ``[M]``."""
    value: np.ndarray
    """Leaf value of each node (0 for a split), float32 ``[M]`` (XGBoost's leaf values are float32)."""
    depth: int
    """Steps that bring every cursor to a leaf (the deepest leaf's depth)."""

    @classmethod
    def from_trees(cls, trees: Sequence[Tree]) -> FlatTrees:
        """Flatten nested-tuple trees, each split's children in adjacent slots, an identical pair of child
        subtrees stored once (the trees pruned from one tree for different schedules share most of their
        subtrees: on the h200x2 fv3 model this halves the eager nodes a one-row walk compares)."""
        feature: list[int] = []
        threshold: list[float] = []
        left: list[int] = []
        value: list[float] = []
        pairs: dict[tuple[Tree, Tree], tuple[int, int]] = {}
        """(left subtree, right subtree) -> (slot of the left one, depth of the deeper one)."""

        def slot() -> int:
            feature.append(0), threshold.append(np.inf), left.append(0), value.append(0.0)
            return len(feature) - 1

        def fill(me: int, node: Tree) -> int:
            """Write ``node`` into slot ``me`` (its children placed); the depth of its deepest leaf."""
            if node[0] == "leaf":
                left[me], value[me] = me, node[1]
                return 0
            feature[me], threshold[me] = node[0], node[1]
            left[me], below = place(node[2], node[3])
            return below + 1

        def place(low: Tree, high: Tree) -> tuple[int, int]:
            found = pairs.get((low, high))
            if found is None:
                first = slot()
                slot()
                found = pairs[low, high] = (first, max(fill(first, low), fill(first + 1, high)))
            return found

        roots, depth = [], 0
        for tree in trees:
            roots.append(slot())
            depth = max(depth, fill(roots[-1], tree))
        return cls(
            roots=np.asarray(roots, dtype=np.intp),
            feature=np.asarray(feature, dtype=np.intp),
            threshold=np.asarray(threshold, dtype=np.float32),
            left=np.asarray(left, dtype=np.intp),
            value=np.asarray(value, dtype=np.float32),
            depth=depth,
        )

    def leaves(self, X: np.ndarray) -> np.ndarray:
        """Leaf values of every tree on rows ``X`` ``[n, F]``: float32 ``[n, U]``, by the cheaper of two
        walks (:data:`ROW_WALK_NODES_PER_STEP`)."""
        row_by_row = len(self.feature) < ROW_WALK_NODES_PER_STEP * len(self.roots) * self.depth
        flat = np.ascontiguousarray(X, dtype=np.float32)
        return self._row_by_row(flat) if row_by_row or len(flat) == 1 else self._cursors(flat)

    def _row_by_row(self, X: np.ndarray) -> np.ndarray:
        """:meth:`leaves` one row at a time: every node's next node for the row at once, then one gather per
        level (``take``: a third faster than ``[...]``)."""
        out = np.empty((len(X), len(self.roots)), dtype=np.float32)
        for i, row in enumerate(X):
            step = self.left + (np.take(row, self.feature) >= self.threshold)
            node = self.roots
            for _ in range(self.depth):
                node = step.take(node)
            out[i] = self.value.take(node)
        return out

    def _cursors(self, X: np.ndarray) -> np.ndarray:
        """:meth:`leaves` with every (row, tree) cursor moved one level per step."""
        n, f = X.shape
        flat, left = X.reshape(-1), self.left
        node = np.broadcast_to(self.roots, (n, len(self.roots)))
        base = np.arange(0, n * f, f, dtype=np.intp)[:, None]
        feature, threshold = self.feature, self.threshold
        for _ in range(self.depth):
            node = left[node] + (flat[base + feature[node]] >= threshold[node])
        return self.value[node]


def booster_trees(booster: Any) -> tuple[list[dict[str, Any]], float]:
    """The JSON trees of a fitted single-output ``xgboost.Booster`` and its base score (identity link);
    ``ValueError`` for a multi-output booster or categorical splits."""
    learner = json.loads(bytes(booster.save_raw("json")))["learner"]
    model = learner["gradient_booster"]["model"]
    if any(g != 0 for g in model["tree_info"]):
        raise ValueError("the fast path supports single-output boosters only; got a multi-output one")
    if any(tree.get("categories_nodes") for tree in model["trees"]):
        raise ValueError("the fast path does not support categorical splits")
    return model["trees"], float(learner["learner_model_param"]["base_score"].strip("[]"))


def prune(tree: dict[str, Any], fixed: dict[int, float], linked: dict[int, int] | None = None,
          node: int = 0) -> Tree:  # fmt: skip
    """``tree`` (XGBoost JSON) as nested tuples, with every split on a column of ``fixed`` (column ->
    value) resolved the way XGBoost would (float32 comparison), and every split on a column of ``linked``
    (pair column -> column of the scenario rows) moved to the column it names."""
    left = tree["left_children"][node]
    if left == -1:
        return ("leaf", tree["split_conditions"][node])
    column, cut = tree["split_indices"][node], tree["split_conditions"][node]
    right = tree["right_children"][node]
    if column in fixed:
        return prune(tree, fixed, linked, right if np.float32(fixed[column]) >= np.float32(cut) else left)
    if linked and column in linked:
        column = linked[column]
    return (column, cut, prune(tree, fixed, linked, left), prune(tree, fixed, linked, right))


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class SpecialisedForest:
    """``G`` boosters over pairs, specialised per (schedule, mode) into distinct trees over the scenario
    features (docs/training.md). ``S`` schedules, ``G`` boosters."""

    trees: dict[str, FlatTrees]
    """Per mode, its distinct pruned trees (a mode's one-row walk reads only its own nodes)."""
    members: dict[str, np.ndarray]
    """Per mode, the terms of each (schedule ``s``, booster ``g``)'s margin in the order XGBoost adds them,
    as positions in ``trees[mode]``: a tree of one leaf holding the booster's base score, the distinct trees
    standing for the booster's trees in tree order, then trees of one leaf of 0.0 up to the largest booster's
    count (adding 0.0 changes no sum); intp ``[1 + max(T_g), S * G]``, a column per (schedule, booster)."""
    n_schedules: int
    """``S``."""

    @classmethod
    def compile(
        cls,
        boosters: Sequence[Any],
        descriptors: np.ndarray,
        modes: dict[str, np.ndarray],
        first: int,
        *,
        linked: dict[str, tuple[int, Sequence[int]]] | None = None,
    ) -> SpecialisedForest:
        """Specialise ``boosters`` for every row of ``descriptors`` (``[S, d]``, the pair columns from
        ``first`` on) beside each mode's columns (``modes``: name -> values ``[e]``, the pair columns from
        ``first + d`` on).

        ``linked``: per mode, one pair column past those that varies with the scenario and the schedule
        both (fv3's ``eager_host_over_gpu`` in eager mode), and for each schedule ``s`` the extra scenario
        column ``c[s]`` its value is read from: its splits under schedule ``s`` read column ``first + c[s]``
        of the scenario rows, which :meth:`predict` then takes in that mode as ``[n, first + max(c) + 1]``
        (the features, then the column's values; schedules of equal values may share one, and then share
        their pruned trees).
        """
        parsed = [booster_trees(b) for b in boosters]
        trees, members = {}, {}
        width = max(len(booster) for booster, _ in parsed)
        for mode, tail in modes.items():
            distinct: dict[Tree, int] = {("leaf", 0.0): 0}
            member: list[list[int]] = []
            link = (linked or {}).get(mode)
            for s, row in enumerate(descriptors):
                fixed = {first + j: float(v) for j, v in enumerate([*row, *tail])}
                moved = None if link is None else {link[0]: first + int(link[1][s])}
                for booster, base in parsed:
                    own = [distinct.setdefault(t, len(distinct)) for t in
                           [("leaf", base), *(prune(t, fixed, moved) for t in booster)]]  # fmt: skip
                    member.append(own + [0] * (1 + width - len(own)))
            trees[mode] = FlatTrees.from_trees(list(distinct))
            members[mode] = np.asarray(member, dtype=np.intp).T.copy()
        return cls(trees=trees, members=members, n_schedules=len(descriptors))

    def predict(self, X: np.ndarray, mode: str) -> np.ndarray:
        """Margins of every schedule of scenario rows ``X`` ``[n, F]`` (wider in a mode with a linked column,
        see :meth:`compile`) in ``mode``, bitwise XGBoost's (:func:`xgboost_sum`): float64 ``[n, S, G]``."""
        trees, members = self.trees[mode], self.members[mode]
        out = np.empty((len(X), members.shape[1]))
        step = max(1, CHUNK_CURSORS // len(trees.roots))
        for first in range(0, len(X), step):  # rows apart: bounded memory
            leaves = trees.leaves(X[first : first + step])
            out[first : first + step] = xgboost_sum(np.take(leaves, members, axis=1))
        return out.reshape(len(X), self.n_schedules, -1)


def xgboost_sum(terms: np.ndarray) -> np.ndarray:
    """Margins as XGBoost's CPU predictor adds them, bitwise: ``terms`` ``[n, T, K]`` (float32: per margin
    ``k``, the base score and then each tree's leaf value, in tree order) added in float32 in index order
    along axis 1, float32 ``[n, K]``. numpy adds the slices of an axis other than the innermost one after
    another (along the innermost it may pair terms up), as ``tests/training/test_fastpath.py`` checks."""
    return np.add.reduce(terms, axis=1, dtype=np.float32)
