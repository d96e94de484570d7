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
