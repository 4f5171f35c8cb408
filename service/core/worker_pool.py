"""The worker pool: separate processes that answer ``POST /v1/recommend/batch``, ``POST /v1/score/batch``
and ``POST /v1/score`` bodies and build schedule tables, at a lower CPU priority than the process serving
single requests (``FICCO_BATCH_PRIORITY``) and on the CPUs ``FICCO_WORKER_CPUS`` names.

Server and worker talk over a socket pair in length-prefixed frames (docs/service.md#the-worker-protocol);
an error comes back by kind and is raised again in the server (:func:`raise_error`). Only the standard
library is imported at module level: the worker lowers its priority before it imports the model code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn

log = logging.getLogger("ficco.service.core.worker_pool")  # also when run as __main__

Priority = Literal["idle", "low", "normal"]
JobKind = Literal["recommend", "score", "score_one", "table"]
"""What a job's body is: a ``/v1/recommend/batch``, ``/v1/score/batch`` or ``/v1/score`` request, or a
schedule table (``worker_jobs.JOBS``)."""
PRIORITIES: tuple[str, ...] = ("idle", "low", "normal")
"""``idle``: ``SCHED_IDLE`` (runs only on otherwise idle CPU; ``nice 19`` where not allowed); ``low``:
``nice 19``; ``normal``: the server's own priority."""

_LENGTH = struct.Struct(">Q")
READ_BUFFER = 1 << 22
"""Bytes the server buffers from a worker before it pauses reading (an answer of 10,000 is ~7 MiB)."""
STOP_TIMEOUT_S = 5.0
"""Seconds a terminated worker gets to exit before it is killed."""
MAX_BACKOFF_S = 30.0
"""Longest wait before starting again a worker that keeps dying before it is ready."""
GC_YOUNG_THRESHOLD = 100_000
"""Allocations between two collections of the youngest generation in a warm worker (Python's default: 700).
A 10,000-scenario batch allocates a few hundred thousand objects that live until its answer is written; at
the default the collector ran ~480 times per batch (docs/service.md#settings)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerOptions:
    """What a worker needs from the server's settings (a field without a docstring is the ``FICCO_`` setting
    of its name); travels as JSON on the worker's command line."""

    model_root: str = "models"
    """The registry the server's store loads from (``ModelStore.loads_from``)."""
    cache_size: int = 4096
    threads: int = 1
    """XGBoost threads per prediction (``FICCO_BATCH_PREDICT_THREADS``, else one per CPU of ``cpus``)."""
    bulk_threads: int = 1
    """Threads a large batch is split over (``FICCO_BATCH_THREADS``)."""
    max_batch: int = 10_000
    default_hardware: str = "h200x2"
    priority: Priority = "idle"
    """CPU priority of the worker (``FICCO_BATCH_PRIORITY``; see ``PRIORITIES``)."""
    cpus: str = "spare"
    """CPUs the worker runs on once warm (``FICCO_WORKER_CPUS``; see :func:`worker_cpus`)."""
    log_level: str = "info"
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    """``{hardware id: version}`` to load at start (the server's models then); each job names its own."""
    warm_up_first: bool = False
    """Load and warm up at the server's priority, then lower it: for the workers started with the server
    (nothing is served yet, and at ``idle`` a machine busy with other work would hold ``/readyz`` back),
    not for one replaced while single requests are being served."""

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ValueError(
                f"WorkerOptions.priority must be one of {list(PRIORITIES)}; got {self.priority!r}"
            )


class WorkerLostError(RuntimeError):
    """A batch worker exited or broke the protocol during a job (503; the next batch starts a new one)."""


# --- the frames, both ends ------------------------------------------------------------------------------


def _send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(data)))
    sock.sendall(data)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``; ``EOFError`` if it closes first."""
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        count = sock.recv_into(view[got:], size - got)
        if not count:
            raise EOFError(f"socket closed after {got} of {size} bytes")
        got += count
    return bytes(buffer)


def _recv_frame(sock: socket.socket) -> bytes:
    (size,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    return _recv_exactly(sock, size)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return await reader.readexactly(size)


# --- errors across the boundary -------------------------------------------------------------------------


def error_reply(err: Exception) -> dict[str, Any]:
    """``err`` as the JSON the worker sends back (``raise_error`` raises it again in the server)."""
    from fastapi.exceptions import RequestValidationError

    from ficco.service.errors import InvalidFieldsError, NoModelError, UnknownHardwareError, from_pydantic

    if isinstance(err, RequestValidationError):  # the same items the server's 422 handler makes of it
        return {"error": "invalid", "errors": [from_pydantic(e) for e in err.errors()]}
    if isinstance(err, InvalidFieldsError):
        return {"error": "invalid", "errors": err.errors}
    if isinstance(err, UnknownHardwareError):
        return {"error": "unknown_hardware", "detail": str(err), "known_ids": err.known_ids}
    if isinstance(err, NoModelError):
        return {"error": "no_model", "detail": str(err)}
    log.exception("batch failed")
    return {"error": "internal", "detail": f"{type(err).__name__}: {err}"}


def raise_error(reply: Mapping[str, Any]) -> NoReturn:
    """Raise the exception a worker's error ``reply`` stands for (the server maps it to its status)."""
    from ficco.service.errors import InvalidFieldsError, NoModelError, UnknownHardwareError

    kind = reply.get("error")
    if kind == "invalid":
        raise InvalidFieldsError(reply["errors"])
    if kind == "unknown_hardware":
        raise UnknownHardwareError(reply["detail"], reply["known_ids"])
    if kind == "no_model":
        raise NoModelError(reply["detail"])
    raise RuntimeError(f"the batch worker failed: {reply.get('detail', reply)}")


# --- the worker process ---------------------------------------------------------------------------------


def _thread_ids() -> list[int]:
    """This process's thread ids (Linux sets priority and affinity per thread); ``[0]`` (this thread) where
    ``/proc`` does not list them."""
    tasks = Path("/proc/self/task")
    return [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]


def lower_priority(priority: str) -> str:
    """Lower the CPU priority of every thread of this process to ``priority`` (see ``PRIORITIES``; Linux
    sets it per thread, and threads started later inherit their starter's); returns what was applied."""
    if priority == "normal":
        return "normal"
    tids = _thread_ids()
    if priority == "idle" and hasattr(os, "sched_setscheduler"):
        try:
            for tid in tids:
                with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE"
        except OSError as err:
            log.warning("SCHED_IDLE refused (%s); using nice 19", err)
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, tid, 19)
    return "nice 19"


def worker_cpus(spec: str, allowed: set[int] | None = None) -> set[int]:
    """The CPUs ``spec`` names out of ``allowed`` (default: this process's affinity, else every CPU):
    ``all``; ``spare``, every CPU but the lowest, which batch and table work leave to the server (``all`` on
    a single CPU); or a cpulist such as ``1,3-5``. ``ValueError`` names a spec that is none of these or that
    leaves no allowed CPU."""
    from ficco.cpulists import parse_cpulist

    if allowed is None:
        affinity = getattr(os, "sched_getaffinity", None)
        allowed = affinity(0) if affinity else set(range(os.cpu_count() or 1))
    if spec == "all":
        return set(allowed)
    if spec == "spare":
        return set(allowed) - {min(allowed)} or set(allowed)
    try:
        named, why = set(parse_cpulist(spec)), ""
    except ValueError as err:
        named, why = set(), f" ({err})"
    if not named:
        raise ValueError(f"worker CPUs must be 'all', 'spare' or a list like '1,3-5'; got {spec!r}{why}")
    if not named & allowed:
        raise ValueError(f"worker CPUs {spec!r} name none of the CPUs allowed here {sorted(allowed)}")
    return named & allowed


def pin_cpus(spec: str) -> str:
    """Run every thread of this process (and those started later) on the CPUs ``spec`` names
    (:func:`worker_cpus`); returns them as a cpulist, or ``any`` where affinity is not supported."""
    from ficco.cpulists import format_cpulist

    if not hasattr(os, "sched_setaffinity"):
        return "any"
    cpus = worker_cpus(spec, os.sched_getaffinity(0))
    for tid in _thread_ids():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)
    return format_cpulist(cpus)


def freeze_heap() -> None:
    """Move every object allocated so far (imports, the loaded models, what the warm-up built) out of the
    garbage collector's sight (``gc.freeze``), as the server does once its models are loaded, and collect
    the youngest generation every :data:`GC_YOUNG_THRESHOLD` allocations."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def settle(options: WorkerOptions) -> str:
    """Lower this worker's priority and pin its CPUs as ``options`` say; what was applied, as text."""
    return f"{lower_priority(options.priority)} on CPUs {pin_cpus(options.cpus)}"


def serve(sock: socket.socket, options: WorkerOptions) -> None:
    """The worker's loop: answer jobs from ``sock`` one at a time until the server closes it."""
    from ficco.service.core.store import ModelStore
    from ficco.service.errors import NoModelError
    from ficco.service.worker_jobs import JOBS

    store = ModelStore(
        Path(options.model_root),
        cache_size=options.cache_size,
        threads=options.threads,
        bulk_threads=options.bulk_threads,
    )
    try:
        store.serve_versions(options.versions)
    except NoModelError as err:
        log.error("%s; the next batch tries again", err)
    warm_up(store, options)
    freeze_heap()
    if options.warm_up_first:
        log.info("batch worker %d now at priority %s", os.getpid(), settle(options))
    serving = {hw: m.version for hw, m in store.served.items()}
    log.info("batch worker %d ready, serving %s", os.getpid(), serving)
    try:
        _send_frame(sock, json.dumps({"ready": True, "serving": serving}).encode())
        while True:
            job = json.loads(_recv_frame(sock))
            body = _recv_frame(sock)
            try:
                store.serve_versions(job["versions"])
                payload = JOBS[job["kind"]](
                    body, store.served, max_batch=options.max_batch, default_hardware=options.default_hardware
                )
                reply = {"ok": True}
            except Exception as err:  # every error goes back to the server, which maps it to a status
                reply, payload = error_reply(err), b""
            _send_frame(sock, json.dumps(reply).encode())
            _send_frame(sock, payload)
    except (EOFError, OSError) as err:  # the server closed its end: it stopped or exited
        log.info("batch worker %d: the server closed the connection (%s); exiting", os.getpid(), err)


WARM_UP_SCENARIOS = 2_500
"""Scenarios of the warm-up batch per model: past the size a batch is split over threads at (2,048)."""
WARM_UP_CONFIG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
}
"""The model config of the warm-up score batch (Llama-3.1-8B's shapes)."""


def warm_up(store: Any, options: WorkerOptions) -> None:
    """Answer one recommend batch (``WARM_UP_SCENARIOS`` distinct dense scenarios) and one score batch
    (``WARM_UP_CONFIG``) with each served model of ``store`` and drop the answers: the first real batch
    then finds every import done, every code path compiled and the thread pools started. A failure is
    logged, never raised (the worker still serves)."""
    from ficco.service.worker_jobs import JOBS

    for hw, model in store.served.items():
        ops = [op for op in ("ag_gemm", "gemm_rs") if model.unmeasured(op) is None]
        size = model.world_sizes[0]
        score = {"configs": [{"config": WARM_UP_CONFIG}], "tp": size, "tokens": [4096], "hardware": hw}
        jobs: dict[str, Any] = {"score": score}
        if ops:
            jobs["recommend"] = {
                "scenarios": [
                    {"op": ops[i % len(ops)], "m": size * (i + 1), "n": 4096, "k": 4096, "hardware": hw}
                    | {"world_size": size}
                    for i in range(WARM_UP_SCENARIOS)
                ]
            }
        for kind, body in jobs.items():
            try:
                JOBS[kind](
                    json.dumps(body).encode(),
                    store.served,
                    max_batch=max(options.max_batch, WARM_UP_SCENARIOS),
                    default_hardware=options.default_hardware,
                )
            except Exception as err:  # a model that cannot answer this still serves what it can
                log.warning("warm-up %s batch with the %s model failed: %s", kind, hw, err)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m ficco.service.core.worker_pool --fd N --options JSON``."""
    parser = argparse.ArgumentParser(description="ficco's batch worker process (the server starts it).")
    parser.add_argument("--fd", type=int, required=True, help="file descriptor of the socket to the server")
    parser.add_argument("--options", required=True, help="WorkerOptions as a JSON object")
    args = parser.parse_args(argv)
    options = WorkerOptions(**json.loads(args.options))
    applied = "normal, until warm" if options.warm_up_first else settle(options)
    logging.basicConfig(
        level=options.log_level.upper(), format="%(levelname)s:     %(name)s (batch worker): %(message)s"
    )
    log.info("batch worker %d started at priority %s", os.getpid(), applied)
    serve(socket.socket(fileno=args.fd), options)


# --- the server's side ----------------------------------------------------------------------------------


def _worker_env() -> dict[str, str]:
    """The server's environment, with the directory holding the server's ``ficco`` package first on the
    path: the worker runs the same checkout as the server, whatever is installed."""
    import ficco

    home = str(Path(ficco.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": home if not path else os.pathsep.join([home, path])}


class WorkerProcess:
    """One worker process and the server's end of its socket; one job at a time. Use from one event loop."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.process: subprocess.Popen | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ready: asyncio.Future | None = None
        """Reads the worker's ready frame; done once it has loaded and warmed up."""
        self._lock = asyncio.Lock()
        """Held by a job and by a restart: a dead worker is replaced by one of them, never both."""
        self._backoff_s = 0.0
        self._next_start = 0.0
        """Monotonic time before which :meth:`revive` does not start the worker again (it keeps dying)."""

    @property
    def alive(self) -> bool:
        """True while the worker's process runs (warming up or ready)."""
        return self.process is not None and self.process.poll() is None

    async def revive(self, versions: Mapping[str, str]) -> bool:
        """Start the worker again with ``versions`` if its process has exited and no job holds it (which
        starts it itself); one that dies again before it is ready waits 1, 2, 4 ... up to ``MAX_BACKOFF_S``
        seconds before the next start. True when it was started."""
        if self._lock.locked() or self.alive or time.monotonic() < self._next_start:
            return False
        async with self._lock:
            code = None if self.process is None else self.process.poll()
            log.warning("batch worker exited (exit code %s) outside a job; starting another", code)
            self._backoff_s = 0.0 if self.was_ready else min(MAX_BACKOFF_S, max(1.0, 2 * self._backoff_s))
            self._next_start = time.monotonic() + self._backoff_s
            await self.stop()
            await self.start(versions)
            return True

    @property
    def was_ready(self) -> bool:
        """True when the last process said it was ready before it exited (or still runs ready)."""
        done = self._ready is not None and self._ready.done() and not self._ready.cancelled()
        return done and self._ready.exception() is None

    async def serving(self) -> dict[str, str]:
        """``{hardware id: version}`` the worker loaded at start, once it is ready (waits for it)."""
        assert self._ready is not None, "start the worker first"
        return json.loads(await asyncio.shield(self._ready))["serving"]

    @property
    def ready(self) -> bool:
        """True once the running worker has said it is ready (loaded and warmed up)."""
        return self.was_ready and self.alive

    async def start(self, versions: Mapping[str, str], *, warm_up_first: bool = False) -> None:
        """Start the process (it loads ``versions`` at once, at its lower priority unless
        ``warm_up_first``: see ``WorkerOptions``); this does not wait."""
        server_end, worker_end = socket.socketpair()
        chosen = dataclasses.replace(self.options, versions=dict(versions), warm_up_first=warm_up_first)
        options = json.dumps(dataclasses.asdict(chosen))
        command = [sys.executable, "-m", __name__, "--fd", str(worker_end.fileno()), "--options", options]
        try:
            self.process = subprocess.Popen(
                command, pass_fds=(worker_end.fileno(),), env=_worker_env(), start_new_session=True
            )
        except BaseException:
            server_end.close()
            raise
        finally:
            worker_end.close()
        self._reader, self._writer = await asyncio.open_connection(sock=server_end, limit=READ_BUFFER)
        self._ready = asyncio.ensure_future(_read_frame(self._reader))
        self._ready.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved
        log.info("batch worker %d started (priority %s)", self.process.pid, self.options.priority)

    async def answer(self, kind: JobKind, body: bytes, versions: Mapping[str, str]) -> bytes:
        """The worker's answer (response bytes) to a batch ``body`` of ``kind`` with the models ``versions``.

        Raises the batch's own errors as the server's exceptions (``raise_error``), and
        ``WorkerLostError`` when the worker dies during the job; a dead worker is replaced first.
        """
        async with self._lock:
            return await self._answer(kind, body, versions)

    async def _answer(self, kind: JobKind, body: bytes, versions: Mapping[str, str]) -> bytes:
        if not self.alive:
            await self.stop()
            await self.start(versions)
        assert self._reader is not None and self._writer is not None and self._ready is not None
        try:
            await asyncio.shield(self._ready)  # the ready frame comes first (the job waits for the warm-up)
            for data in (json.dumps({"kind": kind, "versions": dict(versions)}).encode(), body):
                self._writer.write(_LENGTH.pack(len(data)))
                self._writer.write(data)
            await self._writer.drain()
            reply = json.loads(await _read_frame(self._reader))
            payload = await _read_frame(self._reader)
        except (OSError, EOFError, ValueError) as err:  # IncompleteReadError is an EOFError
            code = self.process.poll() if self.process else None
            await self.stop()
            raise WorkerLostError(
                f"the batch worker exited (exit code {code}) or broke off while answering "
                f"({type(err).__name__}); retry the batch"
            ) from None
        if not reply.get("ok"):
            raise_error(reply)
        return payload

    async def stop(self) -> None:
        """Close the socket and terminate the process (killed after ``STOP_TIMEOUT_S``); reaps it."""
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        if self._ready is not None:
            self._ready.cancel()
        self._reader = self._writer = self._ready = None
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)


class WorkerPool:
    """``count`` batch worker processes; ``answer`` runs a job on an idle one. Use from one event loop.

    The caller bounds the jobs in flight (``BatchGate``); a job whose request is cancelled (the client
    went away) still runs to its end, so its answer is read before the worker takes the next job.
    """

    def __init__(self, options: WorkerOptions, *, count: int = 1) -> None:
        self.workers = [WorkerProcess(options) for _ in range(count)]
        self._idle: asyncio.Queue[WorkerProcess] = asyncio.Queue()
        for worker in self.workers:
            self._idle.put_nowait(worker)

    @property
    def ready(self) -> bool:
        """True when every worker has loaded its models and warmed up (``WorkerProcess.ready``)."""
        return all(worker.ready for worker in self.workers)

    @property
    def pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [w.process.pid for w in self.workers if w.process is not None and w.process.poll() is None]

    async def start(self, versions: Mapping[str, str]) -> None:
        """Start every worker with the models ``versions`` (``{hardware id: version}``), warming up before
        it lowers its priority (the server is starting: nothing is served yet)."""
        for worker in self.workers:
            await worker.start(versions, warm_up_first=True)

    async def answer(self, kind: JobKind, body: bytes, versions: Mapping[str, str]) -> bytes:
        """``WorkerProcess.answer`` on the next idle worker."""
        worker = await self._idle.get()
        job = asyncio.ensure_future(worker.answer(kind, body, versions))
        job.add_done_callback(lambda done: self._release(worker, done))
        return await asyncio.shield(job)

    def _release(self, worker: WorkerProcess, done: asyncio.Future) -> None:
        self._idle.put_nowait(worker)
        if not done.cancelled():
            done.exception()  # retrieved: an abandoned job's error is not logged as never retrieved

    async def supervise(self, versions: Callable[[], Mapping[str, str]], interval_s: float = 1.0) -> None:
        """Every ``interval_s`` seconds, start again each worker whose process exited outside a job (before
        or after it was ready), with the models ``versions()`` names then, so that ``/readyz`` recovers
        without waiting for a batch; never returns (cancel it)."""
        while True:
            await asyncio.sleep(interval_s)
            for worker in self.workers:
                try:
                    await worker.revive(versions())
                except Exception:  # keep supervising whatever happens
                    log.exception("starting a batch worker again failed")

    async def close(self) -> None:
        """Stop every worker (see ``WorkerProcess.stop``)."""
        for worker in self.workers:
            await worker.stop()


if __name__ == "__main__":
    main()
