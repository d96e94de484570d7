"""Turning a cumulative counter into a rate between consecutive reads.

RAPL exposes energy counters (power = ΔE/Δt); the emulated source exposes CPU time
(utilization = Δcpu/Δt). Both need the same bookkeeping: the counter's value at open, the
previous read, and a minimum interval so two reads microseconds apart do not divide noise by
almost nothing. Only for counters that move often: NVML's energy counter moves once every 100 ms
on an H100, so its delta is no power reading (hetcluster/power/nvml.py reads the driver's).
"""

from __future__ import annotations

import time
from typing import Callable

#: Reads closer together than this are stretched (one short sleep) so the rate is meaningful.
MIN_INTERVAL_S = 0.01


class CounterRate:
    """Cumulative amount since open and average rate over the interval since the last update."""

    def __init__(self, total: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start_total = total
        self._last_total = total
        self._last_s = clock()
        self.rate = 0.0
        self.interval_s = 0.0  # the interval the last update measured over (0: it kept the previous rate)

    def wait_min_interval(self) -> None:
        """Sleep (once, at most MIN_INTERVAL_S) when called too soon after the previous update."""
        remaining_s = MIN_INTERVAL_S - (self._clock() - self._last_s)
        if remaining_s > 0:
            time.sleep(remaining_s)

    def update(self, total: float) -> float:
        """Record the counter's new total; return the rate since the previous update.

        A zero or negative interval (a frozen test clock) keeps the previous rate.
        """
        now_s = self._clock()
        interval_s = now_s - self._last_s
        self.interval_s = max(0.0, interval_s)
        if interval_s > 0:
            self.rate = (total - self._last_total) / interval_s
            self._last_s = now_s
            self._last_total = total
        return self.rate

    def since_open(self, total: float) -> float:
        return total - self._start_total
