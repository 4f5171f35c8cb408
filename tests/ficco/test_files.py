"""Whole-file writes: the old file or the new one, never a part, and no temporary file left behind."""

from __future__ import annotations

import os

import pytest

from ficco.files import replacing, write_text_atomic


def test_write_text_atomic_replaces_the_file_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text("old\n")
    write_text_atomic(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_write_text_atomic_sets_the_mode(tmp_path):
    path = tmp_path / "CURRENT"
    write_text_atomic(path, "v1\n", mode=0o640)
    assert path.stat().st_mode & 0o777 == 0o640


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary_one(tmp_path):
    path = tmp_path / "noise.parquet"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="writer failed"), replacing(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer failed")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["noise.parquet"]


def test_a_failed_rename_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    path.write_text("old")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_the_temporary_file_is_hidden_beside_the_target_and_unique(tmp_path):
    path = tmp_path / "result.json"
    with replacing(path) as first, replacing(path) as second:
        assert first.parent == second.parent == tmp_path
        assert first.name.startswith(".result.json.") and first.name.endswith(".tmp")
        assert first != second
        first.write_text("1")
        second.write_text("2")
    assert path.read_text() == "1"
