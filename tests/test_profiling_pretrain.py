"""Pre-training on real agents (in-process AgentServers starting real TF workers) with small_cnn: the
sequential protocol here, the one on lanes in test_profiling_lanes.py."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from hetcluster.models import ModelSpec
from hetcluster.power.base import PowerSample, PowerSource

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]


class TaskAwareSource(PowerSource):
    """Idle watts while the agent runs no TF task, busy watts while one is alive."""

    name = "model"
    measured = False

    def __init__(self, idle_w: float, busy_w: float) -> None:
        self.idle_w, self.busy_w, self.state = idle_w, busy_w, None

    def read(self) -> PowerSample:
        busy = self.state is not None and any(t.alive for t in self.state.tasks.status())
        return self._sample(self.busy_w if busy else self.idle_w)


@contextmanager
def running_fleet(tmp_path, devices_spec, extra=()):
    """In-process agents for (name, idle_w, busy_w, device_class) rows (``extra``: inventory entries
    without an agent); yields the inventory, stops the agents after."""
    from hetcluster.agent.config import AgentConfig
    from hetcluster.agent.credentials import generate_credentials
    from hetcluster.agent.server import AgentServer
    from hetcluster.inventory import inventory_from_mapping

    creds = generate_credentials(tmp_path / "creds")
    client_files = {"token_file": str(creds.token), "ca_file": str(creds.ca_cert), "cert_file": str(creds.client_cert),
                    "key_file": str(creds.client_key)}
    servers, devices = [], []
    for name, idle_w, busy_w, device_class in devices_spec:
        config = AgentConfig.from_mapping(
            {
                "agent": {"name": name, "listen": "127.0.0.1:0", "state_dir": str(tmp_path / name)},
                "auth": {
                    "token_file": str(creds.token),
                    "cert_file": str(creds.server_cert),
                    "key_file": str(creds.server_key),
                    "client_ca_file": str(creds.ca_cert),
                },
            },
            tmp_path,
        )
        source = TaskAwareSource(idle_w, busy_w)
        server = AgentServer(config, source, probe_hardware=False).start()
        source.state = server.state
        servers.append(server)
        devices.append({"name": name, "address": server.address, **client_files,
                        **({"device_class": device_class} if device_class else {})})
    devices += [{**entry, **client_files} for entry in extra]
    inventory = inventory_from_mapping({"cluster": {"name": "t", "network": "loopback",
                                                    "parameter_server_host": "127.0.0.1"},
                                        "devices": devices}, tmp_path)
    try:
        yield inventory
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def fleet(tmp_path):
    """board-1 and board-2 of one class, other, and ghost (an inventory entry with no agent)."""
    from hetcluster.training.servers import free_address

    with running_fleet(
        tmp_path,
        (("board-1", 1.0, 3.0, "board"), ("other", 2.0, 6.0, None), ("board-2", 1.5, 3.0, "board")),
        extra=[{"name": "ghost", "address": free_address("127.0.0.1")}],
    ) as inventory:
        yield inventory


def test_pretraining_measures_a_device_per_class_and_a_set_under_their_memory_plans_and_continues_one_checkpoint(
    fleet, tmp_path
):
    """One phase, every step of it (the two tests it replaced pre-trained a fleet each):
    ghost has no agent and is excluded; board-2 is board-1's class, so one solo run serves both;
    other's memory budget is a byte under what plain TensorFlow needs (with the fit's margin), so
    other trains under its plan (recomputation) in its solo run and in every run with it, as
    training would run it, while the boards train plain beside it; the faster of board-1 and
    other is measured alone twice, around the set; every run continues one checkpoint."""
    from hetcluster.memory import PeakMargin
    from hetcluster.memory.fit import plan_for, training_memory
    from hetcluster.memory.model_graph import graph_of, spec_graph
    from hetcluster.profiling.pretrain import PretrainSettings, run_pretraining
    from hetcluster.profiling.profile import load_profile, save_profile, to_planner_inputs
    from hetcluster.training.checkpoints import checkpoint_steps

    spec = ModelSpec("small_cnn", (16, 16, 3), 4, 8)
    plain_bytes = plan_for(spec_graph(spec), spec.batch_size, 1 << 40).predicted_peak_bytes
    tight = PeakMargin().needed_bytes(plain_bytes, plain=True) - 1
    budgets = {"board-1": (8 << 30, "cpu"), "board-2": (8 << 30, "cpu"), "other": (tight, "cpu")}
    events = []
    # each run: 12 steps past its warm-up, more while that window is under 1 s, at most 24; the warm-up
    # is 2 steps and the steps of the next WARMUP_S seconds, at most half of those past the 2 (here,
    # at the host's speed, the cap comes first: 24 steps leave a window of 11)
    settings = PretrainSettings(steps_per_run=12, warmup_steps=2, idle_s=1.0, max_sets=1, min_window_s=1.0,
                                max_steps_per_run=24, protocol="sequential")
    ckpt = str(tmp_path / "ckpt")
    profile = run_pretraining(fleet, spec, ckpt, settings=settings,
                              memory=lambda names: training_memory(spec, budgets, list(names), spec_graph(spec)),
                              on_event=lambda kind, details: events.append((kind, details)))

    assert set(profile.excluded) == {"ghost"} and "health" in profile.excluded["ghost"]
    assert [d.name for d in profile.devices] == ["board-1", "other", "board-2"]
    board1, other, board2 = profile.devices
    # the faster of the two measured alone (by its first window: both run at the host's speed here,
    # other under its plan) was measured twice, around the set; its figures pool both windows
    [twice] = [d for d in (board1, other) if len(d.solo_rates_steps_per_s) == 2]
    assert twice.steps_per_s_std >= abs(twice.solo_rates_steps_per_s[0] - twice.solo_rates_steps_per_s[1]) / 2
    # the opening run of all three (board-2's worker warmed too), one solo run for board-1's class and
    # one for other, the set of all three, then the recheck
    started = [d["devices"] for kind, d in events if kind == "run_start"]
    assert started[0] == ["board-1", "other", "board-2"] and len(started) == 5
    assert started[1:3] == [["board-1"], ["other"]]
    assert sorted(started[3]) == ["board-1", "board-2", "other"]   # (the set's names go fastest first)
    assert started[4] == [twice.name]
    for device, (idle_w, busy_w) in zip((board1, other), ((1.0, 3.0), (2.0, 6.0))):
        windows = len(device.solo_rates_steps_per_s)
        assert device.steps_per_s > 0 and 10 * windows <= device.steps <= 22 * windows
        assert device.time_s >= windows * 1.0 or device.steps >= 11 * windows  # the windows, or the cap
        assert 0 < device.startup_s <= device.first_step_s
        assert device.startup_power_w == pytest.approx(busy_w, rel=0.15)  # its TF task is up from the start
        assert device.idle_power_w == pytest.approx(idle_w, abs=0.01)
        assert device.busy_power_w == pytest.approx(busy_w, rel=0.1)
        # each window's completions, from its open: as many as its steps, the last one its length
        assert len(device.solo_window_ends_s) == windows
        assert sum(len(ends) for ends in device.solo_window_ends_s) == device.steps
        for rate, ends in zip(device.solo_rates_steps_per_s, device.solo_window_ends_s):
            assert ends == sorted(ends) and ends[0] > 0 and len(ends) / ends[-1] == pytest.approx(rate, rel=1e-3)
    # the class: board-2 takes board-1's figures (pooled, if board-1 was rechecked), its own idle power
    assert (board1.device_class, other.device_class, board2.device_class) == ("board", None, "board")
    assert board1.measured_on == "" and other.measured_on == "" and board2.measured_on == "board-1"
    assert board2.steps_per_s == board1.steps_per_s and board2.busy_power_w == board1.busy_power_w
    assert board2.startup_s == board1.startup_s
    assert board2.idle_power_w == pytest.approx(1.5, abs=0.01)

    [run] = profile.runs
    # the set's steps are shared by its members: each is measured over the later half of its steps
    # past its warm-up steps
    assert set(run.devices) == {"board-1", "board-2", "other"} and 4 <= run.steps <= 22 and run.steps_per_s > 0
    assert run.power_w == pytest.approx(12.0, rel=0.1)
    # per-device figures are each worker's steady rate times the window (not rounded to whole
    # steps), so they add up to the set's throughput
    assert set(run.per_device_steps) == {"board-1", "board-2", "other"} and min(run.per_device_steps.values()) >= 1
    assert sum(run.per_device_steps.values()) / run.time_s == pytest.approx(run.steps_per_s, rel=1e-9)

    # memory: board-1 (and its copy) trained plain, other under its own plan, in the set too
    assert (board1.memory_plan, board1.memory_slowdown) == ("", 1.0) == (board2.memory_plan, board2.memory_slowdown)
    assert other.memory_plan.startswith("recompute") and other.memory_slowdown > 1.0
    assert run.memory_plan == other.memory_plan
    assert run.memory_slowdowns == {"board-1": 1.0, "board-2": 1.0, "other": other.memory_slowdown}
    # what each run's workers really traced (RunResult.memory_plans), and what the display was told
    ran = {tuple(sorted({w for _, _, w in d["result"].step_times})): d["result"].memory_plans
           for kind, d in events if kind == "run_done"}
    assert ran == {("board-1",): {"board-1": ""}, ("other",): {"other": other.memory_plan},
                   ("board-1", "board-2", "other"): {"board-1": "", "board-2": "", "other": other.memory_plan}}
    # the opening run of all three trains under other's plan, as the set does
    assert [d["memory_plan"] for kind, d in events if kind == "run_start"] == [
        other.memory_plan, "", other.memory_plan, other.memory_plan, twice.memory_plan]
    # the layer graph those plans were made on, recorded for planning from the profile later
    assert profile.memory_graph == graph_of(spec.name, 1, spec.input_shape, spec.classes).to_dict()

    # five runs of 12 to 24 steps (the opening run's included) continued one checkpoint: the steps
    # count toward the job
    done = profile.pretrain_steps
    assert 60 <= done <= 120 and checkpoint_steps(ckpt) == done
    # a set's steps are those of its steady window (equal to the run's when the cap cut it short)
    assert done >= board1.steps + other.steps + run.steps + 5 * settings.warmup_steps
    assert profile.checkpoint_path.endswith(f"ckpt-{done}")
    # every device powered over the whole phase: between all-idle (4.5 W) and all-busy (12 W)
    assert 0.9 * 4.5 * profile.pretrain_time_s <= profile.pretrain_energy_j <= 12.0 * profile.pretrain_time_s
    assert any(kind == "excluded" and d.get("device") == "ghost" for kind, d in events)
    assert any(kind == "progress" for kind, _ in events)
    # each finished run hands over its RunResult: the opening run (not measured: the set is the later
    # run), each alone, the set, the recheck; their applied steps the phase's
    done_runs = [d for kind, d in events if kind == "run_done"]
    assert [sorted({w for _, _, w in d["result"].step_times}) for d in done_runs] == [
        ["board-1", "board-2", "other"], ["board-1"], ["other"], ["board-1", "board-2", "other"], [twice.name]]
    assert [d["what"] for d in done_runs] == ["opening", "", "", "", ""]
    assert sum(d["result"].steps_applied for d in done_runs) == profile.pretrain_steps
    # one launch for the phase: each agent started one TF worker, which served all five runs and
    # was stopped at the end
    for name in ("board-1", "other", "board-2"):
        with fleet.device(name).client() as client:
            tasks = client.task_status()
        assert len(tasks) == 1 and not tasks[0].alive and tasks[0].state == "stopped"

    json_path, parquet_path = save_profile(profile, tmp_path / "out" / "profile")
    assert load_profile(json_path) == profile
    import pandas as pd

    table = pd.read_parquet(parquet_path)   # the copy has its idle row, no solo row of its own
    assert sorted(table["kind"]) == ["idle", "idle", "idle", "set", "solo", "solo", "startup", "startup"]
    devices, runs, job = to_planner_inputs(profile, total_steps=500)
    from hetcluster.planner.inputs import validate_inputs

    validate_inputs(devices, runs, job)
    assert [d.class_key for d in devices] == ["board", None, "board"]
    assert job.pretrain_steps == done and job.remaining_steps == 500 - done
