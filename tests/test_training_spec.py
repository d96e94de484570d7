"""Plain data of training runs: validation, JSON round trips and derived figures."""

from __future__ import annotations

import math

import pytest

from hetcluster.errors import ConfigError
from hetcluster.models import ModelSpec
from hetcluster.models.datasets import DataSource
from hetcluster.training.spec import ClusterAddresses, RunResult, TrainSpec


def test_cluster_addresses_spec_and_validation():
    c = ClusterAddresses(workers={"pi": "h1:1", "jetson": "h2:2"}, ps=["h0:3"], chief="h0:4")
    assert c.cluster_spec_dict() == {"chief": ["h0:4"], "worker": ["h1:1", "h2:2"], "ps": ["h0:3"]}
    assert c.worker_names == ["pi", "jetson"]
    assert ClusterAddresses.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="at least one worker"):
        ClusterAddresses(workers={}, ps=["h0:3"], chief="h0:4")
    with pytest.raises(ConfigError, match="parameter server"):
        ClusterAddresses(workers={"a": "h1:1"}, ps=[], chief="h0:4")
    with pytest.raises(ConfigError, match="repeat"):
        ClusterAddresses(workers={"a": "h1:1"}, ps=["h1:1"], chief="h0:4")


def test_a_run_on_shared_servers_names_only_its_workers():
    launched = ClusterAddresses(workers={"server": "h:1", "rpi4": "h:2", "phone": "h:3"}, ps=["h:4"], chief="h:5")
    run = launched.subset(["phone", "server"])
    assert run.workers == {"phone": "h:3", "server": "h:1"} and run.ps == ["h:4"] and run.chief == "h:5"
    assert run.cluster_spec_dict()["worker"] == ["h:3", "h:1"]   # tasks 0 and 1 of the run's cluster


def test_train_spec_round_trip_and_validation(tmp_path):
    spec = TrainSpec(model=ModelSpec("small_cnn", (16, 16, 3), 4, 8), total_steps=100,
                     data=DataSource("synthetic", seed=3), checkpoint_dir=str(tmp_path), checkpoint_every_steps=10)
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ConfigError):
        TrainSpec(model=spec.model, total_steps=-1)
    with pytest.raises(ConfigError):
        TrainSpec(model=spec.model, total_steps=5, warmup_steps=-2)
    with pytest.raises(ConfigError, match="max_steps"):
        TrainSpec(model=spec.model, total_steps=5, min_window_s=2.0, max_steps=4)


def _result(**kw) -> RunResult:
    base = dict(steps_applied=4, steps_total=10, steps_restored=6, steps_per_worker={"a": 3, "b": 1}, time_s=2.0,
                start_wall_s=100.0, end_wall_s=102.0,
                step_times=[(100.0, 100.4, "a"), (100.1, 100.6, "b"), (100.5, 101.0, "a"), (101.0, 101.5, "a")],
                final_loss=1.5, lost_workers=[], checkpoint_path="/x/ckpt-10", closures_scheduled=4, warmup_steps=1)
    base.update(kw)
    return RunResult(**base)


def test_run_result_figures_and_round_trip():
    r = _result()
    # one warm-up step (ends 100.4), then 3 completions up to t=101.5
    assert r.measurement_window() == (100.4, 101.5, 3)
    assert r.window_ends_s() == pytest.approx([0.2, 0.6, 1.1])   # the window's completions, from its open
    # two workers: each its own steady rate, summed. a: 2 steps after its warm-up step over
    # 100.5..101.5; b: only its first step (0.5 s), so one over that step's duration
    assert r.worker_steps_per_s() == pytest.approx({"a": 2.0, "b": 2.0})
    # b's lone step may be its slow first one: not a steady rate, and no steady window
    assert r.worker_windows() == {"a": (100.5, 101.5, 2)}
    assert r.worker_steps_per_s(steady_only=True) == pytest.approx({"a": 2.0})
    assert r.steps_per_s == pytest.approx(4.0)
    alone = _result(step_times=[(t0, t1, "a") for t0, t1, _ in r.step_times])
    assert alone.steps_per_s == pytest.approx(3 / 1.1)  # one worker: the window
    assert _result(warmup_steps=0).measurement_window() == (100.0, 101.5, 4)
    assert _result(warmup_steps=0).window_ends_s() == pytest.approx([0.4, 0.6, 1.0, 1.5])
    assert _result(step_times=[]).window_ends_s() == []
    assert _result(step_times=[], warmup_steps=0).steps_per_s == 0.0
    assert r.step_durations_s("a") == pytest.approx([0.5, 0.5])
    assert r.steps_unattributed == 0
    data = r.to_dict()
    assert data["steps_unattributed"] == 0 and data["step_times"][0] == [100.0, 100.4, "a"]
    assert RunResult.from_dict(data) == r


def test_the_warm_up_holds_its_steps_and_the_seconds_after_them():
    from hetcluster.training.spec import steps_past_warmup, warmup_count

    ends = [1.0, 2.0, 3.0, 3.5, 4.0, 6.0, 7.0]
    assert warmup_count(ends, 3) == 3
    assert warmup_count(ends, 3, warmup_s=1.0) == 5          # 3.5 and 4.0 end within 1 s of step 3
    assert warmup_count(ends, 0, warmup_s=1.0) == 0          # no warm-up steps: the seconds have no start
    assert warmup_count(ends[:2], 3, warmup_s=1.0) == 2
    # a run cut inside the seconds keeps the later half of its steps past the warm-up steps (4 → 2),
    # unless the seconds are counted in full (the engine sizing an extension)
    assert warmup_count(ends, 3, warmup_s=10.0) == 5
    assert warmup_count(ends, 3, warmup_s=10.0, at_most_half=False) == 7
    # per worker: each from the end of its own warm-up steps
    kept = steps_past_warmup({"fast": [(e - 0.5, e) for e in ends], "slow": [(0.0, 5.0), (5.0, 9.0)]}, 1, 2.0)
    assert [end for _, end in kept["fast"]] == [3.5, 4.0, 6.0, 7.0] and kept["slow"] == [(5.0, 9.0)]
    # one worker: the window opens at the last completion in the seconds (100.4 + 0.3), or, where
    # the seconds hold more than half of the steps past the warm-up step, at that half's start
    assert _result(warmup_s=0.3).measurement_window() == (100.6, 101.5, 2)
    assert _result(warmup_s=0.6).measurement_window() == (100.6, 101.5, 2)
    assert RunResult.from_dict(_result(warmup_s=0.6).to_dict()).warmup_s == 0.6


def test_a_measurement_run_is_extended_past_the_warm_up_seconds():
    from hetcluster.training.engine import _Stamp, _steady_window_shortfall_s, _steps_to_fill_window

    model = ModelSpec("small_cnn", (16, 16, 3), 4, 8)
    spec = TrainSpec(model=model, total_steps=10, warmup_steps=2, warmup_s=3.0, min_window_s=8.0, max_steps=200)
    # 1 step/s: the warm-up ends at 1 + 3 s (5 steps), the window 4..9 s is 3 s short
    ends = [float(k) for k in range(10)]
    assert _steps_to_fill_window(spec, _stamps(ends), room=190) == math.ceil(1.1 * 1.0 * 3.0)
    # still in the warm-up's seconds (they end at 1 + 5 s): 3 s of them left and the whole window
    in_warmup = TrainSpec(model=model, total_steps=4, warmup_steps=2, warmup_s=5.0, min_window_s=3.0, max_steps=200)
    assert _steps_to_fill_window(in_warmup, _stamps(ends[:4]), room=190) == math.ceil(1.1 * 1.0 * 6.0)
    # several workers: a slow one past its warm-up step but in its seconds is owed the rest of them
    sets = TrainSpec(model=model, total_steps=11, warmup_steps=1, warmup_s=2.0, min_window_s=1.0, max_steps=200)
    fast = [_Stamp(1.0, True, 0.5 * k - 0.5, 0.5 * k, 0) for k in range(1, 11)]
    slow = [_Stamp(1.0, True, 0.0, 4.0, 1)]
    assert _steady_window_shortfall_s(sets, fast + slow, 2) == pytest.approx(2 * 4.0 + (4.0 + 2.0 - 5.0))


def test_unattributed_steps_count_updates_of_dead_workers():
    assert _result(steps_per_worker={"a": 3, "b": 0}, lost_workers=["b"]).steps_unattributed == 1


def _stamps(ends):
    from hetcluster.training.engine import _Stamp

    return [_Stamp(1.0, True, end - 0.05, end, 0) for end in ends]


def test_a_measurement_run_is_extended_until_its_window_is_long_enough():
    from hetcluster.training.engine import _steps_to_fill_window

    model = ModelSpec("small_cnn", (16, 16, 3), 4, 8)
    spec = TrainSpec(model=model, total_steps=10, warmup_steps=2, min_window_s=3.0, max_steps=200)
    # 10 steps: two warm-up, then 8 at 10 steps/s → a 0.8 s window; 2.2 s more at 10/s, 10 % over
    ends = [5.0, 5.1] + [5.1 + 0.1 * k for k in range(1, 9)]
    assert _steps_to_fill_window(spec, _stamps(ends), room=190) == 25
    assert _steps_to_fill_window(spec, _stamps(ends), room=7) == 7          # capped by max_steps
    assert _steps_to_fill_window(spec, _stamps(ends), room=0) == 0
    long_enough = [5.0, 5.1] + [5.1 + 0.5 * k for k in range(1, 9)]         # 4 s window
    assert _steps_to_fill_window(spec, _stamps(long_enough), room=190) == 0
    plain = TrainSpec(model=model, total_steps=10, warmup_steps=2)           # not a measurement run
    assert _steps_to_fill_window(plain, _stamps(ends), room=190) == 0
    # unapplied closures (past the gate) do not count
    from hetcluster.training.engine import _Stamp
    assert _steps_to_fill_window(spec, [_Stamp(1.0, False, 0.0, 9.0, 0)] * 5, room=190) == 2


def test_a_solo_measurement_run_is_extended_until_its_window_holds_enough_steps():
    from hetcluster.training.engine import _Stamp, _steps_to_fill_window

    model = ModelSpec("small_cnn", (16, 16, 3), 4, 8)
    # 1 step/s, two warm-up steps: ends 0..6 leave a 5 s window (long enough) of 5 steps, 5 short of 10
    spec = TrainSpec(model=model, total_steps=7, warmup_steps=2, min_window_s=3.0, min_window_steps=10, max_steps=200)
    ends = [float(k) for k in range(7)]
    assert _steps_to_fill_window(spec, _stamps(ends), room=190) == math.ceil(1.1 * 1.0 * 5.0)
    assert _steps_to_fill_window(spec, _stamps(ends), room=3) == 3                       # capped by max_steps
    assert _steps_to_fill_window(spec, _stamps([float(k) for k in range(12)]), room=190) == 0   # 10 steps held
    seconds_only = TrainSpec(model=model, total_steps=7, warmup_steps=2, min_window_s=3.0, max_steps=200)
    assert _steps_to_fill_window(seconds_only, _stamps(ends), room=190) == 0
    # still in the warm-up's seconds (to 1 + 5 s): its 3 s left, then the 10 steps at 1 step/s
    in_warmup = TrainSpec(model=model, total_steps=4, warmup_steps=2, warmup_s=5.0, min_window_s=3.0,
                          min_window_steps=10, max_steps=200)
    assert _steps_to_fill_window(in_warmup, _stamps(ends[:4]), room=190) == math.ceil(1.1 * 1.0 * 13.0)
    # steps alone make a measurement run too
    steps_only = TrainSpec(model=model, total_steps=7, warmup_steps=2, min_window_steps=10, max_steps=200)
    assert steps_only.extends_window and _steps_to_fill_window(steps_only, _stamps(ends), room=190) == 6
    # several workers: the steps rule is a solo run's, a set is sized by its seconds
    pair = [_Stamp(1.0, True, end - 0.05, end, k % 2) for k, end in enumerate(ends)]
    assert _steps_to_fill_window(steps_only, pair, room=190, n_workers=2) == 0
    with pytest.raises(ConfigError):
        TrainSpec(model=model, total_steps=7, min_window_steps=-1, max_steps=200)
    with pytest.raises(ConfigError):
        TrainSpec(model=model, total_steps=7, min_window_steps=10, max_steps=5)


def test_steady_rates_start_when_the_last_worker_is_past_its_set_up():
    # warm-up 1 → each worker's first step skipped. a: 0.5 s steps from 100.0; b: set-up until
    # 102.0, then 1 s steps. The common window opens at b's first kept step (102.0, its second step)
    a = [(100.0 + 0.5 * k, 100.5 + 0.5 * k, "a") for k in range(12)]          # ends 100.5 … 106.0
    b = [(100.0, 102.0, "b"), (102.0, 103.0, "b"), (103.0, 104.0, "b"), (104.0, 105.0, "b")]
    r = _result(step_times=sorted(a + b, key=lambda row: row[1]), warmup_steps=1,
                steps_per_worker={"a": 12, "b": 4})
    t0, t1, rates = r.steady_rates()
    assert (t0, t1) == (102.0, 106.0)
    assert rates["a"] == pytest.approx(8 / 4.0)    # a's steps starting at 102.0 … 105.5, over 102 → 106
    assert rates["b"] == pytest.approx(3 / 3.0)    # b's 3 steps from 102, over 102 → 105
    # b with only its set-up step and one more: no common steady window yet
    short = _result(step_times=sorted(a + b[:2], key=lambda row: row[1]), warmup_steps=1,
                    steps_per_worker={"a": 12, "b": 2})
    assert short.steady_rates() is None
    # a worker with no step at all, or one worker only: none either
    assert _result(step_times=a, warmup_steps=1, steps_per_worker={"a": 12, "b": 0}).steady_rates() is None
    assert _result(step_times=a, warmup_steps=1, steps_per_worker={"a": 12}).steady_rates() is None


def test_every_worker_of_a_set_passes_its_own_warm_up_as_a_solo_run_does():
    # the same run with warm-up 2: each worker skips two steps of its own (not one each as a share
    # of the run's two), so the window opens at b's third step (103.0)
    a = [(100.0 + 0.5 * k, 100.5 + 0.5 * k, "a") for k in range(12)]
    b = [(100.0, 102.0, "b"), (102.0, 103.0, "b"), (103.0, 104.0, "b"), (104.0, 105.0, "b")]
    r = _result(step_times=sorted(a + b, key=lambda row: row[1]), warmup_steps=2, steps_per_worker={"a": 12, "b": 4})
    t0, t1, rates = r.steady_rates()
    assert (t0, t1) == (103.0, 106.0)
    assert rates["a"] == pytest.approx(6 / 3.0)    # a's steps starting at 103.0 … 105.5
    assert rates["b"] == pytest.approx(2 / 2.0)    # b's 2 steps from 103, over 103 → 105
    assert r.worker_windows() == {"a": (101.0, 106.0, 10), "b": (103.0, 105.0, 2)}
    # with three steps each to skip, b has one kept step: no steady window
    assert _result(step_times=r.step_times, warmup_steps=3, steps_per_worker={"a": 12, "b": 4}).steady_rates() is None


def test_a_multi_worker_measurement_run_is_extended_until_every_worker_is_steady():
    from hetcluster.training.engine import _Stamp, _steps_to_fill_window

    model = ModelSpec("small_cnn", (16, 16, 3), 4, 8)
    spec = TrainSpec(model=model, total_steps=10, warmup_steps=2, min_window_s=3.0, max_steps=500)
    fast = [_Stamp(1.0, True, 0.1 * k, 0.1 * k + 0.1, 0) for k in range(40)]        # 10 steps/s to 4.0 s
    # the slow worker still in its first step: nothing of it came back; the run's 4 s span as its
    # step, and it owes its two warm-up steps and two in the window (16 s)
    assert _steps_to_fill_window(spec, fast, room=460, n_workers=2) == math.ceil(1.1 * 10.0 * 16.0)
    # its first (set-up) step back at 3.5 s, 3.5 s long: it needs one more warm-up step and two
    # more such steps (10.5 s)
    slow = [_Stamp(1.0, True, 0.0, 3.5, 1)]
    assert _steps_to_fill_window(spec, fast + slow, room=460, n_workers=2) == math.ceil(
        1.1 * (41 - 2) / (4.0 - 0.2) * 10.5
    )
    # steady: past its two warm-up steps (0–3.5, 3.5–4.5) the slow worker's kept steps 4.5–5.5,
    # 5.5–6.5, 6.5–7.5 → a window from 4.5 to 7.5 ≥ 3 s
    fast_long = [_Stamp(1.0, True, 0.1 * k, 0.1 * k + 0.1, 0) for k in range(70)]
    steady = slow + [_Stamp(1.0, True, 3.5 + k, 4.5 + k, 1) for k in range(4)]
    assert _steps_to_fill_window(spec, fast_long + steady, room=430, n_workers=2) == 0
    # one step fewer: the window 4.5 → 7.0 is 2.5 s, half a second short
    assert _steps_to_fill_window(spec, fast_long + steady[:-1], room=430, n_workers=2) > 0
    # the same steps counted as one worker would have been long enough long ago
    assert _steps_to_fill_window(spec, fast + slow, room=460, n_workers=1) == 0
    assert _steps_to_fill_window(spec, fast + slow, room=5, n_workers=2) == 5     # capped


def test_steady_rates_leave_out_what_a_worker_waited_at_the_engines_joins():
    # rounds scheduled at 100.0 and 104.0. In the first, a (0.5 s steps) is done at 102.0 and waits
    # for b's last step (to 104.0): a continuous run would have trained on. warm-up 1 → one step each
    a = [(100.0 + 0.5 * k, 100.5 + 0.5 * k, "a") for k in range(4)] + \
        [(104.0 + 0.5 * k, 104.5 + 0.5 * k, "a") for k in range(4)]                   # ends … 102.0, … 106.0
    b = [(100.0, 101.0, "b"), (101.0, 102.5, "b"), (102.5, 104.0, "b"), (104.0, 105.5, "b"), (105.5, 107.0, "b")]
    steps = sorted(a + b, key=lambda row: row[1])
    joined = _result(step_times=steps, warmup_steps=1, steps_per_worker={"a": 8, "b": 5},
                     round_starts_wall_s=[100.0, 104.0])
    t0, t1, rates = joined.steady_rates()
    assert (t0, t1) == (101.0, 107.0)                     # b's first kept step starts at 101.0
    # a: steps starting 101.0, 101.5 (ending 102.0), then 4 from 104.0 → 6 steps over (102 − 101) + (106 − 104)
    assert rates["a"] == pytest.approx(6 / 3.0)
    # b never waited: 4 steps over 101 → 104 and 104 → 107
    assert rates["b"] == pytest.approx(4 / 6.0)
    # a result without recorded rounds (older ones) keeps the plain span: a's 6 steps over 101 → 106
    plain = _result(step_times=steps, warmup_steps=1, steps_per_worker={"a": 8, "b": 5})
    assert plain.steady_rates()[2]["a"] == pytest.approx(6 / 5.0)
    assert RunResult.from_dict(joined.to_dict()).round_starts_wall_s == [100.0, 104.0]
    assert (
        RunResult.from_dict(
            {k: v for k, v in plain.to_dict().items() if k != "round_starts_wall_s"}
        ).round_starts_wall_s
        == []
    )


def test_a_workers_steady_rate_does_not_count_the_step_it_was_in_when_the_window_opened():
    # a: 1 s steps from 100.0; b: set-up to 102.5, then 1 s steps. warm-up 1: the window opens at
    # b's second step (102.5), half-way through a's step 102.0–103.0, which a does not count
    a = [(100.0 + k, 101.0 + k, "a") for k in range(6)]                           # ends 101.0 … 106.0
    b = [(100.0, 102.5, "b"), (102.5, 103.5, "b"), (103.5, 104.5, "b"), (104.5, 105.5, "b")]
    r = _result(step_times=sorted(a + b, key=lambda row: row[1]), warmup_steps=1, steps_per_worker={"a": 6, "b": 4})
    t0, t1, rates = r.steady_rates()
    assert (t0, t1) == (102.5, 106.0)
    # a's 3 steps from 103.0 over the end of its step before them (103.0) to 106.0 — not 3 over 3.5 s
    assert rates["a"] == pytest.approx(1.0)
    assert rates["b"] == pytest.approx(1.0)
