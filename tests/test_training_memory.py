"""The memory plan a training runs under (`memory.fit.training_memory`): the tightest chosen
device's, and plain TensorFlow where that fits. Budgets come from the inventory, so no agent is
asked (but in the test of asking an agent once); the plans are the memory scheduler's own (TensorFlow builds the
model's layer graph)."""

from __future__ import annotations

import pytest

from hetcluster.cli.pretraining import DeviceBudgets
from hetcluster.inventory import load_inventory
from hetcluster.memory.fit import plan_for, training_memory
from hetcluster.memory.model_graph import spec_graph
from hetcluster.models import ModelSpec

pytestmark = pytest.mark.tensorflow

MODEL = ModelSpec("small_cnn", (16, 16, 3), classes=4, batch_size=8)


def _fleet(tmp_path, budgets: dict[str, int]):
    (tmp_path / "token").write_text("t" * 32)
    (tmp_path / "token").chmod(0o600)
    text = '[cluster]\nname = "m"\nnetwork = "loopback"\nparameter_server_host = "127.0.0.1"\n'
    for port, (name, budget) in enumerate(budgets.items(), start=50000):
        text += (f'\n[[devices]]\nname = "{name}"\naddress = "127.0.0.1:{port}"\ntoken_file = "token"\n'
                 f"memory_budget_bytes = {budget}\n")
    (tmp_path / "cluster.toml").write_text(text)
    return load_inventory(tmp_path / "cluster.toml")


def _plain_peak_bytes() -> int:
    return plan_for(spec_graph(MODEL), MODEL.batch_size, 1 << 40).predicted_peak_bytes


def test_plain_tensorflow_where_the_tightest_budget_holds_it(tmp_path):
    fleet = _fleet(tmp_path, {"big": 8 << 30, "small": 2 << 30})
    memory = training_memory(MODEL, DeviceBudgets(fleet).of(fleet.names), ("big", "small"), spec_graph(MODEL))
    assert memory.budget_bytes == 0 and memory.device == "small" and memory.plan.technique == "none"
    assert "plain TensorFlow fits every chosen device (the tightest: small's 2048.0 MiB)" in memory.describe()


def test_the_tightest_devices_plan_when_plain_tensorflow_does_not_fit_it(tmp_path):
    tight = _plain_peak_bytes() - 1  # a byte under what plain TensorFlow needs: recomputation fits
    fleet = _fleet(tmp_path, {"big": 8 << 30, "small": tight, "other": 4 << 30})
    budgets = DeviceBudgets(fleet).of(fleet.names)
    memory = training_memory(MODEL, budgets, ("big", "small"), spec_graph(MODEL))
    assert (memory.budget_bytes, memory.device_kind, memory.device) == (tight, "cpu", "small")
    assert memory.plan.fits and memory.plan.technique.startswith("recompute")
    assert "every worker trains under the plan for small's" in memory.describe()
    # the devices not chosen do not count; the big one alone trains plain
    assert training_memory(MODEL, budgets, ("big",), spec_graph(MODEL)).budget_bytes == 0
    # the command line's device kind applies to every device (offload only on discrete GPUs)
    gpus = DeviceBudgets(fleet, "discrete-gpu").of(["small"])
    assert gpus == {"small": (tight, "discrete-gpu")}
    assert training_memory(MODEL, gpus, ("small",), spec_graph(MODEL)).device_kind == "discrete-gpu"


def test_no_known_budget_means_plain_tensorflow(tmp_path):
    fleet = _fleet(tmp_path, {"big": 8 << 30})
    assert DeviceBudgets(fleet).of(["ghost"]) == {}  # not in the inventory
    memory = training_memory(MODEL, DeviceBudgets(fleet).of(fleet.names), ("ghost",), spec_graph(MODEL))
    assert memory.budget_bytes == 0 and memory.plan is None
    assert "no chosen device has a known budget" in memory.describe()


def test_a_plans_slowdown_and_technique_are_plain_where_plain_tensorflow_fits(tmp_path):
    tight = _plain_peak_bytes() - 1
    budgets = DeviceBudgets(_fleet(tmp_path, {"big": 8 << 30, "small": tight})).of(["big", "small"])
    graph = spec_graph(MODEL)
    plain = training_memory(MODEL, budgets, ("big",), graph)
    planned = training_memory(MODEL, budgets, ("big", "small"), graph)
    assert (plain.slowdown, plain.technique) == (1.0, "")
    assert planned.technique == planned.plan.technique and planned.technique.startswith("recompute")
    assert planned.slowdown == pytest.approx(1.0 + planned.plan.predicted_slowdown) and planned.slowdown > 1.0


class _CountingAgent:
    """An inventory entry without a budget, whose agent answers DeviceInfo (or is unreachable)."""

    def __init__(self, name: str, memory_bytes: int | None):
        self.name, self.memory_budget_bytes, self.memory_bytes, self.calls = name, None, memory_bytes, 0

    def client(self, timeout_s: float):
        from contextlib import contextmanager
        from types import SimpleNamespace

        @contextmanager
        def connected():
            self.calls += 1
            if self.memory_bytes is None:
                raise ConnectionError("agent unreachable")
            yield SimpleNamespace(device_info=lambda: SimpleNamespace(
                memory_budget_bytes=0, memory_bytes=self.memory_bytes, device_kind="jetson"))
        return connected()


def test_each_agent_is_asked_for_its_budget_once_per_command():
    from types import SimpleNamespace

    agents = {"up": _CountingAgent("up", 4 << 30), "down": _CountingAgent("down", None)}
    budgets = DeviceBudgets(SimpleNamespace(names=tuple(agents), device=agents.__getitem__))
    assert budgets.of(["up", "down"]) == {"up": (4 << 30, "jetson")}   # the unreachable one stays unknown
    assert budgets.of(iter(["down", "up", "up"])) == {"up": (4 << 30, "jetson")}
    assert budgets.of(["ghost"]) == {}
    assert (agents["up"].calls, agents["down"].calls) == (1, 1)
