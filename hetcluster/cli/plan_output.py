"""Rendering a Plan: rich table, JSON, CSV, and the time-vs-energy Pareto plot.

Used by `hetcluster plan` (cmd_plan.py, written on top of this). Rendering only: the plan is
already chosen. rich and matplotlib load lazily so importing this module stays cheap.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

FORMATS = ("table", "json", "csv")
DEFAULT_TOP_ROWS = 20
JSON_MAX_ROWS = 5000
REVISIONS_SHOWN = 8
REVISION_SHOWN_FROM = 0.001   # a relative change smaller than this reads +0.0 % and is not named

_COLUMNS = ("devices", "n_workers", "steps_per_s", "steps_per_s_std", "time_s", "time_s_std", "power_w", "power_w_std",
            "energy_j", "energy_j_std", "edp_js", "edp_js_std", "memory_fits", "feasible", "chosen")


def _fmt(value: float, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _devices_label(row: pd.Series, max_chars: int = 60, sep: str = " ") -> str:
    names = row.get("classes") if "classes" in row and isinstance(row.get("classes"), tuple) else row["devices"]
    label = sep.join(names)
    return label if len(label) <= max_chars else label[: max_chars - 1] + "…"


def plan_table(plan, top: int = DEFAULT_TOP_ROWS):
    """A rich Table of the best `top` rows (and the chosen one), sorted by the objective."""
    from rich import box
    from rich.table import Table

    table = plan.table
    objective = plan.objective
    shown = table.head(top)
    title = f"plan by {objective.name}: {len(table)} configurations"
    if "configurations_total" in table.attrs:
        title += f" evaluated by search of {table.attrs['configurations_total']}"
    if len(table) > top:
        title += f" (best {top} shown)"
    out = Table(title=title, box=box.SIMPLE_HEAD)
    out.add_column("devices", justify="left", overflow="fold", min_width=12)
    for header in ("#workers", "time", "power", "energy", "EDP", f"± {objective.name}"):
        out.add_column(header, justify="right")
    out.add_column("CHOSEN", justify="center", no_wrap=True, min_width=6)
    for _, row in shown.iterrows():
        std = row[objective.std_column]
        mark = "✔" if row["chosen"] else ("" if row["feasible"] else "infeasible")
        out.add_row(
            _devices_label(row), str(int(row["n_workers"])), _fmt(row["time_s"], "s"), _fmt(row["power_w"], "W"),
            _fmt(row["energy_j"], "J"), _fmt(row["edp_js"], "J·s"), _fmt(std, objective.unit), mark,
            style="bold green" if row["chosen"] else (None if row["feasible"] else "dim"),
        )
    return out


def near_ties_line(plan) -> str | None:
    """One line naming the configurations within the chosen prediction's uncertainty, or None."""
    ties = plan.near_ties()
    if ties.empty:
        return None
    objective, row = plan.objective, plan.chosen_row
    relative = row[objective.std_column] / row[objective.column] if row[objective.column] > 0 else math.nan
    listed = ", ".join(
        f"{_devices_label(tie, 40, '+')} {tie['relative_difference']:+.1%}" for _, tie in ties.iterrows()
    )
    return (f"near-tie: within the chosen prediction's ±{relative:.1%} by {objective.name}: {listed} — "
            "pre-training cannot tell these apart from the choice")


def revision_line(solo_rates, shown: int = REVISIONS_SHOWN) -> str | None:
    """One line naming the devices whose solo rate the calibration sets revised (Plan.solo_rates,
    planner/solo_rates.py). Identical devices revised alike are named once with their count; a
    change under REVISION_SHOWN_FROM is left out."""
    changed: dict[tuple[float, float], list[str]] = {}
    for rate in solo_rates:
        old, new = rate.window_steps_per_s, rate.used_steps_per_s
        if abs(new / old - 1.0) >= REVISION_SHOWN_FROM:
            changed.setdefault((old, new), []).append(rate.device)
    if not changed:
        return None
    parts = [f"{names[0] if len(names) == 1 else f'{names[0]} (and {len(names) - 1} alike)'} "
             f"{old:.3g} → {new:.3g} steps/s ({new / old - 1:+.1%})" for (old, new), names in changed.items()]
    more = f", and {len(parts) - shown} more" if len(parts) > shown else ""
    return ("solo rates revised by what the calibration sets measured of each device (window → used): "
            + ", ".join(parts[:shown]) + more)


def print_table(plan, top: int = DEFAULT_TOP_ROWS, console=None) -> None:
    from hetcluster.cli.console import make_console

    console = console or make_console()
    console.print(plan_table(plan, top))
    line = near_ties_line(plan)
    if line:
        console.print(line, style="yellow", markup=False, highlight=False)


def _row_record(row: dict) -> dict:
    record = {}
    for key in _COLUMNS:
        if key not in row:
            continue
        value = row[key]
        if key == "devices":
            value = list(value)
        elif isinstance(value, (bool, np.bool_)):
            value = bool(value)
        elif isinstance(value, (int, np.integer)):
            value = int(value)
        else:
            value = float(value)
            value = value if math.isfinite(value) else None
        record[key] = value
    if "classes" in row and isinstance(row["classes"], tuple):
        record["classes"] = list(row["classes"])
    return record


def plan_to_dict(plan, limit: int | None = JSON_MAX_ROWS) -> dict:
    """JSON-ready dict: objective, chosen, constraints, solo_rates (Plan.solo_rates: each device's
    window and used steps/s), near_ties (Plan.near_ties), configurations (best first, ≤ limit)."""
    table = plan.table
    rows = table if limit is None else table.head(limit)
    return {
        "objective": plan.objective.name,
        "chosen": list(plan.chosen),
        "constraints": [c.describe() for c in plan.constraints],
        "mode": table.attrs.get("mode", "devices"),
        "configurations_total": int(table.attrs.get("configurations_total", len(table))),
        "configurations_listed": int(len(rows)),
        "truncated": bool(len(rows) < len(table)),
        "solo_rates": [{"device": r.device, "window_steps_per_s": float(r.window_steps_per_s),
                        "used_steps_per_s": float(r.used_steps_per_s)} for r in plan.solo_rates],
        "near_ties": [{**_row_record(r), "relative_difference": float(r["relative_difference"])}
                      for r in plan.near_ties().to_dict("records")],
        "configurations": [_row_record(r) for r in rows.to_dict("records")],
    }


def plan_to_json(plan, limit: int | None = JSON_MAX_ROWS) -> str:
    return json.dumps(plan_to_dict(plan, limit), indent=2, ensure_ascii=False)


def plan_to_csv(plan) -> str:
    """Every row as CSV; devices joined by '+'."""
    frame = plan.table[[c for c in _COLUMNS if c in plan.table.columns]].copy()
    frame["devices"] = frame["devices"].map("+".join)
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    return buffer.getvalue()


def render(plan, output_format: str = "table", top: int = DEFAULT_TOP_ROWS, console=None) -> None:
    """Print the plan in one of FORMATS (the CLI validates the format before planning)."""
    import typer

    if output_format == "table":
        print_table(plan, top, console)
    elif output_format == "json":
        typer.echo(plan_to_json(plan))
    elif output_format == "csv":
        typer.echo(plan_to_csv(plan), nl=False)
    else:
        raise typer.BadParameter(f"unknown format {output_format!r}; use one of {', '.join(FORMATS)}")


def plot_pareto(table: pd.DataFrame, chosen, path: str | Path, max_points: int = 20000) -> Path:
    """Time vs energy scatter, Pareto front marked, chosen point labelled; written atomically."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    from hetcluster.fileio import write_figure_atomic
    from hetcluster.planner import pareto_front

    path = Path(path)
    feasible = table["feasible"].to_numpy(bool) if "feasible" in table.columns else np.ones(len(table), bool)
    front = pareto_front(table, among=feasible)
    chosen = tuple(chosen)
    chosen_mask = table["devices"].map(lambda d: tuple(d) == chosen).to_numpy(bool)
    others = np.flatnonzero(~front & ~chosen_mask)
    if others.size > max_points:
        others = np.random.default_rng(0).choice(others, max_points, replace=False)
    time_s = table["time_s"].to_numpy(float)
    energy_j = table["energy_j"].to_numpy(float)
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter(time_s[others], energy_j[others], s=8, c=np.where(feasible[others], "tab:gray", "lightgray"),
               label="configurations", alpha=0.6)
    order = np.flatnonzero(front)[np.argsort(time_s[front])]
    ax.plot(time_s[order], energy_j[order], "-o", color="tab:blue", ms=4, label="Pareto front (feasible)")
    for index in np.flatnonzero(chosen_mask)[:1]:
        ax.scatter([time_s[index]], [energy_j[index]], s=120, marker="*", color="tab:red", zorder=5, label="chosen")
        ax.annotate(_devices_label(table.iloc[index], 40, "+"), (time_s[index], energy_j[index]),
                    textcoords="offset points", xytext=(8, 8), fontsize=8)
    for values, set_scale in ((time_s, ax.set_xscale), (energy_j, ax.set_yscale)):
        positive = values[np.isfinite(values) & (values > 0)]
        if positive.size and positive.max() > 20 * positive.min():  # slow single devices squash the rest
            set_scale("log")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("energy (J)")
    ax.set_title("time vs energy per configuration")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    try:
        path = write_figure_atomic(path, fig, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
