"""Tensors that outlive the call that makes them (scratch buffers, peer memory, index tensors): allocated
outside any CUDA graph memory pool the calling thread allocates to, so that Inductor's CUDA graph trees do not
find them in their pool (docs/executor.md, "Allocation").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def persistent(device: torch.device, make: Callable[[], T]) -> T:
    """``make()``, on CUDA on a short-lived thread whose current stream is the caller's (so outside the graph
    memory pool the calling thread allocates to); on the CPU, and inside stream capture, simply ``make()``.
    Exceptions propagate."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return make()
    stream = torch.cuda.current_stream(device)
    done: dict[str, object] = {}

    def run() -> None:
        try:
            with torch.cuda.stream(stream):
                done["value"] = make()
        except BaseException as err:  # re-raised on the caller's thread
            done["error"] = err

    worker = threading.Thread(target=run, name="ficco-persistent-alloc")
    worker.start()
    worker.join()
    if "error" in done:
        raise done["error"]
    return done["value"]
