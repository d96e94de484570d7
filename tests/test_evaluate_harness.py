"""`hetcluster evaluate` end to end on an emulated fleet: every configuration trained from the same
checkpoint, measured, and scored in the JSON layout issue 5 specifies. The job's model is a user's
own (--model-config tests/data/models/user_net.json, not a registry name): the training processes
build it from the config the job file carries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from train_fleet import MODEL_ARGS, alive_tasks, emulated_fleet, write_profile

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

USER_NET = Path(__file__).parent / "data" / "models" / "user_net.json"

TOTAL = 40


def test_evaluate_trains_every_configuration_and_scores_the_choices(tmp_path):
    from hetcluster.models.spec import ModelSpec
    from hetcluster.training.checkpoints import checkpoint_steps

    model = ModelSpec.from_keras_config(USER_NET.read_text(), batch_size=8)
    with emulated_fleet(tmp_path / "fleet", "t5e") as fleet:
        out = tmp_path / "result.json"
        cmd = [sys.executable, "-m", "hetcluster.cli.app", "evaluate", "--inventory", str(fleet / "cluster.toml"),
               "--profile", str(write_profile(tmp_path / "profile.json", with_ghost=False, model=model)),
               "--model-config", str(USER_NET), "--batch-size", "8", "--total-steps", str(TOTAL),
               "--configs", "slow,fast+slow", "--workdir", str(tmp_path / "eval"), "--out", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["profile"]["model"]["name"] == model.name and model.name.startswith("user_net-")
    # two configurations, one alone and one set, cover every path of the harness (a third trained
    # another 3 TF processes for nothing new)
    assert [c["devices"] for c in result["configurations"]] == [["slow"], ["fast", "slow"]]
    for config in result["configurations"]:
        for side in ("predicted", "measured"):
            assert set(config[side]) >= {"time_s", "power_w", "energy_j", "edp_js"}
        assert config["run"]["steps_total"] == TOTAL and config["run"]["steps_applied"] == TOTAL
        assert config["run"]["memory_plan"] == ""  # plain TensorFlow fits this fleet: no plan traced
        # what pre-training predicted each worker from: its first step and its steady rate
        first, steady = config["run"]["first_step_s"], config["run"]["steady_steps_per_s"]
        assert set(first) <= set(config["devices"]) and config["devices"][0] in first
        assert all(0 < s < config["run"]["time_s"] for s in first.values())
        assert set(steady) <= set(first) and all(rate > 0 for rate in steady.values())
        if len(config["devices"]) == 1:  # alone, a worker takes every step: steady past the warm-up
            assert set(steady) == set(config["devices"])
        # whole job: the profile's 5 s of pre-training are on both sides
        assert config["measured"]["time_s"] > 5.0 and config["measured"]["energy_j"] > 100.0
    for label in ("slow", "fast+slow"):
        assert checkpoint_steps(tmp_path / "eval" / "configs" / label) == TOTAL
        assert (tmp_path / "eval" / "logs" / f"{label}-1.log").is_file()  # each run's own log is kept
    assert set(result["objectives"]) == {"time", "power", "energy", "edp"}
    # the hand-written profile makes every objective choose one of the two (fast alone never is)
    assert all(score["chosen"] in (["slow"], ["fast", "slow"]) for score in result["objectives"].values())
    for score in result["objectives"].values():
        assert set(score) >= {"chosen", "best", "exact", "regret"}
        assert score["exact"] is (score["regret"] == 0.0)
        assert score["regret"] >= 0.0
    # power: slow alone draws far less than anything with fast in it, by prediction and measurement
    assert result["objectives"]["power"]["best"] == ["slow"]
    assert result["pretrain"]["steps"] == 0 and result["pretrain"]["time_s"] == 5.0
    assert 0.0 < result["pretrain"]["overhead"] < 1.0
    assert set(result["mape"]) >= {"time_s", "energy_j", "power_w"}
    assert "76.67%" in done.stdout


def test_sigterm_stops_the_configuration_its_servers_and_its_folders(tmp_path):
    """`kill`, a systemd stop or a CI timeout send SIGTERM, whose default ends Python with no
    `finally`: until 2026-11-29 the TF servers of the configuration being trained kept running on
    the agents and its temporary folders stayed. Now it takes Ctrl-C's path (cli/signals.py)."""
    import os
    import signal
    import time

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with emulated_fleet(tmp_path / "fleet", "t5k") as fleet:
        cmd = [sys.executable, "-m", "hetcluster.cli.app", "evaluate", "--inventory", str(fleet / "cluster.toml"),
               "--profile", str(write_profile(tmp_path / "profile.json", with_ghost=False)), *MODEL_ARGS,
               "--total-steps", "1000000", "--configs", "fast+slow", "--workdir", str(tmp_path / "eval"),
               "--out", str(tmp_path / "result.json")]
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "TMPDIR": str(tmp)})
        def run_folders() -> list:
            return [p.name for p in tmp.iterdir() if p.name.startswith("hetcluster-")]

        deadline = time.monotonic() + 120
        # both workers' servers up and the run's folders made: the configuration is training
        while len(alive_tasks(fleet)) < 2 or not run_folders():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
            time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=120)
        assert process.returncode == 130, out[-3000:]
        assert "interrupted" in out and "servers stopped" in out
        assert not alive_tasks(fleet)
    assert not run_folders()
