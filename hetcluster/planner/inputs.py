"""The data the planner searches over: what pre-training measured, and what the job asks.

These dataclasses are the contract between the profiling phase (which fills them from real
measurements) and the planner (which only reads them). They are validated once, here, so the
estimation code can assume finite, positive numbers.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from hetcluster.errors import PlanningError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceMeasurement:
    """One device measured alone during pre-training."""

    name: str
    steps_per_s: float            # solo throughput (applied steps/s when training alone), warm-up excluded
    busy_power_w: float           # mean power while training alone
    idle_power_w: float           # mean power while idle
    memory_fits: bool = True      # filled from the memory scheduler's plan
    memory_slowdown: float = 1.0  # step-time multiplier of the memory plan (enters the time estimate)
    class_key: str | None = None  # identical devices share a key (class aggregation)
    steps_per_s_std: float = 0.0  # spread of the solo measurement (for uncertainty)
    first_step_s: float = 0.0     # run start → first completed step (graph set-up, first step)
    startup_s: float = 0.0        # intercept of the steady line: N steps alone take ≈ startup_s + N/rate
    startup_power_w: float = 0.0  # mean power over that start-up (0: not measured, priced as training)


@dataclass(frozen=True)
class RunMeasurement:
    """One measured pre-training run of a set of devices together."""

    devices: tuple[str, ...]
    steps: int
    time_s: float                 # warm-up excluded
    steps_per_s: float            # aggregate applied steps/s
    power_w: float                # summed mean power of the participating devices
    per_device_steps: dict[str, float] = field(default_factory=dict)   # member → its rate × time_s (not rounded)
    per_device_power_w: dict[str, float] = field(default_factory=dict)

    @property
    def every_member_steady(self) -> bool:
        """Whether the run recorded each member's own rate: pre-training does when the set reached
        a window where every member trained steadily; a set the step cap ended first keeps only
        the members that did (on heavy models often the fast one alone)."""
        return set(self.per_device_steps) >= set(self.devices)

    @property
    def any_member_steady(self) -> bool:
        """Whether the run recorded any member's own rate (a set the step cap ended before any
        member trained steadily has none; so has a trace without per-device rates)."""
        return bool(self.per_device_steps)


@dataclass(frozen=True)
class JobSpec:
    """The whole job: how many steps, and what pre-training already did of it."""

    total_steps: int
    pretrain_steps: int = 0       # steps already done in pre-training (count toward the job)
    pretrain_time_s: float = 0.0
    idle_power_counts: bool = False   # idle devices' power counts toward a configuration's power
    pretrain_energy_j: float = 0.0

    @property
    def remaining_steps(self) -> int:
        """Steps still to train after pre-training (never negative)."""
        return max(0, int(self.total_steps) - int(self.pretrain_steps))


def _positive_finite(value: float, what: str, hint: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise PlanningError(f"{what} must be a positive finite number, got {value!r}.", hint=hint)


def _nonnegative_finite(value: float, what: str, hint: str) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise PlanningError(f"{what} must be a non-negative finite number, got {value!r}.", hint=hint)


def usable_runs(devices, runs) -> tuple[RunMeasurement, ...]:
    """The runs the model can learn from; the others are dropped with a warning, not an error.

    A device that failed in pre-training is excluded from the fleet, but a multi-device run that
    included it may still be in the profile: it says nothing about the remaining fleet.
    """
    known = {d.name for d in devices}
    kept = []
    for run in runs:
        label = "+".join(run.devices) or "(no devices)"
        unknown = [n for n in run.devices if n not in known]
        if not run.devices or unknown:
            log.warning("ignoring run %s: it names devices without a solo measurement: %s", label, ", ".join(unknown))
        elif len(set(run.devices)) != len(run.devices):
            log.warning("ignoring run %s: a device appears twice", label)
        elif not (math.isfinite(run.steps_per_s) and run.steps_per_s > 0):
            log.warning("ignoring run %s: throughput %r is not positive", label, run.steps_per_s)
        elif not (math.isfinite(run.power_w) and run.power_w >= 0):
            log.warning("ignoring run %s: power %r is not a non-negative number", label, run.power_w)
        else:
            kept.append(run)
    return tuple(kept)


def validate_inputs(
    devices: tuple[DeviceMeasurement, ...] | list[DeviceMeasurement],
    runs: tuple[RunMeasurement, ...] | list[RunMeasurement],
    job: JobSpec,
) -> None:
    """Reject inputs the model cannot use, with a message naming the device or run.

    Strict about runs too (for callers checking a profile); the planner itself passes no runs
    here and lets usable_runs() drop unusable ones with a warning instead."""
    fix = "re-run pre-training (`hetcluster profile`) or fix the profile file."
    if not devices:
        raise PlanningError("No device measurements were given.", hint="profile at least one device.")
    names = [d.name for d in devices]
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise PlanningError(f"Duplicate device names in the measurements: {', '.join(dupes)}.", hint=fix)
    for d in devices:
        _positive_finite(d.steps_per_s, f"steps_per_s of device {d.name!r}", fix)
        _nonnegative_finite(d.busy_power_w, f"busy_power_w of device {d.name!r}", fix)
        _nonnegative_finite(d.idle_power_w, f"idle_power_w of device {d.name!r}", fix)
        _nonnegative_finite(d.steps_per_s_std, f"steps_per_s_std of device {d.name!r}", fix)
        _positive_finite(d.memory_slowdown, f"memory_slowdown of device {d.name!r}", fix)
        _nonnegative_finite(d.startup_power_w, f"startup_power_w of device {d.name!r}", fix)
    kept = usable_runs(devices, runs)
    if len(kept) != len(tuple(runs)):
        bad = [r for r in runs if r not in kept]
        raise PlanningError(
            f"Run of {'+'.join(bad[0].devices) or '(no devices)'} is unusable: it names unmeasured devices, "
            f"repeats a device, or has no throughput or power.",
            hint="measure every device alone before multi-device runs, or drop the run.",
        )
    if int(job.total_steps) <= 0:
        raise PlanningError(
            f"total_steps must be positive, got {job.total_steps}.", hint="pass --total-steps N with N > 0."
        )
    _nonnegative_finite(job.pretrain_time_s, "pretrain_time_s", fix)
    _nonnegative_finite(job.pretrain_energy_j, "pretrain_energy_j", fix)
    if int(job.pretrain_steps) < 0:
        raise PlanningError(f"pretrain_steps must be >= 0, got {job.pretrain_steps}.", hint=fix)
