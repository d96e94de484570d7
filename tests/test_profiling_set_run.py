"""A calibration set's measurement from its run (pure: a RunResult and recorded power)."""

from __future__ import annotations

import pytest

from hetcluster.profiling.pretrain import _set_run
from hetcluster.training.spec import RunResult


class _Recorder:
    """Constant power; records the windows it was asked about."""

    def __init__(self, power_w: float) -> None:
        self.power_w, self.asked = power_w, []

    def mean_power_w(self, t0: float, t1: float) -> float:
        self.asked.append((t0, t1))
        return self.power_w

    def energy_j(self, t0: float, t1: float) -> float:
        return self.power_w * (t1 - t0)


def _run(b_steps: int, b_step_s: float = 1.0) -> RunResult:
    # warm-up 1: each worker's first step (b's 2 s set-up) is left out
    a = [(100.0 + 0.5 * k, 100.5 + 0.5 * k, "a") for k in range(12)]           # to 106.0
    b = [(100.0, 102.0, "b")] + [(102.0 + b_step_s * k, 102.0 + b_step_s * (k + 1), "b") for k in range(b_steps - 1)]
    steps = sorted(a + b, key=lambda row: row[1])
    return RunResult(steps_applied=len(steps), steps_total=len(steps), steps_restored=0,
                     steps_per_worker={"a": 12, "b": b_steps}, time_s=6.0, start_wall_s=100.0, end_wall_s=106.0,
                     step_times=steps, final_loss=None, lost_workers=[], checkpoint_path=None, warmup_steps=1)


def test_a_set_is_measured_where_every_member_trains_steadily():
    recorders = {"a": _Recorder(100.0), "b": _Recorder(10.0)}
    result = _run(4)
    t0, t1, _ = result.measurement_window()
    run = _set_run(("a", "b"), result, t0, t1, recorders)
    assert run.time_s == pytest.approx(4.0) and run.steps_per_s == pytest.approx(2.0 + 1.0)
    assert run.per_device_steps == {"a": 8, "b": 4}           # rates × the 4 s window
    assert run.power_w == pytest.approx(110.0) and recorders["a"].asked == [(102.0, 106.0)]


def test_a_set_cut_short_by_the_cap_keeps_the_run_as_it_went(caplog):
    recorders = {"a": _Recorder(100.0), "b": _Recorder(10.0)}
    result = _run(2)                                           # b: set-up step and one more
    t0, t1, _ = result.measurement_window()
    run = _set_run(("a", "b"), result, t0, t1, recorders)
    assert "step cap" in caplog.text
    assert run.steps_per_s == pytest.approx(result.steps_per_s) and set(run.per_device_steps) == {"a"}


def test_a_members_rate_in_the_set_is_kept_exact_not_rounded_to_whole_steps():
    """A board holds a few steps of a short set window: 0.8 steps/s over 4 s is 3.2 steps, which a
    whole-step count read back as 0.75 steps/s (6 % slow; up to a quarter at 2 steps)."""
    recorders = {"a": _Recorder(100.0), "b": _Recorder(10.0)}
    result = _run(4, b_step_s=1.25)                            # b's last step ends at 105.75
    t0, t1, _ = result.measurement_window()
    run = _set_run(("a", "b"), result, t0, t1, recorders)
    assert run.time_s == pytest.approx(4.0)
    rates = {name: steps / run.time_s for name, steps in run.per_device_steps.items()}
    assert rates == pytest.approx({"a": 2.0, "b": 0.8})
    assert sum(rates.values()) == pytest.approx(run.steps_per_s)
