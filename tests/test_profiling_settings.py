"""How long pre-training measures: per-run step caps and calibration-set sizes (pure)."""

from __future__ import annotations

import math

import pytest

from hetcluster.errors import ProfileError
from hetcluster.profiling.pretrain import PretrainSettings, step_cap_for_job
from hetcluster.profiling.profile import DeviceProfile


def _settings(**kwargs) -> PretrainSettings:
    """Settings sized for the warm-up's steps alone (no warm-up seconds), as these tests count them."""
    return PretrainSettings(**{"warmup_s": 0.0, **kwargs})


def _device(name, steps_per_s, first_step_s):
    return DeviceProfile(name, steps_per_s, 0.0, 10.0, 5.0, steps=10, time_s=1.0, energy_j=10.0,
                         first_step_s=first_step_s, startup_s=first_step_s)


def test_step_cap_defaults_to_five_runs_worth_and_never_below_steps_per_run():
    assert _settings(steps_per_run=10, warmup_steps=3).step_cap == 50
    assert _settings(steps_per_run=10, warmup_steps=3, max_steps_per_run=30).step_cap == 30
    assert _settings(steps_per_run=10, warmup_steps=3, max_steps_per_run=4).step_cap == 10
    with pytest.raises(ProfileError, match="negative"):
        _settings(steps_per_run=10, warmup_steps=3, min_window_s=-1.0)
    with pytest.raises(ProfileError, match="negative"):
        _settings(steps_per_run=10, warmup_steps=3, max_window_s=-1.0)
    with pytest.raises(ProfileError, match="negative"):
        PretrainSettings(steps_per_run=10, warmup_steps=3, warmup_s=-1.0)


def test_step_cap_keeps_pretraining_a_third_of_the_job():
    # 3 devices alone + 3 sets = 6 runs; a third of 3000 steps → 166 per run (not 5 × 20: a
    # long job affords a fast device its whole window)
    assert step_cap_for_job(20, 3000, 3) == 166
    assert step_cap_for_job(10, 5000, 3) == 277
    # a third of 500 over 6 runs → 27
    assert step_cap_for_job(10, 500, 3) == 27
    # a tiny job: never fewer than steps_per_run
    assert step_cap_for_job(10, 120, 3) == 10
    assert step_cap_for_job(10, None, 3) == 0


def test_sequential_settings_for_a_job_cap_each_run_and_the_phase():
    sized = PretrainSettings.for_job(10, 3, 500, 3, protocol="sequential")
    assert (sized.steps_per_run, sized.warmup_steps) == (10, 3)
    assert (sized.max_steps_per_run, sized.max_phase_steps, sized.step_cap) == (27, 166, 27)
    unsized = PretrainSettings.for_job(10, 3, None, 3, protocol="sequential")   # no job size: no budget
    assert (unsized.max_phase_steps, unsized.step_cap) == (0, 50)


def test_settings_for_a_job_on_lanes_keep_its_budget():
    sized = PretrainSettings.for_job(10, 3, 500, 3, budget_share=0.2)
    assert (sized.protocol, sized.budget_share, sized.budget_steps) == ("lanes", 0.2, 100)
    unsized = PretrainSettings.for_job(10, 3, None, 3)   # no job size: no budget
    assert (unsized.budget_share, unsized.budget_steps) == (0.0, 0)
    with pytest.raises(ProfileError, match="protocol"):
        PretrainSettings(protocol="parallel")


def test_a_set_runs_until_its_slowest_member_is_steady_and_the_window_is_long():
    settings = _settings(steps_per_run=10, warmup_steps=3, min_window_s=3.0, max_steps_per_run=400)
    server, phone = _device("server", 5.0, 2.0), _device("phone", 0.5, 20.0)
    # the start barrier: one step each per warm-up round, whatever it costs in time (the phone's
    # 20 s first step no longer lets the server take 90 steps, nor its next two another 20): 2 × 3;
    # then each takes 2 more: the phone's 2 steps at 0.5/s take 4 s, longer than the 3 s window;
    # 4 s at 5/s and 0.5/s is 22 steps
    assert settings.set_steps([server, phone]) == 28
    capped = _settings(steps_per_run=10, warmup_steps=3, min_window_s=3.0, max_steps_per_run=20)
    assert capped.set_steps([server, phone]) == 20
    # two quick devices: their warm-up rounds, then the 3 s window
    quick = [_device("a", 20.0, 1.0), _device("b", 10.0, 2.0)]
    assert settings.set_steps(quick) == 6 + 90             # 30 steps/s over 3 s
    # each of two members needs its own warm-up (3, the barrier's first step one of them) and two
    # steps: 2 × 5, but never fewer than steps_per_run
    assert _settings(steps_per_run=5, warmup_steps=3, min_window_s=0.0).set_steps(
        [_device("a", 1.0, 0.0), _device("b", 1.0, 0.0)]) == 10
    assert _settings(steps_per_run=20, warmup_steps=3, min_window_s=0.0).set_steps(
        [_device("a", 1.0, 0.0), _device("b", 1.0, 0.0)]) == 20
    # no warm-up: the barrier's step is kept, one more each makes two
    assert _settings(steps_per_run=2, warmup_steps=0, min_window_s=0.0).set_steps(
        [_device("a", 1.0, 0.0), _device("b", 1.0, 0.0)]) == 6


def test_a_set_is_sized_for_the_seconds_after_its_warm_up_steps():
    # past the barrier's rounds (2 × 3 steps) every member runs its warm-up's seconds before the
    # window opens: 3 s at 5 + 0.5 steps/s is 16.5 more steps than without them
    server, phone = _device("server", 5.0, 2.0), _device("phone", 0.5, 20.0)
    without = _settings(steps_per_run=10, warmup_steps=3, max_steps_per_run=400)
    default = PretrainSettings(steps_per_run=10, warmup_steps=3, max_steps_per_run=400)
    assert default.warmup_s == 3.0
    assert without.set_steps([server, phone]) == 6 + 22
    assert default.set_steps([server, phone]) == 6 + math.ceil(5.5 * (4.0 + 3.0))


def test_a_set_may_use_its_share_of_what_the_phase_budget_leaves():
    settings = _settings(steps_per_run=10, warmup_steps=3, max_steps_per_run=27, max_phase_steps=666)
    # solo runs took 66 steps: 600 left for three sets → 200 each, then the share of what is left
    assert settings.set_cap(66, 3) == 200
    assert settings.set_cap(366, 1) == 300
    assert settings.set_cap(660, 1) == 27                  # never below the per-run cap
    assert _settings(steps_per_run=10, warmup_steps=3, max_steps_per_run=27).set_cap(66, 3) == 27  # no budget
    server, phone = _device("server", 5.0, 2.0), _device("phone", 0.5, 20.0)
    assert settings.set_steps([server, phone], cap=200) == 28 and settings.set_steps([server, phone], cap=20) == 20


def test_a_set_measures_longer_where_its_share_of_the_budget_affords_it():
    # two quick devices at 20/s and 10/s after the barrier's three rounds (6 steps): W s of window
    # take 6 + 30 W steps
    quick = [_device("a", 20.0, 1.0), _device("b", 10.0, 2.0)]
    settings = _settings(steps_per_run=10, warmup_steps=3, min_window_s=3.0, max_window_s=10.0,
                         max_steps_per_run=27, max_phase_steps=2000)
    assert settings.set_window_s(quick, cap=400) == 10.0                   # 306 steps fit
    assert settings.set_window_s(quick, cap=90) == 3.0                     # 96 > 90: never under 3 s
    window_s = settings.set_window_s(quick, cap=200)                       # 30 W + 6 ≤ 200 → W = 6.47
    assert window_s == pytest.approx(194 / 30, abs=0.05)
    assert settings.set_steps(quick, cap=200, window_s=window_s) <= 200
    assert settings.set_steps(quick, cap=200, window_s=window_s + 0.1) == 200  # capped just above
    # no job size, no phase budget: the minimum window, as before
    no_budget = _settings(steps_per_run=10, warmup_steps=3, min_window_s=3.0, max_steps_per_run=400)
    assert no_budget.set_window_s(quick, cap=400) == 3.0
    assert no_budget.set_steps(quick, cap=400) == 96


def test_a_solo_run_must_hold_min_window_steps_and_a_set_is_sized_by_its_seconds(monkeypatch, tmp_path):
    import hetcluster.training.run_job as run_job
    from hetcluster.errors import TrainingError
    from hetcluster.models import ModelSpec
    from hetcluster.models.datasets import DataSource
    from hetcluster.profiling.pretrain import MIN_SOLO_WINDOW_STEPS, _Phase
    from hetcluster.training.spec import ClusterAddresses

    specs = []

    def run_in_subprocess(spec, addresses, **kwargs):
        specs.append((spec, list(addresses.workers)))
        raise TrainingError("stop here")

    class Launched:
        addresses = ClusterAddresses(
            workers={"a": "127.0.0.1:1", "b": "127.0.0.1:2"}, ps=["127.0.0.1:3"], chief="127.0.0.1:4"
        )
        plane = None

        def stop(self):
            pass

    monkeypatch.setattr(run_job, "run_in_subprocess", run_in_subprocess)
    settings = PretrainSettings()
    assert settings.min_window_steps == MIN_SOLO_WINDOW_STEPS >= 8
    phase = _Phase(None, ModelSpec("small_cnn", (16, 16, 3), 4, 8), DataSource(), str(tmp_path), settings, None)
    for names in (["a"], ["a", "b"]):
        phase.cluster = Launched()
        with pytest.raises(TrainingError):
            phase.measure(names)
    (solo, solo_names), (pair, pair_names) = specs
    assert solo_names == ["a"] and solo.min_window_steps == MIN_SOLO_WINDOW_STEPS and solo.extends_window
    assert pair_names == ["a", "b"] and pair.min_window_steps == 0 and pair.min_window_s == settings.min_window_s
    with pytest.raises(ProfileError):
        _settings(steps_per_run=10, warmup_steps=3, min_window_steps=-1)
