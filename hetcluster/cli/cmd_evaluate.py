"""`hetcluster evaluate`: the ground truth. Pre-train once, predict every configuration, train every
configuration (or --configs) for real from the same pre-training checkpoint, and score the
planner's choice for each objective (exact? regret?) and its prediction errors (MAPE).

The JSON (--out, rewritten atomically after every configuration so a long run keeps its progress)
has `configurations`, `objectives`, `pretrain` and `mape` as issue 5 specifies; `pretrain.overhead`
is the pre-training time over the whole measured job of the configuration the `edp` objective
chose. `mape_training_phase` adds the errors with pre-training taken out of both sides.

`--repeats R` trains every configuration R times, in R rounds over all configurations (so a slow
drift of the host spreads over all of them rather than landing on one), every other round in the
reverse order (A B C, C B A, …: a drift that is linear over two rounds then weighs every
configuration's mean alike; a shared host drifts over minutes), each run from its own fresh copy
of the pre-training checkpoint; a configuration is
then measured by its mean and each objective says whether the choice is within the ground truth's
own noise (evaluation/scoring.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import typer
from rich.console import Console

from hetcluster.cli import job_options as opt
from hetcluster.cli.console import make_console

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import Inventory
    from hetcluster.planner.choose import Plan
    from hetcluster.profiling.profile import Profile
    from hetcluster.training.spec import Training

OVERHEAD_OBJECTIVE = "edp"


def parse_configs(text: str | None, known: tuple[str, ...]) -> list[tuple[str, ...]] | None:
    """``"a+b,c"`` → ``[("a", "b"), ("c",)]``; unknown names are a one-line error."""
    from hetcluster.errors import ConfigError

    if not text:
        return None
    configs = []
    for item in text.split(","):
        names = tuple(n.strip() for n in item.split("+") if n.strip())
        unknown = [n for n in names if n not in known]
        if not names or unknown or len(set(names)) != len(names):
            raise ConfigError(f"--configs entry {item!r} is not a '+'-joined set of distinct devices.",
                              hint=f"devices are: {', '.join(known)}; e.g. --configs {'+'.join(known[:2])},{known[0]}.")
        configs.append(names)
    return configs


def parse_objectives(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        opt.check_objective(name)
    return names


def evaluate_command(
    inventory: Path = opt.INVENTORY,
    model: Optional[str] = opt.MODEL,
    model_config: Optional[Path] = opt.MODEL_CONFIG,
    input_shape: Optional[str] = opt.INPUT_SHAPE,
    classes: Optional[int] = opt.CLASSES,
    batch_size: int = opt.BATCH_SIZE,
    data: Optional[Path] = opt.DATA,
    optimizer: str = opt.OPTIMIZER,
    learning_rate: float = opt.LEARNING_RATE,
    total_steps: int = opt.TOTAL_STEPS,
    pretrain_steps: int = opt.PRETRAIN_STEPS,
    warmup_steps: int = opt.WARMUP_STEPS,
    pretrain_budget: float = opt.PRETRAIN_BUDGET,
    pretrain_protocol: str = opt.PRETRAIN_PROTOCOL,
    remeasure: bool = opt.REMEASURE,
    workdir: Path = typer.Option(
        Path("hetcluster-eval"), "--workdir", help="Where the profile and each configuration's checkpoints go."
    ),
    profile: Optional[Path] = opt.PROFILE,
    device_kind: Optional[str] = opt.DEVICE_KIND,
    objectives: str = typer.Option(
        "time,power,energy,edp", "--objectives", help="Comma-separated objectives to score."
    ),
    out: Path = typer.Option(
        Path("evaluation.json"), "--out", help="Result JSON (rewritten after every configuration)."
    ),
    configs: Optional[str] = typer.Option(
        None, "--configs", help="Only these configurations, e.g. server+rpi4,server (default: all)."
    ),
    repeats: int = typer.Option(
        1, "--repeats", help="Train every configuration this many times; the truth is their mean."
    ),
    round_steps: int = typer.Option(0, "--round-steps", hidden=True),
) -> None:
    """Train every configuration from one pre-training checkpoint and score the planner's choices."""
    from hetcluster.cli.cmd_plan import make_plan
    from hetcluster.cli.signals import sigterm_as_interrupt
    from hetcluster.errors import ConfigError

    console = make_console()
    names = parse_objectives(objectives)
    if repeats < 1:
        raise ConfigError(
            f"--repeats {repeats}: a configuration must be trained at least once.", hint="give --repeats 1 or more."
        )
    from hetcluster.fileio import check_writable

    check_writable(out)   # before the trainings, not after the first
    workdir = workdir.resolve()
    spec = opt.model_spec(model, input_shape, classes, batch_size, model_config)
    prepared = (spec, opt.training(data, None, None, optimizer, learning_rate, spec, console))
    from hetcluster.cli.pretraining import PretrainOptions, check_budget_up_front, check_profile_file

    check_profile_file(profile, *prepared)
    opt.check_pretrain_budget(pretrain_budget)
    check_budget_up_front(total_steps, workdir, profile,
                          PretrainOptions(pretrain_steps, warmup_steps, pretrain_budget, pretrain_protocol))
    fleet = opt.load_fleet(inventory)
    wanted = parse_configs(configs, fleet.names)
    with sigterm_as_interrupt():  # as Ctrl-C: the run in progress stops its servers, exit 130
        plan, measured_profile, spec, job_training, budgets = make_plan(
            objective=OVERHEAD_OBJECTIVE, inventory=inventory, model=model, model_config=model_config,
            input_shape=input_shape, classes=classes, batch_size=batch_size, data=data, optimizer=optimizer,
            learning_rate=learning_rate, total_steps=total_steps,
            pretrain_steps=pretrain_steps, warmup_steps=warmup_steps, pretrain_budget=pretrain_budget,
            pretrain_protocol=pretrain_protocol, remeasure=remeasure, objectives=tuple(names), workdir=workdir,
            profile=profile, deadline=None,
            max_power=None, max_energy=None, require=None, exclude=None, device_kind=device_kind, console=console,
            fleet=fleet, prepared=prepared)
        evaluation = run_evaluation(
            fleet,
            plan,
            measured_profile,
            spec,
            job_training,
            total_steps,
            names,
            wanted,
            workdir,
            out,
            console,
            budgets,
            round_steps=round_steps,
            repeats=repeats,
        )
    from hetcluster.cli.train_output import evaluation_tables

    console.print(evaluation_tables(evaluation))
    console.print(f"result: {out}")


def plans_by_objective(table: Any, names: Sequence[str], constraints: Sequence[Any] = ()) -> dict[str, Any]:
    """One Plan per objective name from one estimate table (its choice and its near-ties)."""
    from hetcluster.planner import choose, get_objective

    return {name: choose(table, get_objective(name), constraints) for name in names}


def run_evaluation(
    fleet: Inventory,
    plan: Plan,
    profile: Profile,
    model_spec: Any,
    training: Training,
    total_steps: int,
    objectives: list[str],
    wanted: list[tuple[str, ...]] | None,
    workdir: Path,
    out: Path,
    console: Console,
    budgets: Any,
    round_steps: int = 0,
    repeats: int = 1,
) -> dict[str, Any]:
    """Measure each configuration ``repeats`` times, round by round (a live progress line per run),
    score, write ``out`` as it goes. Each device of a configuration trains under its own memory
    plan, as `hetcluster train` would train it (``training_memory`` over ``budgets``, the
    command's cli.pretraining.DeviceBudgets)."""
    from hetcluster.cli.cmd_train import LiveProgress
    from hetcluster.errors import ConfigError
    from hetcluster.evaluation.harness import configuration_label, measure_configuration, merge_repeats
    from hetcluster.fileio import write_json_atomic
    from hetcluster.memory.fit import TrainingMemory
    from hetcluster.training.coordinator import SegmentInterrupted, run_on_devices
    from hetcluster.training.report import JobMetrics
    from hetcluster.training.spec import TrainSpec

    predicted = {frozenset(row["devices"]): (tuple(row["devices"]), JobMetrics.from_mapping(row))
                 for row in plan.table.to_dict("records")}
    if wanted is None:
        configs = sorted(predicted.values(), key=lambda item: (len(item[0]), item[0]))
    else:
        missing = [w for w in wanted if frozenset(w) not in predicted]
        if missing:
            raise ConfigError(
                f"No prediction for {', '.join('+'.join(m) for m in missing)} (not among the plan's configurations).",
                hint="name devices that pre-training measured; of a class of identical devices the plan "
                "takes the first k (rpi4-1, then rpi4-2).",
            )
        configs = [predicted[frozenset(w)] for w in wanted]
    plans = plans_by_objective(plan.table, objectives, plan.constraints)
    pretrain = {
        "steps": profile.pretrain_steps,
        "time_s": profile.pretrain_time_s,
        "energy_j": profile.pretrain_energy_j,
    }
    spec = TrainSpec(model=model_spec, total_steps=total_steps, data=training.data, optimizer=training.optimizer,
                     learning_rate=training.learning_rate)
    # the model's graph is built (TensorFlow) only where some device has a memory budget to plan for
    memory = {devices: budgets.training_memory(model_spec, devices)
              if budgets.of(devices) else TrainingMemory() for devices, _ in configs}
    runs: dict[tuple[str, ...], list[Any]] = {}
    results: list[Any] = []
    for round_index in range(repeats):
        for devices, metrics in (configs if round_index % 2 == 0 else configs[::-1]):
            label = configuration_label(devices)
            suffix = f" ({round_index + 1}/{repeats})" if repeats > 1 else ""
            display = LiveProgress(console, total_steps, profile.pretrain_steps, label=f"run {label}{suffix}")
            log_path = run_log(workdir, label, round_index)
            try:
                with display:
                    config_spec = dataclasses.replace(spec, **memory[devices].spec_fields())
                    result = measure_configuration(fleet, devices, metrics, config_spec, pretrain=pretrain,
                                                   pretrain_checkpoint=profile.checkpoint_path, workdir=workdir,
                                                   run=run_on_devices, warmup_steps=profile.warmup_steps,
                                                   on_progress=display.update, round_steps=round_steps,
                                                   log_path=log_path)
            except SegmentInterrupted:
                console.print(
                    f"[yellow]interrupted[/] during {label}{suffix}: servers stopped; what was measured is in {out}"
                )
                raise typer.Exit(130) from None
            if result.error:
                console.print(f"[red]failed:[/] {label}{suffix}: {result.error} (log: {log_path})")
            runs.setdefault(devices, []).append(result)
            results = [merge_repeats(done, pretrain) for done in runs.values()]
            write_json_atomic(out, evaluation_dict(results, plans, pretrain, profile))
    return evaluation_dict(results, plans, pretrain, profile)


def run_log(workdir: Path, label: str, round_index: int) -> Path:
    """Where the training process of one run writes its log (kept: a failed run's TensorFlow
    error is there in full)."""
    path = workdir / "logs" / f"{label}-{round_index + 1}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def evaluation_dict(results: list[Any], plans: dict[str, Any], pretrain: dict[str, float],
                    profile: Profile) -> dict[str, Any]:
    """The evaluation's JSON: every configuration, each objective's score (with the plan's near-ties), MAPE,
    pre-training and the profile."""
    from hetcluster.evaluation.scoring import mape, score_objective

    choices = {name: tuple(p.chosen) for name, p in plans.items()}
    objectives = {name: score_objective(results, name, choices[name],
                                        near_ties=[tuple(d) for d in p.near_ties()["devices"]])
                  for name, p in plans.items()}
    overhead = None
    reference = choices.get(OVERHEAD_OBJECTIVE)
    for result in results:
        if reference is not None and result.measured is not None and frozenset(result.devices) == frozenset(reference):
            overhead = pretrain["time_s"] / result.measured.time_s if result.measured.time_s > 0 else None
    scored = [o for o in objectives.values() if o["exact"] is not None]
    return {
        "configurations": [r.to_dict() for r in results],
        "objectives": objectives,
        "pretrain": {"steps": pretrain["steps"], "time_s": pretrain["time_s"], "energy_j": pretrain["energy_j"],
                     "overhead": overhead, "overhead_of": f"the configuration chosen for {OVERHEAD_OBJECTIVE}"},
        "mape": mape(results),
        "mape_training_phase": mape(results, pretrain["time_s"], pretrain["energy_j"]),
        "exact_rate": sum(bool(o["exact"]) for o in scored) / len(scored) if scored else None,
        # the whole profile: with the measured configurations above, enough to re-plan offline
        # (a later planner can be scored against the same ground truth without training again)
        "profile": profile.to_dict(),
    }


def register(app: typer.Typer) -> None:
    app.command("evaluate")(evaluate_command)
