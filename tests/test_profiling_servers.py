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
