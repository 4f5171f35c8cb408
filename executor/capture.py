"""What CUDA graph capture cannot record: the error, and the check a call makes before such work."""

from __future__ import annotations

import torch


class CaptureError(RuntimeError):
    """A call inside CUDA graph capture needs work that capture cannot record (a peer-memory rendezvous, a
    new NCCL group): the same call must run once eagerly first."""


def refuse_capture(device: torch.device, what: str, needs: str) -> None:
    """Raise :class:`CaptureError` if ``device``'s current stream is capturing a CUDA graph: ``what`` (the
    schedule) ``needs`` (the uncapturable work) this time."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise CaptureError(
            f"{what} cannot run inside CUDA graph capture this time: it {needs}, which capture cannot "
            "record. Run the same call (same shapes, dtype and schedule) once eagerly before capturing it."
        )
