"""Pre-training's shared TF servers: one launch for the phase, a device whose worker cannot start
left out, the servers stopped at the end (launch_cluster faked: no TensorFlow, no agents)."""

from __future__ import annotations

import pytest

from hetcluster.models import ModelSpec
from hetcluster.models.datasets import DataSource
from hetcluster.profiling.pretrain import PretrainSettings, _Phase
from hetcluster.training.launch import DeviceLaunchError
from hetcluster.training.spec import ClusterAddresses


class _Inventory:
    parameter_server_host = "127.0.0.1"

    def device(self, name):
        return name


class _Launched:
    def __init__(self, names):
        self.addresses = ClusterAddresses(workers={n: f"h:{i + 1}" for i, n in enumerate(names)}, ps=["h:90"],
                                          chief="h:91")
        self.stopped = False

    def stop(self):
        self.stopped = True


@pytest.fixture
def phase(monkeypatch):
    """A phase of devices a, b, c (c's worker never starts); ``phase.launches`` lists each launch's devices."""
    import hetcluster.training.launch as launch

    events, launches = [], []

    def launch_cluster(devices, ps_host, **kwargs):
        launches.append(list(devices))
        if "c" in devices:
            raise DeviceLaunchError("c", "Device c could not start its worker: port in use")
        return _Launched(devices)

    monkeypatch.setattr(launch, "launch_cluster", launch_cluster)
    phase = _Phase(_Inventory(), ModelSpec("small_cnn", (16, 16, 3), 4, 8), DataSource(), "/tmp/unused",
                   PretrainSettings(), lambda kind, details: events.append((kind, details)))
    phase.recorders = {"a": None, "b": None, "c": None}   # the devices that passed the health check
    phase.events, phase.launches = events, launches
    return phase


def test_the_phase_launches_its_servers_once_and_leaves_out_a_worker_that_does_not_start(phase):
    cluster = phase.shared_servers()
    assert phase.launches == [["a", "b", "c"], ["a", "b"]]          # c failed: launched again without it
    assert "c" in phase.excluded and "did not start" in phase.excluded["c"]
    assert ("excluded", {"device": "c", "reason": phase.excluded["c"]}) in phase.events
    assert phase.shared_servers() is cluster and len(phase.launches) == 2   # kept up for the next run
    assert cluster.addresses.subset(["b"]).workers == {"b": "h:2"}
    phase.stop_servers()
    assert cluster.stopped and phase.cluster is None
    phase.shared_servers()                                          # after a failed run: launched afresh
    assert phase.launches[-1] == ["a", "b"]


def test_a_run_of_a_device_whose_worker_did_not_start_fails_without_training(phase):
    from hetcluster.errors import ProfileError

    with pytest.raises(ProfileError, match="No TF worker runs on c .*did not start"):
        phase.measure(["c"])          # its launch left c out: the run fails, the servers stay up
    assert phase.cluster is not None and phase.launches == [["a", "b", "c"], ["a", "b"]]


def test_a_launch_with_no_other_device_left_raises(phase):
    phase.excluded.update({"a": "solo run failed", "b": "solo run failed"})
    with pytest.raises(DeviceLaunchError, match="could not start"):
        phase.shared_servers()


class _Result:
    lost_workers: tuple[str, ...] = ()


def test_the_opening_run_trains_every_device_whose_worker_started_together_unmeasured(phase, monkeypatch):
    from hetcluster.profiling.pretrain import _opening_run

    runs = []

    def measure(names, steps=None, cap=None, window_s=None, what=""):
        runs.append((list(names), steps, cap, window_s, what))
        return _Result(), 0.0, 1.0

    monkeypatch.setattr(phase, "measure", measure)
    phase.settings = PretrainSettings(steps_per_run=10, warmup_steps=3, max_steps_per_run=16, max_phase_steps=100)
    phase.steps_total = 40
    _opening_run(phase, ["a", "b", "c"], start_steps=40)
    # c's worker did not start (the launch came first): a and b, for the opening's window, capped at
    # a set's share of the budget (100 steps over 3 sets and the opening: 25)
    assert runs == [(["a", "b"], 10, 25, phase.settings.opening_s, "opening")]
    assert "c" in phase.excluded


def test_no_opening_run_for_one_device_or_when_switched_off(phase, monkeypatch):
    from hetcluster.profiling.pretrain import _opening_run

    runs = []
    monkeypatch.setattr(phase, "measure", lambda names, *args, **kwargs: runs.append(names))
    _opening_run(phase, ["a"], start_steps=0)
    phase.settings = PretrainSettings(opening_s=0.0)
    _opening_run(phase, ["a", "b"], start_steps=0)
    assert runs == [] and phase.launches == []


def test_a_failed_opening_run_warns_and_the_phase_goes_on(phase, monkeypatch, caplog):
    from hetcluster.errors import TrainingError
    from hetcluster.profiling.pretrain import _opening_run

    def measure(names, *args, **kwargs):
        raise TrainingError("worker b stopped answering")

    monkeypatch.setattr(phase, "measure", measure)
    _opening_run(phase, ["a", "b"], start_steps=0)
    assert "solo runs start on cold workers" in caplog.text
    assert ("excluded", {"run": ["a", "b"], "reason": "worker b stopped answering"}) in phase.events
    assert "a" not in phase.excluded and "b" not in phase.excluded


def test_a_device_lost_in_the_opening_run_is_excluded(phase, monkeypatch):
    from hetcluster.profiling.pretrain import _opening_run

    lost = _Result()
    lost.lost_workers = ("b",)
    monkeypatch.setattr(phase, "measure", lambda names, *args, **kwargs: (lost, 0.0, 1.0))
    _opening_run(phase, ["a", "b"], start_steps=0)
    assert phase.excluded["b"] == "lost during the opening run"
