"""Pre-training that fits the job, end to end on an emulated server and phone (small_cnn, batch 16):
`plan` then `train` in one workdir pre-trains once, and the job trains exactly the steps asked
with pre-training inside its budget; a job too short for its budget is refused before any agent
is asked anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

JOB = ("--model", "small_cnn", "--batch-size", "16", "--total-steps", "300")


def hetcluster(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetcluster.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_plan_then_train_pretrains_once_and_trains_exactly_the_steps_asked(tmp_path):
    from hetcluster.emulation.catalog import load_catalog
    from hetcluster.emulation.cluster import cluster_down, cluster_up

    catalog = load_catalog()
    inventory = tmp_path / "cluster.toml"
    cluster_up([catalog["server"], catalog["phone"]], inventory, name=f"pb{os.getpid() % 100000}",
               state_dir=tmp_path / "state")
    try:
        workdir = tmp_path / "job"
        planned = hetcluster("plan", "--inventory", str(inventory), *JOB, "--workdir", str(workdir))
        assert planned.returncode == 0, planned.stdout[-3000:] + planned.stderr[-3000:]
        assert "at most 100 of its 300 steps count toward it" in planned.stdout
        profile = json.loads((workdir / "profile.json").read_text())
        assert profile["pretrain_steps"] <= 100   # a run past the budget was measurement only
        report_path = tmp_path / "report.json"
        trained = hetcluster("train", "--inventory", str(inventory), *JOB, "--workdir", str(workdir),
                             "--report", str(report_path))
        assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
        assert "pre-training: reusing" in trained.stdout and "pre-training budget" not in trained.stdout
        assert json.loads((workdir / "profile.json").read_text())["created_wall_s"] == profile["created_wall_s"]
        report = json.loads(report_path.read_text())
        assert report["steps_total"] == 300
        assert report["pretrain"]["steps"] == profile["pretrain_steps"]
        print(f"pre-training {profile['pretrain_steps']} steps in {profile['pretrain_time_s']:.1f} s; "
              f"the job {report['steps_total']} steps")
    finally:
        cluster_down(tmp_path / "state")


def test_a_job_too_short_for_its_budget_is_refused_before_any_agent_is_asked(tmp_path):
    from recorded_fleet import write_inventory

    inventory = write_inventory(tmp_path)   # its agents are not running: asking one would fail otherwise
    done = hetcluster("train", "--inventory", str(inventory), "--model", "small_cnn", "--input-shape", "16x16x1",
                      "--batch-size", "16", "--total-steps", "40", "--workdir", str(tmp_path / "job"), timeout_s=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "too short to plan" in done.stderr and "--total-steps 42 or more" in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2 and not (tmp_path / "job").exists()
