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
    workdir: Path = opt.WORKDIR,
    device_kind: Optional[str] = opt.DEVICE_KIND,
    total_steps: Optional[int] = typer.Option(
        None, "--total-steps", "-n",
        help="Steps of the whole job this profile is for: pre-training then takes up to a third of them "
             "(default: runs of up to 5 × --pretrain-steps, no phase budget)."),
) -> None:
    """Pre-train the job on every device alone and on calibration sets; save the profile."""
    from hetcluster.cli.pretraining import DeviceBudgets, run_pretraining_with_display
    from hetcluster.cli.signals import sigterm_as_interrupt

    opt.check_total_steps(total_steps)
    opt.check_device_kind(device_kind)
    console = make_console()
    spec = opt.model_spec(model, input_shape, classes, batch_size, model_config)
    job_training = opt.training(data, None, eval_split, optimizer, learning_rate, spec, console)
    fleet = opt.load_fleet(inventory)
    with sigterm_as_interrupt():  # as Ctrl-C: pre-training stops the servers it started
        profile = run_pretraining_with_display(fleet, spec, job_training, workdir, steps_per_run=pretrain_steps,
                                               warmup_steps=warmup_steps, console=console, total_steps=total_steps,
                                               budgets=DeviceBudgets(fleet, device_kind))
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
