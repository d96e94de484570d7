"""`hetcluster memplan`: the memory plan of a model on one device under a budget.

Thin: parses options, calls hetcluster.memory, prints a table or JSON and optionally plots the
memory per step of every technique and the memory/time frontier (with measured points from
benchmarks/memory.py --json). TensorFlow is imported only to build the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from hetcluster.cli.job_options import MODEL_CONFIG


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def memplan(
    model: Optional[str] = typer.Option(
        None, "--model", help="Registry model: resnet50, mobilenet_v2, vgg16, inception_v3, densenet121, small_cnn."
    ),
    model_config: Optional[Path] = MODEL_CONFIG,
    batch_size: int = typer.Option(32, "--batch-size", min=1, help="Per-worker batch size."),
    budget: str = typer.Option(..., "--budget", help="Device memory budget: 1GiB, 512MiB, 2GB or bytes."),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", help="HxWxC (default 224x224x3)."),
    classes: Optional[int] = typer.Option(None, "--classes", min=2, help="Output classes (default 1000)."),
    device_kind: str = typer.Option(
        "cpu", "--device-kind", help="cpu, unified or discrete-gpu (offload only on discrete-gpu)."
    ),
    optimizer: str = typer.Option(
        "sgd-momentum", "--optimizer", help="Optimizer whose slots count: sgd, sgd-momentum, adam, ..."
    ),
    plot: Optional[Path] = typer.Option(
        None, "--plot", help="Write memory per step of every technique and the memory/time frontier to this PNG."
    ),
    measured: Optional[Path] = typer.Option(
        None, "--measured", help="Measured points to draw on the frontier (benchmarks/memory.py --json FILE)."
    ),
    output_format: str = typer.Option("table", "--format", help="table or json."),
) -> None:
    """Choose the least intrusive memory plan (liveness, offload, recomputation) that fits the budget."""
    from hetcluster.cli.job_options import check_plot, model_spec
    from hetcluster.errors import ConfigError
    from hetcluster.memory.budget import parse_bytes
    from hetcluster.memory.cost import DEVICE_KINDS, Overheads

    if output_format not in ("table", "json"):
        raise ConfigError(f"Unknown format {output_format!r}.", hint="use --format table or --format json.")
    if device_kind not in DEVICE_KINDS:
        raise ConfigError(
            f"Unknown device kind {device_kind!r}.", hint=f"use --device-kind {' | '.join(DEVICE_KINDS)}."
        )
    check_plot(plot)
    points = _read_measured(measured) if measured is not None else None
    if points is not None and plot is None:
        raise ConfigError("--measured needs --plot.", hint="add --plot frontier.png.")
    budget_bytes = parse_bytes(budget)
    if model is None and model_config is None:
        raise ConfigError(
            "No model given.", hint="give --model NAME (a registry model) or --model-config FILE (yours)."
        )
    spec = model_spec(model, input_shape, classes, batch_size, model_config, default_input_shape="224x224x3",
                      default_classes=1000)
    overheads = Overheads(optimizer=optimizer)

    from hetcluster.memory.fit import plan_for
    from hetcluster.memory.model_graph import spec_graph

    graph = spec_graph(spec)
    plan = plan_for(graph, batch_size, budget_bytes, device_kind, overheads=overheads)
    if plot is not None:
        from hetcluster.memory.plan import strategy_curves
        from hetcluster.memory.plot import measured_points, plot_plan

        curves = strategy_curves(graph.scaled(batch_size), overheads)
        plot_plan(plan, plot, curves, measured_points(points or {}, plan, spec.input_shape))
    if output_format == "json":
        typer.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        _print_table(plan)
    if plot is not None and output_format != "json":
        typer.echo(f"plot written to {plot}")


def _read_measured(path: Path) -> dict:
    from hetcluster.errors import ConfigError

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read measured points from {path}: {exc}.",
                          hint="write them with benchmarks/memory.py 1 --json FILE.") from exc
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise ConfigError(f"{path} holds no measured points.",
                          hint="write them with benchmarks/memory.py 1 --json FILE.")
    return data


def _print_table(plan) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    from hetcluster.cli.console import make_console

    console = make_console()
    verdict = "[green]fits[/green]" if plan.fits else "[red]does not fit[/red]"
    console.print(f"{plan.model}, batch {plan.batch_size}, {plan.device_kind}: budget {_mib(plan.budget_bytes)} — "
                  f"{verdict} with [bold]{plan.technique}[/bold], predicted peak {_mib(plan.predicted_peak_bytes)}, "
                  f"slowdown {plan.predicted_slowdown:.1%} (fixed {_mib(plan.fixed_bytes)}: weights, gradients, "
                  f"{plan.optimizer} slots, runtime); it needs a budget of {_mib(plan.needed_bytes)} "
                  f"(a {plan.margin:.0%} margin over the prediction)")
    frontier = Table(title="memory/time frontier (predicted)")
    frontier.add_column("technique")
    frontier.add_column("peak", justify="right")
    frontier.add_column("step time", justify="right")
    for technique, peak, slowdown in plan.frontier:
        frontier.add_row(technique, _mib(peak), f"{slowdown:+.1%}")
    console.print(frontier)
    peaks = Table(title="predicted peak per technique")
    peaks.add_column("technique")
    peaks.add_column("peak", justify="right")
    peaks.add_column("vs baseline", justify="right")
    for name, value in plan.technique_peaks.items():
        usable = plan.device_kind == "discrete-gpu" or "offload" not in name
        peaks.add_row(name + ("" if usable else " (n/a on this device)"), _mib(value),
                      f"{value / plan.baseline_peak_bytes:.2f}")
    console.print(peaks)
    if plan.segments or plan.offloaded:
        actions = Table(title="actions")
        actions.add_column("action")
        actions.add_column("layers")
        for seg in plan.segments:
            actions.add_row(f"recompute ({seg.mode}-centric)", ", ".join(seg.layers))
        if plan.offloaded:
            actions.add_row("offload to host", ", ".join(plan.offloaded))
        console.print(actions)
    else:
        console.print("actions: none (every layer keeps its tensors as plain TensorFlow does)")


def register(app: typer.Typer) -> None:
    app.command("memplan")(memplan)
