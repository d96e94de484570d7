"""Pre-training on lanes: every device alone, at the same time where they share nothing, then the
fleet together; a further calibration set only while the choice is still a near-tie and the time
budget affords one.

1. The parameter servers (one per lane) and the training processes of the first runs start first:
   they import TensorFlow on the coordinator host while the devices' idle power is read; then the
   agents start the workers.
2. The solo runs, in the groups of :func:`lanes.solo_groups`: each device alone on a lane of its
   own (a PS and a chief no other run uses), a group's runs at once, each starting as soon as its
   worker listens. The next group's training processes start while a group trains, so that none
   waits for its import. Every run continues the phase's line (its checkpoint) in a scratch copy;
   after a group, the run with the most steps that stay within the step budget becomes the line,
   and its steps count toward the job. The other runs' steps were measurement only.
3. The whole fleet together on one PS, continuing the line: the calibration set that spans every
   multi-device configuration.
4. The fastest device alone once more, its two windows pooled (pretrain.pool_solo_windows), where
   the time budget affords it: the time choice hinges on its rate
   ([decisions](../../docs/decisions.md#recheck-fastest)).
5. The remaining calibration sets (``sets.calibration_sets`` order) one at a time, only while
   ``open_choice`` says the planner's choice still has a near-tie and the time budget affords one
   more set: a set whose outcome cannot change a clear choice is not worth its seconds.

There is no opening run: the solo runs warm every worker for the sets.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hetcluster.errors import HetclusterError, ProfileError
from hetcluster.profiling.lanes import LaneDevice, grouping_line, solo_groups
from hetcluster.profiling.profile import DeviceProfile, Profile, RunProfile
from hetcluster.profiling.sets import calibration_sets, class_unit

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.profiling.pretrain import _Phase

log = logging.getLogger(__name__)

# a set's seconds before its window, beyond its slowest member's first step: barrier rounds, the
# warm-up's seconds, the training process's connection
SET_OVERHEAD_S = 6.0
# runs end when their window is long enough; these caps only stop a run that never gets there
SOLO_CAP_RUNS = 100
SET_CAP_STEPS = 100_000


@dataclass(frozen=True)
class ChoiceCheck:
    """What the planner says of a profile so far: whether a further set could still change the
    choice (a near-tie under some objective asked about), and the training it predicts for the rest
    of the job (seconds), which sizes the time budget."""

    open: bool
    training_time_s: float
    why: str = ""


# open_choice(profile so far) → ChoiceCheck; None: run every calibration set (no objective known)
ChoiceFn = Callable[[Profile], ChoiceCheck]


@dataclass
class _Pending:
    """A run whose training process was started before it could train: it imports TensorFlow,
    then waits for its turn (``go``) and its workers, and trains the spec decided then."""

    names: tuple[str, ...]
    spec: Callable[[str], Any] | None = None   # checkpoint folder → TrainSpec, decided by the time of ``go``
    go: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    result: Any = None
    error: HetclusterError | None = None
    thread: threading.Thread | None = None

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()


class _Lanes:
    """The phase's servers for runs on lanes, its line (the checkpoint the job continues) and its
    scratch space."""

    def __init__(self, phase: _Phase, group_size: int) -> None:
        self.phase = phase
        self.group_size = group_size
        self.scratch = Path(phase.checkpoint_dir).parent / ".pretrain-runs"
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.line_path: str | None = phase.checkpoint_path or _latest(phase.checkpoint_dir)
        self.line_steps = phase.steps_total
        self.start_steps = phase.steps_total
        self.runs = 0

    def start(self, names: Sequence[str], *, lane: int, chief: int,
              spec: Callable[[str], Any] | None = None) -> _Pending:
        """Start the training process of a run of ``names`` on PS ``lane`` and chief ``chief``; once
        its ``go`` is set and its workers listen, it trains ``pending.spec(checkpoint folder)``."""
        pending = _Pending(tuple(names), spec)
        self.runs += 1
        folder = self.scratch / f"run-{self.runs}"
        cluster = self.phase.cluster

        def ready() -> None:
            pending.go.wait()
            if pending.cancelled:
                raise ProfileError("run cancelled")
            cluster.wait_ready(list(names))

        def decided_spec() -> Any:
            from hetcluster.training.coordinator import copy_checkpoint

            copy_checkpoint(self.line_path, folder)
            assert pending.spec is not None
            return pending.spec(str(folder))

        def work() -> None:
            try:
                pending.result = self.phase.train(names, decided_spec, cluster.lane(names, lane, chief), ready=ready)
            except HetclusterError as error:
                pending.error = error

        pending.thread = threading.Thread(target=work, name=f"pretrain-{'+'.join(names)}", daemon=True)
        pending.thread.start()
        return pending

    def within_budget(self, result: Any) -> bool:
        budget = self.phase.settings.budget_steps
        return budget <= 0 or result.steps_total - self.start_steps <= budget

    def adopt(self, results: Sequence[Any]) -> Any:
        """The run among ``results`` with the most steps within the step budget becomes the line
        (None when none stays within it: their steps were measurement only)."""
        kept = [r for r in results if r is not None and r.checkpoint_path and self.within_budget(r)]
        if not kept:
            return None
        best = max(kept, key=lambda r: r.steps_total)
        self.line_path, self.line_steps = best.checkpoint_path, best.steps_total
        self.phase.loss_curve += best.loss_curve
        return best

    def finish(self) -> None:
        """Copy the line into the phase's checkpoint folder (replacing it) and drop the scratch runs."""
        from hetcluster.training.coordinator import copy_checkpoint

        phase = self.phase
        target = Path(phase.checkpoint_dir)
        if self.line_steps != self.start_steps and self.line_path:
            staged = copy_checkpoint(self.line_path, target.with_name(target.name + ".new"))
            old = target.with_name(target.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if target.exists():
                os.replace(target, old)
            os.replace(staged, target)
            shutil.rmtree(old, ignore_errors=True)
            phase.checkpoint_path = str(target / Path(self.line_path).name)
        phase.steps_total = self.line_steps
        shutil.rmtree(self.scratch, ignore_errors=True)


def _latest(checkpoint_dir: str) -> str | None:
    from hetcluster.training.checkpoints import latest_checkpoint

    return latest_checkpoint(checkpoint_dir)


def lane_devices(phase: _Phase, names: Sequence[str]) -> list[LaneDevice]:
    """Each device with its emulated compute share (0 where its agent reports none)."""
    devices = []
    for name in names:
        info = phase.infos.get(name)
        share = float(getattr(info, "compute_share", 0.0) or 0.0) if getattr(info, "emulated", False) else 0.0
        devices.append(LaneDevice(name, share))
    return devices


def measure_on_lanes(phase: _Phase, available: Sequence[str], class_of: dict[str, str | None],
                     measure_idle: Callable[[Sequence[str]], dict[str, float]],
                     open_choice: ChoiceFn | None = None,
                     earlier: dict[str, DeviceProfile] | None = None) -> tuple[list[DeviceProfile], list[RunProfile]]:
    """Steps 1–4 of the module docstring on the recorded devices ``available``; returns the devices'
    solo profiles (class copies included) and the sets' RunProfiles. A device of ``earlier`` (known
    from an earlier pre-training of this job, profiling/known.py) takes those figures instead of a
    solo run. The phase's step count and checkpoint end on the line."""
    from hetcluster.emulation.catalog import available_cores
    from hetcluster.profiling.known import age_text
    from hetcluster.profiling.pretrain import class_copies, solo_device_profile
    from hetcluster.training.launch import launch_cluster

    settings = phase.settings
    earlier = earlier or {}
    units: list[str] = []
    for name in available:
        if not any(class_of.get(name) and class_of.get(name) == class_of.get(u) for u in units):
            units.append(name)
    reused = [n for n in units if n in earlier]
    devices = lane_devices(phase, [n for n in units if n not in earlier])
    cores = available_cores()
    groups = solo_groups(devices, cores)
    now = time.time()
    for name in reused:
        device = earlier[name]
        phase.on_event("plan", {"line": f"{name} known: {device.steps_per_s:.3g} steps/s, {device.busy_power_w:.3g} W "
                                        f"alone, measured {age_text(now - device.measured_wall_s)} ago for this job"})
    if groups:
        phase.on_event("plan", {"line": "each device " + grouping_line(groups, devices, cores)})
    width = max((len(g) for g in groups), default=1)
    inventory = phase.inventory
    # chiefs: one per lane, and the sets' (its process imports while the last group trains)
    phase.cluster = launch_cluster([inventory.device(n) for n in available], inventory.parameter_server_host,
                                   num_ps=width, lanes=width + 1, ready_timeout_s=settings.ready_timeout_s,
                                   isolation=inventory.tf_plane_isolation, wait=False, start_workers=False)
    lanes = _Lanes(phase, width)

    def start_group(index: int) -> list[_Pending]:
        return [lanes.start([name], lane=i, chief=i, spec=_solo_spec(phase, lanes, name))
                for i, name in enumerate(groups[index])]

    # the first group's processes (and the parameter servers) import TensorFlow while the idle power
    # is read; a later group's start when the one before has finished, so that no import runs
    # beside a measured window on a shared host
    fleet: _Pending | None = None
    pendings = start_group(0) if groups else []
    if not groups and len(available) > 1:
        fleet = lanes.start(available, lane=0, chief=width)
    idle_w = measure_idle(available)
    for name, error in phase.cluster.start_workers().items():
        phase.exclude(name, f"its TF worker did not start: {error.message}")
    measured = [replace(earlier[n], idle_power_w=idle_w[n], device_class=class_of.get(n)) for n in reused]
    for index in range(len(groups)):
        if index:
            pendings = start_group(index)
        for pending in pendings:
            pending.cancelled = pending.names[0] in phase.excluded
            pending.go.set()
        if index == len(groups) - 1 and len(available) > 1:
            fleet = lanes.start(available, lane=0, chief=width)   # imports while the slowest start up
        for pending in pendings:
            pending.join()
        results = []
        for pending in pendings:
            name = pending.names[0]
            if pending.error is not None:
                if not pending.cancelled:
                    phase.exclude(name, f"solo run failed: {pending.error}")
                continue
            device = solo_device_profile(phase, name, pending.result, idle_w[name])
            if device is not None:
                measured.append(replace(device, device_class=class_of.get(name)))
                results.append(pending.result)
        lanes.adopt(results)
    profiles = class_copies(measured, available, class_of, idle_w)
    runs: list[RunProfile] = []
    members = [n for n in available if n not in phase.excluded and any(p.name == n for p in profiles)]
    if fleet is not None:
        if members != list(fleet.names):   # a device was lost: its process was routed for the whole fleet
            _cancel(fleet)
            fleet = lanes.start(members, lane=0, chief=width) if len(members) > 1 else None
        if fleet is not None:
            window_s = _budgeted_window_s(phase, lanes, profiles, [], open_choice, members)
            _run_set(phase, lanes, members, profiles, runs, fleet, window_s)
    if len(members) > 1 and settings.recheck_fastest:
        profiles = _recheck_fastest(phase, lanes, profiles, runs, members, open_choice, width)
    if len(members) > 2:
        _further_sets(phase, lanes, profiles, runs, class_of, open_choice)
    lanes.finish()
    return profiles, runs


def _recheck_fastest(phase: _Phase, lanes: _Lanes, profiles: list[DeviceProfile], runs: list[RunProfile],
                     members: Sequence[str], open_choice: ChoiceFn | None, chief: int) -> list[DeviceProfile]:
    """Step 4: the fastest member alone again where the time budget affords it; ``profiles`` with
    its two windows pooled."""
    from hetcluster.profiling.pretrain import pool_solo_windows, solo_device_profile

    fastest = max((p for p in profiles if p.name in members and not p.measured_on), key=lambda p: p.steps_per_s,
                  default=None)
    if fastest is None or fastest.measured_wall_s:   # known from an earlier pre-training: its figures stand
        return profiles
    name = fastest.name
    if open_choice is not None and _over_budget(phase, open_choice(_provisional(phase, lanes, profiles, runs)),
                                                [fastest], f"{name} alone again"):
        return profiles
    pending = lanes.start([name], lane=0, chief=chief, spec=_solo_spec(phase, lanes, name))
    pending.go.set()
    pending.join()
    if pending.error is not None:
        log.warning("second solo run of %s failed: %s", name, pending.error)
        return profiles
    again = solo_device_profile(phase, name, pending.result, fastest.idle_power_w, "second solo run")
    if again is None:
        return profiles
    lanes.adopt([pending.result])
    pooled = pool_solo_windows(fastest, again)
    return [pooled if p.name == name
            else replace(pooled, name=p.name, idle_power_w=p.idle_power_w, measured_on=name) if p.measured_on == name
            else p for p in profiles]


def _solo_spec(phase: _Phase, lanes: _Lanes, name: str) -> Callable[[str], Any]:
    """The spec of a solo run of ``name``, continuing the line. Its steps count only if its line is
    adopted: the window, not a share of the budget, ends it."""
    settings = phase.settings
    return lambda folder: phase.run_spec([name], settings.steps_per_run, SOLO_CAP_RUNS * settings.steps_per_run,
                                         base_steps=lanes.line_steps, checkpoint_dir=folder)


def _over_budget(phase: _Phase, check: ChoiceCheck, members: Sequence[DeviceProfile], what: str) -> bool:
    """Whether a run of ``members`` would take pre-training past its time budget, its share of the
    job as ``check`` predicts it; says so in one line (``what`` skipped)."""
    elapsed_s = time.time() - phase.start_wall_s
    cost_s = _set_estimate_s(members)
    budget_s = phase.settings.budget_share * (elapsed_s + check.training_time_s)
    if elapsed_s + cost_s <= budget_s:
        return False
    phase.on_event("plan", {"line": f"{what} skipped: about {cost_s:.0f} s more would pass the budget "
                                    f"({budget_s:.0f} s)"})
    return True


def _cancel(pending: _Pending) -> None:
    pending.cancelled = True
    pending.go.set()
    pending.join()


def _budgeted_window_s(phase: _Phase, lanes: _Lanes, profiles: Sequence[DeviceProfile], runs: Sequence[RunProfile],
                       open_choice: ChoiceFn | None, members: Sequence[str]) -> float:
    """A set's window: min_window_s, longer (up to max_window_s) where the time budget has room
    for it (docs/decisions.md#set-window)."""
    settings = phase.settings
    if open_choice is None or settings.budget_share <= 0:
        return settings.min_window_s
    check = open_choice(_provisional(phase, lanes, profiles, runs))
    elapsed_s = time.time() - phase.start_wall_s
    room_s = settings.budget_share * (elapsed_s + check.training_time_s) - elapsed_s \
        - _set_estimate_s([p for p in profiles if p.name in members])
    longest_s = max(settings.max_window_s, settings.min_window_s)
    return min(max(settings.min_window_s, settings.min_window_s + room_s), longest_s)


def _set_spec(phase: _Phase, lanes: _Lanes, members: Sequence[str], profiles: Sequence[DeviceProfile],
              window_s: float) -> Callable[[str], Any]:
    """The spec of a set run of ``members`` measuring ``window_s``, continuing the line."""
    solo = [p for p in profiles if p.name in members]
    steps = phase.settings.set_steps(solo, SET_CAP_STEPS, window_s)
    return lambda folder: phase.run_spec(list(members), steps, SET_CAP_STEPS, window_s,
                                         base_steps=lanes.line_steps, checkpoint_dir=folder)


def _run_set(phase: _Phase, lanes: _Lanes, members: Sequence[str], profiles: Sequence[DeviceProfile],
             runs: list[RunProfile], pending: _Pending, window_s: float) -> bool:
    """Release a set run of ``members`` (its process already started) and record it; False when it
    failed or lost a member."""
    from hetcluster.profiling.pretrain import _set_run

    pending.spec = _set_spec(phase, lanes, members, profiles, window_s)
    pending.go.set()
    pending.join()
    if pending.error is not None:
        log.warning("calibration run %s failed: %s", "+".join(members), pending.error)
        phase.on_event("excluded", {"run": list(members), "reason": str(pending.error)})
        return False
    result = pending.result
    if result.lost_workers:
        for name in result.lost_workers:
            phase.exclude(name, f"lost during the run of {'+'.join(members)}")
        return False
    t0, t1, _ = result.measurement_window()
    runs.append(_set_run(tuple(members), result, t0, t1, phase.recorders, phase.memory(members)))
    lanes.adopt([result])
    return True


def _further_sets(phase: _Phase, lanes: _Lanes, profiles: list[DeviceProfile], runs: list[RunProfile],
                  class_of: dict[str, str | None], open_choice: ChoiceFn | None) -> None:
    """Step 5: the remaining calibration sets, one at a time, while the choice is open and the
    time budget affords the next."""
    settings = phase.settings
    usable = [p for p in profiles if p.name not in phase.excluded]
    candidates = calibration_sets({p.name: p.steps_per_s for p in usable}, settings.max_sets, class_of)[1:]
    done = {frozenset(r.devices) for r in runs}

    def composition(names: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted(class_unit(n, class_of.get(n)) for n in names))

    for members in candidates:
        members = tuple(n for n in members if n not in phase.excluded)
        if len(members) < 2 or frozenset(members) in done or composition(members) in map(composition, done):
            continue
        if open_choice is not None:
            check = open_choice(_provisional(phase, lanes, usable, runs))
            if not check.open:
                why = check.why or "the choice is clear"
                phase.on_event("plan", {"line": f"set {'+'.join(members)} skipped: {why}"})
                return
            if _over_budget(phase, check, [p for p in usable if p.name in members], f"set {'+'.join(members)}"):
                return
        pending = lanes.start(list(members), lane=0, chief=lanes.group_size)
        if _run_set(phase, lanes, members, usable, runs, pending, phase.settings.min_window_s):
            done.add(frozenset(members))


def _set_estimate_s(members: Sequence[DeviceProfile]) -> float:
    """Seconds a set of these members takes: the slowest member's start-up, the overhead, and
    the window's minimum seconds."""
    return max((p.first_step_s for p in members), default=0.0) + SET_OVERHEAD_S + 3.0


def _provisional(phase: _Phase, lanes: _Lanes, devices: Sequence[DeviceProfile], runs: Sequence[RunProfile]) -> Profile:
    """The profile measured so far, as if pre-training ended now, for the planner's opinion."""
    now = time.time()
    energy_j = sum(recorder.energy_j(phase.start_wall_s, now) for recorder in phase.recorders.values())
    return Profile(model=phase.model.to_dict(), devices=list(devices), runs=list(runs), excluded=dict(phase.excluded),
                   pretrain_steps=lanes.line_steps, pretrain_time_s=now - phase.start_wall_s,
                   pretrain_energy_j=energy_j, checkpoint_dir=phase.checkpoint_dir, checkpoint_path=None,
                   warmup_steps=phase.settings.warmup_steps, warmup_s=phase.settings.warmup_s,
                   steps_per_run=phase.settings.steps_per_run, created_wall_s=now,
                   idle_power_counts=bool(getattr(phase.inventory, "idle_power_counts", False)))
