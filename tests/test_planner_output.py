"""Rendering a plan: the table marks the chosen row, JSON and CSV carry every required field."""

import io
import json

import pandas as pd
import pytest
from rich.console import Console

from hetcluster.cli.plan_output import plan_to_csv, plan_to_dict, plan_to_json, plot_pareto, print_table, revision_line
from hetcluster.planner import (
    Deadline,
    DeviceMeasurement,
    FittedModels,
    JobSpec,
    RunMeasurement,
    SoloRate,
    choose,
    estimate,
    plan,
)

FLEET = (
    DeviceMeasurement("A", 10.0, 100.0, 50.0),
    DeviceMeasurement("B", 5.0, 20.0, 10.0),
    DeviceMeasurement("C", 2.0, 10.0, 4.0),
)


def make_plan(objective="edp", constraints=()):
    return choose(estimate(FLEET, [], JobSpec(total_steps=1000)), objective, constraints)


def test_table_shows_columns_and_chosen_mark():
    console = Console(file=io.StringIO(), width=160, force_terminal=False)
    print_table(make_plan("energy"), console=console)
    text = console.file.getvalue()
    for header in ("devices", "#workers", "time", "power", "energy", "EDP", "± energy", "CHOSEN"):
        assert header in text
    chosen_line = [line for line in text.splitlines() if "✔" in line]
    assert len(chosen_line) == 1 and "B" in chosen_line[0]


def test_table_shows_top_rows_only():
    console = Console(file=io.StringIO(), width=160)
    print_table(make_plan(), top=2, console=console)
    assert "best 2 shown" in console.file.getvalue()


def test_json_has_the_contract_fields():
    data = json.loads(plan_to_json(make_plan("time", [Deadline(100.0)])))
    assert data["objective"] == "time"
    assert data["chosen"] == ["A", "B", "C"]
    assert len(data["configurations"]) == 7
    first = data["configurations"][0]
    for key in (
        "devices",
        "time_s",
        "power_w",
        "energy_j",
        "edp_js",
        "feasible",
        "time_s_std",
        "energy_j_std",
        "edp_js_std",
    ):
        assert key in first
    assert first["chosen"] is True and first["devices"] == ["A", "B", "C"]
    assert any(not c["feasible"] for c in data["configurations"])   # C alone misses the deadline


def test_json_limit_marks_truncation():
    data = plan_to_dict(make_plan(), limit=3)
    assert data["truncated"] and data["configurations_listed"] == 3 and data["configurations_total"] == 7


def test_csv_round_trips():
    frame = pd.read_csv(io.StringIO(plan_to_csv(make_plan())))
    assert len(frame) == 7
    assert frame.loc[frame["chosen"], "devices"].tolist() == ["A+B+C"]


def test_pareto_plot_is_written(tmp_path):
    plan = make_plan()
    out = plot_pareto(plan.table, plan.chosen, tmp_path / "pareto.png")
    assert out.exists() and out.stat().st_size > 1000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _time_plan(chosen_std_s: float, constraints=()):
    """The FLEET's time plan (by hand: ABC 58.82 s, AB 66.67 s, AC 83.33 s, A 100 s, …) with every
    prediction's time uncertainty set to ``chosen_std_s``."""
    table = estimate(FLEET, [], JobSpec(total_steps=1000))
    table["time_s_std"] = chosen_std_s
    return choose(table, "time", constraints)


def test_near_ties_are_the_feasible_configurations_within_the_chosen_uncertainty():
    plan = _time_plan(30.0)                       # 58.82 + 30 = 88.82 s: AB and AC, not A (100 s)
    ties = plan.near_ties()
    assert [tuple(d) for d in ties["devices"]] == [("A", "B"), ("A", "C")]
    assert ties["relative_difference"].tolist() == pytest.approx([66.667 / 58.824 - 1, 83.333 / 58.824 - 1], rel=1e-4)
    assert [tuple(d) for d in _time_plan(30.0, [Deadline(70.0)]).near_ties()["devices"]] == [("A", "B")]  # AC too slow
    assert _time_plan(5.0).near_ties().empty      # 63.82 s: nothing within

    console = Console(file=io.StringIO(), width=200)
    print_table(plan, console=console)
    assert "near-tie: within the chosen prediction's ±51.0% by time: A+B +13.3%, A+C +41.7%" in console.file.getvalue()
    data = plan_to_dict(plan)
    assert [t["devices"] for t in data["near_ties"]] == [["A", "B"], ["A", "C"]]
    assert data["near_ties"][0]["relative_difference"] == pytest.approx(0.1333, abs=1e-4)

    console = Console(file=io.StringIO(), width=200)
    print_table(_time_plan(5.0), console=console)
    assert "near-tie" not in console.file.getvalue() and plan_to_dict(_time_plan(5.0))["near_ties"] == []


def test_revision_line_names_each_revised_device_with_its_window_and_used_rate():
    rates = (SoloRate("A", 10.0, 10.0001), SoloRate("B", 5.0, 5.5), SoloRate("C", 2.0, 1.9))
    line = revision_line(rates)
    assert "B 5 → 5.5 steps/s (+10.0%)" in line and "C 2 → 1.9 steps/s (-5.0%)" in line
    assert "A " not in line   # +0.001 %: too small to name
    assert revision_line(tuple(SoloRate(d.name, d.steps_per_s, d.steps_per_s) for d in FLEET)) is None
    assert revision_line(()) is None


def test_revision_line_names_identical_devices_once_and_stops_at_the_shown_count():
    rates = tuple(SoloRate(f"pi-{i}", 2.0, 2.2) for i in range(5)) + tuple(
        SoloRate(f"nano-{i}", 3.0 + i, (3.0 + i) * 1.1) for i in range(4))
    line = revision_line(rates, shown=3)
    assert "pi-0 (and 4 alike) 2 → 2.2 steps/s" in line
    assert line.count("steps/s (") == 3 and line.endswith("and 2 more")


def test_a_plan_carries_each_devices_window_and_used_rate_into_its_json():
    """plan() revises a member's solo rate by what the calibration sets measured of it; the JSON
    says, per device, the rate its window read and the rate the prediction used."""
    def run(rates: dict[str, float]) -> RunMeasurement:   # 10 s, each member's own rate measured
        return RunMeasurement(tuple(rates), int(10 * sum(rates.values())), 10.0, sum(rates.values()), 120.0,
                              per_device_steps={name: 10 * rate for name, rate in rates.items()})

    runs = [run({"A": 9.0, "B": 5.6}), run({"B": 5.7, "C": 2.0}), run({"A": 9.4, "C": 2.1})]
    chosen = plan(FLEET, runs, JobSpec(total_steps=1000), "time")
    used = FittedModels.fit(FLEET, runs, JobSpec(total_steps=1000)).throughput.devices
    expected = [{"device": d.name, "window_steps_per_s": d.steps_per_s, "used_steps_per_s": u.steps_per_s}
                for d, u in zip(FLEET, used)]
    assert plan_to_dict(chosen)["solo_rates"] == expected
    assert any(e["used_steps_per_s"] != e["window_steps_per_s"] for e in expected), "the sets should revise a rate"
    assert plan_to_dict(make_plan())["solo_rates"] == []   # choose() alone knows no rates
