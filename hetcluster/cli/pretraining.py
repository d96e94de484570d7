"""Get a job's pre-training profile (from a file or by pre-training now) and turn it into planner
inputs with each device's memory fit — shared by `profile`, `plan`, `train` and `evaluate`.

Every I/O happens here, before the (pure) planner runs: agents are asked for their memory budget
and kind only when the inventory does not say, once per command (DeviceBudgets), and the memory
scheduler sizes each device's plan.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from hetcluster.profiling.lanes import DEFAULT_BUDGET_SHARE

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import Inventory
    from hetcluster.models.spec import ModelSpec
    from hetcluster.profiling.profile import Profile
    from hetcluster.training.spec import Training

log = logging.getLogger(__name__)


def profile_paths(workdir: Path) -> tuple[Path, Path]:
    """(profile JSON, checkpoint dir) of a job's working directory."""
    workdir = workdir.resolve()  # the profile records the checkpoint path; keep it valid from any cwd
    return workdir / "profile.json", workdir / "checkpoints"


@dataclasses.dataclass(frozen=True)
class PretrainOptions:
    """How a command pre-trains: steps per run and their warm-up, the budget (a share of the job),
    the protocol (profiling.pretrain.PROTOCOLS), and the objectives and constraints whose choice
    decides whether a further calibration set is worth its seconds (none: every set)."""

    steps_per_run: int = 20
    warmup_steps: int = 4
    budget_share: float = DEFAULT_BUDGET_SHARE
    protocol: str = "lanes"
    objectives: tuple[str, ...] = ()
    constraints: tuple[Any, ...] = ()
    reuse_known: bool = True   # devices measured for this job before are not measured alone again


def run_pretraining_with_display(
    fleet: Inventory,
    spec: ModelSpec,
    training: Training,
    workdir: Path,
    *,
    options: PretrainOptions,
    console: Console,
    budgets: "DeviceBudgets",
    device_names: list[str] | None = None,
    total_steps: int | None = None,
) -> Any:
    """Pre-train on the fleet with a rich progress display; save the profile atomically. Every run
    trains under the memory plan training would give its devices (``memory.fit.training_memory``), so a
    device that plain TensorFlow does not fit is measured under its plan."""
    from hetcluster.fileio import check_writable
    from hetcluster.memory.fit import TrainingMemory
    from hetcluster.memory.model_graph import spec_graph
    from hetcluster.profiling.pretrain import PretrainSettings, run_pretraining, solo_run_count
    from hetcluster.profiling.profile import save_profile

    profile_path, checkpoint_dir = profile_paths(workdir)
    check_writable(profile_path)   # before the runs, not after them
    if spec.keras_config is not None:  # a user's model, built once here in safe mode (its memory graph kept):
        spec_graph(spec)                # a config the training processes would refuse fails now
    settings = PretrainSettings.for_job(options.steps_per_run, options.warmup_steps, total_steps,
                                        solo_run_count(fleet, device_names or fleet.names),
                                        optimizer=training.optimizer, learning_rate=training.learning_rate,
                                        budget_share=options.budget_share, protocol=options.protocol)
    settings = dataclasses.replace(settings, reuse_known=options.reuse_known)
    console.print(budget_line(settings, total_steps), markup=False, highlight=False, soft_wrap=True)
    plans: dict[frozenset, TrainingMemory] = {}

    def memory(names: Any) -> TrainingMemory:  # a device's budget is asked when it first runs: past its health check
        key = frozenset(names)
        if key not in plans:
            plans[key] = budgets.training_memory(spec, names)
        return plans[key]

    open_choice = None
    if options.objectives and total_steps:
        open_choice = _choice_check(fleet, spec, total_steps, budgets, options)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        profile = run_pretraining(fleet, spec, str(checkpoint_dir), data=training.data, settings=settings,
                                  device_names=device_names, on_event=_display(progress), memory=memory,
                                  open_choice=open_choice)
    profile.training = training.recorded()
    save_profile(profile, profile_path)
    console.print(f"pre-training: {profile.pretrain_steps} steps in {profile.pretrain_time_s:.1f} s, "
                  f"{profile.pretrain_energy_j:.0f} J; profile {profile_path}")
    for line in class_copy_lines(profile):
        console.print(line)
    return profile


def budget_line(settings: Any, total_steps: int | None) -> str:
    """What pre-training may take, said before it starts."""
    if settings.protocol != "lanes":
        return "pre-training: one run at a time (sequential protocol)"
    if not total_steps or settings.budget_share <= 0:
        return "pre-training: every device alone, then the calibration sets (no job size: no budget)"
    return (f"pre-training budget: {settings.budget_share:.0%} of the job — at most {settings.budget_steps} of its "
            f"{total_steps} steps count toward it, and a run beyond each device alone and the fleet together only "
            f"while it fits {settings.budget_share:.0%} of the job's predicted time")


def _display(progress: Progress) -> Any:
    """The phase's events on a rich display: a bar per run (runs on lanes train at once)."""
    overall = progress.add_task("pre-training runs", total=None)
    bars: dict[str, Any] = {}

    def run_label(details: dict[str, Any]) -> str:
        plan = details.get("memory_plan") or getattr(details.get("result"), "memory_plan", "")
        opening = " (opening: warms the workers, not measured)" if details.get("what") == "opening" else ""
        return "+".join(details["devices"]) + (f" (memory plan {plan})" if plan else "") + opening

    def on_event(kind: str, details: dict[str, Any]) -> None:
        key = "+".join(details.get("devices", ()))
        if kind == "run_start":
            bars[key] = progress.add_task(f"  run {run_label(details)}", total=details["steps"])
        elif kind == "progress" and key in bars:
            progress.update(bars[key], completed=details["done"], total=details["to_do"])
        elif kind == "run_done" and key in bars:
            lost = f" (lost: {', '.join(details['lost'])})" if details.get("lost") else ""
            progress.update(bars.pop(key), description=f"  run {run_label(details)}: "
                            f"{details['steps_per_s']:.2f} steps/s{lost}")
            progress.advance(overall)
        elif kind == "idle":
            watts = ", ".join(f"{n} {w:.1f} W" for n, w in details["idle_power_w"].items())
            progress.console.print(f"idle power: {watts}")
        elif kind == "plan":
            progress.console.print(details["line"], markup=False, highlight=False)
        elif kind == "excluded":
            who = details.get("device") or "+".join(details.get("run", []))
            progress.console.print(f"[yellow]warning:[/] excluded {who}: {details['reason']}")

    return on_event


def _choice_check(fleet: Inventory, spec: ModelSpec, total_steps: int, budgets: "DeviceBudgets",
                  options: PretrainOptions) -> Any:
    """The planner's opinion of a profile so far (profiling.lane_phase.ChoiceFn): open while some
    objective's choice has a near-tie; the training time it predicts for the rest of the job."""
    from hetcluster.errors import PlanningError
    from hetcluster.planner import plan as make
    from hetcluster.profiling.lane_phase import ChoiceCheck

    def check(profile: Profile) -> ChoiceCheck:
        devices, runs, job = planner_inputs(profile, fleet, spec, total_steps, budgets)
        ties, training_s = [], 0.0
        for objective in options.objectives:
            try:
                plan = make(devices, runs, job, objective, options.constraints)
            except PlanningError:
                continue
            training_s = max(training_s, float(plan.chosen_row["time_s"]) - job.pretrain_time_s)
            near = plan.near_ties(limit=1)
            if len(near):
                ties.append(f"{objective}: {'+'.join(plan.chosen)} and {'+'.join(near.iloc[0]['devices'])}")
        why = "near-tie " + "; ".join(ties) if ties else f"a clear choice for {', '.join(options.objectives)}"
        return ChoiceCheck(bool(ties), training_s, why)

    return check


def class_copy_lines(profile: Profile) -> list[str]:
    """One line per device measured for its class: which identical devices took its figures."""
    copies: dict[str, list[str]] = {}
    for device in profile.devices:
        if device.measured_on:
            copies.setdefault(device.measured_on, []).append(device.name)
    return [f"  measured once for its class: {source} stands for {', '.join(names)}"
            for source, names in copies.items()]


def obtain_profile(
    fleet: Inventory,
    spec: ModelSpec,
    training: Training,
    workdir: Path,
    profile: Path | None,
    *,
    options: PretrainOptions,
    console: Console,
    budgets: "DeviceBudgets",
    total_steps: int | None = None,
) -> Any:
    """The profile given with --profile, else the workdir's when it measured this job on this fleet
    and nothing trained on from its checkpoint since (``plan`` then ``train``), else a fresh
    pre-training run."""
    from hetcluster.profiling.profile import load_profile

    if profile is not None:
        loaded = load_profile(profile)
        check_profile_job(loaded, spec, profile, training)
        _adopt_memory_graph(loaded, spec)
        return loaded
    reused = workdir_profile(workdir, fleet, spec, training)
    if reused is not None:
        import time

        age_min = max(0.0, time.time() - reused.created_wall_s) / 60
        console.print(f"pre-training: reusing {profile_paths(workdir)[0]} ({reused.pretrain_steps} steps, made "
                      f"{age_min:.0f} min ago for this job and fleet); delete it to measure again",
                      markup=False, highlight=False, soft_wrap=True)
        _adopt_memory_graph(reused, spec)
        return reused
    check_job_fits_budget(total_steps, options)
    return run_pretraining_with_display(fleet, spec, training, workdir, options=options, console=console,
                                        budgets=budgets, total_steps=total_steps)


def workdir_profile(workdir: Path, fleet: Inventory, spec: ModelSpec, training: Training) -> Any:
    """The profile in ``workdir`` when it measured this job (model, input, batch, data, optimizer)
    on this fleet's devices and its checkpoint still stands where pre-training left it; else None."""
    from hetcluster.errors import ProfileError
    from hetcluster.profiling.profile import load_profile
    from hetcluster.training.checkpoints import checkpoint_steps

    path, checkpoint_dir = profile_paths(workdir)
    if not path.exists():
        return None
    try:
        found = load_profile(path)
        check_profile_job(found, spec, path, training)
    except ProfileError:
        return None
    measured = {d.name for d in found.devices} | set(found.excluded)
    if measured != set(fleet.names) or getattr(found, "training", None) is None:
        return None
    if checkpoint_steps(found.checkpoint_dir or checkpoint_dir) != found.pretrain_steps:
        return None   # a job trained on from it: its checkpoint is no longer pre-training's
    return found


def check_budget_up_front(total_steps: int | None, workdir: Path, profile: Path | None,
                          options: PretrainOptions) -> None:
    """Before any agent is asked: a job that will pre-train (no --profile, no profile in its
    workdir) fits its budget (check_job_fits_budget)."""
    if profile is None and not profile_paths(workdir)[0].exists():
        check_job_fits_budget(total_steps, options)


def check_job_fits_budget(total_steps: int | None, options: PretrainOptions) -> None:
    """Before any server starts: a job whose budget holds no measured window is refused."""
    from hetcluster.errors import ConfigError
    from hetcluster.profiling.pretrain import MIN_SOLO_WINDOW_STEPS, budget_steps

    if not total_steps or options.protocol != "lanes":
        return
    budget = budget_steps(total_steps, options.budget_share)
    needed = options.warmup_steps + MIN_SOLO_WINDOW_STEPS
    if budget < needed:
        least = math.ceil(needed / options.budget_share)
        while budget_steps(least, options.budget_share) < needed:   # the share's float rounding
            least += 1
        raise ConfigError(
            f"A job of {total_steps} steps is too short to plan: its pre-training budget "
            f"({options.budget_share:.0%}, {budget} steps) holds no measured window ({needed} steps).",
            hint=f"give --total-steps {least} or more, a larger --pretrain-budget, or a --profile of this job.")


def check_profile_file(path: Path | None, spec: ModelSpec, training: Training) -> None:
    """Before any agent is asked: the --profile (if any) measured this job (check_profile_job)."""
    if path is not None:
        from hetcluster.profiling.profile import load_profile

        check_profile_job(load_profile(path), spec, path, training)


def check_profile_job(profile: Profile, spec: ModelSpec, path: Path, training: Training = None) -> None:
    """A ProfileError unless the profile measured this job: its model, input shape, classes and
    batch size (each step's time and power depend on all four; a field the profile lacks passes),
    and its data and optimizer (the checkpoint it leaves trained on them)."""
    from hetcluster.errors import ProfileError

    difference = training.difference(getattr(profile, "training", None)) if training is not None else None
    if difference:
        raise ProfileError(f"Profile {path} was made with {difference}.",
                           hint="give the options it was made with, or pre-train again without --profile.")

    measured = profile.model
    fields = (
        ("model", "name", "--model", str),
        ("input shape", "input_shape", "--input-shape", lambda v: "x".join(map(str, v))),
        ("classes", "classes", "--classes", str),
        ("batch size", "batch_size", "--batch-size", str),
    )
    wrong = [(what, flag, show(measured[key]), show(getattr(spec, key))) for what, key, flag, show in fields
             if measured.get(key) is not None and show(measured[key]) != show(getattr(spec, key))]
    if not wrong:
        return
    measured_for = ", ".join(f"{what} {was}" for what, _, was, _ in wrong)
    if measured.get("keras_config"):  # a user's model: its name holds a digest of its config, not a flag's value
        measured_for += " (a model config)"
        flags = f"--model-config with the config of {measured['name']} (and --batch-size {measured.get('batch_size')})"
    else:
        flags = " ".join(f"{flag} {was}" for _, flag, was, _ in wrong)
    raise ProfileError(f"Profile {path} was measured for {measured_for}, not {', '.join(now for *_, now in wrong)}.",
                       hint=f"pass {flags}, or pre-train again without --profile.")


def _adopt_memory_graph(profile: Profile, spec: ModelSpec) -> None:
    """Plan memory on the layer graph the profile recorded, when it is this job's model (same
    input shape and classes): the planner then needs no TensorFlow to build the model again."""
    from hetcluster.memory.fit import remember_graph
    from hetcluster.memory.graph import LayerGraph

    model = profile.model
    same_model = (model.get("name"), list(model.get("input_shape", ())), model.get("classes")) == \
        (spec.name, list(spec.input_shape), spec.classes)
    if profile.memory_graph and same_model:
        remember_graph(spec.name, spec.input_shape, spec.classes, LayerGraph.from_dict(profile.memory_graph))


def _budget_and_kind(entry: Any, device_kind: str | None) -> tuple[int | None, str]:
    """The device's memory budget and kind: the command line and inventory first, then the
    agent's own report; an unreachable agent leaves the budget unknown and the kind "cpu"."""
    budget, kind = entry.memory_budget_bytes, device_kind
    if budget is None or kind is None:
        try:
            with entry.client(timeout_s=3.0) as client:
                info = client.device_info()
            budget = budget if budget is not None else (info.memory_budget_bytes or info.memory_bytes)
            kind = kind or info.device_kind or "cpu"
        except Exception as error:  # an unreachable agent
            level = logging.WARNING if budget is None else logging.INFO
            log.log(level, "%s: agent not asked for its memory (%s); %s", entry.name, error,
                    "assuming the job fits" if budget is None else "assuming device kind cpu")
    return budget, kind or "cpu"


class DeviceBudgets:
    """Each inventory device's memory budget and kind, asked at most once per command: the command
    line and inventory first, then the device's agent (one DeviceInfo call; an unreachable agent
    costs its timeout and a warning once, and its budget stays unknown). Pre-training, the planner's
    inputs and training all take their budgets from the command's one instance."""

    def __init__(self, fleet: Inventory, device_kind: str | None = None) -> None:
        self._fleet, self._device_kind = fleet, device_kind
        self._known: dict[str, tuple[int, str]] = {}
        self._asked: set[str] = set()

    def of(self, names: Any) -> dict[str, tuple[int, str]]:
        """Name → (budget bytes, device kind) for the named inventory devices whose budget is known."""
        names = list(dict.fromkeys(names))
        for name in names:
            if name in self._asked or name not in self._fleet.names:
                continue
            self._asked.add(name)
            budget, kind = _budget_and_kind(self._fleet.device(name), self._device_kind)
            if budget is not None:
                self._known[name] = (int(budget), kind)
        return {name: self._known[name] for name in names if name in self._known}

    def training_memory(self, spec: ModelSpec, names: Any) -> Any:
        """The memory plans a training of ``names`` runs under (memory.fit.training_memory): each
        device with a known budget under its own plan."""
        from hetcluster.memory.fit import training_memory
        from hetcluster.memory.model_graph import spec_graph

        return training_memory(spec, self.of(names), list(names), spec_graph(spec))


def planner_inputs(
    profile: Profile, fleet: Inventory, spec: ModelSpec, total_steps: int, budgets: DeviceBudgets
) -> tuple[Any, Any, Any]:
    """(devices, runs, job) for the planner, with each device's memory fit and slowdown filled in."""
    from hetcluster.memory.fit import plan_for
    from hetcluster.memory.model_graph import spec_graph
    from hetcluster.profiling.profile import to_planner_inputs

    devices, runs, job = to_planner_inputs(profile, total_steps, idle_power_counts=fleet.idle_power_counts)
    known = budgets.of(device.name for device in devices)
    filled = []
    for device in devices:
        if device.name not in known:
            filled.append(device)
            continue
        budget, kind = known[device.name]
        plan = plan_for(spec_graph(spec), spec.batch_size, budget, kind)
        # the planner's rates are plain TensorFlow's (a run pre-trained under a plan is multiplied
        # back by its slowdown: to_planner_inputs), so the plan's predicted extra step time (a
        # fraction; 0 when the job fits as it is) enters the planner's time estimate here.
        filled.append(dataclasses.replace(device, memory_fits=bool(plan.fits),
                                          memory_slowdown=1.0 + float(plan.predicted_slowdown) if plan.fits else 1.0))
    return filled, runs, job
