"""`hetcluster train` on an emulated cluster (real agents, cgroup/duty-cycle slowed) when things fail:
a worker killed mid-training, an agent missing at start, Ctrl-C, the coordinator killed, --resume;
and, sharing the fleet, a tight device that puts every worker under its memory plan.

A hand-written profile (no checkpoint, pre-training skipped) keeps each run short; small_cnn at
16x16x3. Each test drives the real CLI in a subprocess and reads the job's checkpoints to know when
to strike.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_fleet import MODEL_ARGS, alive_tasks, emulated_fleet, write_profile

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

# each strike waits for a checkpoint (every 40 steps): the last, 40 steps past the one Ctrl-C left, lands well
# before the end
TOTAL = 300


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with emulated_fleet(tmp_path_factory.mktemp("fleet"), "t5f") as root:
        yield root


def _train(fleet: Path, workdir: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "hetcluster.cli.app", "train", "--inventory", str(fleet / "cluster.toml"),
           "--workdir", str(workdir), "--report", str(workdir / "report.json"), *extra]
    # a coordinator killed outright leaves its temporary directories: in the test's, not the host's
    tmp = workdir.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})


def _new_job(fleet: Path, workdir: Path, *extra: str) -> subprocess.Popen:
    return _train(
        fleet,
        workdir,
        "--profile",
        str(write_profile(fleet / f"profile-{workdir.name}.json")),
        *MODEL_ARGS,
        "--total-steps",
        str(TOTAL),
        "--require",
        "fast",
        "--require",
        "slow",
        "--round-steps",
        "20",
        *extra,
    )


def _ledger(workdir: Path) -> dict:
    try:
        return json.loads((workdir / "train_state.json").read_text())
    except (OSError, ValueError):
        return {}


def _wait_for(condition, process: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"train exited early ({process.returncode}): {process.stdout.read()[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("timed out waiting")
        time.sleep(0.2)


def _finish(process: subprocess.Popen, timeout_s: float = 180.0) -> str:
    out, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, out[-3000:]
    return out


def test_worker_killed_mid_training_and_missing_agent_at_start(fleet, tmp_path):
    from hetcluster.inventory import load_inventory
    from hetcluster.training.checkpoints import checkpoint_steps

    workdir = tmp_path / "job"
    # strike at the first checkpoint (step 40 of 600), not at the ledger's first progress line: that
    # is rewritten every 5 s, and on a fast host the job had finished before the kill landed
    process = _new_job(fleet, workdir, "--allow-missing", "--checkpoint-every", "40")
    _wait_for(lambda: checkpoint_steps(workdir / "checkpoints") >= 40, process)
    ledger = _ledger(workdir)
    assert "ghost" not in ledger["chosen"]  # its agent is missing: re-planned without it
    inventory = load_inventory(fleet / "cluster.toml")
    with inventory.device("slow").client() as client:
        [task] = client.task_status(ledger["tasks"]["slow"])
    os.kill(task.pid, signal.SIGKILL)
    out = _finish(process)
    assert "planning without ghost" in out
    report = json.loads((workdir / "report.json").read_text())
    assert report["steps_total"] == TOTAL and checkpoint_steps(workdir / "checkpoints") == TOTAL
    assert report["lost_workers"] == ["slow"]
    assert report["steps_per_worker"]["fast"] > 0
    assert report["measured"]["energy_j"] > 100.0 and report["measured"]["time_s"] > 5.0
    assert not alive_tasks(fleet)


def test_ctrl_c_then_coordinator_killed_then_resume(fleet, tmp_path):
    from hetcluster.training.checkpoints import checkpoint_steps

    workdir = tmp_path / "job"
    checkpoints = workdir / "checkpoints"
    process = _new_job(fleet, workdir, "--checkpoint-every", "40", "--allow-missing")
    _wait_for(lambda: checkpoint_steps(checkpoints) >= 40, process)
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 130, out[-3000:]
    assert "--resume" in out and "checkpoint at step" in out
    interrupted_at = checkpoint_steps(checkpoints)
    assert 40 <= interrupted_at < TOTAL
    assert not alive_tasks(fleet)  # servers stopped

    # resume, then kill the coordinator outright once it has written another checkpoint
    process = _train(fleet, workdir, "--resume")
    _wait_for(lambda: checkpoint_steps(checkpoints) >= interrupted_at + 40, process)
    process.kill()
    process.wait()
    time.sleep(2.0)  # its training process notices the dead parent within 0.5 s and exits
    last_checkpoint = checkpoint_steps(checkpoints)

    out = _finish(_train(fleet, workdir, "--resume"))
    # the old workers are stopped by the resumed coordinator, or, when it comes later than their
    # lease, by their agents already (test_a_killed_coordinator_leaves_no_worker_past_its_lease)
    assert "stopped workers left by the previous coordinator" in out or not alive_tasks(fleet)
    report = json.loads((workdir / "report.json").read_text())
    assert report["steps_total"] == TOTAL == checkpoint_steps(checkpoints)
    finished = [s for s in _ledger(workdir)["segments"] if "final_loss" in s]
    # the last segment restored the last checkpoint and applied exactly what was left
    assert finished[-1]["steps_restored"] == last_checkpoint
    assert finished[-1]["steps_applied"] == TOTAL - last_checkpoint
    assert report["segments"] >= 3
    assert not alive_tasks(fleet)


def test_a_killed_coordinator_leaves_no_worker_past_its_lease(fleet, tmp_path):
    """SIGKILL the coordinator mid-training: its parameter server and training process see their
    control socket close and exit; each agent stops its worker when the lease lapses."""
    import psutil

    from hetcluster.training.checkpoints import checkpoint_steps
    from hetcluster.training.launch import LEASE_S

    workdir = tmp_path / "job"
    process = _new_job(fleet, workdir, "--checkpoint-every", "40", "--allow-missing")
    _wait_for(lambda: checkpoint_steps(workdir / "checkpoints") >= 40, process)
    assert len(alive_tasks(fleet)) == 2
    children = psutil.Process(process.pid).children(recursive=True)   # the PS and the training process
    assert len(children) >= 2
    process.kill()
    killed_s = time.monotonic()
    process.wait()
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"the coordinator's children outlived it: {alive}"
    while alive_tasks(fleet):
        assert time.monotonic() - killed_s < LEASE_S + 5.0, "a worker outlived its lease"
        time.sleep(0.5)
    print(f"every worker stopped {time.monotonic() - killed_s:.1f} s after the coordinator was killed "
          f"(lease {LEASE_S:.0f} s)")


def test_a_tight_device_trains_under_its_own_memory_plan_beside_a_plain_one(fleet, tmp_path):
    """Not a failure: the one memory test that needs the fleet. slow's inventory budget is a byte
    under what plain TensorFlow needs for the model (the fit's margin included), so slow trains
    under its plan (recompute) and fast, in the same job, plain."""
    import tomllib

    import tomli_w

    from hetcluster.memory import PeakMargin
    from hetcluster.memory.fit import plan_for
    from hetcluster.memory.model_graph import graph_of

    plain_bytes = plan_for(graph_of("small_cnn", 1, (16, 16, 3), 4), 8, 1 << 40).predicted_peak_bytes
    tight = PeakMargin().needed_bytes(plain_bytes, plain=True) - 1
    data = tomllib.loads((fleet / "cluster.toml").read_text())
    for device in data["devices"]:
        if device["name"] == "slow":
            device["memory_budget_bytes"] = tight
    inventory = fleet / "tight.toml"  # beside cluster.toml: its credential paths are relative
    inventory.write_text(tomli_w.dumps(data))
    workdir = tmp_path / "job"
    cmd = [
        sys.executable,
        "-m",
        "hetcluster.cli.app",
        "train",
        "--inventory",
        str(inventory),
        "--workdir",
        str(workdir),
        "--report",
        str(workdir / "report.json"),
        "--profile",
        str(write_profile(fleet / "profile-tight.json")),
        *MODEL_ARGS,
        "--total-steps",
        "40",
        "--require",
        "fast",
        "--require",
        "slow",
        "--allow-missing",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "memory, per worker:" in done.stdout and "\n  slow: recompute" in done.stdout
    assert "\n  fast: plain TensorFlow" in done.stdout
    assert _ledger(workdir)["train_spec"]["worker_budgets_bytes"] == {"slow": tight}
    report = json.loads((workdir / "report.json").read_text())
    assert report["memory_plan"].startswith("recompute") and report["memory_plan"].endswith(" on slow")
    assert report["steps_total"] == 40
    assert set(report["steps_per_worker"]) == {"fast", "slow"}
    assert "memory plan" in done.stdout
    assert not alive_tasks(fleet)
