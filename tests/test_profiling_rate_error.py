"""The standard error of a measured rate (profiling.pretrain.rate_standard_error), hand-computed."""

from __future__ import annotations

import itertools
import math

import pytest

from hetcluster.profiling.pretrain import rate_standard_error


def _ends(intervals):
    return list(itertools.accumulate([0.0, *intervals]))


def test_a_wandering_speed_counts_through_blocks_not_through_independent_steps():
    # 20 steps at 0.05 s, then 20 at 0.15 s: mean interval 0.1 s, so 1 s blocks hold 10 steps and the
    # four block means are 0.05, 0.05, 0.15, 0.15 — stdev 0.05·√(4/3), over √4 blocks, over the mean.
    # Taken as 40 independent intervals it would be stdev 0.05·√(40/39) over √40: 0.0801 of the rate.
    intervals = [0.05] * 20 + [0.15] * 20
    rate = 40 / 4.0
    expected = rate * 0.05 * math.sqrt(4 / 3) / 2 / 0.1
    assert rate_standard_error(_ends(intervals), rate) == pytest.approx(expected)        # 2.887 steps/s
    assert rate_standard_error(_ends(intervals), rate, block_s=0.1) == pytest.approx(rate * 0.0801, rel=1e-3)


def test_independent_noise_keeps_the_independent_error_and_a_steady_rate_has_none():
    # alternating 0.09/0.11 s: every 1 s block (10 steps) has the same mean, so the batch means
    # agree and the error is that of independent intervals, stdev/√n, never less
    intervals = [0.09, 0.11] * 20
    stdev = 0.01 * math.sqrt(40 / 39)
    assert rate_standard_error(_ends(intervals), 10.0) == pytest.approx(10.0 * stdev / math.sqrt(40) / 0.1)
    assert rate_standard_error(_ends([0.1] * 30), 10.0) == pytest.approx(0.0, abs=1e-9)
    assert rate_standard_error(_ends([0.1]), 10.0) == 0.0      # one interval: nothing to spread


def test_a_short_window_still_gets_three_blocks():
    # 9 intervals of a 0.5 s window: 1 s blocks would be 1 block; 3 blocks of 3 steps instead
    intervals = [0.04, 0.04, 0.04, 0.06, 0.06, 0.06, 0.05, 0.05, 0.05]
    means = [0.04, 0.06, 0.05]
    mean = sum(intervals) / len(intervals)
    block_stdev = math.sqrt(sum((m - 0.05) ** 2 for m in means) / 2)
    assert rate_standard_error(_ends(intervals), 20.0) == pytest.approx(20.0 * block_stdev / math.sqrt(3) / mean)
