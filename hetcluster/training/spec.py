"""Plain data of a training run: where the servers are, what to train, and what happened.

Free of TensorFlow so the CLI, the profiler and the report can build, store and read them cheaply.
Every type converts to and from JSON-friendly dicts: a run can be executed in a fresh subprocess
(``python -m hetcluster.training.run_job``), which takes a TrainSpec and writes a RunResult.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from hetcluster.errors import ConfigError
from hetcluster.models.datasets import DataSource
from hetcluster.models.spec import ModelSpec


@dataclass(frozen=True)
class ClusterAddresses:
    """The servers of one run: named workers, parameter servers, and the chief (this process).

    ``workers`` maps a device name to its TF worker server's ``host:port``; the dict order is the
    worker task order. ``chief`` is the address the coordinator's own in-process server binds.
    """

    workers: dict[str, str]
    ps: list[str]
    chief: str

    def __post_init__(self) -> None:
        if not self.workers:
            raise ConfigError("A training run needs at least one worker.", hint="choose at least one device.")
        if not self.ps:
            raise ConfigError("A training run needs at least one parameter server.", hint="give a ps address.")
        addresses = [*self.workers.values(), *self.ps, self.chief]
        if len(set(addresses)) != len(addresses):
            raise ConfigError(f"Server addresses repeat: {addresses}.", hint="give every task its own port.")

    @property
    def worker_names(self) -> list[str]:
        return list(self.workers)

    def cluster_spec_dict(self) -> dict[str, list[str]]:
        """The ``{job: [address, ...]}`` dict for ``tf.train.ClusterSpec``."""
        return {"chief": [self.chief], "worker": list(self.workers.values()), "ps": list(self.ps)}

    def subset(self, names: Sequence[str]) -> "ClusterAddresses":
        """The addresses of a run of ``names`` on servers launched for more devices. A client whose
        cluster names only those workers (in ``names``' order, tasks from 0) trains on them alone:
        TF gives each named server its task in the client's cluster (a session of its own on the
        worker), and the servers it does not name stay idle."""
        return ClusterAddresses(workers={n: self.workers[n] for n in names}, ps=list(self.ps), chief=self.chief)

    def to_dict(self) -> dict:
        return {"workers": dict(self.workers), "ps": list(self.ps), "chief": self.chief}

    @classmethod
    def from_dict(cls, data: dict) -> "ClusterAddresses":
        return cls(workers=dict(data["workers"]), ps=list(data["ps"]), chief=str(data["chief"]))


OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class Training:
    """How a job trains, beyond its model: the data, the held-out data its model is scored on (None:
    not scored), the optimizer and its learning rate. A profile records what it was measured with
    (``recorded``), and a job refuses a profile made otherwise (``difference``)."""

    data: DataSource = field(default_factory=DataSource)
    eval_data: DataSource | None = None
    optimizer: str = "sgd"
    learning_rate: float = 0.01

    def __post_init__(self) -> None:
        check_optimizer(self.optimizer, self.learning_rate)

    def recorded(self) -> dict:
        """What a profile keeps: the training data, optimizer and learning rate."""
        return {"data": self.data.to_dict(), "optimizer": self.optimizer, "learning_rate": self.learning_rate}

    def difference(self, recorded: dict | None) -> str | None:
        """How a profile's record differs from this job, in words; None when it matches (or the
        profile recorded nothing)."""
        if not recorded:
            return None
        data = recorded.get("data")
        if data is not None:
            was = (data.get("kind", "synthetic"), data.get("path"), float(data.get("holdout", 0.0)))
            if was != (self.data.kind, self.data.path, self.data.holdout):
                held = f" ({was[2]:.0%} held out)" if was[2] else ""
                return f"data {was[1] or 'synthetic'}{held}, not {self.data.describe()}"
        if recorded.get("optimizer", self.optimizer) != self.optimizer:
            return f"--optimizer {recorded['optimizer']}, not {self.optimizer}"
        if float(recorded.get("learning_rate", self.learning_rate)) != self.learning_rate:
            return f"--learning-rate {recorded['learning_rate']:g}, not {self.learning_rate:g}"
        return None


def check_optimizer(optimizer: str, learning_rate: float) -> None:
    """ConfigError unless the optimizer is known and the learning rate a positive finite number."""
    import math

    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"Unknown optimizer {optimizer!r}.", hint=f"use --optimizer {' or '.join(OPTIMIZERS)}.")
    if not (math.isfinite(learning_rate) and learning_rate > 0):
        raise ConfigError(
            f"--learning-rate {learning_rate} must be a positive number.", hint="e.g. 0.01 for SGD, 0.001 for Adam."
        )


@dataclass(frozen=True)
class TrainSpec:
    """One training run: the model and data, how many steps in all, and where checkpoints live.

    ``total_steps`` is the job's total of applied steps *including* those already in the restored
    checkpoint; the run applies exactly ``total_steps - restored`` more. ``checkpoint_every_steps``
    = 0 writes only the final checkpoint. ``optimizer`` "sgd" (momentum 0.9) or "adam", at
    ``learning_rate``.
    ``worker_budgets_bytes`` (worker name → budget) runs each named worker under the memory
    scheduler's plan for its own budget and ``worker_device_kinds`` kind (``hetcluster.memory``;
    one traced step serves every worker and selects a worker's plan by its index); the others run
    under ``memory_budget_bytes``'s plan when it is > 0 (``memory_device_kind``), else the plain step.

    ``warmup_steps``: the first steps a measurement leaves out — the run's first completions for
    one worker, each worker's own first steps for several (:func:`steps_past_warmup`);
    ``warmup_s``: and the steps each worker completes in that many seconds after them
    (:func:`warmup_count`; pre-training's WARMUP_S says why).

    ``min_window_s`` > 0 (measurement runs, pre-training): once ``total_steps`` is reached, keep
    applying steps until the window after the warm-up (first kept completion to the last one)
    spans at least this many seconds, but never beyond ``max_steps`` in all. A fast device then
    gets as long a window as a slow one instead of a few hundredths of a second.
    ``min_window_steps`` > 0 (one worker only: pre-training's solo runs): and until the window holds
    at least that many completions, within ``max_steps`` likewise: windows of a few steps read slow
    devices low (docs/decisions.md#min-solo-window-steps). Ignored for several workers.

    ``start_barrier`` (calibration sets): the warm-up's rounds (:func:`barrier_rounds`) are one
    closure per worker each, joined before the next, so every worker's slow first steps (graph
    set-up) happen while the others wait instead of while fast workers spend the capped run's
    steps (docs/decisions.md#set-start-barrier).
    """

    model: ModelSpec
    total_steps: int
    data: DataSource = field(default_factory=DataSource)
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 0
    max_checkpoints: int = 3
    learning_rate: float = 0.01
    optimizer: str = "sgd"
    warmup_steps: int = 0
    warmup_s: float = 0.0
    memory_budget_bytes: int = 0
    memory_device_kind: str = "cpu"
    worker_budgets_bytes: dict[str, int] = field(default_factory=dict)
    worker_device_kinds: dict[str, str] = field(default_factory=dict)
    min_window_s: float = 0.0
    min_window_steps: int = 0
    max_steps: int = 0
    start_barrier: bool = False

    def __post_init__(self) -> None:
        if self.total_steps < 0:
            raise ConfigError(f"total_steps={self.total_steps} is negative.", hint="use --total-steps N >= 0.")
        if (
            self.min_window_s < 0
            or self.min_window_steps < 0
            or (self.extends_window and self.max_steps < self.total_steps)
        ):
            raise ConfigError(
                f"min_window_s={self.min_window_s}, min_window_steps={self.min_window_steps} need both >= 0 and "
                f"max_steps >= total_steps ({self.max_steps} < {self.total_steps}) to extend a window.",
                hint="give the most steps a measurement run may take.",
            )
        if self.checkpoint_every_steps < 0 or self.warmup_steps < 0 or self.warmup_s < 0:
            raise ConfigError("Checkpoint interval and warm-up steps must be >= 0.", hint="fix the values.")
        check_optimizer(self.optimizer, self.learning_rate)

    @property
    def extends_window(self) -> bool:
        """A measurement run: extended past ``total_steps`` (up to ``max_steps``) until its window is long enough."""
        return self.min_window_s > 0 or self.min_window_steps > 0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["model"] = self.model.to_dict()
        data["data"] = self.data.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "TrainSpec":
        data = dict(data)
        data["model"] = ModelSpec.from_dict(data["model"])
        data["data"] = DataSource.from_dict(data.get("data"))
        return cls(**data)


def barrier_rounds(warmup_steps: int) -> int:
    """How many rounds of one closure per worker a run with ``TrainSpec.start_barrier`` starts with:
    one per warm-up step, and at least the first (every worker's set-up)."""
    return max(warmup_steps, 1)


def warmup_count(ends_s: Sequence[float], warmup_steps: int, warmup_s: float = 0.0, *,
                 at_most_half: bool = True) -> int:
    """How many of one worker's steps, by sorted completion times ``ends_s``, are its warm-up: its
    first ``warmup_steps``, and those it completes within ``warmup_s`` seconds after them (none
    more when ``warmup_steps`` is 0: the seconds count from the warm-up steps' end).

    With ``at_most_half`` the seconds take at most half of the steps after the warm-up steps: a
    run that its step cap ended inside them is measured over its later half
    (docs/decisions.md#warmup-at-most-half). The engine, sizing a run that is still to be
    extended, counts the seconds in full."""
    count = min(max(warmup_steps, 0), len(ends_s))
    if warmup_s > 0 and count > 0:
        past_seconds = bisect.bisect_right(ends_s, ends_s[count - 1] + warmup_s)
        count = min(past_seconds, count + (len(ends_s) - count) // 2) if at_most_half else past_seconds
    return count


def steps_past_warmup(by_worker: Mapping[Any, Sequence[tuple[float, float]]], warmup_steps: int,
                      warmup_s: float = 0.0, *, at_most_half: bool = True) -> dict[Any, list[tuple[float, float]]]:
    """Each worker's ``(start, end)`` steps by end time, without its own warm-up (:func:`warmup_count`).

    Every worker warms up on its own, as it does alone: its first steps run slow whatever the
    others do, and a set measured from a shared warm-up read a contention the trainings did not
    have (docs/decisions.md#per-worker-warmup)."""
    kept = {}
    for worker, steps in by_worker.items():
        ordered = sorted(steps, key=lambda step: step[1])
        ends = [end for _, end in ordered]
        kept[worker] = ordered[warmup_count(ends, warmup_steps, warmup_s, at_most_half=at_most_half):]
    return kept


def common_steady_steps(kept: Mapping[Any, Sequence[tuple[float, float]]]
                        ) -> tuple[float, dict[Any, list[tuple[float, float]]]] | None:
    """Where every worker of a run trains steadily, from each worker's ``(start, end)`` steps past
    its set-up and warm-up: the window opens at the latest start of a worker's first such
    step, and each worker's steps that start in it are returned with that time. None while some
    worker has no such step yet. (RunResult.steady_rates measures a run there; the engine extends
    a measurement run until it is long enough.)"""
    if not kept or any(not steps for steps in kept.values()):
        return None
    t0 = max(steps[0][0] for steps in kept.values())
    return t0, {worker: [step for step in steps if step[0] >= t0] for worker, steps in kept.items()}


@dataclass
class RunResult:
    """What a run did. Times are wall-clock seconds (``time.time()``) on the coordinator.

    ``steps_applied`` is the optimizer's iteration count gained in this run (exact, see
    docs/training.md); ``steps_total`` the count after it (restored + applied). ``steps_per_worker``
    counts applied steps whose results came back from each worker; ``step_times`` holds one
    ``(start_wall_s, end_wall_s, worker_name)`` triple per applied step, stamped by the worker
    itself (``tf.timestamp()`` inside the step), sorted by end time. ``stopped`` says the run was
    asked to stop (Ctrl-C, SIGTERM) and ended early at a round boundary, checkpoint written.
    ``round_starts_wall_s`` is when each round's closures were scheduled (the engine joins every
    round before the next: between a worker's last step of one round and its first of the next it
    waits for the slowest worker's last step, which a continuous run would not; empty in results
    recorded before it was kept). ``memory_plan`` names the memory scheduler's techniques the
    workers ran under ("recompute_sqrt on rpi4"; "" = plain TensorFlow on every worker), and
    ``memory_plans`` each worker's technique ("" = plain).
    ``loss_curve`` is the training loss over the run's steps (:func:`loss_curve`).
    """

    steps_applied: int
    steps_total: int
    steps_restored: int
    steps_per_worker: dict[str, int]
    time_s: float
    start_wall_s: float
    end_wall_s: float
    step_times: list[tuple[float, float, str]]
    final_loss: float | None
    lost_workers: list[str]
    checkpoint_path: str | None
    closures_scheduled: int = 0
    warmup_steps: int = 0
    stopped: bool = False
    warmup_s: float = 0.0
    round_starts_wall_s: list[float] = field(default_factory=list)
    memory_plan: str = ""
    memory_plans: dict[str, str] = field(default_factory=dict)
    loss_curve: list[dict[str, float]] = field(default_factory=list)   # loss_curve(): windows of steps

    @property
    def steps_unattributed(self) -> int:
        """Updates applied by a worker that died before its result came back (not in steps_per_worker)."""
        return self.steps_applied - sum(self.steps_per_worker.values())

    def step_durations_s(self, worker: str | None = None) -> list[float]:
        """Per-step compute durations (end - start on the worker), warm-up steps excluded."""
        rows = self.step_times[self.warmup_steps:]
        return [end - start for start, end, w in rows if worker is None or w == worker]

    def measurement_window(self) -> tuple[float, float, int]:
        """``(t0_wall_s, t1_wall_s, steps)``: from the end of the warm-up (the run's start when
        there is none; :func:`warmup_count` over all completions, at least one step left) to the
        last completion, and the applied steps completed inside."""
        t0, inside = self._window_ends()
        if not inside:
            return self.start_wall_s, self.end_wall_s, 0
        return t0, inside[-1], len(inside)

    def window_ends_s(self) -> list[float]:
        """The completions inside :meth:`measurement_window`, in seconds from its open."""
        t0, inside = self._window_ends()
        return [round(end - t0, 4) for end in inside]

    def _window_ends(self) -> tuple[float, list[float]]:
        """(the measurement window's open, the wall times of the completions inside it)."""
        ends = sorted(end for _, end, _ in self.step_times)
        if not ends:
            return self.start_wall_s, []
        warmup = min(warmup_count(ends, self.warmup_steps, self.warmup_s), len(ends) - 1)
        return (ends[warmup - 1] if warmup > 0 else self.start_wall_s), ends[warmup:]

    def worker_windows(self) -> dict[str, tuple[float, float, int]]:
        """Each worker's steady window ``(start_wall_s, end_wall_s, steps)``: from the start of
        its first step after its warm-up to the end of its last, for the workers
        with at least two such steps."""
        windows = {}
        for worker, kept in self._kept_steps().items():
            if len(kept) >= 2 and kept[-1][1] > kept[0][0]:
                windows[worker] = (kept[0][0], kept[-1][1], len(kept))
        return windows

    def steady_rates(self) -> tuple[float, float, dict[str, float]] | None:
        """``(t0_wall_s, t1_wall_s, rate per worker)`` over the part of a multi-worker run where every
        worker trained steadily: from the latest start of a worker's first step after its own
        warm-up to the last completion; a worker's rate is its steps started in there over the
        span from the end of its step before them to its own last completion, less the time it
        waited at round boundaries (:meth:`span_without_joins_s`). None unless every worker has
        two steps in there.

        A worker still in its set-up (tracing, first step) loads a shared host without adding
        steps, so a window that holds it measures the others under a transient, not the set.
        Each worker's span opens where its first counted step's cycle did, as a solo run's window
        opens at the end of its last warm-up step: from ``t0`` itself it would hold the rest of
        the step a worker was in at ``t0``, which it does not count — on average half a step, a
        tenth of a board's rate over a window of five of its steps."""
        by_worker = self._steps_by_worker()
        kept = steps_past_warmup(by_worker, self.warmup_steps, self.warmup_s)
        workers = set(self.steps_per_worker) | set(kept)
        if len(workers) < 2:
            return None
        common = common_steady_steps({worker: kept.get(worker, []) for worker in workers})
        if common is None or any(len(steps) < 2 for steps in common[1].values()):
            return None
        t0, inside = common

        def cycle_start_s(worker: str, steps: list[tuple[float, float]]) -> float:
            before = by_worker[worker][:len(by_worker[worker]) - len(steps)]
            return min(before[-1][1], steps[0][0]) if before else steps[0][0]

        rates = {worker: len(steps) / self.span_without_joins_s(steps, cycle_start_s(worker, steps))
                 for worker, steps in inside.items()}
        return t0, max(steps[-1][1] for steps in inside.values()), rates

    def span_without_joins_s(self, steps: Sequence[tuple[float, float]], t0: float) -> float:
        """A worker's time from ``t0`` to the end of its last step, less what it spent waiting for
        the engine's joins: per round (``round_starts_wall_s``), from the round's start (or ``t0``)
        to the end of the worker's last step in it, summed; rounds it took no step in count nothing.
        ``steps``: its ``(start, end)`` steps, every one starting at or after ``t0``.

        The engine joins every round before scheduling the next, so a fast worker that finishes
        its round's share waits idle until the slowest worker's last step ends — up to a whole
        step of a board (seconds), where a continuous run would have gone on training. A
        measurement window that spans a join would count that wait as the fast worker's time.
        Without recorded rounds: the plain span to the last completion."""
        last_end = max(end for _, end in steps)
        if not self.round_starts_wall_s:
            return last_end - t0
        by_round: dict[int, float] = {}
        for start, end in steps:
            index = bisect.bisect_right(self.round_starts_wall_s, start) - 1
            by_round[index] = max(by_round.get(index, end), end)
        span = sum(end - max(t0, self.round_starts_wall_s[index] if index >= 0 else t0)
                   for index, end in by_round.items())
        return span if span > 0 else last_end - t0

    def _steps_by_worker(self) -> dict[str, list[tuple[float, float]]]:
        """Each worker's (start, end) steps, by end time."""
        by_worker: dict[str, list[tuple[float, float]]] = {}
        for start, end, worker in self.step_times:
            by_worker.setdefault(worker, []).append((start, end))
        return {worker: sorted(steps, key=lambda step: step[1]) for worker, steps in by_worker.items()}

    def _kept_steps(self) -> dict[str, list[tuple[float, float]]]:
        """Each worker's (start, end) steps after its own warm-up, by end time."""
        return steps_past_warmup(self._steps_by_worker(), self.warmup_steps, self.warmup_s)

    def worker_steps_per_s(self, steady_only: bool = False) -> dict[str, float]:
        """Each worker's own steady rate: its steps after its warm-up, over the span
        from the first kept step's start to the last one's end (:meth:`worker_windows`; a worker
        with fewer than two kept steps: one over its last step's duration).

        Why per worker: in a short multi-device run the fast worker takes nearly every step while
        a slow one is still in its first (tracing, warm-up) step, so one window over all
        completions ends at that slow step and under-states what the set sustains (seen in
        pre-training: mobilenet_v2 server+nano measured 2.88 steps/s, then trained at 9.04).
        ``steady_only`` leaves out the workers without two kept steps: their one step may be the
        slow first one (graph set-up), not a rate the set sustains."""
        windows = self.worker_windows()
        rates = {worker: steps / (t1 - t0) for worker, (t0, t1, steps) in windows.items()}
        if not steady_only:
            for start, end, worker in sorted(self.step_times, key=lambda row: row[1]):
                if worker not in windows and end > start:
                    rates[worker] = 1.0 / (end - start)  # the last step wins
        return rates

    @property
    def steps_per_s(self) -> float:
        """Applied steps per second, warm-up excluded: over :meth:`measurement_window` for one
        worker; the sum of :meth:`worker_steps_per_s` (asynchronous PS) for several."""
        if len({worker for _, _, worker in self.step_times}) > 1:
            return float(sum(self.worker_steps_per_s().values()))
        t0, t1, steps = self.measurement_window()
        return steps / (t1 - t0) if t1 > t0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["step_times"] = [[start, end, w] for start, end, w in self.step_times]
        data["steps_per_s"] = self.steps_per_s
        data["steps_unattributed"] = self.steps_unattributed
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RunResult":
        data = dict(data)
        data.pop("steps_per_s", None)
        data.pop("steps_unattributed", None)
        data["step_times"] = [(float(a), float(b), str(w)) for a, b, w in data.get("step_times", [])]
        return cls(**data)


LOSS_CURVE_WINDOWS = 40


def loss_curve(losses_by_end: Sequence[tuple[float, float]], first_step: int, start_wall_s: float,
               windows: int = LOSS_CURVE_WINDOWS) -> list[dict[str, float]]:
    """The training loss smoothed over windows of consecutive applied steps: ``losses_by_end`` is
    (end_wall_s, loss) per applied step, the first of them step ``first_step``. Each window: its
    first and last step, the mean loss of its steps, and when it ended (seconds into the run) and
    lasted."""
    ordered = sorted(losses_by_end)
    if not ordered:
        return []
    size = max(1, -(-len(ordered) // windows))
    curve = []
    window_start_s = start_wall_s
    for index in range(0, len(ordered), size):
        chunk = ordered[index:index + size]
        end_s = chunk[-1][0]
        curve.append({"first_step": first_step + index, "last_step": first_step + index + len(chunk) - 1,
                      "loss": sum(loss for _, loss in chunk) / len(chunk),
                      "end_s": round(end_s - start_wall_s, 3), "time_s": round(end_s - window_start_s, 3)})
        window_start_s = end_s
    return curve
