"""Run the pre-training phase on a fleet and return its Profile.

Two protocols share this module's settings, runs and measurements: on lanes (the default,
lane_phase.py: devices alone at once where they share nothing, then the fleet, within a budget),
and the sequential one below, one run at a time. Sequence of the sequential protocol (all real:
agents start TF workers, the engine trains the job's model):

1. health-check every device's agent; start a PowerRecorder on each (a device that fails here is
   excluded with a warning);
2. idle power: ``idle_s`` with no TF server running; then the TF servers, one worker on every
   device and the PS, launched once at the first run and kept up across the phase's runs
   (:meth:`_Phase.shared_servers`): each run is a new client whose cluster names its members'
   servers only, and no run waits for its servers to start;
3. the opening run: every device together, ``opening_s`` seconds past the warm-up (a set's share
   of ``max_phase_steps`` at most, on top of it), not measured: a worker's first training climbs
   for its first seconds, and every run that is measured then runs on warm workers
   ([decisions](../../docs/decisions.md#opening-run)); its steps count toward the job like every
   run's. The start-up figures still come from the solo runs (a warm worker's first step is no
   shorter: the client's graph set-up is most of it);
4. each device alone (one per class of identical devices, the inventory's ``device_class``: the
   class's other devices take its figures, :func:`class_copies`) for ``steps_per_run`` steps —
   more while the window after the warm-up is shorter than ``min_window_s`` or holds fewer than
   ``min_window_steps`` steps — then the calibration sets of ``sets.py``, each run until every
   member trains steadily in a common window of ``min_window_s``, or longer (up to
   ``max_window_s``) where the set's share of ``max_phase_steps`` affords it (sized up front from
   the members' solo rates; the engine extends a run that falls short). A set's warm-up rounds are
   one step per member each (the engine's start barrier), so a member's slow first steps do not
   let the fast ones spend the set's steps; a set is measured over its steady window only, each
   member past its own warm-up (``warmup_steps``, then ``warmup_s`` seconds). No solo run takes
   more than ``step_cap`` steps and no set more than its share of what ``max_phase_steps``
   leaves, so pre-training stays a small part of the job;
5. the fastest device alone once more (``recheck_fastest``), its two windows pooled
   (:func:`pool_solo_windows`): its solo rate is what a time choice hinges on, and two windows
   minutes apart average a drift that is independent between them, and show it:
   ``steps_per_s_std`` is at least half their difference
   ([decisions](../../docs/decisions.md#recheck-fastest));
6. every run continues one checkpoint (``checkpoint_dir``), so the steps taken here count toward
   the job: the profile records the step count and the checkpoint to continue from.

Times and power use each run's measurement window (from the end of the warm-up, its steps and seconds, to the last
completion, stamped on the workers), so start-up and warm-up are excluded from them; each solo
run records the start-up itself apart (first step, steady-line intercept, and the mean power
over that intercept), which the planner prices separately. A device whose launch
or run fails, or that is lost during a run, is excluded with a warning and the rest continue.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hetcluster.errors import AgentError, HetclusterError, ProfileError
from hetcluster.memory.fit import TrainingMemory
from hetcluster.models.datasets import DataSource
from hetcluster.models.spec import ModelSpec
from hetcluster.profiling import known
from hetcluster.profiling.lanes import DEFAULT_BUDGET_SHARE
from hetcluster.profiling.profile import DeviceProfile, Profile, RunProfile
from hetcluster.profiling.sets import calibration_sets, class_unit
from hetcluster.training.checkpoints import checkpoint_steps
from hetcluster.training.spec import barrier_rounds

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import Inventory
    from hetcluster.profiling.lane_phase import ChoiceFn
    from hetcluster.profiling.profile import DeviceProfile

log = logging.getLogger(__name__)

MIN_STARTUP_WINDOW_S = 0.25   # shorter start-ups take their power over the first step instead
RATE_BLOCK_S = 1.0            # the host's speed wanders over seconds (docs/decisions.md#rate-standard-error)

# a window of a second needs more samples than training's 2 Hz (docs/decisions.md#pretrain-power-rate)
PRETRAIN_POWER_RATE_HZ = 10.0
# a worker still runs slow for seconds past its warm-up steps (docs/decisions.md#warmup-seconds)
WARMUP_S = 3.0
# a fresh worker's first training climbs for 10-20 s: take it unmeasured (docs/decisions.md#opening-run)
OPENING_S = 10.0
# windows of a few steps read slow devices low (docs/decisions.md#min-solo-window-steps)
MIN_SOLO_WINDOW_STEPS = 10

# on_event(kind, details): kinds "excluded", "idle", "launched" (the phase's servers up: "devices",
# "launch_s"), "run_start", "run_done" (with the run's RunResult, its step stamps included),
# "progress", "plan" (a "line" saying what the phase does next and why); a run's events carry
# "what": "opening" for the opening run (step 3, not measured), "" for the others
EventFn = Callable[[str, dict[str, Any]], None]

# memory(devices) → the memory plans a run of those devices trains under, as training would run
# them: a memory.fit.TrainingMemory (training_memory: each member's own plan, plain TensorFlow
# where that fits). None: every run plain TensorFlow.
MemoryFn = Callable[[Sequence[str]], TrainingMemory]
PLAIN = TrainingMemory()

PROTOCOLS = ("lanes", "sequential")
# idle power holds still: 20 samples at PRETRAIN_POWER_RATE_HZ read it as well as 30
LANES_IDLE_S = 2.0


@dataclass(frozen=True)
class PretrainSettings:
    """How much to measure: steps per run (warm-up included), idle time, power rate, sets."""

    steps_per_run: int = 30
    warmup_steps: int = 5
    warmup_s: float = WARMUP_S     # and each worker's steps in these seconds after them (WARMUP_S)
    min_window_s: float = 3.0      # several quota periods for a fast device (docs/decisions.md#min-window-seconds)
    min_window_steps: int = MIN_SOLO_WINDOW_STEPS  # a solo run's window holds this many steps, within step_cap
    max_window_s: float = 10.0     # a set's window where its budget affords it (docs/decisions.md#set-window)
    max_steps_per_run: int = 0     # 0: 5 × steps_per_run
    max_phase_steps: int = 0       # steps the whole phase may take (0: no budget); sets may use what is left
    idle_s: float = 3.0
    power_rate_hz: float = PRETRAIN_POWER_RATE_HZ
    max_sets: int = 3
    recheck_fastest: bool = True   # the fastest device alone again after the sets (docs/decisions.md#recheck-fastest)
    opening_s: float = OPENING_S   # the opening run's window (step 3); 0: no opening run
    learning_rate: float = 0.01
    optimizer: str = "sgd"
    run_timeout_s: float = 600.0
    ready_timeout_s: float = 120.0
    protocol: str = "lanes"        # "lanes" (lane_phase.py), or "sequential": one run at a time, as steps 3-5 above
    budget_share: float = 0.0      # the share of the job pre-training may take (--pretrain-budget); 0: no budget
    budget_steps: int = 0          # of the job's steps, at most this many count toward it (0: no budget)
    reuse_known: bool = True       # a device measured alone for this job before is not measured again (known.py)

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ProfileError(
                f"warmup_steps={self.warmup_steps} (--warmup-steps) is negative.", hint="give 0 or more."
            )
        if self.steps_per_run < self.warmup_steps + 2:
            raise ProfileError(
                f"steps_per_run={self.steps_per_run} (--pretrain-steps) leaves fewer than 2 measured steps after "
                f"{self.warmup_steps} warm-up steps.",
                hint="raise --pretrain-steps.",
            )
        if self.min_window_steps < 0:
            raise ProfileError(f"min_window_steps={self.min_window_steps} is negative.", hint="give 0 steps or more.")
        if self.protocol not in PROTOCOLS:
            raise ProfileError(f"Unknown pre-training protocol {self.protocol!r}.",
                               hint=f"use {' or '.join(PROTOCOLS)}.")
        if min(self.min_window_s, self.max_window_s, self.warmup_s, self.opening_s) < 0:
            raise ProfileError(f"min_window_s={self.min_window_s}, max_window_s={self.max_window_s}, "
                               f"warmup_s={self.warmup_s} or opening_s={self.opening_s} is negative.",
                               hint="give 0 s or more.")

    @classmethod
    def for_job(cls, steps_per_run: int, warmup_steps: int, total_steps: int | None,
                solo_runs: int, *, optimizer: str = "sgd", learning_rate: float = 0.01,
                budget_share: float = DEFAULT_BUDGET_SHARE, protocol: str = "lanes") -> "PretrainSettings":
        """The settings for a job of ``total_steps`` whose pre-training measures ``solo_runs`` devices
        alone (solo_run_count; what `profile`, `plan`, `train` and `evaluate` use). On lanes: at most
        ``budget_share`` of the job's steps count toward it, and the sets' seconds stay within that
        share of its time (lane_phase.py). Sequential: each run capped at its share of the phase's
        budget (step_cap_for_job), the phase at a third of the job (phase_budget_steps), shared by the
        solo runs and the settings' ``max_sets`` sets. No job size, no budget."""
        if protocol == "sequential":
            return cls(steps_per_run=steps_per_run, warmup_steps=warmup_steps,
                       max_steps_per_run=step_cap_for_job(steps_per_run, total_steps, solo_runs, cls.max_sets),
                       max_phase_steps=phase_budget_steps(total_steps), optimizer=optimizer,
                       learning_rate=learning_rate, protocol=protocol)
        return cls(steps_per_run=steps_per_run, warmup_steps=warmup_steps, optimizer=optimizer, idle_s=LANES_IDLE_S,
                   learning_rate=learning_rate, protocol=protocol, budget_share=budget_share if total_steps else 0.0,
                   budget_steps=budget_steps(total_steps, budget_share))

    @property
    def step_cap(self) -> int:
        """The most steps one run may take (never fewer than steps_per_run)."""
        return max(self.steps_per_run, self.max_steps_per_run or 5 * self.steps_per_run)

    def set_cap(self, used_steps: int, sets_left: int) -> int:
        """The most steps a calibration set may take: ``step_cap``, or its share of what the phase's
        budget has left when that is more (a set must run until its slowest member trains steadily,
        while its fast members keep taking steps — steps that count toward the job)."""
        if self.max_phase_steps <= 0:
            return self.step_cap
        return max(self.step_cap, (self.max_phase_steps - used_steps) // max(sets_left, 1))

    def set_steps(self, members: Sequence[DeviceProfile], cap: int | None = None, window_s: float | None = None) -> int:
        """Steps for a calibration set, from its members' solo DeviceProfiles: its warm-up, one step
        each per barrier round (the engine's start barrier: every member sets up and warms up while
        the others wait), then the warm-up's seconds (``warmup_s``), then long enough that every
        member takes two steps and that the window spans ``window_s`` (default min_window_s; at solo
        rates, so under contention the steps take longer; the engine extends a run that still falls
        short)."""
        steps = self._window_steps(members, self.min_window_s if window_s is None else window_s)
        return int(min(max(steps, self.steps_per_run), cap or self.step_cap))

    def set_window_s(self, members: Sequence[DeviceProfile], cap: int) -> float:
        """The window a calibration set measures: the longest up to max_window_s whose steps fit in
        ``cap``, never under min_window_s; min_window_s when the phase has no budget (no job size):
        seconds of a shared host decide a near-tie (docs/decisions.md#set-window)."""
        low, high = self.min_window_s, max(self.max_window_s, self.min_window_s)
        if self.max_phase_steps <= 0 or self._window_steps(members, low) >= cap:
            return low
        if self._window_steps(members, high) <= cap:
            return high
        for _ in range(40):   # steps grow with the window: bisect to the longest that fits
            middle = (low + high) / 2
            low, high = (middle, high) if self._window_steps(members, middle) <= cap else (low, middle)
        return low

    def _window_steps(self, members: Sequence[DeviceProfile], window_s: float) -> int:
        # the barrier rounds: each member's own warm-up steps (as a solo run leaves out,
        # steps_past_warmup), one step each per round; the warm-up's seconds; then the window,
        # where each takes two steps or more
        rates = [d.steps_per_s for d in members if d.steps_per_s > 0]
        span_s = max(max((2 / r for r in rates), default=0.0), window_s) + self.warmup_s
        return len(members) * barrier_rounds(self.warmup_steps) + math.ceil(sum(r * span_s for r in rates))


def budget_steps(total_steps: int | None, share: float) -> int:
    """Of a job of ``total_steps``, how many of pre-training's steps may count toward it (0: no job size)."""
    return int((total_steps or 0) * share + 1e-9)   # a third of 300 is 100, not 99.99...


def phase_budget_steps(total_steps: int | None) -> int:
    """The most steps the whole pre-training phase may take: a third of the job (0: no budget)."""
    return (total_steps or 0) // 3


def step_cap_for_job(steps_per_run: int, total_steps: int | None, solo_runs: int, max_sets: int = 3) -> int:
    """The most steps one pre-training run may take when the job's size is known: its share of a
    third of the job (``solo_runs`` devices alone and up to max_sets sets), never fewer than steps_per_run;
    0 = the settings' default, 5 × steps_per_run (no job size known)
    (docs/decisions.md#pretraining-budget)."""
    if total_steps is None:
        return 0
    return max(steps_per_run, phase_budget_steps(total_steps) // (solo_runs + max_sets))


class _Phase:
    """State of one pre-training phase: clients, recorders, the running step count."""

    def __init__(self, inventory: Inventory, model: ModelSpec, data: DataSource, checkpoint_dir: str,
                 settings: PretrainSettings, on_event: EventFn | None, memory: MemoryFn | None = None) -> None:
        self.inventory, self.model, self.data = inventory, model, data
        self.checkpoint_dir, self.settings = checkpoint_dir, settings
        self.on_event = on_event or (lambda kind, details: None)
        self.memory_of = memory
        self.excluded: dict[str, str] = {}
        self.recorders: dict[str, Any] = {}
        self.clients: dict[str, Any] = {}
        self.steps_total = 0
        self.checkpoint_path: str | None = None
        self.cluster: Any = None   # the phase's LaunchedCluster (shared_servers), None until the first run
        self.loss_curve: list[dict[str, float]] = []   # every run's, in step order (the job's curve starts here)
        self.infos: dict[str, Any] = {}   # each recorded device's DeviceInfo (None where the agent did not say)
        self.start_wall_s = time.time()

    def exclude(self, name: str, reason: str) -> None:
        if name not in self.excluded:
            log.warning("excluding device %s from pre-training: %s", name, reason)
            self.excluded[name] = reason
            self.on_event("excluded", {"device": name, "reason": reason})

    def start_recorders(self, names: Sequence[str]) -> list[str]:
        from hetcluster.agent.client import PowerRecorder

        ready = []
        for name in names:
            client = self.inventory.device(name).client()
            self.clients[name] = client
            if not client.health():
                self.exclude(name, f"agent at {client.address} does not answer its health check")
                continue
            try:
                self.recorders[name] = PowerRecorder(client, rate_hz=self.settings.power_rate_hz).start()
            except AgentError as error:
                self.exclude(name, f"power stream failed: {error}")
                continue
            try:
                self.infos[name] = client.device_info()
            except AgentError as error:
                log.info("%s: no device info (%s)", name, error)
                self.infos[name] = None
            ready.append(name)
        return ready

    def stop(self) -> None:
        self.stop_servers()
        for recorder in self.recorders.values():
            recorder.stop()
        for client in self.clients.values():
            client.close()

    def shared_servers(self) -> Any:
        """The phase's TF servers: one worker on every device not excluded, and the PS, launched
        once at the first run and kept up across the runs (each run is a new client naming its
        members' servers, ClusterAddresses.subset). A device whose worker cannot start is
        excluded with a warning and the rest launched again. Raises the launch error when no
        device is left or the PS fails."""
        from hetcluster.training.launch import DeviceLaunchError, launch_cluster

        while self.cluster is None:
            names = [n for n in self.recorders if n not in self.excluded]
            started_s = time.monotonic()
            try:
                self.cluster = launch_cluster([self.inventory.device(n) for n in names],
                                              self.inventory.parameter_server_host,
                                              ready_timeout_s=self.settings.ready_timeout_s,
                                              isolation=self.inventory.tf_plane_isolation)
            except DeviceLaunchError as error:
                if len(names) < 2 or error.device not in names:
                    raise
                self.exclude(error.device, f"its TF worker did not start: {error.message}")
                continue
            self.on_event("launched", {"devices": names, "launch_s": time.monotonic() - started_s})
        return self.cluster

    def stop_servers(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            cluster.stop()

    def usable(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if n not in self.excluded]

    def memory(self, names: Sequence[str]) -> TrainingMemory:
        """The memory plan a run of ``names`` trains under."""
        return self.memory_of(names) if self.memory_of is not None else PLAIN

    def run_spec(self, names: Sequence[str], steps: int, cap: int | None = None, window_s: float | None = None, *,
                 base_steps: int | None = None, checkpoint_dir: str | None = None) -> Any:
        """The TrainSpec of a measurement run of ``names``: ``steps`` more steps past ``base_steps``
        (default the phase's count), more while the window is shorter than ``window_s`` (default
        ``min_window_s``; with several devices: until every one trains steadily in it), never more
        than ``cap`` (default ``step_cap``), continuing ``checkpoint_dir`` (default the phase's)."""
        from hetcluster.training.spec import TrainSpec

        settings = self.settings
        base = self.steps_total if base_steps is None else base_steps
        memory = self.memory(names)
        return TrainSpec(model=self.model, total_steps=base + steps, data=self.data, **memory.spec_fields(),
                         checkpoint_dir=checkpoint_dir or self.checkpoint_dir, warmup_steps=settings.warmup_steps,
                         warmup_s=settings.warmup_s, learning_rate=settings.learning_rate,
                         optimizer=settings.optimizer,
                         min_window_s=settings.min_window_s if window_s is None else window_s,
                         min_window_steps=settings.min_window_steps if len(names) == 1 else 0,
                         max_steps=base + max(steps, cap or settings.step_cap),
                         start_barrier=len(names) > 1)

    def train(self, names: Sequence[str], spec: Any, addresses: Any, *, what: str = "",
              ready: Callable[[], None] | None = None) -> Any:
        """One run of ``names`` on ``addresses`` of the phase's servers; its events; the RunResult.
        ``spec`` may be a function (run_in_subprocess), called once ``ready`` has returned. The
        phase's step count and checkpoint are the caller's to update."""
        from hetcluster.training.run_job import run_in_subprocess

        memory = self.memory(names)

        def started() -> None:
            if ready is not None:
                ready()
            self.on_event("run_start", {"devices": list(names), "steps": self.settings.steps_per_run,
                                        "memory_plan": memory.technique, "what": what})

        if ready is None:
            started()
        result = run_in_subprocess(
            spec, addresses, timeout_s=self.settings.run_timeout_s, plane=self.cluster.plane,
            ready=started if ready is not None else None,
            on_progress=lambda done, to_do, el: self.on_event(
                "progress", {"devices": list(names), "done": done, "to_do": to_do, "elapsed_s": el}))
        self.on_event("run_done", {"devices": list(names), "steps_per_s": result.steps_per_s,
                                   "lost": list(result.lost_workers), "result": result, "what": what})
        return result

    def adopt(self, result: Any) -> None:
        """A run's steps count toward the job: the phase continues from its checkpoint."""
        self.steps_total = result.steps_total
        self.checkpoint_path = result.checkpoint_path or self.checkpoint_path
        self.loss_curve += result.loss_curve

    def measure(self, names: Sequence[str], steps: int | None = None, cap: int | None = None,
                window_s: float | None = None, what: str = "") -> tuple[Any, float, float]:
        """Train ``steps`` (default ``steps_per_run``) more steps on ``names`` (run_spec) on the
        phase's shared servers, continuing the phase's checkpoint; return (RunResult, t0, t1) of
        its window. ``what`` labels the run in its events ("opening")."""
        spec = self.run_spec(names, steps or self.settings.steps_per_run, cap, window_s)
        cluster = self.shared_servers()
        missing = [n for n in names if n not in cluster.addresses.workers]
        if missing:
            raise ProfileError(f"No TF worker runs on {', '.join(missing)} in this pre-training "
                               f"({self.excluded.get(missing[0], 'not launched')}).")
        try:
            result = self.train(names, spec, cluster.addresses.subset(names), what=what)
        except HetclusterError:
            # a failed run keeps only what its checkpoint holds; its servers may be left dead or
            # half-used, so the next run launches them afresh
            self.steps_total = checkpoint_steps(self.checkpoint_dir)
            self.stop_servers()
            raise
        self.adopt(result)
        t0, t1, _ = result.measurement_window()
        return result, t0, t1


def _opening_run(phase: _Phase, names: Sequence[str]) -> int:
    """Step 3: train every device of ``names`` with a worker together, ``opening_s`` seconds past
    the warm-up, at most a set's share of the phase's budget; not measured, its steps count toward
    the job. Returns the steps it applied (0 without one). Skipped with fewer than two devices (a
    lone device's solo run is the phase) or ``opening_s`` 0. A failed run leaves the solo runs
    cold, with a warning; a device lost in it is excluded."""
    settings = phase.settings
    members = phase.usable(names)
    if settings.opening_s <= 0 or len(members) < 2:
        return 0
    cap = settings.set_cap(0, settings.max_sets + 1)   # the phase's first run: nothing used yet
    try:
        phase.shared_servers()   # launched first: a device whose worker does not start is left out
        members = phase.usable(names)
        if len(members) < 2:
            return 0
        result, _, _ = phase.measure(members, settings.steps_per_run, cap, settings.opening_s, what="opening")
    except HetclusterError as error:
        log.warning("the opening run of %s failed (the solo runs start on cold workers): %s", "+".join(members), error)
        phase.on_event("excluded", {"run": list(members), "reason": str(error)})
        return 0
    for name in result.lost_workers:
        phase.exclude(name, "lost during the opening run")
    return result.steps_applied


def _rate_std(result: Any) -> float:
    """Standard error of the solo rate over the run's post-warm-up completions (rate_standard_error)."""
    ends = sorted(end for _, end, _ in result.step_times)
    return rate_standard_error(ends[len(ends) - result.measurement_window()[2]:], result.steps_per_s)


def rate_standard_error(ends_s: Sequence[float], steps_per_s: float, block_s: float = RATE_BLOCK_S) -> float:
    """Standard error (steps/s) of a rate measured over sorted completion times ``ends_s``, by batch
    means: the window's step intervals are cut into consecutive blocks of about ``block_s`` (at least
    three blocks), and the spread of the blocks' mean intervals gives the error of the overall mean.
    Never less than the error of independent intervals (stdev/√n), which it equals with one-step blocks.
    A shared host's speed wanders over seconds, so neighbouring intervals are alike and, taken as
    independent, understate the error (docs/decisions.md#rate-standard-error)."""
    intervals = [b - a for a, b in zip(ends_s, ends_s[1:]) if b > a]
    if len(intervals) < 2:
        return 0.0
    mean = statistics.fmean(intervals)
    independent = statistics.stdev(intervals) / math.sqrt(len(intervals))
    per_block = max(1, min(round(block_s / mean), len(intervals) // 3))
    blocks = len(intervals) // per_block   # 3 or more, or 2 when there are only 2 intervals
    block_means = [statistics.fmean(intervals[j * per_block:(j + 1) * per_block]) for j in range(blocks)]
    batched = statistics.stdev(block_means) / math.sqrt(blocks)
    return steps_per_s * max(batched, independent) / mean


def _startup(result: Any) -> tuple[float, float]:
    """(first_step_s, startup_s) of a solo run, both from the run's start (see DeviceProfile)."""
    ends = sorted(end for _, end, _ in result.step_times)
    if not ends:
        return 0.0, 0.0
    first_step_s = max(0.0, ends[0] - result.start_wall_s)
    t0, t1, steps = result.measurement_window()
    warm = len(ends) - steps   # the warm-up's steps, its seconds' included
    if steps <= 0 or t1 <= t0 or warm <= 0:
        return first_step_s, first_step_s
    # the steady line through (t0, warm) crosses zero steps at t0 − warm/rate
    startup_s = (t0 - result.start_wall_s) - warm / result.steps_per_s
    return first_step_s, min(max(0.0, startup_s), first_step_s)


def _startup_power_w(recorder: Any, result: Any, first_step_s: float, startup_s: float) -> float:
    """Mean power over a solo run's start-up [start, start + startup_s] (over the first step when
    the start-up is too short to hold a power sample); 0.0 when nothing was recorded there."""
    window_s = startup_s if startup_s >= MIN_STARTUP_WINDOW_S else first_step_s
    if window_s <= 0:
        return 0.0
    return recorder.mean_power_w(result.start_wall_s, result.start_wall_s + window_s)


def _set_run(members: tuple[str, ...], result: Any, t0: float, t1: float, recorders: dict[str, Any],
             memory: TrainingMemory = PLAIN) -> RunProfile:
    """A calibration set's measurement. Over the window where every member trained steadily
    (RunResult.steady_rates) when the run reached one: each member's rate and power there. Else
    (the step cap came first) as the run went: each member's power over its own steady window
    (else the run's), each steady member's own rate, and the set's throughput with a lone first
    step counted as one over its duration. ``memory``: the plan it ran under (_Phase.memory)."""
    energy_j = sum(recorders[n].energy_j(t0, t1) for n in members)
    planned = {"memory_slowdown": memory.slowdown, "memory_plan": memory.technique,
               "memory_slowdowns": {n: memory.slowdowns.get(n, 1.0) for n in members}}
    steady = result.steady_rates()
    if steady is not None:
        s0, s1, rates = steady
        per_device_w = {n: recorders[n].mean_power_w(s0, s1) for n in members}
        per_device_steps = {n: rates[n] * (s1 - s0) for n in members}
        return RunProfile(devices=members, steps=round(sum(per_device_steps.values())), time_s=s1 - s0,
                          steps_per_s=sum(rates.values()), power_w=sum(per_device_w.values()), energy_j=energy_j,
                          per_device_steps=per_device_steps, per_device_power_w=per_device_w, **planned)
    log.warning("calibration run %s: the step cap came before a window where every member trained steadily; "
                "measured as the run went", "+".join(members))
    # each member's power over its own steady window (else the whole run's window): the
    # run's window ends at the last completion, often a slow board's, while the fast
    # devices already wait idle in the run's final join — steady-state power is what the
    # planner predicts for a set
    windows = result.worker_windows()
    per_device_w = {n: recorders[n].mean_power_w(*windows.get(n, (t0, t1, 0))[:2]) for n in members}
    return RunProfile(
        devices=members, steps=result.measurement_window()[2], time_s=t1 - t0,
        steps_per_s=result.steps_per_s, power_w=sum(per_device_w.values()), energy_j=energy_j,
        # each worker's steady rate over the window (see RunResult.worker_steps_per_s), as
        # RunProfile.per_device_steps (only workers with a steady rate: a lone first step is
        # set-up, not throughput)
        per_device_steps={n: rate * (t1 - t0) for n, rate in result.worker_steps_per_s(steady_only=True).items()},
        per_device_power_w=per_device_w, **planned)


def _solo_profile(phase: _Phase, name: str, idle_w: float, what: str = "solo run") -> tuple[DeviceProfile, int] | None:
    """Train ``name`` alone (``_Phase.measure``'s defaults) and return its DeviceProfile with the
    steps the run applied; None, the device excluded, when the run fails or loses it."""
    try:
        result, _, _ = phase.measure([name])
    except HetclusterError as error:
        phase.exclude(name, f"{what} failed: {error}")
        return None
    device = solo_device_profile(phase, name, result, idle_w, what)
    return None if device is None else (device, result.steps_applied)


def solo_device_profile(phase: _Phase, name: str, result: Any, idle_w: float,
                        what: str = "solo run") -> DeviceProfile | None:
    """The DeviceProfile a solo run of ``name`` measured; None, the device excluded, when the run lost it."""
    if result.lost_workers:
        phase.exclude(name, f"lost during its {what}")
        return None
    memory = phase.memory([name])
    t0, t1, _ = result.measurement_window()
    recorder = phase.recorders[name]
    first_step_s, startup_s = _startup(result)
    return DeviceProfile(
        name=name, steps_per_s=result.steps_per_s, steps_per_s_std=_rate_std(result),
        busy_power_w=recorder.mean_power_w(t0, t1), idle_power_w=idle_w,
        steps=result.measurement_window()[2], time_s=t1 - t0, energy_j=recorder.energy_j(t0, t1),
        power_source=(recorder.samples[-1].source if recorder.samples else ""),
        first_step_s=first_step_s, startup_s=startup_s,
        startup_power_w=_startup_power_w(recorder, result, first_step_s, startup_s),
        solo_rates_steps_per_s=[result.steps_per_s], memory_slowdown=memory.slowdown, memory_plan=memory.technique,
        solo_window_ends_s=[result.window_ends_s()])


def pool_solo_windows(first: DeviceProfile, second: DeviceProfile) -> DeviceProfile:
    """One device's two solo measurements as one: rate, power and energy over both windows
    together (steps over time, so the longer window weighs more); start-up figures averaged (the
    first run may have started the job from scratch, the second restored a checkpoint as every
    training run does). The rate's standard error is the larger of the windows' own (combined)
    and half their difference (the standard error of a mean of two), so a host whose speed moved
    between them widens the planner's uncertainty instead of hiding in one reading."""
    time_s = first.time_s + second.time_s
    steps = first.steps + second.steps
    if time_s <= 0:
        return first
    rate = steps / time_s
    within = math.hypot(first.steps_per_s_std * first.time_s, second.steps_per_s_std * second.time_s) / time_s
    between = abs(first.steps_per_s - second.steps_per_s) / 2

    def mean_of_measured(a: float, b: float) -> float:
        measured = [x for x in (a, b) if x > 0]
        return statistics.fmean(measured) if measured else 0.0

    return DeviceProfile(
        name=first.name, steps_per_s=rate, steps_per_s_std=max(within, between),
        busy_power_w=(first.busy_power_w * first.time_s + second.busy_power_w * second.time_s) / time_s,
        idle_power_w=first.idle_power_w, steps=steps, time_s=time_s, energy_j=first.energy_j + second.energy_j,
        power_source=first.power_source or second.power_source,
        first_step_s=mean_of_measured(first.first_step_s, second.first_step_s),
        startup_s=mean_of_measured(first.startup_s, second.startup_s),
        startup_power_w=mean_of_measured(first.startup_power_w, second.startup_power_w),
        solo_rates_steps_per_s=[*first.solo_rates_steps_per_s, *second.solo_rates_steps_per_s],
        solo_window_ends_s=[*first.solo_window_ends_s, *second.solo_window_ends_s],
        device_class=first.device_class, measured_on=first.measured_on,
        memory_slowdown=first.memory_slowdown, memory_plan=first.memory_plan)


def device_classes(inventory: Inventory, names: Sequence[str]) -> dict[str, str | None]:
    """Each device's class of identical devices from the inventory (None: a class of its own)."""
    return {n: getattr(inventory.device(n), "device_class", None) for n in names}


def solo_run_count(inventory: Inventory, names: Sequence[str]) -> int:
    """How many devices pre-training measures alone: one per class, every device of no class."""
    return len({class_unit(name, cls) for name, cls in device_classes(inventory, names).items()})


def class_copies(measured: Sequence[DeviceProfile], names: Sequence[str], class_of: dict[str, str | None],
                 idle_w: dict[str, float]) -> list[DeviceProfile]:
    """A DeviceProfile for every device of ``names`` that has one, in that order: its own solo
    measurement, or — a device of a class whose other member was measured alone — a copy of that
    member's (``measured_on`` names it) with the device's own idle power. Identical devices train
    alike, so one solo run per class is enough: a fleet of 20 identical boards costs pre-training one
    board's solo run, not twenty (the phase launches every board's server once, side by side)."""
    own = {d.name: d for d in measured}
    of_class = {d.device_class: d for d in reversed(measured) if d.device_class}   # the first measured
    profiles = []
    for name in names:
        if name in own:
            profiles.append(own[name])
        elif class_of.get(name) in of_class:
            source = of_class[class_of[name]]
            profiles.append(replace(source, name=name, idle_power_w=idle_w[name], measured_on=source.name,
                                    solo_rates_steps_per_s=list(source.solo_rates_steps_per_s)))
    return profiles


def run_pretraining(inventory: Inventory, model: ModelSpec, checkpoint_dir: str, *, data: DataSource | None = None,
                    settings: PretrainSettings | None = None, device_names: Sequence[str] | None = None,
                    on_event: EventFn | None = None, memory: MemoryFn | None = None,
                    open_choice: ChoiceFn | None = None) -> Profile:
    """Measure every device alone and the calibration sets; return the Profile (not yet saved).

    ``memory`` gives each run the memory plan training would run those devices under (MemoryFn),
    so a device that plain TensorFlow does not fit is measured under its plan, not lost to an
    out-of-memory error; None runs everything plain. ``open_choice`` (lanes only) is the planner's
    opinion of the profile so far, which decides whether further calibration sets are worth their
    seconds (lane_phase.ChoiceFn); None measures every set. Raises ProfileError when no device
    could be measured.
    """
    from hetcluster.profiling.lane_phase import measure_on_lanes
    from hetcluster.training.plane import check_training_plane

    settings = settings or PretrainSettings()
    check_training_plane([inventory.device(n) for n in (device_names or inventory.names)],
                         inventory.tf_plane_isolation)
    phase = _Phase(inventory, model, data or DataSource(), checkpoint_dir, settings, on_event, memory)
    phase.steps_total = checkpoint_steps(checkpoint_dir)  # continue a checkpoint that is already there
    names = list(device_names or inventory.names)
    phase_start_s = phase.start_wall_s = time.time()
    devices: list[DeviceProfile] = []
    runs: list[RunProfile] = []
    try:
        available = phase.start_recorders(names)
        class_of = device_classes(inventory, available)
        job = known.job_key(model.to_dict(), {"data": phase.data.to_dict(), "optimizer": settings.optimizer})
        fingerprints = {n: known.fingerprint(n, phase.infos.get(n)) for n in available}
        if settings.protocol == "lanes":
            earlier = known.known_devices(job, fingerprints) if settings.reuse_known else {}
            devices, runs = measure_on_lanes(phase, available, class_of, lambda names: _idle_power(phase, names),
                                             open_choice, earlier)
        else:
            devices, runs = _sequential(phase, available, class_of, _idle_power(phase, available))
        known.remember([d for d in devices if d.name not in phase.excluded], job, fingerprints)
        phase_end_s = time.time()
        # what pre-training cost: every recorded device over the whole phase (between its runs a
        # device waits, powered), matching pretrain_time_s, which is the phase's wall time too
        energy_j = sum(recorder.energy_j(phase_start_s, phase_end_s) for recorder in phase.recorders.values())
    finally:
        phase.stop()
    devices = [d for d in devices if d.name not in phase.excluded]
    runs = [r for r in runs if not set(r.devices) & set(phase.excluded)]
    if not devices:
        raise ProfileError(f"No device could be measured: {phase.excluded}.",
                           hint="check the agents (`hetcluster cluster status`) and try again.")
    return Profile(model=model.to_dict(), devices=devices, runs=runs, excluded=dict(phase.excluded),
                   pretrain_steps=phase.steps_total, pretrain_time_s=phase_end_s - phase_start_s,
                   pretrain_energy_j=energy_j, checkpoint_dir=checkpoint_dir,
                   checkpoint_path=phase.checkpoint_path, warmup_steps=settings.warmup_steps,
                   warmup_s=settings.warmup_s,
                   steps_per_run=settings.steps_per_run, created_wall_s=time.time(),
                   idle_power_counts=bool(getattr(inventory, "idle_power_counts", False)),
                   memory_graph=_memory_graph(model), loss_curve=phase.loss_curve)


def _idle_power(phase: _Phase, names: Sequence[str]) -> dict[str, float]:
    """Step 2: each device's mean power over ``idle_s`` with no TF server running on it."""
    idle_t0 = time.time()
    time.sleep(phase.settings.idle_s)
    idle_w = {n: phase.recorders[n].mean_power_w(idle_t0, time.time()) for n in names}
    phase.on_event("idle", {"idle_power_w": dict(idle_w)})
    return idle_w


def _sequential(phase: _Phase, available: Sequence[str], class_of: dict[str, str | None],
                idle_w: dict[str, float]) -> tuple[list[DeviceProfile], list[RunProfile]]:
    """Steps 3-5 one run at a time: the opening run, each device alone, the sets, the fastest again."""
    settings = phase.settings
    start_steps = phase.steps_total
    runs: list[RunProfile] = []
    opening_steps = _opening_run(phase, available)
    measured: list[DeviceProfile] = []   # the devices measured alone: one per class
    solo_run_steps: dict[str, int] = {}
    for name in available:
        if name in phase.excluded:
            continue   # its worker did not start (_Phase.shared_servers)
        if class_of[name] and any(class_of[d.name] == class_of[name] for d in measured):
            continue   # its class was measured: it takes that device's figures (class_copies)
        result = _solo_profile(phase, name, idle_w[name])
        if result is not None:
            measured.append(replace(result[0], device_class=class_of[name]))
            solo_run_steps[name] = result[1]
    devices = class_copies(measured, available, class_of, idle_w)
    solo = {d.name: d.steps_per_s for d in devices}
    by_name = {d.name: d for d in devices}
    fastest = (
        max(measured, key=lambda d: d.steps_per_s).name if settings.recheck_fastest and len(devices) > 1 else None
    )
    reserved = solo_run_steps.get(fastest, 0)  # the recheck's steps, kept from the sets' budget
    sets = calibration_sets(solo, settings.max_sets, class_of)
    for index, members in enumerate(sets):
        members = tuple(phase.usable(members))
        if len(members) < 2:
            continue
        # the opening run's steps are not the sets' to give up: its share comes on top of the budget
        cap = settings.set_cap(phase.steps_total - start_steps - opening_steps + reserved, len(sets) - index)
        solo_profiles = [by_name[n] for n in members]
        window_s = settings.set_window_s(solo_profiles, cap)
        try:
            result, t0, t1 = phase.measure(members, settings.set_steps(solo_profiles, cap, window_s), cap, window_s)
        except HetclusterError as error:
            log.warning("calibration run %s failed: %s", "+".join(members), error)
            phase.on_event("excluded", {"run": list(members), "reason": str(error)})
            continue
        if result.lost_workers:
            for name in result.lost_workers:
                phase.exclude(name, f"lost during the run of {'+'.join(members)}")
            continue
        runs.append(_set_run(members, result, t0, t1, phase.recorders, phase.memory(members)))
    if fastest is not None and fastest not in phase.excluded:
        again = _solo_profile(phase, fastest, idle_w[fastest], what="second solo run")
        if again is not None:
            measured = [pool_solo_windows(d, again[0]) if d.name == fastest else d for d in measured]
            devices = class_copies(measured, available, class_of, idle_w)
    return devices, runs


def _memory_graph(model: Any) -> dict[str, Any] | None:
    """The batch-1 layer graph this phase's memory plans were made on, if it made any."""
    from hetcluster.memory.fit import extracted_graph

    graph = extracted_graph(model.name, model.input_shape, model.classes)
    return graph.to_dict() if graph is not None else None
