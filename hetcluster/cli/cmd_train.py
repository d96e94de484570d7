"""`hetcluster train`: plan (pre-training first, or --profile), then train the job on the chosen
devices with TF ParameterServerStrategy, live progress, and a predicted-vs-measured report.

The job lives in --workdir: profile.json, checkpoints/ and train_state.json (the ledger of
coordinator.py). Ctrl-C or SIGTERM stop the run at its next round boundary: every server is
stopped, the checkpoint is kept, and the command prints how to resume (`--resume`).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

import typer
from rich.console import Console

from hetcluster.cli import job_options as opt
from hetcluster.cli.console import make_console
from hetcluster.cli.signals import sigterm_as_interrupt

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import Inventory
    from hetcluster.models.spec import ModelSpec
    from hetcluster.planner.choose import Plan
    from hetcluster.profiling.profile import Profile
    from hetcluster.training.coordinator import JobLedger
    from hetcluster.training.launch import LaunchedCluster
    from hetcluster.training.report import TrainReport

CHECKPOINT_EVERY = typer.Option(
    0, "--checkpoint-every", help="Write a checkpoint every this many steps (0: only at the end)."
)
EXPORT = typer.Option(
    None,
    "--export",
    help="Where the trained model goes (.keras; the weights beside it as .weights.h5) [WORKDIR/model.keras].",
)
PLOT_LOSS = typer.Option(
    None,
    "--plot-loss",
    help="Draw the training loss over the job's steps here (a format matplotlib writes, by the suffix).",
)
REPORT = typer.Option(None, "--report", help="Write the report as JSON here (atomically).")
ALLOW_MISSING = typer.Option(
    False, "--allow-missing", help="Plan without devices whose agent does not answer, instead of failing."
)
ELASTIC = typer.Option(
    False, "--elastic",
    help="Watch the fleet while training: re-plan when a device leaves or joins (the inventory file, each agent's "
         "health) and switch configuration when the predicted saving beats the switch's cost.",
)
ELASTIC_POLL_S = typer.Option(2.0, "--elastic-poll-s", help="With --elastic: seconds between checks of the fleet.")


def train_command(
    objective: str = opt.OBJECTIVE,
    inventory: Path = opt.INVENTORY,
    model: Optional[str] = opt.MODEL,
    model_config: Optional[Path] = opt.MODEL_CONFIG,
    input_shape: Optional[str] = opt.INPUT_SHAPE,
    classes: Optional[int] = opt.CLASSES,
    batch_size: int = opt.BATCH_SIZE,
    data: Optional[Path] = opt.DATA,
    eval_data: Optional[Path] = opt.EVAL_DATA,
    eval_split: Optional[float] = opt.EVAL_SPLIT,
    optimizer: str = opt.OPTIMIZER,
    learning_rate: float = opt.LEARNING_RATE,
    total_steps: int = opt.TOTAL_STEPS,
    pretrain_steps: int = opt.PRETRAIN_STEPS,
    warmup_steps: int = opt.WARMUP_STEPS,
    pretrain_budget: float = opt.PRETRAIN_BUDGET,
    pretrain_protocol: str = opt.PRETRAIN_PROTOCOL,
    remeasure: bool = opt.REMEASURE,
    workdir: Path = opt.WORKDIR,
    profile: Optional[Path] = opt.PROFILE,
    deadline: Optional[float] = opt.DEADLINE,
    max_power: Optional[float] = opt.MAX_POWER,
    max_energy: Optional[float] = opt.MAX_ENERGY,
    require: Optional[List[str]] = opt.REQUIRE,
    exclude: Optional[List[str]] = opt.EXCLUDE,
    device_kind: Optional[str] = opt.DEVICE_KIND,
    checkpoint_every: int = CHECKPOINT_EVERY,
    report: Optional[Path] = REPORT,
    export: Optional[Path] = EXPORT,
    plot_loss: Optional[Path] = PLOT_LOSS,
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the job in --workdir from its latest checkpoint (its plan and options are reused).",
    ),
    allow_missing: bool = ALLOW_MISSING,
    elastic: bool = ELASTIC,
    elastic_poll_s: float = ELASTIC_POLL_S,
    round_steps: int = typer.Option(
        0, "--round-steps", hidden=True, help="Steps between the engine's joins (0: its default)."
    ),
) -> None:
    """Plan, then train the job on the chosen devices and report predicted against measured."""
    from hetcluster.errors import ConfigError

    if checkpoint_every < 0:
        raise ConfigError(f"--checkpoint-every {checkpoint_every} is negative.", hint="give 0 or a step count.")
    if not elastic_poll_s > 0:
        raise ConfigError(f"--elastic-poll-s {elastic_poll_s} is not a positive number of seconds.",
                          hint="e.g. --elastic-poll-s 2.")
    from hetcluster.fileio import check_writable

    for path in (report, export):
        if path is not None:
            check_writable(path)   # before training, not after it
    if export is not None and export.suffix != ".keras":
        raise ConfigError(
            f"--export {export}: the model file ends in .keras.", hint=f"use --export {export.with_suffix('.keras')}."
        )
    opt.check_plot(plot_loss)
    console = make_console()
    workdir = workdir.resolve()
    prepared = None
    if not resume:  # the model and the data are checked before any agent is asked anything
        opt.check_objective(objective)
        opt.check_pretrain_budget(pretrain_budget)
        spec = opt.model_spec(model, input_shape, classes, batch_size, model_config)
        prepared = (spec, opt.training(data, eval_data, eval_split, optimizer, learning_rate, spec, console))
        from hetcluster.cli.pretraining import PretrainOptions, check_budget_up_front, check_profile_file

        check_profile_file(profile, *prepared)
        check_budget_up_front(total_steps, workdir, profile,
                              PretrainOptions(pretrain_steps, warmup_steps, pretrain_budget, pretrain_protocol))
    with sigterm_as_interrupt():  # the same path as Ctrl-C: stop the run, stop the servers, keep the checkpoint
        fleet = opt.load_fleet(inventory)
        if resume:
            job = _resume_job(fleet, workdir, allow_missing, console, {"poll_s": elastic_poll_s} if elastic else None)
        else:
            elastic_record = {"poll_s": elastic_poll_s} if elastic else None
            job = _new_job(fleet, workdir, console, allow_missing, checkpoint_every, export, elastic_record, dict(
                objective=objective, inventory=inventory, model=model, model_config=model_config,
                input_shape=input_shape, classes=classes, batch_size=batch_size, data=data, eval_data=eval_data,
                eval_split=eval_split, optimizer=optimizer, learning_rate=learning_rate, total_steps=total_steps,
                pretrain_steps=pretrain_steps, warmup_steps=warmup_steps, pretrain_budget=pretrain_budget,
                pretrain_protocol=pretrain_protocol, remeasure=remeasure, workdir=workdir, profile=profile,
                deadline=deadline, max_power=max_power, max_energy=max_energy, require=require, exclude=exclude,
                device_kind=device_kind, prepared=prepared))
        train_ledger(fleet, job, console, round_steps=round_steps, allow_missing=allow_missing, resumed=resume,
                     resume_hint=f"hetcluster train --inventory {inventory} --workdir {workdir} --resume")
        export_job_model(job, console)
    final = build_report(job)
    if final.segments > 1 or "elastic" in job.data:
        from hetcluster.cli.train_output import timeline_table

        console.print(timeline_table(final))
    console.print(_report_table(final))
    if final.model_path:
        console.print(f"model: {final.model_path} (tf_keras.models.load_model; weights: {final.weights_path})")
    if report is not None:
        from hetcluster.fileio import write_json_atomic

        write_json_atomic(report, final.to_dict())
        console.print(f"report: {report}")
    if plot_loss is not None:
        from hetcluster.cli.train_output import plot_loss_curve

        plot_loss_curve(final, plot_loss)
        console.print(f"loss curve: {plot_loss}")


def _report_table(report: TrainReport) -> Any:
    from hetcluster.cli.train_output import report_table

    return report_table(report)


def _missing_error(missing: dict[str, str]) -> Exception:
    from hetcluster.errors import AgentError

    text = "; ".join(f"device {name}: {reason}" for name, reason in missing.items())
    return AgentError(f"Unreachable at start: {text}.",
                      hint="start the agent(s), or pass --allow-missing to plan without them.")


def _replan_without(plan: Plan, names: list[str]) -> Any:
    """Choose again from the same predictions with ``names`` excluded (no new pre-training)."""
    from hetcluster.planner import Exclude, choose

    known = plan.table.attrs.get("device_names") or sorted({n for row in plan.table["devices"] for n in row})
    drop = tuple(n for n in names if n in known)
    return plan if not drop else choose(plan.table, plan.objective, (*plan.constraints, Exclude(drop)))


def _new_job(fleet: Inventory, workdir: Path, console: Console, allow_missing: bool, checkpoint_every: int,
             export: Path | None, elastic: dict[str, Any] | None, options: dict[str, Any]) -> Any:
    """Check the agents, pre-train or load the profile, plan, and write the job's ledger."""
    from hetcluster.cli.cmd_plan import make_plan
    from hetcluster.cli.plan_output import print_table
    from hetcluster.cli.pretraining import profile_paths
    from hetcluster.errors import ConfigError
    from hetcluster.profiling.profile import save_profile
    from hetcluster.training.coordinator import JobLedger, check_agents
    from hetcluster.training.report import JobMetrics
    from hetcluster.training.spec import TrainSpec

    if JobLedger.exists(workdir):
        raise ConfigError(f"{workdir} already holds a training job.",
                          hint="continue it with --resume, or pass a new --workdir.")
    missing = check_agents(fleet, fleet.names)
    if missing and not allow_missing:
        raise _missing_error(missing)
    for name, reason in missing.items():
        console.print(f"[yellow]warning:[/] planning without {name}: {reason}")
    plan, profile, spec, training, budgets = make_plan(console=console, fleet=fleet, **options)
    # and without devices the profile measured that the inventory no longer lists (nothing could launch them)
    plan = _replan_without(plan, [*missing, *(d.name for d in profile.devices if d.name not in fleet.names)])
    print_table(plan, console=console)
    profile_path, checkpoint_dir = profile_paths(workdir)
    _adopt_checkpoint(profile, checkpoint_dir)
    if not profile_path.exists():
        save_profile(profile, profile_path)
    memory = budgets.training_memory(spec, plan.chosen)
    console.print(memory.describe())
    train = TrainSpec(model=spec, total_steps=int(options["total_steps"]), data=training.data,
                      checkpoint_dir=str(checkpoint_dir), checkpoint_every_steps=checkpoint_every,
                      **memory.spec_fields(),
                      optimizer=training.optimizer, learning_rate=training.learning_rate)
    model_path = (export or workdir / "model.keras").expanduser().absolute()
    record = {"objective": plan.objective.name, "chosen": list(plan.chosen),
              "export": {"model_path": str(model_path),
                         "eval_data": training.eval_data.to_dict() if training.eval_data else None},
              "predicted": JobMetrics.from_mapping(plan.chosen_row).to_dict(), "train_spec": train.to_dict(),
              "pretrain": {"steps": profile.pretrain_steps, "time_s": profile.pretrain_time_s,
                           "energy_j": profile.pretrain_energy_j},
              "pretrain_loss_curve": [w for w in profile.loss_curve if w["last_step"] <= profile.pretrain_steps],
              "plan_table": _plan_rows(plan),
              "constraints": opt.constraints_record(*(options[k] for k in ("deadline", "max_power", "max_energy",
                                                                           "require", "exclude")))}
    if elastic is not None:
        record["elastic"] = dict(elastic)
    return JobLedger.create(workdir, record)


def _plan_rows(plan: Plan) -> list[dict[str, Any]]:
    from hetcluster.cli.plan_output import plan_to_dict

    return plan_to_dict(plan, limit=64)["configurations"]


def _adopt_checkpoint(profile: Profile, checkpoint_dir: Path) -> None:
    """The job trains on from the pre-training checkpoint in its own workdir (a --profile's is copied)."""
    from hetcluster.training.checkpoints import checkpoint_steps
    from hetcluster.training.coordinator import copy_checkpoint

    source = Path(profile.checkpoint_dir) if profile.checkpoint_dir else None
    if source is not None and source.resolve() == checkpoint_dir.resolve():
        return  # pre-trained right here
    if checkpoint_steps(checkpoint_dir) == 0:
        copy_checkpoint(profile.checkpoint_path, checkpoint_dir)


def _resume_job(fleet: Inventory, workdir: Path, allow_missing: bool, console: Console,
                elastic: dict[str, Any] | None = None) -> Any:
    """Load the ledger, stop workers a killed coordinator left behind, check the chosen agents.
    ``elastic``: --elastic given now, for a job started without it."""
    from hetcluster.training.checkpoints import checkpoint_steps
    from hetcluster.training.coordinator import JobLedger, check_agents, stop_stale_tasks

    ledger = JobLedger.load(workdir)
    if elastic is not None and "elastic" not in ledger.data:
        ledger.data["elastic"] = dict(elastic)
    ledger.close_partial()
    stale = stop_stale_tasks(fleet, ledger.data.get("tasks", {}))
    if stale:
        console.print(f"stopped workers left by the previous coordinator on: {', '.join(stale)}")
    missing = check_agents(fleet, ledger.data["chosen"])
    elastic = "elastic" in ledger.data   # it re-plans without them (train_ledger)
    if missing and not (allow_missing or elastic):
        raise _missing_error(missing)
    if missing:
        kept = [n for n in ledger.data["chosen"] if n not in missing]
        if not kept and not elastic:
            raise _missing_error(missing)
        console.print(f"[yellow]warning:[/] continuing without {', '.join(missing)}; "
                      + ("re-planning" if elastic else "the prediction is the original plan's"))
        ledger.data["chosen"] = [] if elastic else kept
        ledger.save()
    steps = checkpoint_steps(ledger.data["train_spec"]["checkpoint_dir"])
    console.print(f"resuming on {' + '.join(ledger.data['chosen'])} from the checkpoint at step {steps} "
                  f"of {ledger.data['train_spec']['total_steps']}")
    return ledger


def train_ledger(
    fleet: Inventory,
    ledger: JobLedger,
    console: Console,
    *,
    round_steps: int = 0,
    allow_missing: bool = False,
    resume_hint: str = "",
    resumed: bool = False,
) -> None:
    """Train the ledger's job to its total on its chosen devices; record the segment(s). An
    elastic job (``ledger.data["elastic"]``) watches its fleet meanwhile and switches configuration
    when that pays; ``resumed``, it first re-plans over the fleet as it is now (every option a
    fresh launch: a coordinator killed mid-switch may have left either configuration in the ledger)."""
    from hetcluster.training.checkpoints import checkpoint_steps
    from hetcluster.training.coordinator import SegmentInterrupted, run_on_devices, segment_record
    from hetcluster.training.launch import DeviceLaunchError
    from hetcluster.training.spec import TrainSpec

    spec = TrainSpec.from_dict(ledger.data["train_spec"])
    elastic = None
    if "elastic" in ledger.data:
        from hetcluster.cli.elastic import ElasticJob

        elastic = ElasticJob(fleet, ledger, console)
        if (resumed or not ledger.data["chosen"]) and checkpoint_steps(spec.checkpoint_dir) < spec.total_steps:
            spec = elastic.adopt(elastic.fresh_plan())
    while True:
        restored = checkpoint_steps(spec.checkpoint_dir)
        if restored >= spec.total_steps:
            return
        chosen = list(ledger.data["chosen"])
        display = LiveProgress(console, spec.total_steps, restored, ledger)
        notes = elastic.segment_notes(chosen, restored) if elastic is not None else {}
        rounds = round_steps or (elastic.round_steps(chosen) if elastic is not None else 0)

        def launched_hook(launched: LaunchedCluster) -> None:
            ledger.set_tasks(launched.task_ids)
            if stopper.event.is_set() and stopper.signalled:  # stopped while the servers started: nothing to train
                raise KeyboardInterrupt

        def on_progress(done: int, to_do: int, elapsed_s: float, power_w: float) -> None:
            display.update(done, to_do, elapsed_s, power_w)
            if elastic is not None:
                elastic.on_progress(done, to_do, elapsed_s, power_w)

        try:
            with StopOnSignal() as stopper, display, _watching(elastic, chosen, restored, stopper.event):
                run = run_on_devices(elastic.fleet if elastic is not None else fleet, chosen, spec,
                                     on_progress=on_progress, on_launched=launched_hook, stop_event=stopper.event,
                                     round_steps=rounds, on_ready=elastic.on_ready if elastic is not None else None)
        except SegmentInterrupted as interrupt:
            applied = checkpoint_steps(spec.checkpoint_dir) - restored
            ledger.record_segment({"time_s": interrupt.time_s, "energy_j": sum(interrupt.energy_per_device_j.values()),
                                   "energy_per_device_j": interrupt.energy_per_device_j, "steps_applied": applied,
                                   "steps_total": restored + applied, "steps_restored": restored,
                                   "steps_per_worker": {}, "lost_workers": [], "stopped": True,
                                   "devices": ledger.data["chosen"]})
            _stopped(ledger, console, spec, resume_hint)
        except DeviceLaunchError as error:
            if not (allow_missing or elastic is not None) or len(ledger.data["chosen"]) == 1:
                raise
            console.print(f"[yellow]warning:[/] {error.device} could not start its worker; continuing without it")
            ledger.data["chosen"] = [n for n in ledger.data["chosen"] if n != error.device]
            ledger.save()
            continue
        record = {**segment_record(run), **notes}
        ledger.record_segment(record)
        ledger.set_tasks({})
        if elastic is not None:
            elastic.finish_switch(record)
            if elastic.decision is not None and not stopper.signalled:
                if run.result.stopped:
                    spec = elastic.adopt(elastic.begin_switch(record))
                    continue
                elastic.say("the job reached its total before the switch")
        if run.result.stopped:
            _stopped(ledger, console, spec, resume_hint)
        return


def _watching(elastic: Any, chosen: list[str], restored: int, stop: threading.Event) -> Any:
    import contextlib

    return elastic.watching(chosen, restored, stop) if elastic is not None else contextlib.nullcontext()


def export_job_model(ledger: JobLedger, console: Console) -> None:
    """Export the trained model and score it on the held-out data, once per finished job (the ledger
    keeps the result; a job resumed after its end exports again only if that failed)."""
    from hetcluster.models.datasets import DataSource
    from hetcluster.training.checkpoints import checkpoint_steps, latest_checkpoint
    from hetcluster.training.export import export_in_subprocess
    from hetcluster.training.spec import TrainSpec

    spec = TrainSpec.from_dict(ledger.data["train_spec"])
    target = ledger.data.setdefault("export", {"model_path": str(Path(spec.checkpoint_dir).parent / "model.keras")})
    steps = checkpoint_steps(spec.checkpoint_dir)
    if steps < spec.total_steps or (target.get("result") and target.get("steps") == steps):
        return
    eval_source = DataSource.from_dict(target["eval_data"]) if target.get("eval_data") else None
    with console.status("exporting the model (BatchNorm statistics for its final weights"
                        + (", held-out evaluation)" if eval_source else ")")):
        result = export_in_subprocess(spec, latest_checkpoint(spec.checkpoint_dir), Path(target["model_path"]),
                                      eval_source)
    target.update(result=result.to_dict(), steps=steps)
    ledger.save()


def _stopped(ledger: JobLedger, console: Console, spec: ModelSpec, resume_hint: str) -> None:
    from hetcluster.training.checkpoints import checkpoint_steps

    ledger.set_tasks({})
    console.print(
        f"[yellow]interrupted:[/] servers stopped; checkpoint at step {checkpoint_steps(spec.checkpoint_dir)} "
        f"of {spec.total_steps} kept in {spec.checkpoint_dir}. Resume with: {resume_hint}"
    )
    raise typer.Exit(130)


class StopOnSignal:
    """While a run trains: the first SIGINT/SIGTERM asks it to stop at its next round boundary (the
    engine then checkpoints and still returns its result, per-worker counts included); a second
    one interrupts at once (KeyboardInterrupt: servers stopped, the run's process checkpoints)."""

    def __init__(self) -> None:
        self.event = threading.Event()   # also set by an elastic job's switch: ``signalled`` tells them apart
        self.signalled = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signalled:
            raise KeyboardInterrupt
        self.signalled = True
        self.event.set()

    def __enter__(self) -> "StopOnSignal":
        self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class LiveProgress:
    """The rich progress line of a training run (steps, steps/s, power); also keeps the ledger's
    in-progress segment current every few seconds, so a killed coordinator loses little accounting."""

    def __init__(self, console: Console, total_steps: int, restored: int, ledger: JobLedger = None,
                 label: str = "training", record_every_s: float = 5.0) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[power]}"),
                                  TimeElapsedColumn(), console=console, transient=False)
        self._task = self._progress.add_task(label, total=total_steps, completed=restored, rate="", power="")
        self._restored, self._ledger, self._record_every_s = restored, ledger, record_every_s
        self._energy_j = 0.0
        self._last: tuple[float, float] | None = None
        self._last_record_s = time.monotonic()
        self._lock = threading.Lock()

    def __enter__(self) -> "LiveProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, done: int, to_do: int, elapsed_s: float, power_w: float) -> None:
        with self._lock:
            if self._last is not None:  # trapezoid over the polled live power (in-progress estimate only)
                self._energy_j += 0.5 * (power_w + self._last[1]) * max(0.0, elapsed_s - self._last[0])
            self._last = (elapsed_s, power_w)
        rate = done / elapsed_s if elapsed_s > 0 else 0.0
        self._progress.update(self._task, completed=self._restored + done, rate=f"{rate:.1f} steps/s",
                              power=f"{power_w:.1f} W")
        if self._ledger is not None and time.monotonic() - self._last_record_s >= self._record_every_s:
            self._last_record_s = time.monotonic()
            self._ledger.record_segment({"time_s": elapsed_s, "energy_j": self._energy_j, "steps_applied": done,
                                         "steps_restored": self._restored, "steps_per_worker": {},
                                         "lost_workers": [], "approximate": True}, partial=True)


def build_report(ledger: JobLedger) -> Any:
    """The whole job's report from the ledger: pre-training plus every segment trained."""
    from hetcluster.training.checkpoints import checkpoint_steps, latest_checkpoint
    from hetcluster.training.report import JobMetrics, TrainReport, job_timeline, measured_metrics

    data, segments = ledger.data, ledger.segments
    pre = data["pretrain"]
    events = (data.get("elastic") or {}).get("events", [])
    switches = [e for e in events if e.get("kind") == "switch" and e.get("gap_s") is not None]
    switch_s = sum(float(e["gap_s"]) for e in switches)
    # a joining device measured alone trains beside the job (no time added), on energy the job spends
    measure_j = sum(float(e.get("energy_j") or 0.0) for e in events if e.get("kind") == "figures")
    run_time_s = sum(s["time_s"] for s in segments) + switch_s
    run_energy_j = (sum(s["energy_j"] for s in segments) + sum(float(e.get("gap_energy_j") or 0.0) for e in switches)
                    + measure_j)
    per_worker: dict[str, int] = {}
    per_device_j: dict[str, float] = {}
    lost: list[str] = []
    for segment in segments:
        for name, steps in segment.get("steps_per_worker", {}).items():
            per_worker[name] = per_worker.get(name, 0) + int(steps)
        for name, joules in segment.get("energy_per_device_j", {}).items():
            per_device_j[name] = per_device_j.get(name, 0.0) + float(joules)
        lost += [n for n in segment.get("lost_workers", []) if n not in lost]
    checkpoint_dir = data["train_spec"]["checkpoint_dir"]
    steps_total = checkpoint_steps(checkpoint_dir)
    finished = [s for s in segments if "final_loss" in s]
    exported = (data.get("export") or {}).get("result") or {}
    return TrainReport(
        objective=data["objective"],
        chosen=list(data["chosen"]),
        predicted=JobMetrics(**data["predicted"]),
        measured=measured_metrics(pre["time_s"], pre["energy_j"], run_time_s, run_energy_j),
        steps_total=steps_total,
        steps_per_worker=per_worker,
        lost_workers=lost,
        final_loss=finished[-1]["final_loss"] if finished else None,
        steps_restored=int(pre["steps"]),
        steps_applied=steps_total - int(pre["steps"]),
        steps_unattributed=sum(int(s.get("steps_unattributed", 0)) for s in segments),
        pretrain=dict(pre),
        run={
            "time_s": run_time_s,
            "energy_j": run_energy_j,
            "launch_s": sum(float(s.get("launch_s", 0.0)) for s in segments),
            "switch_s": switch_s,
            "switches": len(switches),
            "measure_energy_j": measure_j,
        },
        energy_per_device_j=per_device_j,
        stopped=steps_total < int(data["train_spec"]["total_steps"]),
        checkpoint_path=latest_checkpoint(checkpoint_dir),
        segments=len(segments),
        memory_plan=finished[-1].get("memory_plan", "") if finished else "",
        loss_curve=data.get("pretrain_loss_curve", [])
        + [window for s in finished for window in s.get("loss_curve", [])],
        model_path=exported.get("model_path"),
        weights_path=exported.get("weights_path"),
        held_out=exported.get("held_out"),
        timeline=job_timeline(segments, events),
    )


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
