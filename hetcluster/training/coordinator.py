"""Run one training segment on chosen devices and measure it: launch, train, meter power, stop.

``run_on_devices`` is what `hetcluster train`, `hetcluster evaluate` and the overhead benchmark
share: it starts a PowerRecorder on every device whose power belongs to the job (the chosen ones,
and the others too when the inventory says idle power counts), launches a TF worker on each chosen
device through its agent and the parameter server locally (``launch_cluster``), runs the remaining
steps in a fresh process (``run_in_subprocess``: one PS cluster per process), stops every server
it started — also on errors, Ctrl-C and SIGTERM turned into KeyboardInterrupt — and integrates
each device's power stream over the run's wall-clock span.

``JobLedger`` is the job's record in its working directory (``train_state.json``, written
atomically): the plan, the tasks started on agents, and one entry per training segment. A job
interrupted (Ctrl-C) or killed and resumed with ``--resume`` adds segments, so its report still
covers the whole job. A segment in progress is rewritten every few seconds, so a coordinator that
is killed outright loses at most those seconds of accounting; the model state it loses is what
was applied after the last checkpoint (``--checkpoint-every``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hetcluster.errors import AgentError, TrainingError
from hetcluster.fileio import write_json_atomic
from hetcluster.training.spec import RunResult, TrainSpec

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import Inventory
    from hetcluster.training.launch import LaunchedCluster

log = logging.getLogger(__name__)

# recorders cost an emulating host CPU; fewer samples lose resolution, not energy (docs/decisions.md#train-power-rate)
TRAIN_POWER_RATE_HZ = 2.0

# on_progress(done, to_do, elapsed_s, power_w): applied steps of this run, its target, seconds, live watts
ProgressFn = Callable[[int, int, float, float], None]


def check_agents(inventory: Inventory, names: Sequence[str], timeout_s: float = 3.0) -> dict[str, str]:
    """``{device: reason}`` for every named device whose agent does not answer a health check."""
    missing: dict[str, str] = {}
    for name in names:
        entry = inventory.device(name)
        try:
            with entry.client(timeout_s=timeout_s) as client:
                if not client.health():
                    missing[name] = f"its agent at {entry.address} does not answer"
        except AgentError as error:
            missing[name] = f"agent at {entry.address} unreachable ({error})"
        except Exception as error:  # noqa: BLE001 - credentials or address problems: same outcome
            missing[name] = f"agent at {entry.address} unusable ({type(error).__name__}: {error})"
    return missing


class PowerMeter:
    """PowerRecorders on several devices; a device whose stream fails is logged and left out."""

    def __init__(self, inventory: Inventory, names: Sequence[str], rate_hz: float = 10.0) -> None:
        self._inventory, self._names, self._rate_hz = inventory, list(names), rate_hz
        self._recorders: dict[str, Any] = {}
        self._clients: list[Any] = []

    def start(self) -> "PowerMeter":
        from hetcluster.agent.client import PowerRecorder

        for name in self._names:
            try:
                client = self._inventory.device(name).client(timeout_s=5.0)
                self._clients.append(client)
                self._recorders[name] = PowerRecorder(client, rate_hz=self._rate_hz).start()
            except AgentError as error:
                log.warning("no power stream from %s: %s", name, error)
        return self

    def live_power_w(self, names: Sequence[str] | None = None) -> float:
        """Sum of the latest sample of each (named) device."""
        total = 0.0
        for name, recorder in self._recorders.items():
            if names is None or name in names:
                samples = recorder.samples
                total += samples[-1].power_w if samples else 0.0
        return total

    def energy_j(self, t0_wall_s: float, t1_wall_s: float) -> dict[str, float]:
        """Each device's energy over [t0, t1] (counter difference or trapezoid, see PowerRecorder)."""
        return {name: rec.energy_j(t0_wall_s, t1_wall_s) for name, rec in self._recorders.items()}

    def stop(self) -> None:
        for recorder in self._recorders.values():
            recorder.stop()
        for client in self._clients:
            client.close()
        self._clients = []

    def __enter__(self) -> "PowerMeter":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class MeasuredRun:
    """One training segment: the engine's RunResult and the energy metered over it."""

    devices: list[str]
    result: RunResult
    energy_per_device_j: dict[str, float]
    launch_s: float
    launch_wall_s: float = 0.0     # when its servers were asked to start
    stopped_wall_s: float = 0.0    # when its servers were all stopped again
    launch_energy_j: float = 0.0   # metered from launch_wall_s to the run's start
    stop_energy_j: float = 0.0     # metered from the run's end to stopped_wall_s

    @property
    def time_s(self) -> float:
        return self.result.end_wall_s - self.result.start_wall_s

    @property
    def energy_j(self) -> float:
        return sum(self.energy_per_device_j.values())


class SegmentInterrupted(KeyboardInterrupt):
    """Ctrl-C/SIGTERM during a segment: servers are stopped; what was metered comes with it."""

    def __init__(self, time_s: float, energy_per_device_j: dict[str, float]) -> None:
        super().__init__("interrupted")
        self.time_s, self.energy_per_device_j = time_s, energy_per_device_j


def metered_devices(inventory: Inventory, chosen: Sequence[str]) -> list[str]:
    """The chosen devices, plus every other device whose idle power counts toward the job."""
    others = [d.name for d in inventory.devices if d.name not in chosen and inventory.idle_counts(d)]
    return [*chosen, *others]


def run_on_devices(inventory: Inventory, chosen: Sequence[str], spec: TrainSpec, *,
                   on_progress: ProgressFn | None = None, stop_event: threading.Event | None = None,
                   on_launched: Callable[[Any], None] | None = None, on_ready: Callable[[float], None] | None = None,
                   round_steps: int = 0,
                   power_rate_hz: float = TRAIN_POWER_RATE_HZ, ready_timeout_s: float = 180.0,
                   run_timeout_s: float | None = None, log_path: Path | None = None) -> MeasuredRun:
    """Launch workers on ``chosen`` (+ a local PS), train ``spec`` to its total, meter, stop.

    ``on_ready(launch_s)`` is called once every server is up, with the seconds that took.
    Raises DeviceLaunchError (``.device``) when a device cannot start its worker, TrainingError
    when the run fails, SegmentInterrupted on Ctrl-C/SIGTERM (servers stopped, the engine's
    checkpoint written by the run's process).
    """
    from hetcluster.training.launch import launch_cluster

    entries = [inventory.device(name) for name in chosen]
    with PowerMeter(inventory, metered_devices(inventory, chosen), rate_hz=power_rate_hz) as meter:
        t_launch, launch_wall_s = time.monotonic(), time.time()
        launch_s, run_start_wall_s = 0.0, launch_wall_s
        try:
            # the training process starts beside the servers and connects once they are ready
            with launch_cluster(entries, inventory.parameter_server_host, ready_timeout_s=ready_timeout_s,
                                wait=False, isolation=inventory.tf_plane_isolation) as launched:
                if on_launched is not None:
                    on_launched(launched)

                def ready() -> None:
                    nonlocal launch_s, run_start_wall_s
                    launched.wait_ready()
                    launch_s, run_start_wall_s = time.monotonic() - t_launch, time.time()
                    if on_ready is not None:
                        on_ready(launch_s)

                try:
                    result = train_on(launched, chosen, spec, meter, on_progress=on_progress, stop_event=stop_event,
                                      round_steps=round_steps, run_timeout_s=run_timeout_s, log_path=log_path,
                                      ready=ready)
                except TrainingError as error:
                    # asked before the servers are stopped (a PS's log goes with it)
                    ended = launched.ended_servers()
                    servers = f"Servers that ended: {'; '.join(ended)}." if ended else "Every server still ran."
                    raise TrainingError(f"{error.message} {servers}", hint=error.hint) from error
        except KeyboardInterrupt as interrupt:
            now = time.time()
            raise SegmentInterrupted(now - run_start_wall_s, meter.energy_j(run_start_wall_s, now)) from interrupt
        stopped_wall_s = time.time()
        energies = meter.energy_j(result.start_wall_s, result.end_wall_s)
        launch_j = sum(meter.energy_j(launch_wall_s, result.start_wall_s).values())
        stop_j = sum(meter.energy_j(result.end_wall_s, stopped_wall_s).values())
    log.info("run on %s: %d steps in %.1f s, %.1f J", "+".join(chosen), result.steps_applied,
             result.end_wall_s - result.start_wall_s, sum(energies.values()))
    return MeasuredRun(list(chosen), result, energies, launch_s, launch_wall_s, stopped_wall_s, launch_j, stop_j)


def train_on(launched: LaunchedCluster, chosen: Sequence[str], spec: TrainSpec, meter: PowerMeter, *,
             on_progress: ProgressFn | None = None, stop_event: threading.Event | None = None, round_steps: int = 0,
             run_timeout_s: float | None = None, log_path: Path | None = None,
             ready: Callable[[], None] | None = None) -> RunResult:
    """The training half of :func:`run_on_devices`, on servers already up or, with ``ready``
    (see run_job.run_in_subprocess), coming up (also used by the PS-overhead benchmark, which
    compares it with a bare ParameterServerStrategy loop)."""
    from hetcluster.training.run_job import run_in_subprocess

    def progress(done: int, to_do: int, elapsed_s: float) -> None:
        if on_progress is not None:
            on_progress(done, to_do, elapsed_s, meter.live_power_w(chosen))

    return run_in_subprocess(spec, launched.addresses, on_progress=progress, stop_event=stop_event,
                             round_steps=round_steps, timeout_s=run_timeout_s, log_path=log_path, ready=ready,
                             plane=launched.plane)


@dataclass
class JobLedger:
    """The job's record in its working directory: plan, agent tasks, and segments trained."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    # held while the record is changed and written: an elastic job's watching thread writes it too
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    FILE = "train_state.json"

    @classmethod
    def create(cls, workdir: Path, plan_record: dict[str, Any]) -> "JobLedger":
        ledger = cls(Path(workdir) / cls.FILE, {**plan_record, "segments": [], "tasks": {}})
        ledger.save()
        return ledger

    @classmethod
    def load(cls, workdir: Path) -> "JobLedger":
        import json

        path = Path(workdir) / cls.FILE
        if not path.exists():
            raise TrainingError(f"Nothing to resume in {workdir}: no {cls.FILE}.",
                                hint="start the job without --resume, or give the --workdir it ran in.")
        return cls(path, json.loads(path.read_text(encoding="utf-8")))

    @staticmethod
    def exists(workdir: Path) -> bool:
        return (Path(workdir) / JobLedger.FILE).exists()

    def save(self) -> None:
        with self.lock:
            write_json_atomic(self.path, self.data)

    def set_tasks(self, task_ids: dict[str, str]) -> None:
        self.data["tasks"] = dict(task_ids)
        self.save()

    def record_segment(self, segment: dict[str, Any], *, partial: bool = False) -> None:
        """Add a segment; a partial one (in progress) replaces the previous partial entry."""
        with self.lock:
            segments = [s for s in self.data["segments"] if not s.get("partial")]
            segments.append({**segment, "partial": partial})
            self.data["segments"] = segments
            self.save()

    def close_partial(self) -> int:
        """Keep a killed coordinator's in-progress segment as a finished one (its time was spent)."""
        closed = 0
        for segment in self.data["segments"]:
            if segment.get("partial"):
                segment.update(partial=False, killed=True)
                closed += 1
        if closed:
            self.save()
        return closed

    @property
    def segments(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.data["segments"])


def copy_checkpoint(checkpoint_path: str | None, target_dir: Path) -> Path:
    """Copy ONE checkpoint (``.../ckpt-N``: its index and data shards) into a fresh ``target_dir``
    with a ``checkpoint`` index naming it, so a run there restores exactly that state.

    Copying the pre-training checkpoint by its path, not its folder's latest, keeps later training
    in the same folder (``hetcluster train`` continues there) out of the copy.
    """
    import shutil

    target_dir = Path(target_dir)
    if target_dir.exists():
        shutil.rmtree(target_dir)
    target_dir.mkdir(parents=True)
    if not checkpoint_path:
        return target_dir
    source = Path(checkpoint_path)
    files = list(source.parent.glob(f"{source.name}.*"))
    if not any(f.suffix == ".index" for f in files):
        raise TrainingError(f"Checkpoint {checkpoint_path} is gone (no {source.name}.index).",
                            hint="pre-train again, or pass a --profile whose checkpoint still exists.")
    for file in files:
        shutil.copy2(file, target_dir / file.name)
    (target_dir / "checkpoint").write_text(f'model_checkpoint_path: "{source.name}"\n'
                                           f'all_model_checkpoint_paths: "{source.name}"\n', encoding="utf-8")
    return target_dir


def stop_stale_tasks(inventory: Inventory, tasks: dict[str, str]) -> list[str]:
    """Stop worker tasks a killed coordinator left on agents; returns the devices that still had one."""
    stopped = []
    for name, task_id in tasks.items():
        if name not in inventory.names:
            continue
        try:
            with inventory.device(name).client(timeout_s=5.0) as client:
                if any(t.alive for t in client.task_status(task_id)):
                    client.stop_task(task_id)
                    stopped.append(name)
        except AgentError as error:
            log.warning("could not check the old task %s on %s: %s", task_id, name, error)
    return stopped


def segment_record(run: MeasuredRun) -> dict[str, Any]:
    """A ledger entry for a finished (or stopped) segment."""
    r = run.result
    return {"time_s": run.time_s, "energy_j": run.energy_j, "energy_per_device_j": run.energy_per_device_j,
            "launch_s": run.launch_s, "steps_applied": r.steps_applied, "steps_total": r.steps_total,
            "steps_restored": r.steps_restored, "steps_per_worker": r.steps_per_worker,
            "steps_unattributed": r.steps_unattributed, "lost_workers": r.lost_workers,
            "final_loss": r.final_loss, "stopped": r.stopped, "checkpoint_path": r.checkpoint_path,
            "devices": run.devices, "steps_per_s": r.steps_per_s, "memory_plan": r.memory_plan,
            "loss_curve": r.loss_curve, "start_wall_s": r.start_wall_s, "end_wall_s": r.end_wall_s,
            "first_step_wall_s": min((end for _, end, _ in r.step_times), default=None),
            "launch_wall_s": run.launch_wall_s, "stopped_wall_s": run.stopped_wall_s,
            "launch_energy_j": run.launch_energy_j, "stop_energy_j": run.stop_energy_j}
