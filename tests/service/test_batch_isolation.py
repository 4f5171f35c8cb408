"""Large batches cannot starve single requests: they are answered by a batch worker process at idle CPU
priority, with the model versions the server serves; a full queue answers 429 with Retry-After; workers
end with the server, however it ends (issue 15 item 5)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ficco.service.core.admission import BatchGate, BusyError
from ficco.service.core.config import Settings
from ficco.service.core.store import ModelStore
from ficco.service.core.worker_pool import WorkerOptions, worker_cpus
from ficco.service.main import _worker_options
from ficco.training.predict.registry import current_version, list_models, promote

GOOD = {"op": "ag_gemm", "m": 64, "n": 64, "k": 64}
HARDWARE = "h200x2"


def _running(pid: int) -> bool:
    """True while any thread of process ``pid`` runs (a zombie has ended: only its parent has not reaped it
    yet; a killed process whose leader is a zombie may still have threads exiting, and cannot be reaped)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return False
    states = []
    for task in tasks:
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            continue
    return any(state not in ("Z", "X") for state in states)


def test_gate_refuses_past_running_plus_queued():
    async def scenario():
        release = asyncio.Event()

        async def first():
            await release.wait()
            return "first"

        async def answer(value):
            return value

        gate = BatchGate(concurrency=1, queue=1, retry_after_s=2)
        running = asyncio.create_task(gate.run(first))
        waiting = asyncio.create_task(gate.run(answer, "second"))
        await asyncio.sleep(0.01)
        with pytest.raises(BusyError) as busy:
            await gate.run(answer, "third")
        assert busy.value.retry_after_s == 2
        release.set()
        assert (await running, await waiting) == ("first", "second")
        return await gate.run(answer, "after")

    assert asyncio.run(scenario()) == "after"


def test_full_batch_queue_is_429_with_retry_after(registry_root, start):
    with start(registry_root, BATCH_CONCURRENCY=1, BATCH_QUEUE=0) as client:
        gate: BatchGate = client.app.state.batch_gate
        gate.admitted = gate.limit  # as if a batch were running
        response = client.post("/v1/recommend/batch", json={"scenarios": [GOOD]})
        assert response.status_code == 429
        assert response.headers["retry-after"] == str(gate.retry_after_s)
        assert "busy" in response.json()["detail"]
        gate.admitted = 0
        assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}).status_code == 200


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_batch_is_answered_by_a_worker_process_at_idle_priority(client):
    assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD, GOOD]}).json()["count"] == 2
    (pid,) = client.app.state.batch_workers.pids  # it has answered: it runs at the priority it set
    assert pid != os.getpid()
    threads = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    assert len(threads) > 1  # it warmed up at normal priority, then lowered every thread's
    assert {os.sched_getscheduler(tid) for tid in threads} == {os.SCHED_IDLE}


def test_concurrency_starts_one_worker_per_slot(registry_root, start, wait_for):
    with start(registry_root, BATCH_CONCURRENCY=2, BATCH_PRIORITY="low") as client:
        for _ in range(2):
            assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}).status_code == 200
        pids = client.app.state.batch_workers.pids
        assert len(set(pids)) == 2
        assert wait_for(lambda: all(os.getpriority(os.PRIO_PROCESS, pid) == 19 for pid in pids))


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_workers_run_on_the_cpus_they_were_given(registry_root, start, wait_for):
    allowed = os.sched_getaffinity(0)
    with start(registry_root, WORKER_CPUS=str(max(allowed))) as client:
        assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}).status_code == 200
        (pid,) = client.app.state.batch_workers.pids
        threads = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
        assert wait_for(lambda: all(os.sched_getaffinity(tid) == {max(allowed)} for tid in threads))
    assert os.sched_getaffinity(0) == allowed  # the server's own stay as they were


@pytest.mark.parametrize(
    ("spec", "allowed", "cpus"),
    [
        ("all", {0, 1, 2}, {0, 1, 2}),
        ("spare", {2, 5, 7}, {5, 7}),
        ("spare", {3}, {3}),
        ("1,3-4", {0, 1, 3, 9}, {1, 3}),
        ("1, 3-4", {0, 1, 3, 9}, {1, 3}),
    ],
)
def test_worker_cpus_reads_each_spelling(spec, allowed, cpus):
    assert worker_cpus(spec, allowed) == cpus


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("odd", "'all', 'spare' or a list like '1,3-5'; got 'odd' \\(bad cpulist entry 'odd'"),
        ("1-0", "got '1-0' \\(bad cpulist range '1-0': 0 < 1\\)"),
        ("", "'all', 'spare' or a list like '1,3-5'; got ''$"),
        ("8-9", r"none of the CPUs allowed here \[0, 1\]"),
    ],
)
def test_bad_worker_cpus_say_what_is_allowed(spec, message):
    with pytest.raises(ValueError, match=message):
        worker_cpus(spec, {0, 1})


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
@pytest.mark.parametrize(("cpus", "predict_threads"), [("all", 0), ("spare", 0), ("all", 3), ("spare", 1)])
def test_batch_workers_predict_with_one_xgboost_thread_per_cpu_they_run_on(tmp_path, cpus, predict_threads):
    """A batch's XGBoost prediction spreads over the CPUs its worker may use (``FICCO_WORKER_CPUS``), unless
    ``FICCO_BATCH_PREDICT_THREADS`` says how many threads."""
    allowed = len(os.sched_getaffinity(0))
    per_cpu = {"all": allowed, "spare": max(allowed - 1, 1)}[cpus]
    settings = Settings(WORKER_CPUS=cpus, BATCH_PREDICT_THREADS=predict_threads)
    options = _worker_options(settings, ModelStore(tmp_path))
    assert options.threads == (predict_threads or per_cpu)
    assert options.cpus == cpus


def test_bad_priority_names_the_allowed_values():
    with pytest.raises(ValueError, match=r"priority must be one of \['idle', 'low', 'normal'\]; got 'high'"):
        WorkerOptions(priority="high")


def test_batch_errors_keep_their_shape(client):
    response = client.post("/v1/recommend/batch", json={"scenarios": [GOOD, {**GOOD, "op": "x"}]})
    assert response.status_code == 200 and response.json()["failed"] == 1
    assert response.json()["data"][1]["errors"][0]["field"] == "scenarios.1.op"
    bad_json = client.post(
        "/v1/recommend/batch", content=b'{"scenarios": [', headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 422 and bad_json.json()["detail"][0]["field"] == "body"


def test_batch_answers_with_the_served_version_across_reloads_and_current_flips(model_root, start):
    old = current_version(model_root, HARDWARE)
    new = next(c["version"] for c in list_models(model_root)[HARDWARE] if c["version"] != old)
    scenarios = [GOOD, {**GOOD, "m": 128}]

    def versions(client) -> tuple[set[str], str]:
        batch = client.post("/v1/recommend/batch", json={"scenarios": scenarios})
        single = client.post("/v1/recommend", json={**GOOD, "m": 256})
        return {a["result"]["model_version"] for a in batch.json()["data"]}, single.json()["model_version"]

    with start(model_root) as client:  # no polling: the server swaps models only when told
        assert versions(client) == ({old}, old)
        promote(model_root, HARDWARE, new)
        assert versions(client) == ({old}, old)  # CURRENT flipped, the server still serves old
        client.app.state.store.refresh()
        assert versions(client) == ({new}, new)
        promote(model_root, HARDWARE, old)
        assert versions(client) == ({new}, new)


@pytest.mark.heavy
def test_a_worker_lost_during_a_batch_is_503_then_replaced(registry_root, start, wait_for):
    with start(registry_root) as client:
        workers, gate = client.app.state.batch_workers, client.app.state.batch_gate
        (pid,) = workers.pids
        assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}).status_code == 200
        os.kill(pid, signal.SIGSTOP)  # the job waits in its socket until the worker is killed
        answers = []
        request = threading.Thread(
            target=lambda: answers.append(client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}))
        )
        request.start()
        assert wait_for(lambda: gate.admitted == 1)
        time.sleep(0.2)  # the job is written as soon as the batch is admitted
        os.kill(pid, signal.SIGKILL)
        request.join(timeout=60)
        (lost,) = answers
        assert lost.status_code == 503 and lost.headers["retry-after"] == "1"
        assert "batch worker exited" in lost.json()["detail"]
        assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}).status_code == 200
        assert workers.pids != [pid]


def test_shutdown_stops_the_workers(registry_root, start):
    with start(registry_root) as client:
        pids = client.app.state.batch_workers.pids
        assert pids and all(_running(pid) for pid in pids)
    assert not any(_running(pid) for pid in pids)


@pytest.mark.heavy
def test_workers_exit_when_the_server_dies(registry_root, tmp_path, wait_for):
    # A server process that ends without its shutdown (os._exit, as after SIGKILL): the worker sees its
    # socket close and exits on its own, leaving no orphan.
    script = textwrap.dedent(
        f"""
        import os, warnings
        warnings.filterwarnings("ignore")
        from fastapi.testclient import TestClient
        from ficco.service.core.config import Settings
        from ficco.service.main import create_app

        settings = Settings(MODEL_ROOT={str(registry_root)!r}, RELOAD_POLL_S=0)
        client = TestClient(create_app(settings)).__enter__()
        response = client.post("/v1/recommend/batch", json={{"scenarios": [{GOOD!r}]}})
        print(response.status_code, *client.app.state.batch_workers.pids, flush=True)
        os._exit(0)
        """
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the dead server leaves its model snapshot there
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    status, pid = done.stdout.split()
    assert status == "200", done.stderr
    assert wait_for(lambda: not _running(int(pid)))


def test_a_worker_is_ready_once_it_has_loaded_and_warmed_up(registry_root):
    from ficco.service.core.worker_pool import WorkerProcess

    version = current_version(registry_root, HARDWARE)

    async def scenario():
        worker = WorkerProcess(WorkerOptions(model_root=str(registry_root), priority="normal"))
        await worker.start({HARDWARE: version})
        try:
            assert not worker.ready  # a process just started has not loaded anything yet
            assert await asyncio.wait_for(worker.serving(), 120) == {HARDWARE: version}
            assert worker.ready
        finally:
            await worker.stop()
        assert not worker.ready

    asyncio.run(scenario())


def test_readyz_waits_for_the_batch_workers(client, monkeypatch, wait_for):
    from ficco.service.core.worker_pool import WorkerProcess

    assert wait_for(lambda: client.get("/readyz").status_code == 200)
    monkeypatch.setattr(WorkerProcess, "ready", property(lambda self: False))
    cold = client.get("/readyz")
    assert cold.status_code == 503
    assert cold.json()["batch_workers_ready"] is False and cold.json()["serving"]


@pytest.mark.heavy
def test_a_worker_restarted_after_the_model_file_is_damaged_serves_what_the_server_serves(
    model_root, start, damage, wait_for
):
    served = current_version(model_root, HARDWARE)
    with start(model_root) as client:
        workers = client.app.state.batch_workers
        assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}).status_code == 200
        damage(model_root / HARDWARE / served, "corrupt")  # the served version's file, in place
        (worker,) = workers.workers
        pid = worker.process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_for(  # gone, or already started again by the supervisor
            lambda: worker.process is None or worker.process.pid != pid or worker.process.poll() is not None
        )
        batch = client.post("/v1/recommend/batch", json={"scenarios": [GOOD]})
        assert batch.status_code == 200, batch.text
        assert batch.json()["data"][0]["result"]["model_version"] == served
        assert workers.pids != [pid]
        single = client.post("/v1/recommend", json=GOOD).json()
        assert single["model_version"] == served


def test_models_with_an_unreadable_card_show_no_absolute_path(model_root, start):
    other = next(
        c["version"]
        for c in list_models(model_root)[HARDWARE]
        if c["version"] != current_version(model_root, HARDWARE)
    )
    (model_root / HARDWARE / other / "card.json").write_text("{not json")
    with start(model_root) as client:
        text = client.get("/v1/models").text
        assert "is corrupt" in text and "$FICCO_MODEL_ROOT" in text
        assert str(model_root) not in text and "ficco-models-" not in text


@pytest.mark.heavy
@pytest.mark.parametrize("when", ["before ready", "after ready"])
def test_a_worker_killed_outside_a_job_is_started_again_and_readyz_recovers(
    when, registry_root, start, wait_for
):
    """No batch needs to arrive: the supervisor starts a dead worker again (a load balancer that routes only
    to ready instances would never send one)."""
    with start(registry_root) as client:
        workers = client.app.state.batch_workers
        (pid,) = workers.pids
        if when == "after ready":
            assert wait_for(lambda: client.get("/readyz").status_code == 200)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: client.get("/readyz").status_code == 503 or workers.pids not in ([], [pid]))
        assert wait_for(lambda: client.get("/readyz").status_code == 200, timeout_s=120)
        assert workers.pids and workers.pids != [pid]


@pytest.mark.heavy
def test_an_unread_batch_answer_holds_its_admission_only_until_the_send_timeout(
    registry_root, settings_for, wait_for
):
    """A client that sends a batch and never reads the answer: the answer goes out as the connection drains,
    its admission held (at most FICCO_BATCH_CONCURRENCY + FICCO_BATCH_QUEUE answers wait in memory) until
    FICCO_SEND_TIMEOUT_S, then the connection is closed and the admission freed."""
    import json
    import socket
    import urllib.request

    import uvicorn

    from ficco.service.main import create_app

    app = create_app(settings_for(registry_root, SEND_TIMEOUT_S=2.0, MAX_BATCH=10_000))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        assert wait_for(lambda: server.started, timeout_s=60)
        body = json.dumps({"scenarios": [{**GOOD, "m": 2 * (i + 1)} for i in range(10_000)]}).encode()
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(sock.getsockname())
        head = b"POST /v1/recommend/batch HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        reader.sendall(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        gate = app.state.batch_gate
        assert wait_for(lambda: gate.admitted == 1)
        assert wait_for(lambda: gate.admitted == 0, timeout_s=60)  # the send timed out
        reader.settimeout(10)
        received = b""
        while chunk := reader.recv(1 << 16):
            received += chunk
        head_bytes, _, answer_bytes = received.partition(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head_bytes.lower()).group(1))
        assert received.startswith(b"HTTP/1.1 200") and len(answer_bytes) < length  # cut off, then closed
        one = json.dumps({"scenarios": [GOOD]}).encode()
        headers = {"content-type": "application/json"}
        small = urllib.request.Request(url + "/v1/recommend/batch", data=one, headers=headers)
        with urllib.request.urlopen(small, timeout=60) as answer:
            assert answer.status == 200
    finally:
        server.should_exit = True


def test_a_full_batch_queue_does_not_refuse_single_scores(registry_root, start):
    """Single POST /v1/score requests are admitted apart from batches (FICCO_SCORE_QUEUE): a full batch
    queue gives batches 429 and still answers them."""
    config = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 8,
              "num_key_value_heads": 8, "num_hidden_layers": 2}  # fmt: skip
    with start(registry_root, SCORE_QUEUE=2) as client:
        gate = client.app.state.batch_gate
        gate.admitted = gate.limit  # as if every batch slot and queue place were taken
        try:
            assert client.post("/v1/recommend/batch", json={"scenarios": [GOOD]}).status_code == 429
            assert (
                client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [64]}).status_code == 200
            )
        finally:
            gate.admitted = 0
        scores = client.app.state.score_gate
        scores.admitted = scores.limit
        refused = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [64]})
        scores.admitted = 0
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"


def test_a_warm_worker_freezes_what_it_loaded_and_collects_young_objects_less_often():
    code = textwrap.dedent(
        """
        import gc
        from ficco.service.core.worker_pool import GC_YOUNG_THRESHOLD, freeze_heap
        models = [list(range(100)) for _ in range(1000)]  # what a worker holds for life
        freeze_heap()
        print(gc.get_freeze_count() > len(models), gc.get_threshold()[0] == GC_YOUNG_THRESHOLD > 700)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]
