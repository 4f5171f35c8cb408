"""Side streams ("lanes") that carry the communication beside the GEMMs on the current stream.

``DeviceLanes``: CUDA ``copy`` lanes for the pieces and one ``signal`` lane for the device barriers that
publish landed pieces, ordered with stream waits and CUDA events only, never host synchronisation.
``InlineLanes``: everything on the caller's stream in program order (the CPU, and a CUDA call with nothing to
overlap its copies with). ``CopyStreams``: how many copy lanes a call gets. See docs/executor.md ("Lanes")
for the fork/join protocol and why reusing its events is safe.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch


class InlineLanes:
    """No side lanes: work runs in program order on the caller's stream (CPU: in the caller's thread), so
    there is nothing to fork, wait for or join."""

    capturing = False
    """Not tracked: with one stream there is no join that graph capture would need."""
    count = 1
    """Every piece goes on "lane 0", the caller's stream."""

    def fork(self, signal: bool) -> None:
        """No-op: nothing runs beside the caller's stream."""

    def home(self) -> None:
        """No-op: there is one stream of work."""

    def to_copy_lane(self, index: int) -> None:
        """No-op: copies run on the caller's stream."""

    def join(self, signal: bool) -> None:
        """No-op."""

    def mark_produced(self, key: int) -> None:
        """No-op: the GEMM that produced the data has already run."""

    def after_produced(self, index: int, key: int) -> None:
        """No-op."""

    def mark_copied(self, lanes: Iterable[int], key: int) -> None:
        """No-op: the copies have already run."""

    def signal_after(
        self, lanes: Iterable[int], key: int, barrier: Callable[[], None], *, on_copy_lane: bool = False
    ) -> None:
        """Run ``barrier`` now, behind the copies issued before it (the CPU: they have finished; CUDA: stream
        order)."""
        barrier()

    def wait_signal(self, key: int) -> None:
        """No-op: the barrier already returned."""


class DeviceLanes:
    """CUDA lanes at one stream priority; the per-piece events are created once and reused."""

    def __init__(self, device: torch.device, count: int, high_priority: bool) -> None:
        priority = _HIGH_PRIORITY if high_priority else 0
        self.copy = [torch.cuda.Stream(device=device, priority=priority) for _ in range(count)]
        """Copy lanes, one per concurrent stream of pieces."""
        self.count = count
        """Copy lanes (a call puts piece ``p`` on lane ``executor.plan.lane_of(p, count)``)."""
        self.signal = torch.cuda.Stream(device=device, priority=priority)
        """The lane that runs device barriers after copies and records when pieces have landed."""
        self._copied: dict[tuple[int, int], torch.cuda.Event] = {}
        """Per (round key, copy lane): when that lane's copies of the round were issued."""
        self._produced: dict[int, torch.cuda.Event] = {}
        """Per key (a scatter unit): when the GEMM that produced its pieces was issued."""
        self._landed: dict[int, torch.cuda.Event] = {}
        self._forked = torch.cuda.Event()
        self._current: torch.cuda.Stream | None = None
        """The caller's stream, as ``fork`` saw it; the call runs on it until ``join``."""
        self._set: torch.cuda.Stream | None = None
        """The stream this call last made current (``_switch`` skips a switch to it)."""
        self.capturing = False
        """Whether the caller's stream was capturing a CUDA graph at ``fork``."""
        self._done = [torch.cuda.Event() for _ in range(count + 1)]  # per copy lane, then the signal lane
        self._with_signal = [*self.copy, self.signal]
        self._device_index = device.index
        """The lanes' device (None: the current device)."""
        self._callers: dict[int, torch.cuda.Stream] = {}
        """The caller streams seen, by stream id (:meth:`caller_stream`)."""

    def caller_stream(self) -> torch.cuda.Stream:
        """``torch.cuda.current_stream()`` of the lanes' device, without a new ``Stream`` object per call."""
        index = self._device_index if self._device_index is not None else torch.cuda.current_device()
        stream_id, device_index, device_type = torch._C._cuda_getCurrentStream(index)
        stream = self._callers.get(stream_id)
        if stream is None:
            stream = self._callers[stream_id] = torch.cuda.Stream(
                stream_id=stream_id, device_index=device_index, device_type=device_type
            )
        return stream

    def fork(self, signal: bool) -> None:
        """The copy lanes (and the signal lane when ``signal``) wait for the work issued so far on the
        current stream, which the lanes remember as the caller's stream until :meth:`join`."""
        self._current = self._set = self.caller_stream()
        self.capturing = torch.cuda.is_current_stream_capturing()
        self._forked.record(self._current)
        for lane in self._used(signal):
            lane.wait_event(self._forked)

    def join(self, signal: bool) -> None:
        """The current stream waits for everything issued on the copy lanes (and the signal lane when
        ``signal``; pass the same value as to :meth:`fork`), and is made current again."""
        self.home()
        for lane, done in zip(self._used(signal), self._done, strict=False):
            done.record(lane)
            self._current.wait_event(done)

    def _used(self, signal: bool) -> list[torch.cuda.Stream]:
        """The lanes a call forks and joins, in the order of ``self._done``."""
        return self._with_signal if signal else self.copy

    def _switch(self, stream: torch.cuda.Stream) -> None:
        """Make ``stream`` current, unless this call already did (one ``set_stream`` per change of lane,
        not two per piece)."""
        if stream is not self._set:
            torch.cuda.set_stream(stream)
            self._set = stream

    def home(self) -> None:
        """Make the caller's stream (as ``fork`` saw it) current again; GEMMs run there."""
        self._switch(self._current)

    def to_copy_lane(self, index: int) -> None:
        """Make copy lane ``index`` current (until :meth:`home`, another switch or :meth:`join`)."""
        self._switch(self.copy[index])

    def mark_produced(self, key: int) -> None:
        """Remember, under ``key``, the work issued so far on the caller's stream (a GEMM that produced
        pieces), for :meth:`after_produced`."""
        _record(self._produced, key, self._current)

    def after_produced(self, index: int, key: int) -> None:
        """Copy lane ``index`` waits for the work marked under ``key`` (:meth:`mark_produced`)."""
        self.copy[index].wait_event(self._produced[key])

    def mark_copied(self, lanes: Iterable[int], key: int) -> None:
        """Remember, under round ``key``, the copies issued so far on ``lanes`` (for :meth:`signal_after`:
        a call issues every round's copies first, then every round's barrier, switching lanes twice)."""
        for index in lanes:
            _record(self._copied, (key, index), self.copy[index])

    def signal_after(
        self, lanes: Iterable[int], key: int, barrier: Callable[[], None], *, on_copy_lane: bool = False
    ) -> None:
        """After the copies of round ``key`` on ``lanes`` (:meth:`mark_copied`), run ``barrier`` on the
        signal lane, left current, and remember its completion under ``key`` (for :meth:`wait_signal`).

        ``on_copy_lane``: ``lanes`` is a single copy lane and the barrier runs on it, right behind its copies
        (call it before anything else on that lane, without :meth:`mark_copied`). Only for a call with one
        round on one lane, which runs no other barrier that could overlap this one.
        """
        if on_copy_lane:
            (index,) = lanes
            stream = self.copy[index]
        else:
            for index in lanes:
                self.signal.wait_event(self._copied[key, index])
            stream = self.signal
        self._switch(stream)
        barrier()
        _record(self._landed, key, stream)

    def wait_signal(self, key: int) -> None:
        """The caller's stream waits until the barrier recorded under ``key`` has completed; it is made
        current again."""
        self.home()
        self._current.wait_event(self._landed[key])


def _record(events: dict, key: object, stream: torch.cuda.Stream) -> None:
    """Record the work issued so far on ``stream`` in ``events[key]``, an event made on first use and reused
    by every later call (a wait on a key never recorded raises ``KeyError``: a pipeline bug, not a no-op)."""
    event = events.get(key)
    if event is None:
        event = events[key] = torch.cuda.Event()
    event.record(stream)


@dataclass(frozen=True, slots=True)
class CopyStreams:
    """How many side streams a copy-engine (``dma``) call spreads the pieces of its peers over, by the bytes
    of one piece: the executor's copy arrangement (``executor.set_copy_streams``, ``FICCO_COPY_STREAMS``).
    String form (:meth:`parse`): ``per_peer``, ``<n>`` (at most ``n`` streams the peers share in ring order)
    or ``"0:<streams>;<MiB>:<streams>;..."``, by MiB of a piece (docs/executor.md: "Copy arrangement")."""

    bounds: tuple[int, ...] = (0,)
    """Smallest piece of each entry, bytes: starts at 0, strictly increasing."""
    streams: tuple[int | None, ...] = (None,)
    """Side streams of each entry, at most; None: one per peer."""

    def __post_init__(self) -> None:
        ok_bounds = self.bounds[:1] == (0,) and all(a < b for a, b in itertools.pairwise(self.bounds))
        ok_streams = all(s is None or (isinstance(s, int) and s >= 1) for s in self.streams)
        if not (ok_bounds and ok_streams and len(self.bounds) == len(self.streams)):
            raise ValueError(
                f"CopyStreams needs bounds starting at 0 and increasing, and one entry of streams (None or "
                f"an int >= 1) per bound; got bounds {list(self.bounds)}, streams {list(self.streams)}"
            )

    def at(self, piece_bytes: int) -> int | None:
        """Side streams for pieces of ``piece_bytes`` bytes, at most (None: one per peer)."""
        return self.streams[bisect_right(self.bounds, piece_bytes) - 1]

    def __str__(self) -> str:
        names = ["per_peer" if s is None else str(s) for s in self.streams]
        if len(names) == 1:
            return names[0]
        return ";".join(f"{b / 2**20:g}:{n}" for b, n in zip(self.bounds, names, strict=True))

    @classmethod
    def parse(cls, text: str) -> CopyStreams:
        """Parse the string form (class docstring); ValueError naming the text and the allowed forms."""
        forms = "'per_peer', a number of streams >= 1, or a table '0:STREAMS;MIB:STREAMS;...'"
        try:
            entries = [e.partition(":") for e in str(text).split(";")]
            if len(entries) == 1 and not entries[0][1]:
                entries = [("0", ":", entries[0][0])]
            bounds = tuple(round(float(mib) * 2**20) for mib, _, _ in entries)
            streams = tuple(None if s.strip() == "per_peer" else int(s) for _, _, s in entries)
            if any(not sep for _, sep, _ in entries):
                raise ValueError("an entry lacks its ':'")
            return cls(bounds=bounds, streams=streams)
        except ValueError as err:
            raise ValueError(f"copy streams {text!r} are none of {forms}: {err}") from None


def copy_lanes(policy: CopyStreams, peers_at_once: int, piece_bytes: int, overlaps: bool) -> int:
    """Side lanes of a copy-engine call under ``policy``: ``peers_at_once`` (the plan's pieces in flight
    together: one per peer, or one for a ring of shards), at most the policy's streams for pieces of
    ``piece_bytes``; 0 (every copy on the caller's stream, no fork or join) when that is one lane and the
    call has no GEMM to overlap the copies with (``overlaps`` False: the collective alone, or ``serial``)."""
    cap = policy.at(piece_bytes)
    lanes = peers_at_once if cap is None else min(peers_at_once, cap)
    return 0 if lanes == 1 and not overlaps else lanes


_HIGH_PRIORITY = -1
"""A higher-than-default CUDA stream priority (lower numbers are higher). -1 lies inside every CUDA
device's priority range, so nothing relies on how a torch version clamps values outside it."""
