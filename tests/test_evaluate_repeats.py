"""`hetcluster evaluate --repeats R`: every configuration trained R times, round by round, from its
own copy of the checkpoint; the truth is the mean, every run is kept. The trainer is replaced by a
scripted one (no TensorFlow): the rounds' order and the merge are what is under test here; the
real training path is tests/test_evaluate_harness.py's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from hetcluster.planner import plan
from hetcluster.planner.inputs import DeviceMeasurement, JobSpec
from hetcluster.training.coordinator import MeasuredRun
from hetcluster.training.spec import RunResult

# run time of each configuration in each round (s): b+a is the mean best, a wins round 2
SCRIPT = {("a",): [40.0, 30.0], ("b",): [80.0, 82.0], ("a", "b"): [34.0, 34.0]}


def _fake_run(order):
    def run(fleet, devices, spec, **options):
        key = tuple(devices)
        time_s = SCRIPT[key][sum(1 for k in order if k == key)]
        order.append(key)
        result = RunResult(steps_applied=10, steps_total=10, steps_restored=0, steps_per_worker={d: 5 for d in devices},
                           time_s=time_s, start_wall_s=1000.0, end_wall_s=1000.0 + time_s, step_times=[],
                           final_loss=None, lost_workers=[], checkpoint_path=None)
        return MeasuredRun(list(devices), result, {d: 10.0 * time_s for d in devices}, launch_s=1.0)
    return run


def test_repeats_run_in_rounds_and_score_against_the_mean(tmp_path, monkeypatch):
    import hetcluster.training.coordinator as coordinator
    from hetcluster.cli.cmd_evaluate import run_evaluation
    from hetcluster.cli.pretraining import DeviceBudgets

    order: list[tuple[str, ...]] = []
    monkeypatch.setattr(coordinator, "run_on_devices", _fake_run(order))
    devices = [DeviceMeasurement("a", 2.0, 20.0, 5.0), DeviceMeasurement("b", 1.0, 10.0, 5.0)]
    job = JobSpec(total_steps=10)
    the_plan = plan(devices, [], job, "edp", ())
    profile = SimpleNamespace(
        pretrain_steps=0,
        pretrain_time_s=5.0,
        pretrain_energy_j=50.0,
        checkpoint_path=None,
        warmup_steps=0,
        to_dict=lambda: {},
    )
    out = tmp_path / "r.json"
    no_budgets = SimpleNamespace(names=())  # no device with a known memory budget: plain TensorFlow
    from hetcluster.training.spec import Training

    result = run_evaluation(no_budgets, the_plan, profile, None, Training(), 10, ["time"], None, tmp_path / "w", out,
                            Console(quiet=True), DeviceBudgets(no_budgets), repeats=2)
    # two rounds, each over every configuration, the second in reverse order (drift cancels in the mean)
    assert order == [("a",), ("b",), ("a", "b"), ("a", "b"), ("b",), ("a",)]
    configs = {tuple(c["devices"]): c for c in result["configurations"]}
    assert configs[("a",)]["measured"]["time_s"] == pytest.approx(5.0 + 35.0)
    assert [m["time_s"] for m in configs[("a",)]["repeats"]] == pytest.approx([45.0, 35.0])
    assert [r["time_s"] for r in configs[("b",)]["runs"]] == [80.0, 82.0]
    time = result["objectives"]["time"]
    assert time["best"] == ["a", "b"] and time["chosen"] == ["a", "b"]   # mean 34 < 35; a+b predicted fastest
    assert time["exact"] is True and time["within_noise"] is True
    # scored against the same truth, a would be a miss within the truth's noise (its 30 s run), b a clear one
    from hetcluster.evaluation.scoring import ConfigurationResult, score_objective
    from hetcluster.training.report import JobMetrics

    merged = [ConfigurationResult(tuple(c["devices"]), JobMetrics.from_mapping(c["predicted"]),
                                  JobMetrics.from_mapping(c["measured"]),
                                  repeats=[JobMetrics.from_mapping(m) for m in c["repeats"]])
              for c in result["configurations"]]
    assert score_objective(merged, "time", ("a",))["within_noise"] is True
    assert score_objective(merged, "time", ("b",))["within_noise"] is False
    assert json.loads(out.read_text())["configurations"] == result["configurations"]  # written as it went
    assert [c["devices"] for c in result["configurations"]] == [["a"], ["b"], ["a", "b"]]  # the first round's order


def test_a_runs_record_keeps_each_workers_first_step_and_steady_rate():
    from hetcluster.evaluation.harness import worker_timings

    # a: first step done 10 s after the start, then one step per 0.5 s; b: one slow first step, then 2 s steps
    a = [(1000.0, 1010.0, "a")] + [(1010.0 + 0.5 * i, 1010.5 + 0.5 * i, "a") for i in range(8)]
    b = [(1000.0, 1020.0, "b"), (1020.0, 1022.0, "b"), (1022.0, 1024.0, "b"), (1024.0, 1026.0, "b")]
    result = RunResult(
        steps_applied=13,
        steps_total=13,
        steps_restored=0,
        steps_per_worker={"a": 9, "b": 4},
        time_s=26.0,
        start_wall_s=1000.0,
        end_wall_s=1026.0,
        step_times=sorted(a + b, key=lambda r: r[1]),
        final_loss=None,
        lost_workers=[],
        checkpoint_path=None,
    )
    timings = worker_timings(result, warmup_steps=2)
    assert timings["first_step_s"] == {"a": pytest.approx(10.0), "b": pytest.approx(20.0)}
    # past one warm-up step each (2 over 2 workers): a's 8 steps of 0.5 s, b's 3 of 2 s
    assert timings["steady_steps_per_s"] == {"a": pytest.approx(2.0), "b": pytest.approx(0.5)}
    # without a warm-up, a's rate counts its first (10 s) step over its span
    assert worker_timings(result, warmup_steps=0)["steady_steps_per_s"]["a"] == pytest.approx(9 / 14.0)
