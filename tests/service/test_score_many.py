"""Many model configs in one call: ``ficco score`` over files, a folder and a model folder holding
config.json, and POST /v1/score/batch (issue 15, config files as downloaded)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from typer.testing import CliRunner

from ficco.cli import app

HF = Path(__file__).resolve().parents[1] / "features" / "configs"
MEMORY = HF / "from_memory"  # families with no real config.json at hand (see the folder's README)
runner = CliRunner()


def _score(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["score", *args])
    return result.exit_code, result.output


def test_score_many_files_and_a_model_folder_in_one_csv(registry_root, tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    for path in (HF / "Qwen3-8B.json", MEMORY / "granite-3.1-8b-instruct.json"):
        (folder / path.name).write_text(path.read_text())
    args = [str(MEMORY / "c4ai-command-r-v01.json"), str(folder), str(HF / "DeepSeek-V3")]
    code, text = _score(*args, "--format", "csv", "--model-root", str(registry_root))
    assert code == 0, text
    rows = list(csv.DictReader(io.StringIO(text)))
    models = list(dict.fromkeys(r["model"] for r in rows))
    assert models == ["c4ai-command-r-v01", "Qwen3-8B", "granite-3.1-8b-instruct", "DeepSeek-V3"]
    cohere = [r["pair"] for r in rows if r["model"] == "c4ai-command-r-v01"]
    assert cohere == ["qkv_mlp_up", "attn_mlp_out"]


def test_score_many_json_is_the_batch_answer_and_table_has_a_block_each(registry_root, client):
    paths = [HF / "Qwen3-8B.json", MEMORY / "OLMo-2-1124-7B.json"]
    code, text = _score(*map(str, paths), "--format", "json", "--model-root", str(registry_root))
    assert code == 0, text
    body = {
        "configs": [{"name": p.stem, "config": json.loads(p.read_text())} for p in paths],
        "tp": 2,
        "tokens": [4096],
    }
    response = client.post("/v1/score/batch", json=body)
    assert response.status_code == 200, response.text
    assert json.loads(text) == response.json()
    assert [d["result"]["model"] for d in response.json()["data"]] == ["Qwen3-8B", "OLMo-2-1124-7B"]
    assert response.json()["failed"] == 0
    code, table = _score(*map(str, paths), "--model-root", str(registry_root))
    assert code == 0 and table.count("layers, tp=2") == 2
    assert "parallel attention+MLP block" not in table


def test_score_table_says_how_a_parallel_block_is_scored(registry_root):
    code, table = _score(str(MEMORY / "c4ai-command-r-v01.json"), "--model-root", str(registry_root))
    assert code == 0, table
    assert "parallel attention+MLP block: scored as one all-gather+GEMM (qkv_mlp_up" in table


def test_score_batch_scores_every_good_config_and_refuses_each_bad_one(client):
    good = json.loads((HF / "Qwen3-8B.json").read_text())
    untyped = {k: v for k, v in good.items() if k != "model_type"}
    body = {
        "configs": [{"config": good}, {"config": {**good, "model_type": "falcon"}}, {"config": untyped}],
        "tp": 2,
        "tokens": [4096],
    }
    response = client.post("/v1/score/batch", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert (answer["count"], answer["failed"]) == (3, 2)
    assert [item["status"] for item in answer["data"]] == ["ok", "error", "error"]
    assert answer["data"][0]["result"]["data"][0]["pairs"]
    assert [e["field"] for e in answer["data"][1]["errors"]] == ["configs.1.config"]
    assert "model_type 'falcon'" in answer["data"][1]["errors"][0]["msg"]
    assert "has no 'model_type'" in answer["data"][2]["errors"][0]["msg"]


def test_score_folder_with_a_broken_file_scores_the_rest_and_exits_1(registry_root, tmp_path):
    folder = tmp_path / "configs"
    folder.mkdir()
    for path in (HF / "Qwen3-8B.json", MEMORY / "granite-3.1-8b-instruct.json"):
        (folder / path.name).write_text(path.read_text())
    (folder / "broken.json").write_text('{"hidden_size": 4096,\n "num_hidden_layers": }\n')
    code, text = _score(str(folder), "--format", "csv", "--model-root", str(registry_root))
    assert code == 1, text
    models = {r["model"] for r in csv.DictReader(io.StringIO(text.split("error:")[0]))}
    assert models == {"Qwen3-8B", "granite-3.1-8b-instruct"}
    assert f"error: {folder / 'broken.json'}: invalid JSON at line 2, column 23: Expecting value" in text
    assert "scored 2 of 3 configs" in text


def test_score_json_of_files_has_an_item_per_file_with_its_status(registry_root, tmp_path):
    untyped = {k: v for k, v in json.loads((HF / "Qwen3-8B.json").read_text()).items() if k != "model_type"}
    (tmp_path / "untyped.json").write_text(json.dumps(untyped))
    (tmp_path / "list.json").write_text("[1, 2]")
    paths = [HF / "Qwen3-8B.json", tmp_path / "untyped.json", tmp_path / "list.json"]
    result = runner.invoke(
        app, ["score", *map(str, paths), "--format", "json", "--model-root", str(registry_root)]
    )
    assert result.exit_code == 1
    answer = json.loads(result.stdout)
    assert [(i["index"], i["name"], i["status"]) for i in answer["data"]] == [
        (0, "Qwen3-8B", "ok"),
        (1, "untyped", "error"),
        (2, "list", "error"),
    ]
    assert "has no 'model_type'" in result.stderr and "must hold a JSON object" in result.stderr


def test_score_kv_layout_option_replicates_or_refuses(registry_root, tmp_path):
    # starcoder2-15b has 4 KV heads; at tp=2 both layouts split them, so use a 1-KV-head copy.
    data = json.loads((MEMORY / "starcoder2-15b.json").read_text())
    path = tmp_path / "mqa.json"
    path.write_text(json.dumps({**data, "num_key_value_heads": 1}))
    code, out = _score(str(path), "--model-root", str(registry_root))
    assert code == 1 and "kv_layout='megatron'" in out
    code, out = _score(str(path), "--kv-layout", "vllm", "--model-root", str(registry_root))
    assert code == 0, out
