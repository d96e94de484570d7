"""The train report: whole-job measured metrics, relative errors, and the JSON keys issue 5 names."""

import json

import pytest

from hetcluster.cli.train_output import report_table
from hetcluster.training.report import JobMetrics, TrainReport, measured_metrics, relative_errors


def test_measured_metrics_add_pretraining_and_take_power_from_the_run():
    m = measured_metrics(pretrain_time_s=10.0, pretrain_energy_j=500.0, run_time_s=40.0, run_energy_j=4000.0)
    assert m.time_s == 50.0 and m.energy_j == 4500.0
    assert m.power_w == pytest.approx(100.0)  # run energy / run time, pre-training not in it
    assert m.edp_js == pytest.approx(4500.0 * 50.0)


def test_relative_errors_are_against_the_measurement_and_skip_zero():
    predicted = JobMetrics(time_s=55.0, power_w=90.0, energy_j=4500.0, edp_js=0.0)
    measured = JobMetrics(time_s=50.0, power_w=100.0, energy_j=4500.0, edp_js=0.0)
    errors = relative_errors(predicted, measured)
    assert errors["time_s"] == pytest.approx(0.1) and errors["power_w"] == pytest.approx(-0.1)
    assert errors["energy_j"] == 0.0 and errors["edp_js"] is None


def test_report_json_has_the_issue_keys_and_renders():
    report = TrainReport(objective="edp", chosen=["server", "rpi4"],
                         predicted=JobMetrics(50.0, 100.0, 5000.0, 250000.0),
                         measured=measured_metrics(10.0, 500.0, 45.0, 4050.0),
                         steps_total=400, steps_per_worker={"server": 300, "rpi4": 40}, lost_workers=["rpi4"],
                         final_loss=1.5, steps_restored=60, steps_applied=340)
    data = json.loads(json.dumps(report.to_dict()))
    for key in ("predicted", "measured", "steps_total", "steps_per_worker", "chosen", "errors", "lost_workers",
                "final_loss"):
        assert key in data
    for side in ("predicted", "measured"):
        assert set(data[side]) == {"time_s", "power_w", "energy_j", "edp_js"}
    assert data["errors"]["time_s"] == pytest.approx((50.0 - 55.0) / 55.0)
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(report_table(report))
    text = console.export_text()
    assert "rpi4 (lost)" in text and "server + rpi4" in text


def test_the_timeline_orders_segments_and_elastic_events_and_renders_them():
    from hetcluster.cli.train_output import timeline_table
    from hetcluster.training.report import job_timeline

    segments = [
        {"devices": ["b"], "steps_restored": 0, "steps_applied": 400, "time_s": 40.0, "energy_j": 240.0,
         "stopped": True, "lost_workers": [], "start_wall_s": 100.0,
         "predicted": {"steps_per_s": 10.0, "startup_s": 2.0, "power_w": 6.0}},
        {"devices": ["b", "c"], "steps_restored": 400, "steps_applied": 600, "time_s": 12.0, "energy_j": 500.0,
         "stopped": False, "lost_workers": [], "start_wall_s": 160.0, "why": "re-plan ..."},
        {"devices": ["b", "c"], "steps_applied": 5, "time_s": 1.0, "energy_j": 1.0, "partial": True},
    ]
    decision = {"switch": True, "chosen": ["b", "c"], "candidate": {"devices": ["b", "c"]}, "saving": 20.0,
                "switch_cost": 8.0, "unit": "s"}
    events = [
        {"kind": "joined", "device": "c", "reason": "added to the inventory", "wall_s": 120.0, "step": 200},
        {"kind": "figures", "device": "c", "source": "measured now", "steps_per_s": 50.0, "wall_s": 135.0,
         "step": 350},
        {"kind": "replan", "line": "re-plan ...", "decision": decision, "wall_s": 136.0, "step": 360},
        {"kind": "switch", "source": ["b"], "target": ["b", "c"], "wall_s": 141.0, "step": 400,
         "measured_to_first_step_s": 19.0, "predicted": {"to_first_step_s": 15.0}},
    ]
    timeline = job_timeline(segments, events)
    assert [row["kind"] for row in timeline] == ["segment", "joined", "figures", "replan", "switch", "segment"]
    first = timeline[0]
    assert (first["steps_from"], first["steps_to"]) == (0, 400)
    assert first["predicted_time_s"] == pytest.approx(2.0 + 400 / 10.0)
    assert first["predicted_energy_j"] == pytest.approx(6.0 * 42.0)
    assert timeline[-1]["predicted_time_s"] is None   # a segment recorded without a prediction
    assert timeline[3]["saving"] == 20.0 and "decision" not in timeline[3]
    report = TrainReport(objective="time", chosen=["b", "c"], predicted=JobMetrics(50.0, 10.0, 500.0, 25000.0),
                         measured=measured_metrics(5.0, 100.0, 52.0, 740.0), steps_total=1000,
                         steps_per_worker={"b": 700, "c": 300}, lost_workers=[], final_loss=1.0, timeline=timeline)
    from rich.console import Console

    console = Console(record=True, width=160)
    console.print(timeline_table(report))
    text = console.export_text()
    assert "joined: added to the inventory" in text and "re-plan: switch, saving 20 s against a cost of 8 s" in text
    assert "b → b+c" in text and "first step 19.0 s after the decision (predicted 15.0 s)" in text
    assert "40.0 (42.0)" in text and "0→400" in text
