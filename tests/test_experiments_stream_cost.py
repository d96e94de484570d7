"""experiments/investigations/stream_cost.py: a run's rate past its warm-up, the two conditions' runs, bad arguments."""

from __future__ import annotations

import pytest

from experiments.investigations import stream_cost
from hetcluster.training.spec import RunResult


def test_rate_counts_from_the_first_step_past_the_warmup():
    # two warm-up steps (slow), then four steps of 0.5 s back to back from t = 3
    stamps = [(0.0, 2.0, "w"), (2.0, 3.0, "w")] + [(3.0 + 0.5 * k, 3.5 + 0.5 * k, "w") for k in range(4)]
    rate, mean_step_s = stream_cost.run_rate(_result(stamps, 2))
    assert rate == pytest.approx(2.0) and mean_step_s == pytest.approx(0.5)
    with pytest.raises(SystemExit, match="too few steps"):
        stream_cost.run_rate(_result(stamps[:3], 2))


def _result(stamps: list[tuple[float, float, str]], warmup_steps: int) -> RunResult:
    return RunResult(steps_applied=len(stamps), steps_total=len(stamps), steps_restored=0,
                     steps_per_worker={"w": len(stamps)}, time_s=stamps[-1][1], start_wall_s=0.0,
                     end_wall_s=stamps[-1][1], step_times=stamps, final_loss=None, lost_workers=[],
                     checkpoint_path=None, warmup_steps=warmup_steps)


def test_the_cold_first_run_is_left_out_of_both_conditions():
    rows = [{"power_hz": 0.0, "steps_per_s": 9.0}, {"power_hz": 10.0, "steps_per_s": 1.0},
            {"power_hz": 0.0, "steps_per_s": 2.0}, {"power_hz": 10.0, "steps_per_s": 3.0}]
    assert stream_cost.rates_by_condition(rows) == {10.0: [1.0, 3.0], 0.0: [2.0]}


@pytest.mark.parametrize("argv", [["--runs", "2"], ["--steps", "4"], ["--power-hz", "0"]])
def test_bad_arguments_are_refused_before_a_fleet_starts(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        stream_cost.main(argv)
    assert exit_info.value.code == 2 and "--runs must be" in capsys.readouterr().err
