"""docs/results.md is what ``ficco results`` writes from the committed results, to the byte."""

from pathlib import Path

from typer.testing import CliRunner

from ficco.cli import app
from ficco.training.results import render_results

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_results_page_is_the_generated_one():
    committed = (REPO / "docs" / "results.md").read_text()
    stale = "docs/results.md is stale: run `ficco results --out docs/results.md`"
    assert committed == render_results(REPO), stale


def test_the_command_writes_the_page(tmp_path):
    out = tmp_path / "docs" / "results.md"
    done = CliRunner().invoke(app, ["results", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert out.read_text() == render_results(REPO) and "| eager | model |" in out.read_text()
