"""Shared by the train and evaluate end-to-end tests: a small emulated fleet and a hand-written profile.

The emulated cluster is the real thing (agent processes slowed by cgroup quotas or duty cycling);
``ghost`` is an inventory entry with no agent behind it. The profile has no checkpoint and no
pre-training steps, so tests skip the pre-training phase and stay short.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def emulated_fleet(root: Path, tag: str) -> Iterator[Path]:
    """Devices fast (1.0 core) and slow (0.5 core), plus ghost; yields the folder with cluster.toml.

    Each worker imports TensorFlow inside its device's quota (about 10 CPU seconds on a slow host):
    at 0.3 core that took slow 33 s per job started, most of what these tests waited for."""
    import tomllib

    import tomli_w

    from hetcluster.emulation.catalog import DeviceProfile
    from hetcluster.emulation.cluster import cluster_down, cluster_up
    from hetcluster.training.servers import free_address

    profiles = [DeviceProfile("fast", 1.0, 2 << 30, 10.0, 40.0, 1000.0, 0.1),
                DeviceProfile("slow", 0.5, 2 << 30, 2.0, 6.0, 1000.0, 0.1)]
    cluster_up(profiles, root / "cluster.toml", name=f"{tag}{os.getpid() % 100000}", state_dir=root / "state")
    try:
        data = tomllib.loads((root / "cluster.toml").read_text())
        ghost = dict(data["devices"][0], name="ghost", address=free_address("127.0.0.1"))
        ghost.pop("profile", None)
        data["devices"].append(ghost)
        (root / "cluster.toml").write_text(tomli_w.dumps(data))
        yield root
    finally:
        cluster_down(root / "state")


def alive_tasks(fleet: Path) -> list:
    """The TF server tasks still alive on fast's and slow's agents (ghost has none)."""
    from hetcluster.inventory import load_inventory

    inventory = load_inventory(fleet / "cluster.toml")
    alive = []
    for name in ("fast", "slow"):
        with inventory.device(name).client(timeout_s=5.0) as client:
            alive += [t for t in client.task_status() if t.alive]
    return alive


MODEL_ARGS = ("--model", "small_cnn", "--input-shape", "16x16x3", "--classes", "4", "--batch-size", "8")


def write_profile(path: Path, with_ghost: bool = True, model: Any = None) -> Path:
    """Measurements in which ghost is the best device by far (leaving it out must be deliberate), of
    ``model`` (a ModelSpec; MODEL_ARGS' small_cnn without one).

    With the layer graph pre-training records (Profile.memory_graph), extracted once in the test's
    process: the CLI under test plans memory on it and imports no TensorFlow of its own (about 8 CPU
    seconds per command on a 2-core host); its training processes still do."""
    from hetcluster.memory.model_graph import graph_of
    from hetcluster.models.spec import ModelSpec

    model = model or ModelSpec("small_cnn", (16, 16, 3), 4, 8)

    device = {"steps_per_s_std": 0.1, "steps": 20, "time_s": 2.0, "energy_j": 20.0, "power_source": "model"}
    devices = [dict(device, name="fast", steps_per_s=20.0, busy_power_w=40.0, idle_power_w=10.0),
               dict(device, name="slow", steps_per_s=8.0, busy_power_w=6.0, idle_power_w=2.0)]
    if with_ghost:
        devices.append(dict(device, name="ghost", steps_per_s=100.0, busy_power_w=1.0, idle_power_w=0.5))
    profile = {
        "format_version": 1, "model": model.to_dict(),
        "devices": devices,
        "runs": [{"devices": ["fast", "slow"], "steps": 20, "time_s": 0.8, "steps_per_s": 25.0, "power_w": 46.0,
                  "energy_j": 37.0, "per_device_steps": {"fast": 14, "slow": 6}, "per_device_power_w": {}}],
        "excluded": {}, "pretrain_steps": 0, "pretrain_time_s": 5.0, "pretrain_energy_j": 100.0,
        "checkpoint_dir": None, "checkpoint_path": None, "warmup_steps": 2, "steps_per_run": 20,
        "created_wall_s": time.time(), "idle_power_counts": False,
        "memory_graph": graph_of(model.name, 1, model.input_shape, model.classes).to_dict()}
    path.write_text(json.dumps(profile))
    return path
