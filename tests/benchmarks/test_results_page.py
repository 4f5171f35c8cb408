"""docs/results.md is what ``python -m benchmarks.results_page`` (and ``ficco results`` in a checkout) writes
from the committed results, to the byte."""

import json
from pathlib import Path

from typer.testing import CliRunner

from benchmarks.results_page import render_results
from ficco.cli import app

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_results_page_is_the_generated_one():
    committed = (REPO / "docs" / "results.md").read_text()
    stale = "docs/results.md is stale: run `python -m benchmarks.results_page --out docs/results.md`"
    assert committed == render_results(REPO), stale


def test_the_command_writes_the_page(tmp_path):
    out = tmp_path / "docs" / "results.md"
    done = CliRunner().invoke(app, ["results", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert out.read_text() == render_results(REPO) and "| eager | model |" in out.read_text()


def test_the_command_needs_a_checkout(monkeypatch, tmp_path):
    """An installed ficco (no checkout, so no ``benchmarks/``) says in one line what the command needs."""
    monkeypatch.setattr("ficco.CHECKOUT", None)
    done = CliRunner().invoke(app, ["results", "--out", str(tmp_path / "results.md")])
    assert done.exit_code == 1 and "source checkout" in done.output
    assert not (tmp_path / "results.md").exists()


def _write(root: Path, name: str, data: dict) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _held(regret: float) -> dict:
    return {"geomean_regret": regret, "in_best_set": 0.9, "n_slower_than_serial_2pct": 1, "n_scenarios": 600}


def test_the_four_gpu_section_reads_each_committed_result_and_states_the_goals(tmp_path):
    """Nothing without four-GPU results; with them, the model against its goals (eager 2%, graph 1.5%, vLLM's
    rule 10x the model's regret), the copy arrangement shipped, the all-gather, the knobs' verdicts and the
    world-size shares, each from its file."""
    from benchmarks.results_page import four_gpu_section

    assert four_gpu_section(tmp_path) == []
    results = "benchmarks/results"
    held = {
        "eager": {"model": _held(0.018), "size_heuristic": _held(0.05)},
        "graph": {"model": _held(0.016), "model_on_async_tp_rows": _held(0.01), "vllm_sp_rule": _held(0.2)},
    }
    evaluation = {
        "modes": {m: {"family_holdout": h} for m, h in held.items()},
        "dataset": {"path": "datasets/h100x4"},
    }
    _write(tmp_path, f"{results}/evaluate-h100x4.json", evaluation)
    (tmp_path / "models" / "h100x4").mkdir(parents=True)
    (tmp_path / "models" / "h100x4" / "CURRENT").write_text("20270101T000000Z-abc\n")
    _write(
        tmp_path,
        f"{results}/copy-arrangements-h100x4.json",
        {"verdict": {"ship": "1", "scores": {"per_peer": 1.2, "1": 1.0}}},
    )
    bench = {
        "allgather_bandwidth": [{"mbytes": 64, "nccl_ms": 0.3, "dma_ms": 0.25}],
        "goals": [{"goal": "average realized overlap", "value": 0.55, "target": 0.6, "met": False}],
    }
    _write(tmp_path, f"{results}/executor-h100x4.json", bench)
    verdict = {"ctas": {"kept": False, "modes": {"graph": {"shapes": 10, "wins": 0, "share": 0.0}}}}
    _write(tmp_path, f"{results}/knobs-h100x4.json", {"meta": {"world_size": 4}, "verdict": verdict})
    shares = {f: 0.0 for f in ("serial/sm", "serial/dma", "shard/sm", "shard/dma", "finer/sm", "finer/dma")}
    world = {
        "best_schedules": {
            "2 GPUs": {"graph": {**shares, "shard/dma": 1.0}},
            "4 GPUs": {"graph": {**shares, "serial/sm": 1.0}},
        },
        "moves": {
            "2 GPUs -> 4 GPUs": {"matched": 3, "graph": {"shard/dma": {"serial/sm": 2, "shard/dma": 1}}}
        },
    }
    _write(tmp_path, "reports/world-size/world-size.json", world)
    text = "\n".join(four_gpu_section(tmp_path))
    assert text.startswith("## Four GPUs") and "Model `h100x4/20270101T000000Z-abc`" in text
    assert "| eager: family holdout geomean regret <= 2.00% | 1.80% | yes |" in text
    assert "| graph: family holdout geomean regret <= 1.50% | 1.60% | **no** |" in text
    assert "| graph: vLLM's rule's regret >= 10x the model's, same rows | 20.0x | yes |" in text
    assert "`FICCO_COPY_STREAMS=1`" in text and "| 64 | 0.300 | 0.250 | 1.20 |" in text
    assert "| average realized overlap | 0.55 | 0.6 | **no** |" in text
    assert "| ctas | 4 | graph | 10 | 0 | 0% | leaves |" in text
    assert "| 4 GPUs | graph | 100% | 0% | 0% | 0% | 0% | 0% |" in text
    assert "2 GPUs -> 4 GPUs, graph: 1 of 3 model layers keep their fastest family" in text
