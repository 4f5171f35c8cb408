"""Tensors that outlive the call that makes them (scratch buffers, peer memory, index tensors): allocated
outside any CUDA graph memory pool the calling thread allocates to.

``torch.compile(mode="reduce-overhead")`` runs each compiled graph's warm-up with every allocation of the
calling thread routed to the graph tree's private pool (``torch._C._cuda_beginAllocateCurrentThreadToPool``
in ``torch._inductor.cudagraph_trees``), then fails the run if anything in that pool outlives it but the
graph's outputs ("tensor(s) in the cudagraph pool not tracked as outputs"). The executor's workspaces are
made on first use, which under Inductor is that warm-up. The caching allocator routes such allocations by
thread, so :func:`persistent` makes the tensor on a short-lived helper thread whose current stream is the
caller's: it comes from the ordinary pools, associated with the same stream as an eager allocation
(PyTorch's symmetric memory, the workspace on real peers, lies outside the caching allocator altogether).

During stream capture (``torch.cuda.graph``, ``runtime.GraphedCall``) the tensor is made on the calling
thread, as before: CUDA forbids another thread's ``cudaMalloc`` while a global-mode capture is under way,
and the capture's pool then holds the tensor for the graph's lifetime.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def persistent(device: torch.device, make: Callable[[], T]) -> T:
    """``make()``, on CUDA outside the graph memory pool the calling thread allocates to (module
    docstring); on the CPU, and inside stream capture, simply ``make()``. Exceptions propagate."""
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
