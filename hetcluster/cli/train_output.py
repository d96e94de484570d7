"""Rendering what `hetcluster train` and `hetcluster evaluate` measured: rich tables only (the
numbers are computed in training/report.py and evaluation/scoring.py)."""

from __future__ import annotations

from typing import Any

from hetcluster.cli.plan_output import _fmt
from hetcluster.training.report import METRICS, TrainReport


def report_table(report: TrainReport) -> Any:
    """A rich Table: predicted, measured and error per metric, then steps per worker."""
    from rich import box
    from rich.table import Table

    status = " (stopped early)" if report.stopped else ""
    table = Table(title=f"job on {' + '.join(report.chosen)} by {report.objective}{status}", box=box.SIMPLE_HEAD)
    for header in ("", "predicted", "measured", "error"):
        table.add_column(header, justify="right" if header else "left")
    errors = report.errors
    for name, unit in zip(METRICS, ("s", "W", "J", "J·s")):
        error = errors[name]
        table.add_row(name.rsplit("_", 1)[0], _fmt(getattr(report.predicted, name), unit),
                      _fmt(getattr(report.measured, name), unit), "-" if error is None else f"{error:+.1%}")
    table.add_section()
    for worker, steps in report.steps_per_worker.items():
        lost = " [red](lost)[/]" if worker in report.lost_workers else ""
        table.add_row(f"steps on {worker}{lost}", "", str(steps), "")
    if report.steps_unattributed:
        table.add_row("steps by lost workers", "", str(report.steps_unattributed), "")
    table.add_row("steps in all", "", f"{report.steps_total} ({report.steps_restored} restored)", "")
    table.add_row("final loss", "", "-" if report.final_loss is None else f"{report.final_loss:.4f}", "")
    if report.memory_plan:
        table.add_row("memory plan", "", report.memory_plan, "")
    if report.held_out:
        held = report.held_out
        table.add_section()
        table.add_row("held-out loss", "", f"{held['loss']:.4f}", "")
        table.add_row("held-out accuracy", "", f"{held['accuracy']:.1%} of {held['examples']}", "")
    return table


def timeline_table(report: TrainReport) -> Any:
    """A rich Table of the job's timeline: each segment (configuration, steps, measured time and
    energy against the planner's) and, for an elastic job, each departure, arrival, re-plan and
    switch at the step it happened."""
    from rich import box
    from rich.table import Table

    table = Table(title="timeline", box=box.SIMPLE_HEAD, show_lines=False)
    for header in ("at step", "what", "devices", "steps", "time s (predicted)", "energy J (predicted)"):
        table.add_column(header, justify="right" if header.startswith(("at", "steps", "time", "energy")) else "left",
                         overflow="fold")

    def predicted(measured: float, guess: Any) -> str:
        return f"{measured:.1f}" + (f" ({guess:.1f})" if guess is not None else "")

    for row in report.timeline:
        kind = row["kind"]
        if kind == "segment":
            what = "trained, stopped to switch" if row["stopped"] else "trained"
            lost = f" (lost {', '.join(row['lost_workers'])})" if row["lost_workers"] else ""
            table.add_row(str(row["steps_from"]), what + lost, "+".join(row["devices"]),
                          f"{row['steps_from']}→{row['steps_to']}", predicted(row["time_s"], row["predicted_time_s"]),
                          predicted(row["energy_j"], row["predicted_energy_j"]))
        elif kind in ("left", "joined"):
            table.add_row(str(row["step"]), f"{kind}: {row['reason']}", row["device"], "", "", "")
        elif kind == "figures":
            table.add_row(str(row["step"]), f"figures: {row['steps_per_s']:.2f} steps/s alone ({row['source']})",
                          row["device"], "", "", "")
        elif kind == "unmeasured":
            table.add_row(str(row["step"]), f"not measured: {row['reason']}", row["device"], "", "", "")
        elif kind == "replan":
            table.add_row(str(row["step"]), _replan_what(row), "+".join(row.get("chosen") or []), "", "", "")
        elif kind == "switch":
            cost = ""
            if row.get("measured_to_first_step_s") is not None:
                cost = (f", first step {row['measured_to_first_step_s']:.1f} s after the decision (predicted "
                        f"{row['predicted']['to_first_step_s']:.1f} s)")
            table.add_row(str(row["step"]), f"switch{cost}", f"{'+'.join(row['source'])} → {'+'.join(row['target'])}",
                          "", "", "")
    return table


def _replan_what(row: dict[str, Any]) -> str:
    """A re-plan in brief: what it decided, its saving against its cost."""
    unit = row.get("unit", "")

    def amount(value: Any) -> str:
        return "-" if value is None else f"{value:.3g} {unit}"

    if not row.get("candidate"):
        return "re-plan: stay (nothing to switch to)"
    weighed = f"saving {amount(row['saving'])} against a cost of {amount(row['switch_cost'])}"
    if row.get("switch"):
        return f"re-plan: switch, {weighed}"
    return f"re-plan: stay ({'+'.join(row['candidate'])}: {weighed})"


def plot_loss_curve(report: TrainReport, path: Any) -> None:
    """The training loss over the job's steps (each window's mean), as a figure at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hetcluster.fileio import write_figure_atomic

    curve = report.loss_curve
    figure, axes = plt.subplots(figsize=(7, 4))
    if curve:
        axes.plot([(w["first_step"] + w["last_step"]) / 2 for w in curve], [w["loss"] for w in curve], marker=".")
    if report.held_out:
        axes.axhline(report.held_out["loss"], linestyle="--", color="tab:orange",
                     label=f"held-out loss {report.held_out['loss']:.3f}, accuracy {report.held_out['accuracy']:.1%}")
        axes.legend()
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (window mean)")
    axes.set_title(f"{' + '.join(report.chosen)}: {report.steps_total} steps ({report.steps_restored} in pre-training)")
    axes.grid(alpha=0.3)
    write_figure_atomic(path, figure)
    plt.close(figure)


def evaluation_tables(evaluation: dict[str, Any]) -> Any:
    """Rich tables: every configuration predicted/measured, then each objective and the MAPE."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

    configs = Table(title="configurations: predicted / measured", box=box.SIMPLE_HEAD)
    configs.add_column("devices", overflow="fold")
    for header in ("time s", "power W", "energy J", "EDP J·s"):
        configs.add_column(header, justify="right")
    for row in evaluation["configurations"]:
        p, m = row["predicted"], row["measured"]
        cells = [
            f"{p[k]:.4g} / {m[k]:.4g}" if m else f"{p[k]:.4g} / failed"
            for k in ("time_s", "power_w", "energy_j", "edp_js")
        ]
        configs.add_row("+".join(row["devices"]), *cells)
    scores = Table(title="objectives", box=box.SIMPLE_HEAD)
    for header in ("objective", "chosen", "measured best", "exact", "regret"):
        scores.add_column(header)
    for name, o in evaluation["objectives"].items():
        regret = "-" if o["regret"] is None else f"{o['regret']:.1%}"
        scores.add_row(name, "+".join(o["chosen"]), "+".join(o["best"] or []), str(o["exact"]), regret)
    m, mt = evaluation["mape"], evaluation["mape_training_phase"]
    fmt = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    pre = evaluation["pretrain"]
    overhead = "-" if pre["overhead"] is None else f"{pre['overhead']:.1%}"
    summary = (f"MAPE whole job: time {fmt(m['time_s'])}, power {fmt(m['power_w'])}, energy {fmt(m['energy_j'])}; "
               f"training phase: time {fmt(mt['time_s'])}, energy {fmt(mt['energy_j'])}\n"
               f"exact choices: {fmt(evaluation['exact_rate'])} (reference paper: 76.67%); pre-training "
               f"{pre['steps']} steps, {pre['time_s']:.1f} s, overhead {overhead} of the edp choice's job")
    return Group(configs, scores, summary)
