"""Replay a forward, or a whole training step, from CUDA graphs: decide and warm up eagerly, then capture.

Two captures, replayed in turn, keep the copy-engine executor's double-buffered peer memory alternating
halves. Replay one ``GraphedCall`` at a time, and an even number of times before eager calls (docs/planner.md
says why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class GraphedCall:
    """``fn()`` captured into CUDA graphs after ``warmup`` eager calls; calling the object replays it.

    Parameters
    ----------
    fn : callable
        Takes no arguments: reads its inputs from tensors the caller refills before each replay (static
        inputs), and returns its output (a tensor or a structure of tensors).
    warmup : int, default=2
        Eager calls before the capture (>= 1: the planner must have decided every op).
    pool : optional
        A ``torch.cuda.graph_pool_handle()`` to share with other graphs; default: one pool for both captures.
    """

    def __init__(self, fn: Callable[[], Any], *, warmup: int = 2, pool: Any = None) -> None:
        if not (isinstance(warmup, int) and warmup >= 1):
            raise ValueError(
                f"GraphedCall.warmup must be an int >= 1 (eager calls before capture); got {warmup!r}"
            )
        if not torch.cuda.is_available():
            raise ValueError("GraphedCall needs CUDA: CUDA graphs capture GPU work only")
        # Warm up on a side stream, as PyTorch's whole-network capture does: a training step's gradient
        # accumulators take the stream they are first used on, and one left on the default stream breaks the
        # capture of a backward that reaches it.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.outputs: list[Any] = []
        for _ in range(2):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs.append(fn())
            self.graphs.append(graph)
        self._next = 0

    def __call__(self) -> Any:
        """Replay once (no host synchronisation); the output stays valid until the next replay."""
        i = self._next
        self._next ^= 1
        self.graphs[i].replay()
        return self.outputs[i]
