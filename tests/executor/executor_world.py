"""Run a function on every rank of a fresh CPU (gloo) process group, one forked process per rank.

Forking keeps a world of 8 ranks quick to start on a 2-core runner: torch, torch.distributed and the
executor are imported here, once, before the fork (spawn would import torch in each of the 8 ranks).
Each rank's function returns a picklable value; ``run_world`` returns them in rank order, or raises with
the first failing rank's traceback (and kills the rest, so a hang cannot outlive the timeout).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ficco import executor


def run_world(world_size: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 240.0) -> list[Any]:
    """``[fn(rank, world_size, *args) for rank in range(world_size)]``, each in its own gloo process."""
    ctx = mp.get_context("fork")
    results: mp.Queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        procs = [
            ctx.Process(target=_rank_main, args=(rank, world_size, store, results, fn, args), daemon=True)
            for rank in range(world_size)
        ]
        for proc in procs:
            proc.start()
        out: dict[int, Any] = {}
        try:
            while len(out) < world_size:
                rank, ok, value = results.get(timeout=timeout_s)
                if not ok:
                    raise RuntimeError(f"rank {rank} of {world_size} failed:\n{value}")
                out[rank] = value
        except queue.Empty:
            raise RuntimeError(f"world of {world_size} ranks timed out after {timeout_s} s") from None
        finally:
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
    return [out[rank] for rank in range(world_size)]


def _rank_main(rank: int, world_size: int, store: str, results: mp.Queue, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)  # no OpenMP pool in a forked child, and 8 ranks share 2 cores
    executor.reset()
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
        try:
            value = fn(rank, world_size, *args)
        finally:
            executor.reset()
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def errors_of(calls: dict[str, Callable[[], Any]]) -> list[tuple[str, str]]:
    """Run each call in order; ``(name, "Type: message")`` of the error it raised (``"no error"`` if none)."""
    out = []
    for name, call in calls.items():
        try:
            call()
            out.append((name, "no error"))
        except Exception as exc:
            out.append((name, f"{type(exc).__name__}: {exc}"))
    return out


def assert_every_rank_refused(world: tuple[int, list[dict]], call: str, expected: list[str]) -> None:
    """Each rank's report of a world (``report["bad_inputs"]``: (call, message) pairs) gives ``call`` a
    message holding every part of ``expected``."""
    world_size, reports = world
    for rank, report in enumerate(reports):
        message = dict(report["bad_inputs"])[call]
        for part in expected:
            assert part in message, f"rank {rank} of {world_size}, {call}: {message!r} lacks {part!r}"
