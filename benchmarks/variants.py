"""Named variants of one collective call, timed against each other: the machinery the benchmarks of a
collective alone share (``a2a_bench``, ``copy_arrangements``).

- :func:`time_variants`: interleaved rounds, each visiting the variants in a freshly shuffled order (the same
  on every rank); before each timed repetition the ranks are aligned (a one-element all-reduce, then a host
  synchronisation, outside the timed region); a repetition is one call of the variant's closure (usually
  ``CALLS`` calls, :func:`repeat`) between CUDA events (CPU: the host clock); per round the maximum over
  ranks; a variant's time is the median over rounds, with the host time to issue it beside.
- :func:`graphed`: a closure captured into a CUDA graph (its replay); :func:`agreed_reasons`: why variants
  do not run, merged over ranks.
- :class:`BatchedCopies`: the copy-engine collective as one ``cudaMemcpyBatchAsync`` of every copy, then the
  executor's device barrier (CUDA runtime >= 13, through ctypes: torch exposes no batched copy).
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ficco.rounds import interleaved_rounds

CALLS = 2
"""Back-to-back calls per timed repetition: even, so that a captured graph's replays keep alternating the
copy-engine executor's double-buffered halves."""
FAILED_CAPTURES: list = []
"""CUDA graphs whose capture raised (see :func:`graphed`)."""


def repeat(one: Callable[[], object], calls: int = CALLS) -> Callable[[], None]:
    """A closure running ``one`` ``calls`` times."""

    def run() -> None:
        for _ in range(calls):
            one()

    return run


def time_variants(
    variants: dict[str, Callable[[], None]], *, rounds: int, seed: object, device, calls: int = CALLS
) -> dict[str, tuple[float, float]]:
    """``{name: (ms per call, host ms per call)}``, medians over ``rounds`` interleaved rounds (the module
    docstring); every rank calls it with the same variants, in the same order."""
    import torch
    import torch.distributed as dist

    token = torch.zeros(1, device=device)
    cuda = device.type == "cuda"
    times: dict[str, list[float]] = {v: [] for v in variants}
    host: dict[str, list[float]] = {v: [] for v in variants}

    def align() -> None:
        dist.all_reduce(token)
        if cuda:
            torch.cuda.synchronize()

    def run_round(order: list[str]) -> None:
        local = []
        for name in order:
            call = variants[name]
            align()
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                t0 = time.perf_counter()
                call()
                issued = time.perf_counter() - t0
                end.record()
                end.synchronize()
                ms = begin.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                call()
                issued = time.perf_counter() - t0
                ms = 1e3 * issued
            local.append((name, ms / calls, 1e3 * issued / calls))
        flat = torch.tensor([v for _, ms, hs in local for v in (ms, hs)], dtype=torch.float64, device=device)
        dist.all_reduce(flat, op=dist.ReduceOp.MAX)
        for j, (variant, _, _) in enumerate(local):
            times[variant].append(flat[2 * j].item())
            host[variant].append(flat[2 * j + 1].item())

    interleaved_rounds(list(variants), run_round, rounds=rounds, seed=seed)
    return {v: (statistics.median(times[v]), statistics.median(host[v])) for v in variants if times[v]}


def graphed(calls: Callable[[], None]) -> Callable[[], None]:
    """``calls`` (already run eagerly) captured into a CUDA graph; its replay."""
    import torch

    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(graph):
            calls()
    except Exception:
        # torch 2.11 aborts the process when a graph whose capture failed is destroyed (its destructor
        # unregisters it from the RNG state a second time): such graphs live until the process ends.
        FAILED_CAPTURES.append(graph)
        raise
    torch.cuda.synchronize()

    def replay() -> None:
        graph.replay()

    return replay


def exit_keeping_failed_captures() -> None:
    """End the process without destroying :data:`FAILED_CAPTURES` (which would abort it) when there are
    any: call it last in a tool's ``__main__``, after its results are on disk."""
    if FAILED_CAPTURES:
        sys.stdout.flush()
        os._exit(0)


def agreed_reasons(reasons: dict[str, str]) -> dict[str, str]:
    """Every rank's reasons merged (a variant that failed anywhere is left out everywhere)."""
    import torch.distributed as dist

    every: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(every, reasons)
    merged: dict[str, str] = {}
    for rank, found in enumerate(every):
        for name, why in (found or {}).items():
            merged.setdefault(name, f"rank {rank}: {why}")
    return merged


def attempt(fn: Callable[[], str]) -> str:
    """``fn()`` (a reason, or ``""``), or the exception it raised as ``"Type: message"``."""
    try:
        return fn()
    except Exception as err:
        return f"{type(err).__name__}: {err}"


class BatchedCopies:
    """One call of a copy-engine collective with every copy in one ``cudaMemcpyBatchAsync``, then the
    executor's device barrier, into the executor's peer memory (its double-buffered halves, as
    ``executor.communicate`` uses them). ``layout`` (``executor.plan.Layout``, one sub-chunk per block) says
    which rows of ``x`` go where; ``keep_own`` copies the block this rank keeps too (what the all-to-all's
    ``communicate`` does; the all-gather's leaves it in place). CUDA runtime >= 13 only: its signature has no
    ``failIdx`` (12.8 and 12.9 differ)."""

    def __init__(self, x, layout, *, keep_own: bool) -> None:
        import torch

        from ficco.executor.context import get_context
        from ficco.executor.plan import Piece

        self._fn, self._attrs = _memcpy_batch()
        ctx = get_context(None, x.device)
        width, itemsize = x.shape[1], x.element_size()
        self.workspace = ctx.get_workspace(max(layout.dest_rows) * width * itemsize, what="batched copies")
        row_bytes = width * itemsize
        self._batches: dict[int, tuple] = {}
        for _ in range(2):  # one pointer list per half
            remote = [self.workspace.rows(q, width, x.dtype) for q in range(ctx.world_size)]
            own_source, own_dest = layout.own_block()
            copies = [(remote[ctx.rank][own_dest], x[own_source])] if keep_own else []
            for offset in range(1, ctx.world_size):
                piece = Piece(offset=offset, sub=0)
                copies.append((remote[layout.peer_to(piece)][layout.remote(piece)], x[layout.sent(piece)]))
            copies = [(d, s) for d, s in copies if s.numel()]
            count = len(copies)
            self._batches[self.workspace.parity] = (
                (ctypes.c_void_p * count)(*[d.data_ptr() for d, _ in copies]),
                (ctypes.c_void_p * count)(*[s.data_ptr() for _, s in copies]),
                (ctypes.c_size_t * count)(*[s.shape[0] * row_bytes for _, s in copies]),
                count,
            )
            self.workspace.advance()
        self._views_alive = x  # the source rows the pointers address
        self._index = ctypes.c_size_t(0)
        self._stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def __call__(self) -> None:
        dsts, srcs, sizes, count = self._batches[self.workspace.parity]
        status = self._fn(
            dsts, srcs, sizes, count, ctypes.byref(self._attrs), ctypes.byref(self._index), 1, self._stream()
        )
        if status:
            raise RuntimeError(f"cudaMemcpyBatchAsync returned CUDA error {status}")
        self.workspace.barrier()
        self.workspace.advance()


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemcpyAttributes(ctypes.Structure):
    """``cudaMemcpyAttributes`` (CUDA 12.8+): source access order, two location hints, flags."""

    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", _MemLocation),
        ("dstLocHint", _MemLocation),
        ("flags", ctypes.c_uint),
    ]


_SRC_ACCESS_ORDER_STREAM = 1
"""``cudaMemcpySrcAccessOrderStream``: the sources are read in stream order, as ``cudaMemcpyAsync`` does."""


def _memcpy_batch() -> tuple[Callable[..., int], MemcpyAttributes]:
    """``cudaMemcpyBatchAsync`` of the CUDA runtime torch loaded, and stream-ordered attributes for it;
    RuntimeError naming what is missing."""
    lib = None
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        if "libcudart.so" in os.path.basename(path):
            lib = ctypes.CDLL(path)
            break
    if lib is None:
        raise RuntimeError("no CUDA runtime library (libcudart.so) is loaded in this process")
    version = ctypes.c_int(0)
    lib.cudaRuntimeGetVersion(ctypes.byref(version))
    if version.value < 13000 or not hasattr(lib, "cudaMemcpyBatchAsync"):
        raise RuntimeError(
            f"needs CUDA runtime >= 13.0 with cudaMemcpyBatchAsync; this one is {version.value}"
        )
    fn = lib.cudaMemcpyBatchAsync
    fn.restype = ctypes.c_int
    fn.argtypes = [
        ctypes.c_void_p,  # void** dsts
        ctypes.c_void_p,  # void** srcs
        ctypes.c_void_p,  # size_t* sizes
        ctypes.c_size_t,  # count
        ctypes.POINTER(MemcpyAttributes),
        ctypes.POINTER(ctypes.c_size_t),  # attrsIdxs
        ctypes.c_size_t,  # numAttrs
        ctypes.c_void_p,  # stream
    ]
    return fn, MemcpyAttributes(srcAccessOrder=_SRC_ACCESS_ORDER_STREAM)
