"""Atomic writes leave the old file intact when writing fails, and no temp files behind."""

import json

import numpy as np
import pytest

from hetcluster.fileio import write_atomic, write_json_atomic, write_text_atomic


def test_write_replaces_content(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    write_text_atomic(target, "one")
    write_text_atomic(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["a.txt"]


def test_failed_write_keeps_old_file(tmp_path):
    target = tmp_path / "a.txt"
    write_text_atomic(target, "old")

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(target, broken)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_json_handles_numpy(tmp_path):
    target = write_json_atomic(tmp_path / "r.json", {"x": np.float64(1.5), "v": np.arange(3)})
    assert json.loads(target.read_text()) == {"x": 1.5, "v": [0, 1, 2]}
