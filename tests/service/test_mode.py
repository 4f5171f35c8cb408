"""The execution mode (eager, or graph: the layer runs inside a replayed CUDA graph) reaches the predictor
(issue 15 item 4)."""

from __future__ import annotations

from types import SimpleNamespace

from ficco.service.core.store import predict_fn

GOOD = {"op": "ag_gemm", "m": 4096, "n": 4096, "k": 4096}


class _ModePredictor:
    def __init__(self) -> None:
        self.modes: list[str] = []

    def recommend(self, scenarios, mode="eager"):
        self.modes.append(mode)
        return [SimpleNamespace(mode=mode)] * len(scenarios)


def test_predict_fn_passes_the_mode():
    predictor = _ModePredictor()
    assert predict_fn(predictor, "graph")([object()])[0].mode == "graph"
    assert predictor.modes == ["graph"]


def test_mode_field_defaults_to_eager_and_refuses_others(client):
    assert client.post("/v1/recommend", json={**GOOD, "mode": "graph"}).status_code == 200
    response = client.post("/v1/recommend", json={**GOOD, "mode": "compiled"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["allowed"] == "one of ['eager', 'graph']"


def test_mode_reaches_the_predictor_on_every_path(registry_root, start, monkeypatch):
    from ficco.training.predictor import Predictor

    seen: list[str] = []
    original = Predictor.recommend

    def recommend(self, scenarios, mode="eager"):
        seen.append(mode)
        return original(self, scenarios, mode=mode)

    monkeypatch.setattr(Predictor, "recommend", recommend)
    with start(registry_root, CACHE_SIZE=0) as client:
        seen.clear()
        single = client.post("/v1/recommend", json={**GOOD, "mode": "graph"}).json()
        config = {
            "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        }  # fmt: skip
        client.post("/v1/score", json={"config": config, "tp": 2, "tokens": [4096], "mode": "graph"})
        # Batches are answered in the batch worker process, out of the patch's reach: its answer is the
        # predictor's graph-mode answer, as the single request's is.
        batch = client.post("/v1/recommend/batch", json={"scenarios": [{**GOOD, "mode": "graph"}]}).json()
    assert seen == ["graph", "graph"]
    assert single["mode"] == "graph" and batch["data"] == [single]


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
