"""Options shared by the commands that describe a training job (profile, plan, train, evaluate).

Typer declares options per function, so each command lists them in its signature with these
`typer.Option` constants as defaults; the helpers below turn the raw values into typed objects
(ModelSpec, DataSource, constraints) once, at the boundary, with one-line errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import typer

from hetcluster.errors import ConfigError

INVENTORY = typer.Option(Path("cluster.toml"), "--inventory", "-i", help="Fleet inventory (TOML), e.g. from `hetcluster cluster up`.")
MODEL = typer.Option("small_cnn", "--model", "-m", help="Registry name: resnet50, mobilenet_v2, vgg16, inception_v3, densenet121, small_cnn.")
INPUT_SHAPE = typer.Option("32x32x3", "--input-shape", help="Input shape HxWxC (small shapes let small devices train).")
CLASSES = typer.Option(10, "--classes", help="Number of output classes.")
BATCH_SIZE = typer.Option(32, "--batch-size", "-b", help="Per-step batch size.")
DATA = typer.Option(None, "--data", help="Training data: an image folder, a .npz file or a .tfrecord file (default: synthetic).")
TOTAL_STEPS = typer.Option(600, "--total-steps", "-n", help="Steps of the whole job, pre-training included.")
PRETRAIN_STEPS = typer.Option(20, "--pretrain-steps", help="Steps per pre-training run (warm-up included).")
WARMUP_STEPS = typer.Option(4, "--warmup-steps", help="Steps per pre-training run excluded from timings.")
WORKDIR = typer.Option(Path("hetcluster-run"), "--workdir", help="Where the profile and the job's checkpoints go.")
PROFILE = typer.Option(None, "--profile", help="Use this pre-training profile (JSON) instead of pre-training.")
OBJECTIVE = typer.Option("edp", "--objective", help="What to minimise: time, power, energy or edp.")
DEADLINE = typer.Option(None, "--deadline", help="Constraint: job time at most this many seconds.")
MAX_POWER = typer.Option(None, "--max-power", help="Constraint: average power at most this many watts.")
MAX_ENERGY = typer.Option(None, "--max-energy", help="Constraint: job energy at most this many joules.")
REQUIRE = typer.Option(None, "--require", help="Constraint: this device must join (repeatable).")
EXCLUDE = typer.Option(None, "--exclude", help="Constraint: this device must not join (repeatable).")
DEVICE_KIND = typer.Option(None, "--device-kind", help="Memory model for every device: cpu, unified or discrete-gpu (default: what each agent reports).")

OBJECTIVES = ("time", "power", "energy", "edp")


def model_spec(model: str, input_shape: str, classes: int, batch_size: int):
    from hetcluster.models.spec import ModelSpec, parse_input_shape

    return ModelSpec(name=model, input_shape=parse_input_shape(input_shape), classes=classes, batch_size=batch_size)


def data_source(data: Path | None):
    """Synthetic without --data; else the kind from the path (folder, .npz, .tfrecord)."""
    from hetcluster.models.datasets import DataSource

    if data is None:
        return DataSource()
    if not data.exists():
        raise ConfigError(f"--data {data} does not exist.", hint="give an image folder, a .npz or a .tfrecord file.")
    if data.is_dir():
        kind = "image_folder"
    elif data.suffix == ".npz":
        kind = "npz"
    elif data.suffix in (".tfrecord", ".tfrecords"):
        kind = "tfrecord"
    else:
        raise ConfigError(f"--data {data}: cannot tell the format from the name.", hint="use a folder, .npz or .tfrecord.")
    return DataSource(kind=kind, path=str(data))


def check_total_steps(total_steps: int | None) -> int | None:
    """A job's --total-steps: positive when given."""
    if total_steps is not None and total_steps < 1:
        raise ConfigError(f"--total-steps {total_steps} must be positive.", hint="give the job's number of steps.")
    return total_steps


def check_device_kind(device_kind: str | None) -> str | None:
    """A --device-kind: one the memory model knows, when given."""
    if device_kind is not None and device_kind not in ("cpu", "unified", "discrete-gpu"):
        raise ConfigError(f"Unknown device kind {device_kind!r}.", hint="use cpu, unified or discrete-gpu.")
    return device_kind


def check_plot(plot: Path | None) -> Path | None:
    """A --plot path: a format matplotlib writes, in a folder that can be written (checked before
    pre-training, so a long run does not end in this error)."""
    if plot is not None:
        from hetcluster.fileio import check_writable, figure_format

        figure_format(plot)
        check_writable(plot)
    return plot


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise ConfigError(f"Unknown objective {objective!r}.", hint=f"use one of {', '.join(OBJECTIVES)}.")
    return objective


def load_fleet(inventory: Path, agents_needed: bool = True):
    """The inventory; ``agents_needed=False`` (planning from a profile) does not require its
    credential files to be readable: a fleet that is down can still be re-planned for."""
    from hetcluster.inventory import load_inventory

    if not inventory.exists():
        raise ConfigError(f"No inventory at {inventory}.", hint="start a fleet with `hetcluster cluster up --out cluster.toml` or pass --inventory.")
    return load_inventory(inventory, check_credentials=agents_needed)


def constraints(deadline: float | None, max_power: float | None, max_energy: float | None,
                require: Sequence[str] | None, exclude: Sequence[str] | None, known: Sequence[str]) -> tuple[Any, ...]:
    """Planner constraint objects from the command line; unknown device names are an error."""
    from hetcluster.planner import Deadline, Exclude, MaxEnergy, MaxPower, Require

    for flag, names in (("--require", require), ("--exclude", exclude)):
        unknown = sorted(set(names or ()) - set(known))
        if unknown:
            raise ConfigError(f"{flag} names unknown device(s): {', '.join(unknown)}.", hint=f"devices are: {', '.join(known)}.")
    result: list[Any] = []
    for value, flag, kind in ((deadline, "--deadline", Deadline), (max_power, "--max-power", MaxPower), (max_energy, "--max-energy", MaxEnergy)):
        if value is not None:
            if value <= 0:
                raise ConfigError(f"{flag} {value} must be positive.", hint=f"give {flag} a positive number.")
            result.append(kind(value))
    if require:
        result.append(Require(tuple(require)))
    if exclude:
        result.append(Exclude(tuple(exclude)))
    return tuple(result)
