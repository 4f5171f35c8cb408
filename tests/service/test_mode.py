"""The execution mode (eager, or graph: the layer runs inside a replayed CUDA graph) reaches the predictor
(issue 15 item 4)."""

from __future__ import annotations

GOOD = {"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096}


def _request(pair: dict) -> dict:
    """The /v1/recommend body of a scored pair's scenario."""
    keys = ("op", "m", "n", "k", "dtype", "world_size")
    return {key: pair["scenario"][key] for key in keys}


def test_mode_field_defaults_to_eager_and_refuses_others(client):
    assert client.post("/v1/recommend", json={**GOOD, "mode": "graph"}).status_code == 200
    response = client.post("/v1/recommend", json={**GOOD, "mode": "compiled"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["allowed"] == "one of ['eager', 'graph']"


def test_mode_reaches_the_predictor_on_every_path(registry_root, start, monkeypatch):
    from ficco.training.predict.predictor import Predictor

    seen: list[str] = []
    original = Predictor.recommend

    def recommend(self, scenarios, mode="eager", *, host_factor=None):
        seen.append(mode)
        return original(self, scenarios, mode=mode, host_factor=host_factor)

    monkeypatch.setattr(Predictor, "recommend", recommend)
    with start(registry_root, CACHE_SIZE=0) as client:
        seen.clear()
        single = client.post("/v1/recommend", json={**GOOD, "mode": "graph"}).json()
        config = {
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        }  # fmt: skip
        score = client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [4096], "mode": "graph"})
        # Batches and scores are answered in the batch worker process, out of the patch's reach: their
        # answers are the predictor's graph-mode answers, as the single request's is.
        batch = client.post("/v1/recommend/batch", json={"scenarios": [{**GOOD, "mode": "graph"}]}).json()
        pair = score.json()["data"][0]["pairs"][0]
        alone = client.post("/v1/recommend", json={**_request(pair), "mode": "graph"}).json()
    assert seen == ["graph", "graph"]  # the single request and the pair asked alone
    assert single["mode"] == "graph" and [item["result"] for item in batch["data"]] == [single]
    assert score.json()["mode"] == "graph" and pair["predicted_speedup"] == alone["predicted_speedup"]


def test_cli_mode_option_is_checked(registry_root):
    from typer.testing import CliRunner

    from ficco.cli import app

    args = [
        "recommend",
        "--op",
        "ag_gemm",
        "--m",
        "64",
        "--n",
        "64",
        "--k",
        "64",
        "--model-root",
        str(registry_root),
    ]
    assert CliRunner().invoke(app, [*args, "--mode", "graph"]).exit_code == 0
    bad = CliRunner().invoke(app, [*args, "--mode", "compiled"])
    assert bad.exit_code == 2 and "mode" in bad.output


def test_host_factor_reaches_the_predictor_and_keys_the_cache(registry_root, start, monkeypatch):
    """A request's host factor is the one its answer is for, on the single, batch and score paths; answers
    for other factors are cached apart; out of range is refused naming the field and the range."""
    from ficco.training.predict.predictor import Predictor

    seen: list[float | None] = []
    original = Predictor.recommend

    def recommend(self, scenarios, mode="eager", *, host_factor=None):
        seen.append(host_factor)
        return original(self, scenarios, mode=mode, host_factor=host_factor)

    monkeypatch.setattr(Predictor, "recommend", recommend)
    with start(registry_root) as client:
        own = client.post("/v1/recommend", json=GOOD).json()["host_factor"]
        seen.clear()
        slow = client.post("/v1/recommend", json={**GOOD, "host_factor": 4.0}).json()
        again = client.post("/v1/recommend", json={**GOOD, "host_factor": 4.0}).json()
        batch = client.post("/v1/recommend/batch", json={"scenarios": [{**GOOD, "host_factor": 2.0}]}).json()
        config = {
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        }  # fmt: skip
        score = client.post(
            "/v1/score", json={"config": config, "tp": 2, "tokens": [4096], "host_factor": 3.0}
        )
        pair = score.json()["data"][0]["pairs"][0]
        alone = client.post("/v1/recommend", json={**_request(pair), "host_factor": 3.0}).json()
        bad = client.post("/v1/recommend", json={**GOOD, "host_factor": 0})
    assert slow["host_factor"] == again["host_factor"] == 4.0 and own != 4.0
    assert batch["data"][0]["result"]["host_factor"] == 2.0  # answered in the batch worker process
    assert pair["predicted_speedup"] == alone["predicted_speedup"]  # the score too
    assert seen == [4.0, 3.0]  # the repeat came from the cache; 3.0: the pair asked alone
    assert bad.status_code == 422
    detail = bad.json()["detail"][0]
    assert detail["loc"][-1] == "host_factor" and "0.25" in str(detail)
