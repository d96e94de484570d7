"""Energy and mean power from recorded samples: trapezoid, counters, interpolated window ends."""

import pytest

from hetcluster.agent.client import energy_between, mean_power_between
from hetcluster.power.base import PowerSample


def sample(t: float, power_w: float, energy_j: float | None = None) -> PowerSample:
    return PowerSample(
        monotonic_s=t, wall_time_s=1000.0 + t, power_w=power_w, source="x", measured=True, energy_j=energy_j
    )


def test_trapezoid_over_a_linear_ramp_with_interpolated_ends():
    samples = [sample(t / 10, 10.0 * t / 10) for t in range(0, 21)]  # P = 10 t over 2 s
    # integral of 10 t from 0.25 to 1.55 = 5 (1.55^2 - 0.25^2)
    assert energy_between(samples, 1000.25, 1001.55) == pytest.approx(5 * (1.55**2 - 0.25**2))
    assert mean_power_between(samples, 1000.25, 1001.55) == pytest.approx(5 * (1.55**2 - 0.25**2) / 1.3)


def test_counter_difference_wins_when_every_sample_has_one():
    samples = [sample(t, 999.0, energy_j=3.0 * t) for t in range(5)]  # 3 W by the counter
    assert energy_between(samples, 1000.5, 1003.5) == pytest.approx(9.0)
    assert mean_power_between(samples, 1000.0, 1004.0) == pytest.approx(3.0)


def test_window_is_clipped_to_covered_span_and_empty_windows_are_zero():
    samples = [sample(t, 4.0) for t in range(3)]
    assert energy_between(samples, 990.0, 2000.0) == pytest.approx(8.0)
    assert energy_between(samples, 2000.0, 2001.0) == 0.0
    assert mean_power_between([], 0.0, 1.0) == 0.0
    assert mean_power_between(samples[:1], 999.0, 1001.0) == 4.0
