"""Atomic writes leave the old file intact when writing fails, and no temp files behind."""

import json

import numpy as np
import pytest

from hetcluster.errors import ConfigError
from hetcluster.fileio import (
    check_writable,
    figure_format,
    write_atomic,
    write_figure_atomic,
    write_json_atomic,
    write_text_atomic,
)


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


def test_a_folder_that_cannot_hold_the_file_is_a_config_error_not_an_oserror(tmp_path):
    blocker = tmp_path / "report"
    blocker.write_text("a file where a folder is wanted")
    with pytest.raises(ConfigError, match="is not a folder"):
        check_writable(blocker / "sub" / "pareto.png")
    with pytest.raises(ConfigError, match=r"Cannot write .*pareto\.png"):
        write_text_atomic(blocker / "sub" / "pareto.png", "x")


def test_figures_are_written_in_their_suffix_format_and_readable(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    svg = write_figure_atomic(tmp_path / "a.svg", fig)
    png = write_figure_atomic(tmp_path / "b", fig)
    plt.close(fig)
    assert b"<svg" in svg.read_bytes()[:400] and png.read_bytes()[:4] == b"\x89PNG"
    assert svg.stat().st_mode & 0o777 == 0o644
    assert figure_format(tmp_path / "c.JPG") == "jpg"
    with pytest.raises(ConfigError, match=r"\.xyz"):
        figure_format("plot.xyz")
