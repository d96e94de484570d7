"""`hetcluster profile`: the pre-training phase alone — real steps of the job on every device and
a few calibration sets, with power from the agents; writes the profile (JSON + Parquet)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from hetcluster.cli import job_options as opt
from hetcluster.cli.console import make_console


def profile_command(
    inventory: Path = opt.INVENTORY,
    model: Optional[str] = opt.MODEL,
    model_config: Optional[Path] = opt.MODEL_CONFIG,
    input_shape: Optional[str] = opt.INPUT_SHAPE,
    classes: Optional[int] = opt.CLASSES,
    batch_size: int = opt.BATCH_SIZE,
    data: Optional[Path] = opt.DATA,
    eval_split: Optional[float] = opt.EVAL_SPLIT,
    optimizer: str = opt.OPTIMIZER,
    learning_rate: float = opt.LEARNING_RATE,
    pretrain_steps: int = opt.PRETRAIN_STEPS,
    warmup_steps: int = opt.WARMUP_STEPS,
    pretrain_budget: float = opt.PRETRAIN_BUDGET,
    pretrain_protocol: str = opt.PRETRAIN_PROTOCOL,
    remeasure: bool = opt.REMEASURE,
    workdir: Path = opt.WORKDIR,
    device_kind: Optional[str] = opt.DEVICE_KIND,
    total_steps: Optional[int] = typer.Option(
        None, "--total-steps", "-n",
        help="Steps of the whole job this profile is for: pre-training then keeps to --pretrain-budget of it, "
             "and measures a calibration set beyond the fleet's runs only while some objective's choice is a "
             "near-tie (default: no job size, no budget, every set)."),
) -> None:
    """Pre-train the job on every device alone and on calibration sets; save the profile."""
    from hetcluster.cli.pretraining import (
        DeviceBudgets,
        PretrainOptions,
        check_job_fits_budget,
        run_pretraining_with_display,
    )
    from hetcluster.cli.signals import sigterm_as_interrupt
    from hetcluster.planner.objectives import OBJECTIVES

    opt.check_total_steps(total_steps)
    opt.check_device_kind(device_kind)
    opt.check_pretrain_budget(pretrain_budget)
    options = PretrainOptions(pretrain_steps, warmup_steps, pretrain_budget, pretrain_protocol, tuple(OBJECTIVES),
                              reuse_known=not remeasure)
    check_job_fits_budget(total_steps, options)
    console = make_console()
    spec = opt.model_spec(model, input_shape, classes, batch_size, model_config)
    job_training = opt.training(data, None, eval_split, optimizer, learning_rate, spec, console)
    fleet = opt.load_fleet(inventory)
    with sigterm_as_interrupt():  # as Ctrl-C: pre-training stops the servers it started
        profile = run_pretraining_with_display(fleet, spec, job_training, workdir, options=options, console=console,
                                               total_steps=total_steps, budgets=DeviceBudgets(fleet, device_kind))
    table = Table(title=f"pre-training profile: {spec.name} batch {spec.batch_size}")
    for column in ("devices", "steps/s", "power (W)", "idle (W)", "steps", "time (s)", "memory plan"):
        table.add_column(column, justify="left" if column in ("devices", "memory plan") else "right")
    for device in profile.devices:
        table.add_row(
            device.name,
            f"{device.steps_per_s:.2f} ± {device.steps_per_s_std:.2f}",
            f"{device.busy_power_w:.1f}",
            f"{device.idle_power_w:.1f}",
            str(device.steps),
            f"{device.time_s:.1f}",
            device.memory_plan or "plain",
        )
    for run in profile.runs:
        table.add_row("+".join(run.devices), f"{run.steps_per_s:.2f}", f"{run.power_w:.1f}", "", str(run.steps),
                      f"{run.time_s:.1f}", run.memory_plan or "plain")
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_command)
