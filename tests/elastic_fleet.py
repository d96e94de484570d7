"""Shared by the elastic end-to-end tests and benchmark: a small emulated fleet whose devices can be
added and removed while a job trains (`hetcluster cluster add|remove`), and a profile of it.

The model (small_cnn, 32x32x3, batch 32) is heavy enough for a step's time to follow a device's
compute share, so a device of a full core trains several times as fast as one of a quarter. The
hand-written profile has no checkpoint and no pre-training steps (the job starts from scratch) and
holds the layer graph, so the CLI under test imports no TensorFlow of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

MODEL_ARGS = ("--model", "small_cnn", "--input-shape", "32x32x3", "--classes", "4", "--batch-size", "32")

# catalog profiles: (compute share, idle W, busy W); dev-c is the fast device that joins
DEVICES = {"dev-a": (0.5, 5.0, 15.0), "dev-b": (0.25, 2.0, 6.0), "dev-c": (1.0, 10.0, 40.0), "dev-d": (0.15, 2.0, 5.0)}
# what each would measure alone (steps/s): the shares' order and rough ratio
RATES = {"dev-a": 28.0, "dev-b": 14.0, "dev-c": 50.0, "dev-d": 8.0}


def write_catalog(path: Path) -> Path:
    lines = []
    for name, (share, idle_w, busy_w) in DEVICES.items():
        lines += [f"[profiles.{name}]", f"compute_share = {share}", "memory_budget_bytes = 2147483648",
                  f"idle_w = {idle_w}", f"busy_w = {busy_w}", "link_bandwidth_mbit_per_s = 1000.0",
                  "link_latency_ms = 0.1", ""]
    path.write_text("\n".join(lines))
    return path


def cli(*args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetcluster.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout_s)


@contextlib.contextmanager
def elastic_fleet(root: Path, tag: str, devices: str = "dev-a,dev-b") -> Iterator[Path]:
    """The fleet of ``devices`` (catalog names above), up through the CLI; yields its folder
    (cluster.toml, catalog.toml, state/)."""
    root.mkdir(parents=True, exist_ok=True)
    catalog = write_catalog(root / "catalog.toml")
    up = cli("cluster", "up", "--devices", devices, "--catalog", str(catalog), "--out", str(root / "cluster.toml"),
             "--state-dir", str(root / "state"), "--name", f"{tag}{os.getpid() % 100000}")
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        yield root
    finally:
        cli("cluster", "down", "--state-dir", str(root / "state"))


def add_device(fleet: Path, name: str) -> None:
    added = cli("cluster", "add", "--devices", name, "--catalog", str(fleet / "catalog.toml"),
                "--state-dir", str(fleet / "state"))
    assert added.returncode == 0, added.stderr[-2000:]


def write_profile(path: Path, names: tuple[str, ...] = ("dev-a", "dev-b")) -> Path:
    """Measurements of ``names`` alone at RATES (and, with dev-a and dev-b, of the two together)."""
    from hetcluster.memory.model_graph import graph_of
    from hetcluster.models.spec import ModelSpec

    model = ModelSpec("small_cnn", (32, 32, 3), 4, 32)
    devices = [{"name": n, "steps_per_s": RATES[n], "steps_per_s_std": 0.05 * RATES[n], "busy_power_w": DEVICES[n][2],
                "idle_power_w": DEVICES[n][1], "steps": 40, "time_s": 40 / RATES[n], "energy_j": 40.0,
                "power_source": "model", "first_step_s": 1.0, "startup_s": 1.0, "device_class": n} for n in names]
    runs = []
    if {"dev-a", "dev-b"} <= set(names):
        runs.append({"devices": ["dev-a", "dev-b"], "steps": 120, "time_s": 3.0, "steps_per_s": 40.0,
                     "power_w": 21.0, "energy_j": 63.0, "per_device_steps": {"dev-a": 80.0, "dev-b": 40.0},
                     "per_device_power_w": {"dev-a": 15.0, "dev-b": 6.0}})
    profile = {
        "format_version": 1, "model": model.to_dict(), "devices": devices, "runs": runs, "excluded": {},
        "pretrain_steps": 0, "pretrain_time_s": 5.0, "pretrain_energy_j": 100.0, "checkpoint_dir": None,
        "checkpoint_path": None, "warmup_steps": 3, "steps_per_run": 20, "created_wall_s": time.time(),
        "idle_power_counts": False, "memory_graph": graph_of(model.name, 1, model.input_shape, model.classes).to_dict()}
    path.write_text(json.dumps(profile))
    return path


def train(fleet: Path, workdir: Path, profile: Path, total_steps: int, *extra: str) -> subprocess.Popen:
    """`hetcluster train` on the fleet in a subprocess (its temporary files under the test's folder)."""
    tmp = workdir.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "hetcluster.cli.app", "train", "--inventory", str(fleet / "cluster.toml"),
           "--workdir", str(workdir), "--report", str(workdir / "report.json"), "--profile", str(profile),
           *MODEL_ARGS, "--total-steps", str(total_steps), "--checkpoint-every", str(max(20, total_steps // 20)),
           *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp), "COLUMNS": "200"})


def wait_for_steps(workdir: Path, steps: int, process: subprocess.Popen, timeout_s: float = 300.0) -> int:
    """Block until the job's checkpoint holds ``steps`` steps; returns the checkpoint's count."""
    from hetcluster.training.checkpoints import checkpoint_steps

    deadline = time.monotonic() + timeout_s
    while checkpoint_steps(workdir / "checkpoints") < steps:
        if process.poll() is not None:
            raise AssertionError(f"train exited early ({process.returncode}): {process.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out waiting for the job's checkpoint")
        time.sleep(0.25)
    return checkpoint_steps(workdir / "checkpoints")


def finish(process: subprocess.Popen, timeout_s: float = 400.0) -> str:
    out, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, out[-4000:]
    return out


def report_of(workdir: Path) -> dict[str, Any]:
    return json.loads((workdir / "report.json").read_text())


def ledger_of(workdir: Path) -> dict[str, Any]:
    return json.loads((workdir / "train_state.json").read_text())


def agent_pid(fleet: Path, name: str) -> int:
    from hetcluster.emulation.state import load_state

    state = load_state(fleet / "state")
    return next(d.agent.pid for d in state.devices if d.name == name)
