"""The memory plans a training runs under (`memory.fit.training_memory`): each chosen device's
own, plain TensorFlow where that fits, a device no plan fits refused. Budgets come from the inventory, so no agent is
asked (but in the test of asking an agent once); the plans are the memory scheduler's own (TensorFlow builds the
model's layer graph)."""

from __future__ import annotations

import pytest

from hetcluster.cli.pretraining import DeviceBudgets
from hetcluster.errors import MemoryPlanError
from hetcluster.inventory import load_inventory
from hetcluster.memory import PeakMargin
from hetcluster.memory.fit import plan_for, training_memory, worker_memory
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


def _tight_bytes() -> int:
    """A byte under what plain TensorFlow needs, its margin included: a plan is needed, and fits."""
    plain_peak = plan_for(spec_graph(MODEL), MODEL.batch_size, 1 << 40).predicted_peak_bytes
    return PeakMargin().needed_bytes(plain_peak, plain=True) - 1


def test_plain_tensorflow_where_every_budget_holds_it(tmp_path):
    fleet = _fleet(tmp_path, {"big": 8 << 30, "small": 2 << 30})
    memory = training_memory(MODEL, DeviceBudgets(fleet).of(fleet.names), ("big", "small"), spec_graph(MODEL))
    assert not memory.planned and [w.device for w in memory.workers] == ["big", "small"]
    assert memory.spec_fields() == {"worker_budgets_bytes": {}, "worker_device_kinds": {}}
    assert "plain TensorFlow fits every chosen device (the tightest: small's 2048.0 MiB)" in memory.describe()


def test_each_device_trains_under_its_own_plan(tmp_path):
    tight = _tight_bytes()
    fleet = _fleet(tmp_path, {"big": 8 << 30, "small": tight, "other": 4 << 30})
    budgets = DeviceBudgets(fleet).of(fleet.names)
    memory = training_memory(MODEL, budgets, ("big", "small"), spec_graph(MODEL))
    small, big = memory.of("small"), memory.of("big")
    assert small.planned and small.plan.fits and small.technique.startswith("recompute")
    assert not big.planned and big.technique == "" and big.slowdown == 1.0
    # only the planned worker is named to the training: the other runs the plain step
    assert memory.spec_fields() == {"worker_budgets_bytes": {"small": tight}, "worker_device_kinds": {"small": "cpu"}}
    line = memory.describe()
    assert f"\n  small: {small.technique}, predicted peak" in line and "\n  big: plain TensorFlow" in line
    assert memory.slowdowns == {"big": 1.0, "small": small.slowdown} and small.slowdown > 1.0
    # the devices not chosen do not count; the big one alone trains plain
    assert not training_memory(MODEL, budgets, ("big",), spec_graph(MODEL)).planned
    # the command line's device kind applies to every device (offload only on discrete GPUs)
    gpus = DeviceBudgets(fleet, "discrete-gpu").of(["small"])
    assert gpus == {"small": (tight, "discrete-gpu")}
    assert training_memory(MODEL, gpus, ("small",), spec_graph(MODEL)).of("small").device_kind == "discrete-gpu"


def test_a_device_no_plan_fits_is_refused_with_the_budget_it_needs(tmp_path):
    fleet = _fleet(tmp_path, {"big": 8 << 30, "tiny": 1 << 20})
    budgets = DeviceBudgets(fleet).of(fleet.names)
    needed = worker_memory(MODEL, budgets, ("tiny",), spec_graph(MODEL)).of("tiny").plan.needed_bytes
    with pytest.raises(MemoryPlanError, match=rf"tiny cannot train small_cnn .* 1\.0 MiB memory budget: "
                       rf"it needs at least {needed / 2**20:.1f} MiB"):
        training_memory(MODEL, budgets, ("big", "tiny"), spec_graph(MODEL))
    assert training_memory(MODEL, {**budgets, "tiny": (needed, "cpu")}, ("tiny",), spec_graph(MODEL)).planned


def test_no_known_budget_means_plain_tensorflow(tmp_path):
    fleet = _fleet(tmp_path, {"big": 8 << 30})
    assert DeviceBudgets(fleet).of(["ghost"]) == {}  # not in the inventory
    memory = training_memory(MODEL, DeviceBudgets(fleet).of(fleet.names), ("ghost",), spec_graph(MODEL))
    assert memory.workers == () and not memory.planned
    assert "no chosen device has a known budget" in memory.describe()


def test_a_plans_slowdown_and_technique_are_plain_where_plain_tensorflow_fits(tmp_path):
    tight = _tight_bytes()
    budgets = DeviceBudgets(_fleet(tmp_path, {"big": 8 << 30, "small": tight})).of(["big", "small"])
    graph = spec_graph(MODEL)
    plain = training_memory(MODEL, budgets, ("big",), graph)
    planned = training_memory(MODEL, budgets, ("big", "small"), graph)
    assert (plain.slowdown, plain.technique) == (1.0, "")
    assert planned.technique == planned.of("small").plan.technique and planned.technique.startswith("recompute")
    assert planned.slowdown == pytest.approx(1.0 + planned.of("small").plan.predicted_slowdown)
    assert planned.slowdown > 1.0


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


def test_the_engine_plans_on_the_model_it_trains_whatever_keras_named_its_layers():
    """mobilenet_v2's head layers have no names: a second build in the same process numbers them
    anew (global_average_pooling2d_1), so a plan made on another build would name layers this model
    lacks. The engine plans on the model it trains."""
    import tensorflow as tf
    import tf_keras as keras

    from hetcluster.models.registry import build_from_spec
    from hetcluster.training.engine import _memory_gradient_fn
    from hetcluster.training.spec import TrainSpec

    model_spec = ModelSpec("mobilenet_v2", (32, 32, 3), classes=4, batch_size=4)
    smallest = plan_for(spec_graph(model_spec), 4, 1)  # one build; the plan that recomputes most
    [planned_pool] = [n for n in smallest.recompute_layers if n.startswith("global_average_pooling2d")]
    model = build_from_spec(model_spec)   # another build: its pooling layer numbered anew
    assert planned_pool not in [layer.name for layer in model.layers]
    spec = TrainSpec(model=model_spec, total_steps=1, worker_budgets_bytes={"a": smallest.needed_bytes})
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    gradients, techniques = _memory_gradient_fn(spec, ["a"], model, loss, keras.optimizers.SGD(0.01))
    assert techniques["a"].startswith("recompute")
    x, y = tf.zeros((4, 32, 32, 3)), tf.zeros((4,), tf.int32)
    _, grads = tf.function(lambda: gradients(model, x, y))()
    assert len(grads) == len(model.trainable_variables)
