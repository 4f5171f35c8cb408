"""Replaying a training step captured in a CUDA graph, for the GPU tests that compare its gradients with
the eager step's."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch


def replayed_grads(
    graphed: Callable[[], None], leaves: list[torch.Tensor], replays: int = 2
) -> Iterator[tuple[int, list[torch.Tensor]]]:
    """``(replay, gradients of leaves)`` after each of ``replays`` replays of ``graphed`` (a captured step
    that writes the ``leaves``' gradients in place); the gradients are filled with NaN before each replay,
    so one that the replay left unwritten shows as NaN."""
    for replay in range(replays):
        for leaf in leaves:
            leaf.grad.fill_(float("nan"))
        graphed()
        torch.cuda.synchronize()
        yield replay, [leaf.grad for leaf in leaves]
