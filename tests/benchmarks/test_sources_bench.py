"""benchmarks.sources keeps every finished line; a second run under the same arguments resumes from them."""

import json

from benchmarks.sources import kept_lines

SETTINGS = {
    "target": ["datasets/h200x2"],
    "repeats": [],
    "added": ["datasets/h200x2-v2"],
    "config": "c",
    "seed": 0,
}


def _keep(path, settings, names):
    lines = [{"recipe": n, "own": {"eager": {"regret": 0.01}}} for n in names]
    path.write_text(json.dumps({"settings": settings, "lines": lines}))


def test_lines_kept_under_the_same_arguments_are_reused(tmp_path):
    path = tmp_path / "sources.lines.json"
    _keep(path, SETTINGS, ["target alone", "+ h200x2-v2"])
    assert list(kept_lines(path, SETTINGS)) == ["target alone", "+ h200x2-v2"]


def test_lines_kept_under_other_arguments_start_over(tmp_path, capsys):
    path = tmp_path / "sources.lines.json"
    _keep(path, {**SETTINGS, "seed": 1}, ["target alone"])
    assert kept_lines(path, SETTINGS) == {}
    assert "starting over" in capsys.readouterr().out


def test_no_kept_file_means_nothing_kept(tmp_path):
    assert kept_lines(tmp_path / "missing.lines.json", SETTINGS) == {}
