"""The experiment notebooks run headless on their reduced configuration, so they cannot rot.

Each notebook is executed top to bottom with nbclient (kernel "python3", which jupyter_client
launches with this interpreter) into a temporary results folder; a failing cell fails the test
with the cell's traceback. The checks afterwards look at what the notebook wrote, so a notebook
that runs but produces nothing still fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.run_notebook import execute

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]


def reduced(out_dir: Path) -> dict[str, str]:
    return {"HETCLUSTER_EXPERIMENTS_REDUCED": "1", "HETCLUSTER_EXPERIMENTS_OUT": str(out_dir)}


def test_memory_capacity_notebook_scheduler_fits_at_least_plain(tmp_path: Path) -> None:
    # each value is measured at its prediction (shrunk while over the budget) and not grown past it:
    # every measurement is a process importing TensorFlow: growing took 10-12 of them (the test 191
    # CPU seconds on a 2-core host), not growing 5-7 (71-74 s). The published reduced run grows, up to twice
    execute("memory_capacity", {**reduced(tmp_path), "HETCLUSTER_MEMORY_MAX_GROWS": "0"}, timeout_s=600)
    batches = pd.read_csv(tmp_path / "largest_batch.csv")
    depths = pd.read_csv(tmp_path / "deepest_resnet.csv").set_index("method")
    assert not batches["over_budget"].any() and not depths["over_budget"].any()
    by_method = batches.set_index("method")
    # the plan's own prediction is deterministic: the scheduler fits at least plain TF's batch
    assert by_method.loc["scheduler", "predicted_batch"] >= by_method.loc["plain TF", "predicted_batch"] >= 1
    # measured: a peak-memory search on a 24 MiB budget moves by ±10 % between runs (small_cnn
    # 16x16 scheduled measured 314 and, once, 234 against plain TF's 249), and small_cnn has
    # little activation memory to save, so the measured order is checked within that noise
    per_method = by_method["largest_batch"]
    assert per_method["scheduler"] >= 0.9 * per_method["plain TF"] and per_method["plain TF"] >= 1
    assert depths.loc["scheduler", "depth"] >= depths.loc["plain TF", "depth"]
    assert (depths["measured_peak_mib"] <= depths["budget_mib"]).all()
    assert (tmp_path / "memory_capacity.png").read_bytes()[:4] == b"\x89PNG"


def test_choice_accuracy_notebook_renders_results(tmp_path: Path) -> None:
    from test_experiments_accuracy import write_raw_results

    from experiments import choice_accuracy
    from experiments.common import machine_info

    choice_accuracy.render(tmp_path, write_raw_results(tmp_path))

    run = {"before": machine_info(), "after": machine_info(), "command": "test", "models_run_now": ["m1", "m2"]}
    (tmp_path / "machine.json").write_text(json.dumps({"runs": [run]}))
    nb = execute("choice_accuracy", {"HETCLUSTER_CHOICE_ACCURACY_DIR": str(tmp_path)}, timeout_s=300)
    text = "".join(o.get("text", "") + json.dumps(o.get("data", {})) for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert "76.7%" in text and "62.5%" in text  # the reference, and 5 of 8 exact in RUNS
    assert "image/png" in text


def test_compare_preferences_notebook_on_the_emulated_fleet(tmp_path: Path) -> None:
    execute("compare_preferences", reduced(tmp_path), timeout_s=900)
    plans = json.loads((tmp_path / "plans.json").read_text())
    assert set(plans) == {"time", "power", "energy", "edp"}
    choices = pd.read_csv(tmp_path / "choices.csv").set_index("objective")
    assert (choices["measured_time_s"] > 0).all() and (choices["measured_energy_j"] > 0).all()
    # the power objective's choice draws the least measured power of the chosen configurations
    assert choices.loc["power", "predicted_power_w"] == choices["predicted_power_w"].min()
    saved = pd.read_csv(tmp_path / "energy_saved.csv", index_col=0)
    assert all(saved.loc[o, o] == 0 for o in saved.index)
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    # the notebook tore its fleet down: no agent of its state dir is left
    assert "cluster down" in (tmp_path / "commands.log").read_text()
