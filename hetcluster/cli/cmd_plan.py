"""`hetcluster plan`: pre-train (or read --profile), predict every configuration, choose the best
for the objective under the constraints, and print the plan table (and a Pareto plot)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, List, NamedTuple, Optional

import typer
from rich.console import Console

from hetcluster.cli import job_options as opt
from hetcluster.cli.console import make_console

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import Inventory


class PlannedJob(NamedTuple):
    """What make_plan leaves to the command that called it: the plan, the profile it came from, and
    the job, data and memory budgets, so that training asks no agent twice."""

    plan: Any
    profile: Any
    spec: Any
    training: Any  # training.spec.Training: data, held-out data, optimizer
    budgets: Any  # cli.pretraining.DeviceBudgets


def plan_command(
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
    output_format: str = typer.Option("table", "--format", help="table, json or csv."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a time-vs-energy Pareto plot (PNG) here."),
) -> None:
    """Choose which devices should train the job, for the objective and constraints."""
    from hetcluster.cli.signals import sigterm_as_interrupt

    opt.check_plot(plot)
    with sigterm_as_interrupt():  # as Ctrl-C: pre-training (without --profile) stops the servers it started
        plan = make_plan(objective=objective, inventory=inventory, model=model, model_config=model_config,
                         input_shape=input_shape, classes=classes, batch_size=batch_size, data=data,
                         eval_data=eval_data, eval_split=eval_split, optimizer=optimizer, learning_rate=learning_rate,
                         total_steps=total_steps, pretrain_steps=pretrain_steps, warmup_steps=warmup_steps,
                         pretrain_budget=pretrain_budget, pretrain_protocol=pretrain_protocol, remeasure=remeasure,
                         workdir=workdir, profile=profile, deadline=deadline, max_power=max_power,
                         max_energy=max_energy, require=require, exclude=exclude, device_kind=device_kind,
                         output_format=output_format,
                         console=make_console(stderr=output_format != "table")).plan
    from hetcluster.cli.plan_output import plot_pareto, render

    render(plan, output_format)
    if plot is not None:
        plot_pareto(plan.table, plan.chosen, plot)
        make_console(stderr=True).print(f"Pareto plot: {plot}")


def make_plan(*, objective, inventory, model, input_shape, classes, batch_size, data, total_steps, pretrain_steps,
              warmup_steps, workdir, profile, deadline, max_power, max_energy, require, exclude, device_kind,
              model_config: Path | None = None, output_format: str = "table", console: Console, fleet: Inventory = None,
              eval_data: Path | None = None, eval_split: float | None = None, optimizer: str = "sgd",
              learning_rate: float = 0.01, prepared: tuple[Any, Any] | None = None,
              pretrain_budget: float = opt.DEFAULT_BUDGET_SHARE, pretrain_protocol: str = "lanes",
              objectives: tuple[str, ...] | None = None, remeasure: bool = False):
    """Validate every option (the data against the model too), then pre-train or load the
    profile, then plan. ``fleet``: the inventory already loaded by the caller (so the agents it
    checked are the ones planned for); ``prepared``: the (ModelSpec, Training) the caller already
    checked (job_options.model_spec, .training) from these options; ``objectives``: those whose
    choices pre-training keeps apart (default: ``objective``)."""
    from hetcluster.cli.plan_output import FORMATS
    from hetcluster.errors import ConfigError

    opt.check_objective(objective)
    if output_format not in FORMATS:
        raise ConfigError(f"Unknown format {output_format!r}.", hint=f"use one of {', '.join(FORMATS)}.")
    opt.check_total_steps(total_steps)
    opt.check_device_kind(device_kind)
    opt.check_pretrain_budget(pretrain_budget)
    from hetcluster.cli.pretraining import PretrainOptions, check_budget_up_front

    if prepared is None:
        spec = opt.model_spec(model, input_shape, classes, batch_size, model_config)
        job_training = opt.training(data, eval_data, eval_split, optimizer, learning_rate, spec, console)
    else:
        spec, job_training = prepared
    check_budget_up_front(total_steps, workdir, profile,
                          PretrainOptions(pretrain_steps, warmup_steps, pretrain_budget, pretrain_protocol))
    fleet = fleet if fleet is not None else opt.load_fleet(inventory, agents_needed=profile is None)
    constraints = opt.constraints(deadline, max_power, max_energy, require, exclude, fleet.names)

    from hetcluster.cli.pretraining import DeviceBudgets, PretrainOptions, obtain_profile, planner_inputs
    from hetcluster.planner import plan as make

    budgets = DeviceBudgets(fleet, device_kind)
    options = PretrainOptions(pretrain_steps, warmup_steps, pretrain_budget, pretrain_protocol,
                              tuple(objectives or (objective,)), constraints, reuse_known=not remeasure)
    measured = obtain_profile(fleet, spec, job_training, workdir, profile, options=options, console=console,
                              budgets=budgets, total_steps=total_steps)
    if measured.pretrain_steps >= total_steps:
        raise ConfigError(f"Pre-training already took {measured.pretrain_steps} steps of the {total_steps} asked for.",
                          hint="raise --total-steps or lower --pretrain-steps.")
    devices, runs, job = planner_inputs(measured, fleet, spec, total_steps, budgets)
    from hetcluster.cli.plan_output import revision_line

    plan = make(devices, runs, job, objective, constraints)
    line = revision_line(plan.solo_rates)
    if line:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return PlannedJob(plan, measured, spec, job_training, budgets)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
