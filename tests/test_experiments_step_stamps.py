"""experiments/investigations/step_stamps.py: where a run trains freely, its per-bin step durations,
bad arguments; on a recorded run kept as test data."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.investigations import step_stamps
from hetcluster.training.spec import RunResult

RECORDED = (
    Path(__file__).parent
    / "data"
    / "step_stamps"
    / "mobilenet_v2-pretrain400-server+jetson-tx2+phone_server+jetson-tx2"
)


def _result(rounds: list[float], stamps: list[tuple[float, float, str]], warmup_steps: int = 2) -> RunResult:
    return RunResult(steps_applied=len(stamps), steps_total=len(stamps), steps_restored=0,
                     steps_per_worker={}, time_s=stamps[-1][1], start_wall_s=0.0, end_wall_s=stamps[-1][1],
                     step_times=stamps, final_loss=None, lost_workers=[], checkpoint_path=None,
                     warmup_steps=warmup_steps, round_starts_wall_s=rounds)


def test_bins_start_where_the_barrier_rounds_end():
    # two barrier rounds (at 0 and 5 s), free from 6 s: "a" steps 0.1 s, then 0.3 s from 7 s on
    stamps = [(4.0, 5.0, "a"), (5.0, 5.9, "b"), (5.2, 5.5, "a"), (6.0, 6.1, "a"), (6.5, 6.6, "a"),
              (7.0, 7.3, "a"), (6.0, 7.5, "b"), (9.0, 9.3, "a")]
    result = _result([0.0, 5.0, 6.0], stamps)
    assert step_stamps.free_start_s(result, barrier=True) == 6.0
    assert step_stamps.free_start_s(result, barrier=False) == 0.0   # no barrier: from the run's start
    bins = step_stamps.duration_bins(result, "a", 6.0, 1.0)
    assert bins == pytest.approx([0.1, 0.3, None, 0.3])            # by end time: 6.1 and 6.6, 7.3, -, 9.3
    assert step_stamps.duration_bins(result, "b", 6.0, 1.0) == pytest.approx([None, 1.5])


def test_a_recorded_pretraining_set_runs_slow_after_its_barrier():
    result = step_stamps.read_run(RECORDED / "pretrain-3-jetson-tx2+phone+server.json")
    start_s = step_stamps.free_start_s(result, barrier=True)
    assert start_s == result.round_starts_wall_s[3]   # three barrier rounds of one step per member
    [first] = step_stamps.duration_bins(result, "server", start_s, 3.0)
    steady = step_stamps.read_run(RECORDED / "server+jetson-tx2+phone.json")
    late = [
        d for d in step_stamps.duration_bins(steady, "server", step_stamps.free_start_s(steady, True), 3.0)[3:] if d
    ]
    # docs/experiments.md, "A sub-second set window reads its fastest member low": 80-171 ms steps after
    # the set's barrier (110 ms on the mean), 71-87 ms later in a long run of the same set
    assert first == pytest.approx(0.110, abs=0.005) and 0.070 < min(late) and max(late) < 0.090


def test_a_run_file_reads_back_as_its_run_result(tmp_path):
    result = step_stamps.read_run(RECORDED / "server+jetson-tx2.json")
    step_stamps.write_run(tmp_path / "run.json", result, devices=["server", "jetson-tx2"], barrier=True)
    assert step_stamps.read_run(tmp_path / "run.json") == result


def test_a_configuration_trained_twice_keeps_both_files():
    labels = ["server+phone", "server", "server+phone", "server+phone"]
    assert step_stamps.run_file_names(labels) == ["server+phone.json", "server.json", "server+phone-2.json",
                                                  "server+phone-3.json"]


def test_shared_servers_say_which_workers_trained_before():
    runs = [["server"], ["phone"], ["server", "phone"], ["server", "phone"], ["rpi4", "phone"]]
    assert step_stamps.workers_used_before(runs, shared_servers=True) == [
        [], [], ["server", "phone"], ["server", "phone"], ["phone"]]
    assert step_stamps.workers_used_before(runs, shared_servers=False) == [[]] * 5   # every run launches afresh


def test_runs_must_name_devices_of_the_fleet(capsys):
    with pytest.raises(SystemExit) as error:
        step_stamps.main(["--devices", "server,phone", "--runs", "server+rpi4"])
    assert error.value.code == 2 and "['rpi4'] are not in --devices" in capsys.readouterr().err
