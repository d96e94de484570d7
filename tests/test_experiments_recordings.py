"""experiments/recordings.py: the recorded choice-accuracy truths in one Parquet file, read back as
they were recorded; the committed dataset holds the recordings kept as test data, unchanged."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from recorded_truths import RESULTS, copy_recordings

from experiments import recordings

REPEATED, ONCE = ("full-x4-r2-5dev", "small_cnn"), ("full", "small_cnn")


def _same(a: recordings.Recording, b: recordings.Recording) -> bool:
    return json.dumps(a.evaluation) == json.dumps(b.evaluation) and json.dumps(a.setting) == json.dumps(b.setting)


def test_a_folder_added_reads_back_as_recorded_and_replaces_its_earlier_rows(tmp_path, capsys) -> None:
    root = copy_recordings(tmp_path / "root", (REPEATED, ONCE))
    dataset = tmp_path / "recordings.parquet"
    assert recordings.main(["--dataset", str(dataset), "add", str(root / "full-x4-r2-5dev"), "--unseen"]) == 0
    assert recordings.main(["--dataset", str(dataset), "add", str(root / "full"), "--left-out", "a reason"]) == 0
    assert "added full/small_cnn" in capsys.readouterr().out
    back = recordings.read(dataset)
    assert [r.label for r in back] == ["full/small_cnn", "full-x4-r2-5dev/small_cnn"]   # by folder name
    once, repeated = back
    assert repeated.unseen and not repeated.left_out and repeated.scored and repeated.total_steps == 2000
    assert once.left_out == "a reason" and not once.repeated and not once.scored
    assert all(_same(r, recordings.in_folder(root / r.folder)[0]) for r in back)
    columns = pd.read_parquet(dataset, columns=["folder", "devices", "configurations", "repeated"])
    assert columns.loc[1].tolist() == ["full-x4-r2-5dev", "server+jetson-xavier+jetson-nano+rpi4+phone", 31, True]

    recordings.add(root / "full-x4-r2-5dev", dataset)   # again, now counted as seen: one row, new flags
    again = {r.label: r for r in recordings.read(dataset)}
    assert len(again) == 2 and not again["full-x4-r2-5dev/small_cnn"].unseen
    assert recordings.main(["--dataset", str(dataset), "list"]) == 0
    assert "full/small_cnn  once, left out: a reason" in capsys.readouterr().out

    assert recordings.main(["--dataset", str(dataset), "export", "full/small_cnn", "--to", str(tmp_path / "out")]) == 0
    [exported] = recordings.load(tmp_path / "out")
    assert exported.label == "full/small_cnn" and _same(exported, again["full/small_cnn"])
    with pytest.raises(SystemExit, match="not in .*: full/typo"):
        recordings.main(["--dataset", str(dataset), "export", "full/typo", "--to", str(tmp_path / "out")])


def test_load_reads_a_dataset_a_results_folder_or_a_folder_of_them(tmp_path) -> None:
    root = copy_recordings(tmp_path / "root", (REPEATED, ONCE))
    assert [r.label for r in recordings.load(root)] == ["full/small_cnn", "full-x4-r2-5dev/small_cnn"]
    assert [r.label for r in recordings.load(root / "full")] == ["full/small_cnn"]
    with pytest.raises(SystemExit, match="neither a .parquet dataset nor a folder"):
        recordings.load(tmp_path / "nothing-here")
    with pytest.raises(SystemExit, match="no recording in"):
        recordings.add(tmp_path / "root", tmp_path / "recordings.parquet")   # a root, not a results folder


def test_the_committed_dataset_holds_the_test_recordings_unchanged() -> None:
    kept = {r.label: r for r in recordings.read()}
    copies = recordings.load(RESULTS)
    assert len(copies) == 7
    for copy in copies:
        assert _same(copy, kept[copy.label]), copy.label


def test_the_committed_headline_scores_every_counted_repeated_recording_of_the_dataset() -> None:
    """summary.csv of replanned-repeated is four cases per scored recording, the unseen ones among them."""
    dataset = recordings.read()
    summary = pd.read_csv(recordings.DATASET.parent / "replanned-repeated" / "summary.csv").set_index("scope")
    scored = [r for r in dataset if r.scored]
    assert summary.loc["all", "cases"] == 4 * len(scored)
    assert summary.loc["unseen", "cases"] == 4 * sum(r.unseen for r in scored)
    assert all(r.scored for r in dataset if r.unseen)
