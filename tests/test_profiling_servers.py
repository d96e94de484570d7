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
    tf_plane_isolation = "auto"

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
    steps_applied = 7


def test_the_opening_run_trains_every_device_whose_worker_started_together_unmeasured(phase, monkeypatch):
    from hetcluster.profiling.pretrain import _opening_run

    runs = []

    def measure(names, steps=None, cap=None, window_s=None, what=""):
        runs.append((list(names), steps, cap, window_s, what))
        return _Result(), 0.0, 1.0

    monkeypatch.setattr(phase, "measure", measure)
    phase.settings = PretrainSettings(steps_per_run=10, warmup_steps=3, max_steps_per_run=16, max_phase_steps=100)
    assert _opening_run(phase, ["a", "b", "c"]) == 7   # the steps it applied
    # c's worker did not start (the launch came first): a and b, for the opening's window, capped at
    # a set's share of the budget (100 steps over 3 sets and the opening: 25)
    assert runs == [(["a", "b"], 10, 25, phase.settings.opening_s, "opening")]
    assert "c" in phase.excluded


def test_no_opening_run_for_one_device_or_when_switched_off(phase, monkeypatch):
    from hetcluster.profiling.pretrain import _opening_run

    runs = []
    monkeypatch.setattr(phase, "measure", lambda names, *args, **kwargs: runs.append(names))
    _opening_run(phase, ["a"])
    phase.settings = PretrainSettings(opening_s=0.0)
    _opening_run(phase, ["a", "b"])
    assert runs == [] and phase.launches == []


def test_a_failed_opening_run_warns_and_the_phase_goes_on(phase, monkeypatch, caplog):
    from hetcluster.errors import TrainingError
    from hetcluster.profiling.pretrain import _opening_run

    def measure(names, *args, **kwargs):
        raise TrainingError("worker b stopped answering")

    monkeypatch.setattr(phase, "measure", measure)
    _opening_run(phase, ["a", "b"])
    assert "solo runs start on cold workers" in caplog.text
    assert ("excluded", {"run": ["a", "b"], "reason": "worker b stopped answering"}) in phase.events
    assert "a" not in phase.excluded and "b" not in phase.excluded


def test_a_device_lost_in_the_opening_run_is_excluded(phase, monkeypatch):
    from hetcluster.profiling.pretrain import _opening_run

    lost = _Result()
    lost.lost_workers = ("b",)
    monkeypatch.setattr(phase, "measure", lambda names, *args, **kwargs: (lost, 0.0, 1.0))
    _opening_run(phase, ["a", "b"])
    assert phase.excluded["b"] == "lost during the opening run"


def _steady_result(names, steps, start_s, total_before, warmup_steps):
    """A RunResult where each of ``names`` trains at 1 step/s from ``start_s`` (``steps`` each)."""
    from hetcluster.training.spec import RunResult

    times = sorted(((start_s + k, start_s + k + 1.0, n) for n in names for k in range(steps)), key=lambda r: r[1])
    return RunResult(steps_applied=len(times), steps_total=total_before + len(times), steps_restored=total_before,
                     steps_per_worker={n: steps for n in names}, time_s=float(steps), start_wall_s=start_s,
                     end_wall_s=start_s + steps, step_times=times, final_loss=None, lost_workers=[],
                     checkpoint_path=None, warmup_steps=warmup_steps)


def test_the_opening_runs_steps_do_not_shrink_the_sets_share_of_the_budget(monkeypatch):
    """Budget 300 steps: the opening run takes its 75 (a set's share: 300 over 4), and the sets
    still share what the budget leaves past the solo runs, as they would without it."""
    import hetcluster.profiling.pretrain as pretrain
    import hetcluster.training.plane as plane

    monkeypatch.setattr(plane, "check_training_plane", lambda devices, isolation: "netns")  # no agents, no TLS files

    class _Recorder:
        samples: list = []

        def mean_power_w(self, t0, t1):
            return 5.0

        def energy_j(self, t0, t1):
            return 5.0 * (t1 - t0)

    def phase_caps(opening_s):
        caps = []

        def start_recorders(self, names):
            self.recorders = {n: _Recorder() for n in names}
            return list(names)

        def measure(self, names, steps=None, cap=None, window_s=None, what=""):
            caps.append((what or "+".join(names), cap))
            each = (cap if what == "opening" else steps or self.settings.steps_per_run) // len(names)
            result = _steady_result(names, each, 1000.0 + self.steps_total, self.steps_total,
                                    self.settings.warmup_steps)
            self.steps_total = result.steps_total
            return result, *result.measurement_window()[:2]

        monkeypatch.setattr(pretrain._Phase, "start_recorders", start_recorders)
        monkeypatch.setattr(pretrain._Phase, "measure", measure)
        monkeypatch.setattr(pretrain._Phase, "stop", lambda self: None)
        monkeypatch.setattr(pretrain._Phase, "shared_servers", lambda self: None)
        monkeypatch.setattr(pretrain.time, "sleep", lambda s: None)
        settings = PretrainSettings(steps_per_run=10, warmup_steps=2, warmup_s=0.0, idle_s=0.0,
                                    max_phase_steps=300, max_steps_per_run=20, max_sets=3, opening_s=opening_s,
                                    protocol="sequential")
        inventory = _Inventory()
        inventory.names = ["a", "b", "c"]
        profile = pretrain.run_pretraining(inventory, ModelSpec("small_cnn", (16, 16, 3), 4, 8), "/tmp/unused",
                                           settings=settings)
        return caps, profile

    with_opening, profile = phase_caps(10.0)
    without, without_profile = phase_caps(0.0)
    assert with_opening[0] == ("opening", 75) and with_opening[1:] == without
    assert [what for what, _ in without] == ["a", "b", "c", "a+b+c", "a+b", "b+c", "a"]  # solos, sets, recheck
    assert profile.pretrain_steps == without_profile.pretrain_steps + 75    # counted toward the job
