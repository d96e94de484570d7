"""Options shared by the commands that describe a training job (profile, plan, train, evaluate).

Typer declares options per function, so each command lists them in its signature with these
`typer.Option` constants as defaults; the helpers below turn the raw values into typed objects
(ModelSpec, DataSource, constraints) once, at the boundary, with one-line errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import typer

from hetcluster.errors import ConfigError
from hetcluster.profiling.lanes import DEFAULT_BUDGET_SHARE

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from hetcluster.models.spec import ModelSpec

INVENTORY = typer.Option(
    Path("cluster.toml"), "--inventory", "-i", help="Fleet inventory (TOML), e.g. from `hetcluster cluster up`."
)
MODEL = typer.Option(
    None,
    "--model",
    "-m",
    help="Registry name: resnet50, mobilenet_v2, vgg16, inception_v3, densenet121, small_cnn (default small_cnn).",
)
MODEL_CONFIG = typer.Option(
    None,
    "--model-config",
    help="Your own model instead of --model: a tf_keras model.to_json() file (functional, one image input, a Dense "
         "logits output; loaded in safe mode, built-in layers only). Its input shape and classes are the config's.",
)
INPUT_SHAPE = typer.Option(
    None, "--input-shape", help="Input shape HxWxC (small shapes let small devices train; default 32x32x3)."
)
CLASSES = typer.Option(None, "--classes", help="Number of output classes (default 10).")
BATCH_SIZE = typer.Option(32, "--batch-size", "-b", help="Per-step batch size.")
DATA = typer.Option(
    None, "--data", help="Training data: an image folder, a .npz file or a .tfrecord file (default: synthetic)."
)
EVAL_DATA = typer.Option(
    None,
    "--eval-data",
    help="Held-out data (the formats of --data): the trained model's loss and accuracy are measured on it.",
)
EVAL_SPLIT = typer.Option(
    None,
    "--eval-split",
    help="Hold this share of --data out of training (0 < F < 1) and measure the trained model on it.",
)
OPTIMIZER = typer.Option("sgd", "--optimizer", help="sgd (momentum 0.9) or adam.")
LEARNING_RATE = typer.Option(0.01, "--learning-rate", help="The optimizer's learning rate.")
TOTAL_STEPS = typer.Option(600, "--total-steps", "-n", help="Steps of the whole job, pre-training included.")
PRETRAIN_STEPS = typer.Option(20, "--pretrain-steps", help="Steps per pre-training run (warm-up included).")
WARMUP_STEPS = typer.Option(4, "--warmup-steps", help="Steps per pre-training run excluded from timings.")
PRETRAIN_BUDGET = typer.Option(
    DEFAULT_BUDGET_SHARE,
    "--pretrain-budget",
    show_default=False,
    help="The share of the job pre-training may take (0 < F < 1, default a third): at most this share of "
         "--total-steps count toward the job (its other steps are measurement only), and a calibration set "
         "beyond the fleet's runs only while it fits this share of the job's predicted time.",
)
PRETRAIN_PROTOCOL = typer.Option(
    "lanes", "--pretrain-protocol", hidden=True,
    help="lanes, or sequential: one run at a time with an opening run and the fastest measured twice "
         "(benchmarks/pretraining_cost.py and the experiments compare them).",
)
REMEASURE = typer.Option(
    False, "--remeasure",
    help="Measure every device alone again, even one measured for this job within the last week.",
)
WORKDIR = typer.Option(Path("hetcluster-run"), "--workdir", help="Where the profile and the job's checkpoints go.")
PROFILE = typer.Option(None, "--profile", help="Use this pre-training profile (JSON) instead of pre-training.")
OBJECTIVE = typer.Option("edp", "--objective", help="What to minimise: time, power, energy or edp.")
DEADLINE = typer.Option(None, "--deadline", help="Constraint: job time at most this many seconds.")
MAX_POWER = typer.Option(None, "--max-power", help="Constraint: average power at most this many watts.")
MAX_ENERGY = typer.Option(None, "--max-energy", help="Constraint: job energy at most this many joules.")
REQUIRE = typer.Option(None, "--require", help="Constraint: this device must join (repeatable).")
EXCLUDE = typer.Option(None, "--exclude", help="Constraint: this device must not join (repeatable).")
DEVICE_KIND = typer.Option(
    None,
    "--device-kind",
    help="Memory model for every device: cpu, unified or discrete-gpu (default: what each agent reports).",
)

OBJECTIVES = ("time", "power", "energy", "edp")


def model_spec(model: str | None, input_shape: str | None, classes: int | None, batch_size: int,
               model_config: Path | None = None, *, default_input_shape: str = "32x32x3", default_classes: int = 10):
    """The job's ModelSpec: a registry model (--model, default small_cnn; --input-shape and --classes
    default to the two defaults) or the user's config (--model-config; --input-shape and --classes,
    when given, must be the config's)."""
    from hetcluster.models.spec import ModelSpec, format_input_shape, parse_input_shape

    if model_config is None:
        return ModelSpec(name=model or "small_cnn", input_shape=parse_input_shape(input_shape or default_input_shape),
                         classes=default_classes if classes is None else classes, batch_size=batch_size)
    if model is not None:
        raise ConfigError(
            f"--model {model} and --model-config {model_config} name two models.", hint="give one of them."
        )
    from hetcluster.models.keras_config import read_keras_config

    described = read_keras_config(model_config)
    if input_shape is not None and parse_input_shape(input_shape) != described.input_shape:
        raise ConfigError(
            f"--input-shape {input_shape}: the model of {model_config} takes "
            f"{format_input_shape(described.input_shape)}.",
            hint="leave --input-shape out with --model-config.",
        )
    if classes is not None and classes != described.classes:
        raise ConfigError(f"--classes {classes}: the model of {model_config} has {described.classes}.",
                          hint="leave --classes out with --model-config.")
    return ModelSpec.from_keras_config(described, batch_size=batch_size)


def data_source(data: Path | None, holdout: float = 0.0, flag: str = "--data"):
    """Synthetic without --data; else the kind from the path (folder, .npz, .tfrecord), the path
    made absolute (the training processes do not share this process's working directory)."""
    from hetcluster.models.datasets import DataSource

    if data is None:
        return DataSource()
    data = data.expanduser().absolute()
    if not data.exists():
        raise ConfigError(f"{flag} {data} does not exist.", hint="give an image folder, a .npz or a .tfrecord file.")
    if data.is_dir():
        kind = "image_folder"
    elif data.suffix == ".npz":
        kind = "npz"
    elif data.suffix in (".tfrecord", ".tfrecords"):
        kind = "tfrecord"
    else:
        raise ConfigError(
            f"{flag} {data}: cannot tell the format from the name.", hint="use a folder, .npz or .tfrecord."
        )
    try:
        with open(data if data.is_file() else next(iter(data.iterdir()), data), "rb"):
            pass
    except OSError as error:
        raise ConfigError(f"{flag} {data} cannot be read: {error.strerror}.", hint="check its permissions.") from None
    return DataSource(kind=kind, path=str(data), holdout=holdout)


def training(data: Path | None, eval_data: Path | None, eval_split: float | None, optimizer: str,
             learning_rate: float, spec: ModelSpec, console: Console = None):
    """The job's Training (data, held-out data, optimizer), its data checked against the model
    here, before any server starts; the conversions the pipelines will make are printed."""
    from hetcluster.models.data_check import check_job_data
    from hetcluster.training.spec import Training, check_optimizer

    check_optimizer(optimizer, learning_rate)
    if eval_split is not None:
        if eval_data is not None:
            raise ConfigError("--eval-data and --eval-split both name held-out data.", hint="give one of them.")
        if data is None:
            raise ConfigError("--eval-split holds part of --data out, and no --data was given.",
                              hint="give --data FILE, or --eval-data FILE.")
        if not 0.0 < eval_split < 1.0:
            raise ConfigError(
                f"--eval-split {eval_split} is not a share between 0 and 1.", hint="e.g. --eval-split 0.2."
            )
    source = data_source(data, holdout=eval_split or 0.0)
    held_out = data_source(eval_data, flag="--eval-data") if eval_data is not None else (
        source.held_out() if eval_split else None)
    for line in check_job_data(source, held_out, spec):
        if console is not None:
            console.print(line, markup=False, highlight=False)
    return Training(source, held_out, optimizer, learning_rate)


def check_total_steps(total_steps: int | None) -> int | None:
    """A job's --total-steps: positive when given."""
    if total_steps is not None and total_steps < 1:
        raise ConfigError(f"--total-steps {total_steps} must be positive.", hint="give the job's number of steps.")
    return total_steps


def check_pretrain_budget(share: float) -> float:
    """A --pretrain-budget: a share strictly between 0 and 1."""
    if not 0 < share < 1:
        raise ConfigError(f"--pretrain-budget {share:g} is not a share of the job.",
                          hint="give a number between 0 and 1, e.g. --pretrain-budget 0.25.")
    return share


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
    credential files to be readable: a fleet that is down can still be re-planned for. With
    agents needed, the training plane's credentials and this host's isolation are checked too,
    before any server starts."""
    from hetcluster.inventory import load_inventory
    from hetcluster.training.plane import check_training_plane

    if not inventory.exists():
        raise ConfigError(
            f"No inventory at {inventory}.",
            hint="start a fleet with `hetcluster cluster up --out cluster.toml` or pass --inventory.",
        )
    fleet = load_inventory(inventory, check_credentials=agents_needed)
    if agents_needed:
        check_training_plane(fleet.devices, fleet.tf_plane_isolation)
    return fleet


def constraints(deadline: float | None, max_power: float | None, max_energy: float | None,
                require: Sequence[str] | None, exclude: Sequence[str] | None, known: Sequence[str]) -> tuple[Any, ...]:
    """Planner constraint objects from the command line; unknown device names are an error."""
    from hetcluster.planner import Deadline, Exclude, MaxEnergy, MaxPower, Require

    for flag, names in (("--require", require), ("--exclude", exclude)):
        unknown = sorted(set(names or ()) - set(known))
        if unknown:
            raise ConfigError(
                f"{flag} names unknown device(s): {', '.join(unknown)}.", hint=f"devices are: {', '.join(known)}."
            )
    result: list[Any] = []
    for value, flag, kind in (
        (deadline, "--deadline", Deadline),
        (max_power, "--max-power", MaxPower),
        (max_energy, "--max-energy", MaxEnergy),
    ):
        if value is not None:
            if value <= 0:
                raise ConfigError(f"{flag} {value} must be positive.", hint=f"give {flag} a positive number.")
            result.append(kind(value))
    if require:
        result.append(Require(tuple(require)))
    if exclude:
        result.append(Exclude(tuple(exclude)))
    return tuple(result)


def constraints_record(deadline: float | None, max_power: float | None, max_energy: float | None,
                       require: Sequence[str] | None, exclude: Sequence[str] | None) -> dict[str, Any]:
    """The job's constraints as its ledger keeps them (an elastic job re-plans under them)."""
    return {"deadline": deadline, "max_power": max_power, "max_energy": max_energy,
            "require": list(require or ()), "exclude": list(exclude or ())}


def ledger_constraints(ledger_data: dict[str, Any], known: Sequence[str]) -> tuple[Any, ...]:
    """The planner constraints of a job's ledger over the devices ``known`` now: a required or
    excluded device that is not among them (it left) is dropped from the constraint."""
    record = ledger_data.get("constraints") or {}
    keep = set(known)
    return constraints(record.get("deadline"), record.get("max_power"), record.get("max_energy"),
                       [n for n in record.get("require", ()) if n in keep] or None,
                       [n for n in record.get("exclude", ()) if n in keep] or None, list(known))
