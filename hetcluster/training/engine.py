"""Train on given TF servers with TensorFlow's own ParameterServerStrategy + ClusterCoordinator.

The coordinator is this process (job ``chief``); workers and parameter servers are plain
``tf.distribute.Server`` processes at the addresses in :class:`ClusterAddresses`. Model and
optimizer variables live on the parameter servers; step functions are traced here and sent to the
workers by ClusterCoordinator, which hands each closure to whichever worker is free (asynchronous
PS training: fast devices take more steps).

Exact step count. ClusterCoordinator guarantees *at-least-once* execution of a closure: when a
worker fails mid-closure, the closure is put back and re-run on another worker, so an update the
dead worker had already applied on the parameter servers could be applied twice. The engine
therefore (1) counts steps with ``optimizer.iterations`` (a variable on the PS, incremented by every
applied update) rather than by closures, (2) schedules in rounds only ``total - iterations`` more
closures, joins, re-reads ``iterations`` and schedules again if failures left it short, and (3)
gates each update inside the step (``iterations < total`` else the gradients are not applied), so
a retried closure whose first execution already counted is a no-op once the total is reached.
The gate is check-then-apply, not atomic: workers that read ``total - 1`` together all apply, so
over-scheduled closures can overshoot by up to ``workers - 1``. Rounds never over-schedule; the
remaining gap is a retried closure racing other workers' final updates inside one round (it needs
a worker failure at that moment), and the reported ``steps_applied`` is still the true
``iterations`` count.

Worker identity per step: ``tf.distribute.coordinator.experimental_get_current_worker_index()``
inside the step. Step timestamps: ``tf.timestamp()`` on the worker at the start and end of the step.

One run per process: TensorFlow keeps one eager cluster context per process; a second
ParameterServerStrategy on another cluster in the same process works in TF 2.20 but leaves the
first cluster's function registrations and failure-handler threads behind (gRPC "Tried to remove
non-existent function" errors, watchers on dead servers). Use :mod:`hetcluster.training.run_job`
to run each training run in a fresh subprocess; call :func:`run_training` directly only once per
process.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from hetcluster.errors import TrainingError
from hetcluster.models.datasets import make_dataset_fn
from hetcluster.models.registry import build_from_spec
from hetcluster.tfenv import prepare_tf_env
from hetcluster.training.servers import address_reachable, free_port, port_bindable
from hetcluster.training.spec import (
    ClusterAddresses,
    RunResult,
    TrainSpec,
    barrier_rounds,
    common_steady_steps,
    loss_curve,
    steps_past_warmup,
    warmup_count,
)

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger(__name__)

DEFAULT_ROUND_STEPS = 200
DONE_CHECK_S = 0.005   # a slow check cut fast devices' short windows (docs/decisions.md#round-end-check)
DEFAULT_ROUND_STEPS_PER_WORKER = 50

# gradient_fn(model, x, y) -> (loss, gradients aligned with model.trainable_variables)
GradientFn = Callable[[Any, Any, Any], tuple[Any, list[Any]]]
# on_progress(steps_applied_so_far_in_run, steps_to_do_in_run, elapsed_s), polled ~4 times a second
ProgressFn = Callable[[int, int, float], None]


@dataclass
class _Stamp:
    loss: float
    applied: bool
    start_s: float
    end_s: float
    worker_index: int


def with_bindable_chief(cluster: ClusterAddresses) -> ClusterAddresses:
    """``cluster``, or a copy whose chief listens on a fresh port where another process has taken
    its port since it was picked. The chief is this process's own server: the workers and the PS
    learn its address from the cluster the client brings, so it may change from run to run (shared
    servers keep one chief address across a whole pre-training, minutes in which any process on
    this host may take that port: TF then fails with "Could not start gRPC server")."""
    host, _, port = cluster.chief.rpartition(":")
    if port_bindable(int(port)):
        return cluster
    chief = f"{host}:{free_port('')}"
    log.warning("the chief's port %s is taken on this host; this run's coordinator listens on %s", cluster.chief, chief)
    return dataclasses.replace(cluster, chief=chief)


def connect(cluster: ClusterAddresses) -> tuple["tf.distribute.Strategy", Any]:
    """ParameterServerStrategy + ClusterCoordinator over ``cluster`` (this process = chief; on a
    fresh port if its own was taken: with_bindable_chief)."""
    cluster = with_bindable_chief(cluster)
    unreachable = [name for name, addr in cluster.workers.items() if not address_reachable(addr)]
    unreachable += [f"ps{i}" for i, addr in enumerate(cluster.ps) if not address_reachable(addr)]
    if unreachable:
        raise TrainingError(f"TF servers not reachable before training: {', '.join(unreachable)}.",
                            hint="start their servers (agents) or leave those devices out.")
    prepare_tf_env()
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.cluster_spec_dict()), task_type="chief", task_id=0, rpc_layer="grpc")
    try:
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    except (ValueError, tf.errors.OpError) as exc:
        raise TrainingError(f"Cannot connect to the TF cluster {cluster.cluster_spec_dict()}: {exc}",
                            hint="check the addresses and that the servers use the same cluster spec.") from exc
    return strategy, coordinator


def default_gradient_fn(loss_fn: Any) -> GradientFn:
    """Forward + backward with a GradientTape; loss averaged over the global batch."""
    import tensorflow as tf

    def gradient_fn(model: Any, x: Any, y: Any) -> tuple[Any, list[Any]]:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        return loss, tape.gradient(loss, model.trainable_variables)

    return gradient_fn


def _memory_gradient_fn(spec: TrainSpec, worker_names: list[str], model: Any, loss_fn: Any,
                        optimizer: Any) -> tuple[GradientFn | None, dict[str, str]]:
    """Gradients through each worker's own memory plan (None: every worker plain), and each
    worker's technique ("" = plain). Refuses, before any step, a worker no plan fits."""
    from hetcluster.memory.executor import build_train_step, per_worker_gradients
    from hetcluster.memory.fit import worker_memory
    from hetcluster.memory.keras_graph import extract_graph

    budgets = {name: (spec.worker_budgets_bytes.get(name, spec.memory_budget_bytes),
                      spec.worker_device_kinds.get(name, spec.memory_device_kind)) for name in worker_names}
    budgets = {name: value for name, value in budgets.items() if value[0] > 0}
    # the graph of the very model trained here: Keras numbers unnamed layers per process, so
    # another build of the same model can name them differently
    memory = worker_memory(spec.model, budgets, worker_names, extract_graph(model, 1))
    for worker in memory.workers:
        worker.check_fits()
        log.info("memory %s", worker.describe())
    techniques = {name: (memory.of(name).technique if memory.of(name) else "") for name in worker_names}
    if not memory.planned:
        return None, techniques
    import tensorflow as tf

    average = lambda y, out: tf.nn.compute_average_loss(loss_fn(y, out))  # noqa: E731
    plain = default_gradient_fn(loss_fn)
    branches: list[Any] = []
    keys: dict[Any, int] = {}  # one branch per distinct plan (None: the plain step)
    branch_of_worker = []
    for name in worker_names:
        worker = memory.of(name)
        plan = worker.plan if worker is not None and worker.planned else None
        key = None if plan is None else (plan.segments, plan.offloaded)
        if key not in keys:
            keys[key] = len(branches)
            branches.append((lambda x, y: plain(model, x, y)) if plan is None
                            else build_train_step(model, average, optimizer, plan).gradients_fn)
        branch_of_worker.append(keys[key])
    gradients = per_worker_gradients(branches, branch_of_worker, model.trainable_variables)
    return (lambda _model, x, y: gradients(x, y)), techniques


def memory_plan_summary(techniques: dict[str, str]) -> str:
    """"recompute_sqrt on rpi4; recompute_cost_aware on a, b" ("" where every worker runs plain)."""
    by_technique: dict[str, list[str]] = {}
    for name, technique in techniques.items():
        if technique:
            by_technique.setdefault(technique, []).append(name)
    return "; ".join(f"{technique} on {', '.join(names)}" for technique, names in by_technique.items())


def make_optimizer(keras: Any, name: str, learning_rate: float) -> Any:
    """The job's optimizer: SGD with momentum 0.9, or Adam."""
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=learning_rate)
    return keras.optimizers.SGD(learning_rate=learning_rate, momentum=0.9)


class _Trainer:
    """Model, optimizer, checkpoint and traced step of one run on one cluster."""

    def __init__(self, spec: TrainSpec, cluster: ClusterAddresses, strategy: Any, coordinator: Any,
                 gradient_fn: GradientFn | None) -> None:
        import tensorflow as tf
        import tf_keras as keras

        self.spec, self.cluster, self.strategy, self.coordinator = spec, cluster, strategy, coordinator
        with strategy.scope():
            self.model = build_from_spec(spec.model)
            self.optimizer = make_optimizer(keras, spec.optimizer, spec.learning_rate)
            self.optimizer.build(self.model.trainable_variables)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        self.manager = None
        if spec.checkpoint_dir:
            self.manager = tf.train.CheckpointManager(self.checkpoint, spec.checkpoint_dir,
                                                      max_to_keep=max(1, spec.max_checkpoints))
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
        self.memory_plans = {name: "" for name in cluster.worker_names}
        if gradient_fn is None and (spec.memory_budget_bytes > 0 or spec.worker_budgets_bytes):
            gradient_fn, self.memory_plans = _memory_gradient_fn(spec, cluster.worker_names, self.model, loss_fn,
                                                                 self.optimizer)
        self.gradient_fn = gradient_fn or default_gradient_fn(loss_fn)
        dataset_fn = make_dataset_fn(spec.data, spec.model)

        @tf.function
        def per_worker_dataset_fn() -> Any:
            return strategy.distribute_datasets_from_function(dataset_fn)

        self.iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))
        self._steps: dict[int, Any] = {}

    def restore(self) -> int:
        """Restore the latest checkpoint if there is one; return the restored step count."""
        if self.manager is None or self.manager.latest_checkpoint is None:
            return 0
        path = self.manager.latest_checkpoint
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError) as exc:
            raise TrainingError(
                f"Checkpoint {path} does not match model {self.spec.model.name}: {exc}",
                hint="use the same --model, --input-shape and --classes, or a new --checkpoint-dir.",
            ) from exc
        steps = int(self.optimizer.iterations.numpy())
        log.info("restored %s at step %d", path, steps)
        return steps

    def save(self) -> str | None:
        """Write a checkpoint numbered by the step count (kept if one with that number exists)."""
        if self.manager is None:
            return None
        steps = int(self.optimizer.iterations.numpy())
        latest = self.manager.latest_checkpoint
        if latest is not None and latest.endswith(f"-{steps}"):
            return latest
        return self.manager.save(checkpoint_number=steps)

    def step_for(self, target: int) -> Any:
        """The traced step gated at ``target`` (one trace per target; a run uses one target)."""
        if target not in self._steps:
            self._steps[target] = self._make_step(target)
        return self._steps[target]

    def _make_step(self, target: int) -> Any:
        """Build the step with ``target`` as a graph constant: a tensor argument would live on the
        coordinator and cost every closure an extra transfer, a fifth of a small step."""
        import tensorflow as tf

        strategy, model, optimizer, gradient_fn = self.strategy, self.model, self.optimizer, self.gradient_fn

        variables = model.trainable_variables

        def replica_gradients(x: Any, y: Any) -> tuple[Any, list[Any]]:
            return gradient_fn(model, x, y)

        def replica_apply(grads: list[Any]) -> Any:
            optimizer.apply_gradients(zip(grads, variables))
            return tf.constant(True)

        @tf.function
        def step(iterator: Any) -> tuple[Any, ...]:
            start_s = tf.timestamp()
            x, y = next(iterator)
            loss, grads = strategy.run(replica_gradients, args=(x, y))

            def apply() -> Any:
                return tf.reduce_all(strategy.experimental_local_results(strategy.run(replica_apply, args=(grads,))))

            # The gate: once the job's total is reached, a retried closure applies nothing.
            applied = tf.cond(optimizer.iterations < tf.constant(target, tf.int64), apply,
                              lambda: tf.constant(False))
            # the mean over this worker's replicas, computed on the worker (strategy.reduce would
            # move the value to another device first)
            loss = tf.reduce_mean(tf.stack(strategy.experimental_local_results(loss)))
            with tf.control_dependencies([loss, applied]):
                end_s = tf.timestamp()
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            # One float64 vector: the coordinator copies each returned tensor home with its own
            # RPC, so five separate outputs cost five round trips per step.
            return tf.stack([tf.cast(loss, tf.float64), tf.cast(applied, tf.float64), start_s, end_s,
                             tf.cast(worker, tf.float64)])

        return step

    def iterations(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def run_round(self, count: int, target: int, on_poll: Callable[[], None], poll_s: float = 0.25) -> list[_Stamp]:
        """Schedule ``count`` closures, poll ``on_poll`` until they are done, join, then fetch.

        Results are fetched only after ``join()``: a RemoteValue is marked ready before the
        coordinator's worker thread has copied it home, and copying it from a worker that dies in
        that moment would raise here instead of inside TF's failure handling (which re-runs it).
        """
        step = self.step_for(target)
        values = [self.coordinator.schedule(step, args=(self.iterator,)) for _ in range(count)]
        # notice the end of the round within milliseconds (the next round waits for it: a
        # 0.25 s sleep here cost a fast device a third of a short measurement window), and
        # report progress every poll_s
        next_poll = time.monotonic()
        while not self.coordinator.done():
            if time.monotonic() >= next_poll:
                on_poll()
                next_poll = time.monotonic() + poll_s
            time.sleep(DONE_CHECK_S)
        self.coordinator.join()
        stamps = []
        for value in values:
            loss, applied, start_s, end_s, worker = (float(v) for v in value.fetch())
            stamps.append(_Stamp(loss, applied > 0.5, start_s, end_s, int(worker)))
        return stamps

    def lost_workers(self) -> list[str]:
        """Workers the coordinator saw fail, or whose server no longer accepts connections."""
        names = self.cluster.worker_names
        lost = set()
        for worker in getattr(getattr(self.coordinator, "_cluster", None), "workers", []):
            # ClusterCoordinator keeps the last failure per worker (cleared on recovery);
            # read defensively, it is not public API.
            if getattr(worker, "_is_dead_with_error", None):
                lost.add(names[worker.worker_index])
        lost.update(name for name, addr in self.cluster.workers.items() if not address_reachable(addr))
        return [name for name in names if name in lost]


def run_training(spec: TrainSpec, cluster: ClusterAddresses, *, gradient_fn: GradientFn | None = None,
                 on_progress: ProgressFn | None = None, stop_event: threading.Event | None = None,
                 round_steps: int | None = None, all_lost_timeout_s: float = 15.0) -> RunResult:
    """Restore the latest checkpoint, apply exactly ``total_steps - restored`` steps, checkpoint.

    Call at most once per process (see the module docstring); :func:`run_job.run_in_subprocess`
    does that for you. ``stop_event`` is honoured between rounds (``round_steps``, by default
    max(200, 50 per worker), or ``checkpoint_every_steps`` if smaller); a stopped run saves a
    checkpoint and returns what it did with ``stopped=True``.
    With ``spec.start_barrier`` the first ``barrier_rounds(warmup_steps)`` rounds are one closure
    per worker each (see TrainSpec).
    When no worker has accepted a connection for ``all_lost_timeout_s``, the steps applied are
    checkpointed and TrainingError is raised (TF itself would wait for them forever); the process
    is then unusable for TF, so exit it. When none answers while a stop is asked, the run ends at
    once the same way, stopped, without waiting that long (an elastic job re-plans on other devices).
    """
    import tensorflow as tf

    strategy, coordinator = connect(cluster)
    trainer = _Trainer(spec, cluster, strategy, coordinator, gradient_fn)
    restored = trainer.restore()
    target = max(spec.total_steps, restored)
    to_do = target - restored
    # Rounds bound how long a stop request waits; each costs one join (a short pipeline drain).
    round_default = max(DEFAULT_ROUND_STEPS, DEFAULT_ROUND_STEPS_PER_WORKER * len(cluster.workers))
    per_round = min(x for x in (round_steps or round_default, spec.checkpoint_every_steps, to_do or 1) if x > 0)
    stamps: list[_Stamp] = []
    round_starts: list[float] = []   # wall time each round was scheduled (RunResult.round_starts_wall_s)
    start_wall_s = time.time()

    last_alive_s = [time.monotonic(), time.monotonic()]  # last time a worker answered, last probe

    def on_poll() -> None:
        # optimizer.iterations lives on the PS: reading it is the exact live count of applied steps
        if on_progress is not None:
            on_progress(trainer.iterations() - restored, to_do, time.time() - start_wall_s)
        now = time.monotonic()
        if now - last_alive_s[1] >= 1.0:
            last_alive_s[1] = now
            if any(address_reachable(a, timeout_s=0.5) for a in cluster.workers.values()):
                last_alive_s[0] = now
            elif (stop_event is not None and stop_event.is_set()) or now - last_alive_s[0] > all_lost_timeout_s:
                # ClusterCoordinator would wait for a worker to come back forever: the round is
                # given up; the parameter servers still hold every applied step, so it is saved
                raise _WorkersGone

    scheduled = 0
    checkpoint_path = None
    current = restored
    # the update gate: the job's total, or the cap of a measurement run that may be extended
    # (one traced step for the whole run: a new gate would mean a new trace on every worker)
    gate = max(spec.max_steps, target) if spec.extends_window else target
    # the start barrier: rounds of one closure per worker (each idle worker takes one), one per
    # warm-up step, so every worker warms up in step with the others
    barrier = len(cluster.workers) if spec.start_barrier and len(cluster.workers) > 1 else 0
    barriers_left = barrier_rounds(spec.warmup_steps) if barrier else 0
    try:
        while not (stop_event is not None and stop_event.is_set()):
            if current >= target:
                extra = _steps_to_fill_window(spec, stamps, gate - current, len(cluster.workers))
                if extra <= 0:
                    break
                target, to_do = current + extra, to_do + extra
            count = min(barrier if barriers_left else per_round, target - current)
            round_starts.append(time.time())
            round_stamps = trainer.run_round(count, gate, on_poll)
            if barriers_left:
                if count == barrier:  # fewer steps left than workers: nobody can expect a step each
                    _check_barrier(cluster, round_stamps)
                barriers_left -= 1
            stamps += round_stamps
            scheduled += count
            current = trainer.iterations()
            if spec.checkpoint_every_steps and current < target:
                checkpoint_path = trainer.save()
            if scheduled > 2 * to_do + 16 * len(cluster.workers):
                raise TrainingError(f"Scheduled {scheduled} closures for {to_do} steps without reaching them.",
                                    hint="check the workers' logs; servers keep failing.")
    except tf.errors.OpError as exc:
        log.error("training failed (%d steps applied at the last round): %s", current, exc)
        raise TrainingError(f"Training failed: {op_error_summary(exc.message or str(exc))}",
                            hint="check that the parameter server is alive; resume from the last checkpoint.") from exc
    except _WorkersGone:
        current = trainer.iterations()
        saved = trainer.save()
        if stop_event is None or not stop_event.is_set():
            raise TrainingError(f"All workers are gone ({', '.join(cluster.worker_names)}); {current} steps applied "
                                f"so far, checkpointed at {saved}.",
                                hint="restart the devices' workers and resume from the last checkpoint.") from None
        log.warning("every worker is gone and a stop was asked: %d steps applied, checkpointed", current)
    end_wall_s = time.time()
    if on_progress is not None:
        on_progress(current - restored, to_do, end_wall_s - start_wall_s)
    checkpoint_path = trainer.save() or checkpoint_path
    result = _result(spec, cluster, trainer, stamps, restored, current, start_wall_s, end_wall_s,
                     checkpoint_path, scheduled)
    result.round_starts_wall_s = round_starts
    result.stopped = current < target
    return result


class _WorkersGone(Exception):
    """No worker has answered for a while (or none answers and a stop was asked): the round in
    progress can never end, since ClusterCoordinator waits for a lost worker to come back."""


def op_error_summary(message: str, limit_chars: int = 240) -> str:
    """A TensorFlow error message as one line: its first line, and for "N root error(s) found"
    each root error's own first line (``(0) UNAVAILABLE: ...``), each cut at ``limit_chars``."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "unknown TensorFlow error"
    roots = [line for line in lines[1:] if re.match(r"\(\d+\) ", line)]
    return "; ".join(line[:limit_chars] for line in [lines[0], *roots])


def _check_barrier(cluster: ClusterAddresses, stamps: list[_Stamp]) -> None:
    """Warn when a barrier round did not give every worker a step (a fast worker that finished
    before another took its closure takes a second one): the missing worker then catches up on its
    set-up or warm-up while the others train."""
    names = cluster.worker_names
    missing = sorted(set(names) - {names[s.worker_index] for s in stamps})
    if missing:
        log.warning("start barrier: %s took no step in a barrier round; it warms up while the others train",
                    ", ".join(missing))


def _steps_to_fill_window(spec: TrainSpec, stamps: list[_Stamp], room: int, n_workers: int = 1) -> int:
    """How many more steps a measurement run needs for a window of ``spec.min_window_s`` after
    its warm-up (0: long enough, not a measurement run, or no room left under ``max_steps``).
    Sized from the rate so far, 10 % over, so one more round usually suffices. With several
    workers the window is the one where every worker trains steadily (RunResult.steady_rates):
    it opens when the last of them has begun a step past its set-up and its own warm-up, and each
    needs two steps in it. With one worker the window must also hold ``spec.min_window_steps``
    completions (those still to come in the warm-up's seconds do not count)."""
    if not spec.extends_window or room <= 0:
        return 0
    ends = sorted(s.end_s for s in stamps if s.applied)
    if len(ends) < 2:
        return min(room, 2)
    # sized for the warm-up's seconds in full (a measurement may take only half of a capped run's)
    warm = warmup_count(ends, spec.warmup_steps, spec.warmup_s, at_most_half=False)
    if len(ends) - warm >= 2:  # the rate past the warm-up, else (still in it) since the first completion
        opened_s = ends[warm - 1 if warm else 0]
        rate = (len(ends) - warm - (0 if warm else 1)) / max(ends[-1] - opened_s, 1e-6)
    else:
        rate = (len(ends) - 1) / max(ends[-1] - ends[0], 1e-6)
        if warm < len(ends):  # one step past the warm-up
            opened_s = ends[warm - 1]
        else:  # still in it: the window opens when the seconds after its warm-up steps end
            opened_s = ends[min(spec.warmup_steps, len(ends)) - 1] + spec.warmup_s
    if n_workers > 1:
        if spec.min_window_s <= 0:
            return 0
        short_s = _steady_window_shortfall_s(spec, stamps, n_workers)
    else:  # the window opens at opened_s (past the last completion while the warm-up's seconds run)
        short_s = spec.min_window_s - (ends[-1] - opened_s)
        steps_short = spec.min_window_steps - (len(ends) - warm)
        if steps_short > 0:  # their seconds, after what is left of the warm-up's seconds
            short_s = max(short_s, steps_short / rate + max(opened_s - ends[-1], 0.0))
    if short_s <= 0:
        return 0
    return min(room, max(1, math.ceil(1.1 * rate * short_s)))


def _steady_window_shortfall_s(spec: TrainSpec, stamps: list[_Stamp], n_workers: int) -> float:
    """Seconds more a multi-worker run needs until every worker has two steps in a common steady
    window of ``spec.min_window_s`` (0 when it has one); a worker not yet steady is given the rest
    of its warm-up and two more of its steps (its mean step so far, or the run's span when it has
    not finished one), and what is left of its warm-up's seconds (``spec.warmup_s``)."""
    by_worker: dict[int, list[tuple[float, float]]] = {w: [] for w in range(n_workers)}
    for stamp in sorted((s for s in stamps if s.applied), key=lambda s: s.end_s):
        by_worker[stamp.worker_index].append((stamp.start_s, stamp.end_s))
    span_s = max(s.end_s for s in stamps) - min(s.start_s for s in stamps)
    kept = steps_past_warmup(by_worker, spec.warmup_steps, spec.warmup_s, at_most_half=False)
    common = common_steady_steps(kept)
    if common is None:
        lagging = [w for w, steps in kept.items() if not steps]
    else:
        t0, inside = common
        if all(len(steps) >= 2 for steps in inside.values()):
            return spec.min_window_s - (max(steps[-1][1] for steps in inside.values()) - t0)
        lagging = [w for w, steps in inside.items() if len(steps) < 2]
    short_s = 0.0
    last_end_s = max(s.end_s for s in stamps)
    for w in lagging:
        steps = by_worker[w]
        step_s = sum(end - start for start, end in steps) / len(steps) if steps else span_s
        if not spec.warmup_steps:
            warm_left_s = 0.0
        elif len(steps) >= spec.warmup_steps:  # in the seconds after its warm-up steps
            warm_left_s = max(steps[spec.warmup_steps - 1][1] + spec.warmup_s - last_end_s, 0.0)
        else:
            warm_left_s = spec.warmup_s
        short_s = max(short_s, (max(spec.warmup_steps - len(steps), 0) + 2) * step_s + warm_left_s)
    return max(short_s, spec.min_window_s)


def _result(spec: TrainSpec, cluster: ClusterAddresses, trainer: _Trainer, stamps: list[_Stamp], restored: int,
            current: int, start_wall_s: float, end_wall_s: float, checkpoint_path: str | None,
            scheduled: int) -> RunResult:
    names = cluster.worker_names
    applied = sorted((s for s in stamps if s.applied), key=lambda s: s.end_s)
    per_worker = {name: 0 for name in names}
    for stamp in applied:
        per_worker[names[stamp.worker_index]] += 1
    lost = trainer.lost_workers()
    if lost:
        log.warning("lost workers during training: %s", ", ".join(lost))
    return RunResult(
        steps_applied=current - restored,
        steps_total=current,
        steps_restored=restored,
        steps_per_worker=per_worker,
        time_s=end_wall_s - start_wall_s,
        start_wall_s=start_wall_s,
        end_wall_s=end_wall_s,
        step_times=[(s.start_s, s.end_s, names[s.worker_index]) for s in applied],
        final_loss=applied[-1].loss if applied else None,
        lost_workers=lost,
        checkpoint_path=checkpoint_path,
        closures_scheduled=scheduled,
        warmup_steps=min(spec.warmup_steps, len(applied)),
        warmup_s=spec.warmup_s,
        memory_plan=memory_plan_summary(trainer.memory_plans),
        memory_plans=dict(trainer.memory_plans),
        loss_curve=loss_curve([(s.end_s, s.loss) for s in applied], restored + 1, start_wall_s),
    )
