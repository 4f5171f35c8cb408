"""The fast inference path: XGBoost forests compiled into flat numpy arrays, every tree walked at once.

Each (schedule, mode) prunes the forests to trees over the scenario features; the distinct trees are walked
one level per step for every (scenario, tree) at once and summed in tree order, giving the same picks as
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
    """Leaf value of each node (0 for a split), float64 ``[M]``."""
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
            value=np.asarray(value, dtype=np.float64),
            depth=depth,
        )

    def leaves(self, X: np.ndarray) -> np.ndarray:
        """Leaf values of every tree on rows ``X`` ``[n, F]``: float64 ``[n, U]``."""
        n, f = X.shape
        flat = np.ascontiguousarray(X, dtype=np.float32).reshape(-1)
        left = self.left
        if n == 1:  # one scenario: every node's next node at once, then each step is one gather
            step = left + (np.take(flat, self.feature) >= self.threshold)  # take: a third faster than [...]
            node = self.roots
            for _ in range(self.depth):
                node = step.take(node)
            return self.value.take(node)[None, :]
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
    """Per mode, for each (schedule ``s``, booster ``g``) in turn, the positions in ``trees[mode]`` of the
    distinct trees standing for the booster's trees, in tree order, flattened: intp ``[S * sum(T_g)]``."""
    starts: np.ndarray
    """Where each (schedule, booster) segment of ``members`` starts, intp ``[S * G]``."""
    base_score: np.ndarray
    """Each booster's base score, float64 ``[G]``."""
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
        n_s = len(descriptors)
        sizes = np.tile([len(booster) for booster, _ in parsed], n_s)  # trees of each (schedule, booster)
        for mode, tail in modes.items():
            distinct: dict[Tree, int] = {}
            member: list[int] = []
            link = (linked or {}).get(mode)
            for s, row in enumerate(descriptors):
                fixed = {first + j: float(v) for j, v in enumerate([*row, *tail])}
                moved = None if link is None else {link[0]: first + int(link[1][s])}
                for booster, _ in parsed:
                    member += [distinct.setdefault(prune(t, fixed, moved), len(distinct)) for t in booster]
            trees[mode] = FlatTrees.from_trees(list(distinct))
            members[mode] = np.asarray(member, dtype=np.intp)
        return cls(
            trees=trees, members=members, starts=np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp),
            base_score=np.array([base for _, base in parsed]), n_schedules=n_s,
        )  # fmt: skip

    def predict(self, X: np.ndarray, mode: str) -> np.ndarray:
        """Margins of every schedule of scenario rows ``X`` ``[n, F]`` (wider in a mode with a linked column,
        see :meth:`compile`) in ``mode``: float64 ``[n, S, G]``."""
        trees = self.trees[mode]
        out = np.empty((len(X), len(self.starts)))
        step = max(1, CHUNK_CURSORS // len(trees.roots))
        for first in range(0, len(X), step):  # rows apart: the same sums in the same order, bounded memory
            leaves = trees.leaves(X[first : first + step])
            # reduceat adds each segment in tree order (sum's pairwise order may change with the batch shape)
            # (np.take gathers the members about twice as fast as leaves[:, members] on one row)
            out[first : first + step] = np.add.reduceat(
                np.take(leaves, self.members[mode], axis=1), self.starts, axis=1
            )
        return out.reshape(len(X), self.n_schedules, -1) + self.base_score
