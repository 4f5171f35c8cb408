"""One mistake, one answer (docs/service.md, "One error contract"): the cases of issue 60 items 2, 3, 4, 6 and
9, each through the command line, HTTP and the Python client, with the documented status and the same line.

The registry: the h200x2 test model, and a custom profile ``b200x8`` (registered as ``ficco bench`` or
``ficco retrain --hardware b200x8.json`` registers one) with a simulated model of it at world size 8, and a
custom profile ``c100x2`` registered with no model at all.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from ficco.cli import app
from ficco.features import get_hardware
from ficco.features.hardware import NEW_PROFILE_HINT, register_profile
from ficco.service.client import ServiceError, _message
from ficco.service.errors import error_line

CHECKOUT = Path(__file__).resolve().parents[2]
LLAMA = CHECKOUT / "datasets" / "model_configs" / "Llama-3.1-8B.json"
DEEPSEEK = CHECKOUT / "tests" / "features" / "configs" / "DeepSeek-V3" / "config.json"
GOOD = {"op": "ag_gemm", "m": 8192, "n": 4096, "k": 4096}
SCENARIO = "recommend --op ag_gemm --m 8192 --n 4096 --k 4096 --format json"
B200 = dataclasses.replace(get_hardware("h200x8"), id="b200x8", gpu_name="NVIDIA B200", sm_count=148,
                           peak_bf16_tflops=2250.0, hbm_gbps=8000.0, link_gbps=900.0)  # fmt: skip
C100 = dataclasses.replace(get_hardware("h200x2"), id="c100x2", gpu_name="Custom C100", sm_count=100)


@pytest.fixture(scope="module")
def root(tmp_path_factory, train) -> Path:
    """h200x2's test model; b200x8 registered with a simulated model; c100x2 registered without one."""
    root = tmp_path_factory.mktemp("contract")
    train(root, "h200x2")
    register_profile(root, B200)
    train(root, "b200x8-sim", world_size=8, profile=B200)
    register_profile(root, C100)
    return root


@pytest.fixture(scope="module")
def http(root, start):
    with start(root) as client:
        yield client


@pytest.fixture(scope="module")
def service(http, service_client):
    with service_client(http) as client:
        yield client


def cli(root: Path, command: str, *extra: str):
    """``ficco <command>`` over the registry ``root``: (exit status, stdout, its ``error:`` lines, stderr)."""
    done = CliRunner().invoke(app, [*shlex.split(command), *extra, "--model-root", str(root)])
    errors = [line.removeprefix("error: ") for line in done.stderr.splitlines() if line.startswith("error: ")]
    return done.exit_code, done.stdout, errors, done.stderr


def refused(service, call) -> ServiceError:
    """The ``ServiceError`` ``call(service)`` raises; never pydantic's, never a raw list in its message."""
    with pytest.raises(ServiceError) as err:
        call(service)
    assert "[{" not in str(err.value), str(err.value)
    return err.value


# item 3: no model at this world size is 422 everywhere, with the same line ----------------------------------


@pytest.mark.parametrize(
    ("hardware", "world_size", "why"),
    [
        ("h200x2", 4, "the h200x2 model was trained at world_size [2] only"),
        ("h200x4", 4, "no model is loaded for it"),  # a known id: 422 as h200x2 at 4 is, never 404
        ("h200x8", None, "no model is loaded for it"),  # no world size: the hardware's 8 GPUs
    ],
)
def test_no_model_at_a_world_size_is_422_at_that_field_everywhere(
    root, http, service, hardware, world_size, why
):
    body = {**GOOD, "hardware": hardware, **({"world_size": world_size} if world_size else {})}
    response = http.post("/v1/recommend", json=body)
    assert response.status_code == 422, response.text
    (item,) = response.json()["detail"]
    size = world_size or 8
    assert (item["field"], item["type"]) == ("world_size", "not_served")
    assert f"no model answers hardware {hardware!r} at world_size={size}: {why}" in item["msg"]
    assert "pairs served: (h200x2, 2)." in item["msg"] and "`ficco retrain" in item["msg"]
    line = error_line([item])
    tp = ["--tp", str(world_size)] if world_size else []
    code, _, errors, _ = cli(root, f"{SCENARIO} --hardware {hardware}", *tp)
    assert (code, errors) == (2, [line])
    err = refused(service, lambda s: s.recommend(**body))
    assert err.status_code == 422 and err.errors == [item] and str(err).endswith(line)
    # scoring and tables say it at tp, with the same message
    score = http.post("/v1/score", json={"config": json.loads(LLAMA.read_text()), "tokens": [4096], **(
        {"tp": world_size} if world_size else {}), "hardware": hardware})  # fmt: skip
    (at_tp,) = score.json()["detail"]
    assert score.status_code == 422 and at_tp["field"] == "tp" and at_tp["msg"] == item["msg"]
    code, _, errors, _ = cli(root, f"score {LLAMA} --hardware {hardware}", *tp)
    assert (code, errors) == (2, [error_line([at_tp])])
    table = http.get(f"/v1/tables/{hardware}", params={"tp": world_size} if world_size else {})
    assert table.status_code == 422 and table.json()["detail"][0]["msg"] == item["msg"]


# item 2: no silent world-size substitution ---------------------------------------------------------------


def test_a_substitution_happens_only_when_asked_and_is_a_structured_field(root, http, service):
    """h200x8 with world size 2: the h200x2 model answers, and every interface says so in fields."""
    body = {**GOOD, "hardware": "h200x8", "world_size": 2}
    answer = http.post("/v1/recommend", json=body).json()
    assert answer["world_size"] == 2 and answer["hardware_id"] == "h200x2"
    sub = answer["substitution"]
    assert (sub["requested_hardware"], sub["answered_hardware"], sub["world_size"]) == ("h200x8", "h200x2", 2)
    assert sub["differs"] == {"gpu_count": [8, 2]} and sub["reason"] == answer["hardware_substitution"]
    code, out, _, _ = cli(root, f"{SCENARIO} --hardware h200x8 --tp 2")
    assert code == 0 and json.loads(out) == answer
    assert service.recommend(**body).model_dump() == answer
    own = http.post("/v1/recommend", json=GOOD).json()
    assert own["world_size"] == 2 and own["substitution"] is None and own["hardware_substitution"] is None


# item 3: unknown ids are 404 with the same known_ids on every route, and a way forward ---------------------


def test_an_unknown_hardware_id_is_404_with_the_same_known_ids_and_a_way_forward(root, http, service):
    config = json.loads(LLAMA.read_text())
    answers = [
        http.post("/v1/recommend", json={**GOOD, "hardware": "h200x3"}),
        http.post("/v1/score", json={"config": config, "tokens": [4096], "hardware": "h200x3"}),
        http.post(
            "/v1/score/batch", json={"configs": [{"config": config}], "tokens": [64], "hardware": "h200x3"}
        ),
        http.get("/v1/tables/h200x3"),
        http.post("/v1/tables/h200x3", json={"shapes": ["ag_gemm:4096:4096"]}),
    ]
    known = answers[0].json()["known_ids"]
    assert {"h200x2", "h200x8", "b200x8", "b200x8-sim", "c100x2"} <= set(known)
    for response in answers:
        assert response.status_code == 404, response.text
        assert response.json()["known_ids"] == known
        detail = response.json()["detail"]
        assert "unknown hardware id 'h200x3' (did you mean" in detail and detail.endswith(NEW_PROFILE_HINT)
    code, _, errors, _ = cli(root, f"{SCENARIO} --hardware h200x3")
    assert (code, errors) == (2, [answers[0].json()["detail"]])
    err = refused(service, lambda s: s.recommend(**GOOD, hardware="h200x3"))
    assert (err.status_code, err.known_ids) == (404, known) and str(err).endswith(answers[0].json()["detail"])


def test_the_client_raises_its_own_error_with_the_servers_items(http, service):
    """A mistyped op: the client's ServiceError (never pydantic's ValidationError), 422, the server's
    items."""
    err = refused(service, lambda s: s.recommend(**{**GOOD, "op": "ag_gem"}))
    server = http.post("/v1/recommend", json={**GOOD, "op": "ag_gem"}).json()["detail"]
    assert err.status_code == 422 and err.errors == server and str(err).endswith(error_line(server))
    err = refused(service, lambda s: s.score({"model_type": "llama"}, tp=2, tokens=[0]))
    assert err.status_code == 422 and err.errors[0]["field"] == "tokens.0"


# item 4: registered hardware ids work in every command and route --------------------------------------------


def test_registered_hardware_is_known_in_every_command_and_route(root, http, service, tmp_path):
    # b200x8: registered, with a simulated model only: refused with the way to its simulated model
    response = http.post("/v1/recommend", json={**GOOD, "hardware": "b200x8"})
    (item,) = response.json()["detail"]
    assert response.status_code == 422 and item["field"] == "world_size"
    assert "no model answers hardware 'b200x8' at world_size=8" in item["msg"]
    assert "ask the simulated model served for it: hardware 'b200x8-sim'" in item["msg"]
    assert "unknown hardware id" not in item["msg"]
    code, _, errors, _ = cli(root, f"{SCENARIO} --hardware b200x8")
    assert (code, errors) == (2, [error_line([item])])
    assert refused(service, lambda s: s.recommend(**GOOD, hardware="b200x8")).errors == [item]
    # b200x8-sim answers, at its 8 GPUs, in every interface (the batch in a worker process)
    sim = {**GOOD, "hardware": "b200x8-sim"}
    answer = http.post("/v1/recommend", json=sim).json()
    assert (answer["world_size"], answer["model_backend"], answer["hardware_id"]) == (
        8,
        "simulated",
        "b200x8-sim",
    )
    code, out, _, _ = cli(root, f"{SCENARIO} --hardware b200x8-sim")
    assert code == 0 and json.loads(out) == answer
    items = [sim, {**GOOD, "hardware": "b200x8"}, {**GOOD, "hardware": "c100x2"}]
    batch = http.post("/v1/recommend/batch", json={"scenarios": items}).json()
    assert batch["data"][0]["result"] == answer
    assert [item["errors"][0]["type"] for item in batch["data"][1:]] == ["not_served", "not_served"]
    code, out, _, _ = cli(root, f"score {LLAMA} --hardware b200x8-sim --format json")
    assert code == 0 and json.loads(out)["tp"] == 8
    # c100x2: registered without a model: a 422 naming how to measure it, never "unknown"
    code, _, errors, _ = cli(root, f"{SCENARIO} --hardware c100x2")
    assert code == 2 and "no model answers hardware 'c100x2' at world_size=2" in errors[0]
    assert "`ficco retrain --hardware c100x2 --tp 2`" in errors[0] and "unknown" not in errors[0]
    # tables: the simulated model's own; export names it
    assert http.get("/v1/tables/b200x8").status_code == 422
    posted = http.post(
        "/v1/tables/b200x8-sim", json={"shapes": ["ag_gemm:4096:4096"], "allow_simulated": True}
    )
    assert posted.status_code == 200 and posted.json()["world_size"] == 8
    code, _, errors, _ = cli(root, "export --hardware b200x8 --shape ag_gemm:4096:4096 --out", str(tmp_path))
    assert code == 2 and "a simulated model of it is registered: ask hardware 'b200x8-sim'" in errors[0]
    code, out, _, _ = cli(root, "export --hardware b200x8-sim --allow-simulated --shape ag_gemm:4096:4096 "
                                "--mode graph --out", str(tmp_path))  # fmt: skip
    assert code == 0 and "tp=8,mode=graph" in out


# item 6: batches answer each item; every bad field is named ------------------------------------------------


def test_a_batch_answers_every_good_item_in_http_and_the_client(http, service):
    scenarios = [GOOD, {**GOOD, "m": 8191}, {**GOOD, "hardware": "h200x3"}, {**GOOD, "op": "nope"}]
    body = http.post("/v1/recommend/batch", json={"scenarios": scenarios}).json()
    assert [item["status"] for item in body["data"]] == ["ok", "error", "error", "error"] and body[
        "failed"
    ] == 3
    answers = service.recommend_many(scenarios, errors="return")
    assert answers[0].model_dump() == body["data"][0]["result"]
    for got, item, status in zip(answers[1:], body["data"][1:], (422, 404, 422), strict=True):
        assert isinstance(got, ServiceError) and got.status_code == status  # what a single request gets
        assert got.errors == item["errors"]
    err = refused(service, lambda s: s.recommend_many(scenarios))
    assert [e["field"] for e in err.errors] == ["scenarios.1.m", "scenarios.2.hardware", "scenarios.3.op"]


def test_a_table_request_names_every_bad_shape(root, http, service, tmp_path):
    shapes = ["ag_gemm:4096", "ag_gemm:4096:4096", "zz_gemm:64:64", "ag_gemm:x:64", "a2a_gemm:4096:4096:7:2"]
    response = http.post("/v1/tables/h200x2", json={"shapes": shapes, "allow_simulated": True})
    assert response.status_code == 422
    fields = [e["field"] for e in response.json()["detail"]]
    assert fields == ["shapes.0", "shapes.2", "shapes.3", "shapes.4"], fields
    fetch = {"tp": 2, "mode": "graph", "shapes": shapes, "allow_simulated": True}
    err = refused(service, lambda s: s.fetch_table("h200x2", **fetch))
    assert err.status_code == 422 and [e["field"] for e in err.errors] == fields
    assert str(err).endswith(error_line(response.json()["detail"]))
    bad = "export --allow-simulated --shape ag_gemm:4096 --shape ag_gemm:x:64 --out"
    code, _, _, stderr = cli(root, bad, str(tmp_path))
    assert code == 2 and "'ag_gemm:4096', 'ag_gemm:x:64'" in stderr


# item 9: one refusal for what every config shares; notes; complete reasons; option names -------------------


def test_a_tp_no_model_answers_is_one_refusal_for_every_config(root, http, service, tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    for name in ("a", "b", "c"):
        (folder / f"{name}.json").write_text(LLAMA.read_text())
    code, out, errors, _ = cli(root, f"score {folder} --tp 4")
    assert code == 2 and len(errors) == 1 and not out, errors
    assert errors[0].startswith("tp: no model answers hardware 'h200x2' at world_size=4")
    config = json.loads(LLAMA.read_text())
    batch = http.post("/v1/score/batch", json={"configs": [{"config": config}] * 3, "tp": 4, "tokens": [64]})
    assert batch.status_code == 422 and [e["field"] for e in batch.json()["detail"]] == ["tp"]
    assert errors[0] == error_line(batch.json()["detail"])
    assert refused(service, lambda s: s.score(config, tp=4, tokens=[64])).errors[0]["field"] == "tp"


def test_a_quantized_config_is_scored_with_a_note(root, http, service):
    config = json.loads(DEEPSEEK.read_text())
    answer = http.post("/v1/score", json={"config": config, "tp": 2, "tokens": [4096]}).json()
    note = answer["config_note"]
    assert note.startswith("the config's quantization_config (fp8: fmt=e4m3") and "scored as bf16" in note
    assert service.score(config, tp=2, tokens=[4096]).config_note == note
    code, out, _, _ = cli(root, f"score {DEEPSEEK} --tp 2")
    assert code == 0 and f"note: {note}" in out
    llama = http.post("/v1/score", json={"config": json.loads(LLAMA.read_text()), "tp": 2, "tokens": [64]})
    assert llama.json()["config_note"] is None


def test_a_bad_json_reason_is_whole(root, http, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 4096,, }')
    reason = "Expecting property name enclosed in double quotes"
    code, _, errors, _ = cli(root, f"score {bad} {LLAMA}")
    assert code == 1 and errors[0] == f"{bad}: invalid JSON at line 1, column 45: {reason}"
    response = http.post(
        "/v1/score/batch", content=bad.read_bytes(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and response.json()["detail"][0]["msg"].endswith(reason)
    long = "x" * 300 + " and the end of the sentence."
    assert _message(long).endswith("the end of the sentence.")  # a proxy's text answer, whole


def test_one_spelling_per_option_and_the_old_one_for_a_release(root, tmp_path):
    code, out, _, stderr = cli(root, f"{SCENARIO} --world-size 2")
    assert code == 0 and json.loads(out)["world_size"] == 2
    assert "warning: `ficco recommend --world-size` is the last release's spelling of `--tp`" in stderr
    done = CliRunner().invoke(app, ["export", "--registry", str(root), "--hardware", "h200x2", "--shape",
                                    "ag_gemm:4096:4096", "--mode", "graph", "--out", str(tmp_path),
                                    "--allow-simulated"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "`ficco export --registry` is the last release's spelling of `--model-root`" in done.stderr
    group = typer.main.get_command(app)
    options = {
        name: {o for p in group.commands[name].params for o in p.opts} for name in group.commands
    }  # fmt: skip
    for command in ("train", "report", "retrain", "export", "recommend", "score", "serve"):
        assert "--model-root" in options[command] and "--registry" not in options[command], command
    for command in ("recommend", "score", "export", "bench", "retrain"):
        assert "--tp" in options[command] and "--world-size" not in options[command], command
