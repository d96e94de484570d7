"""`hetcluster memplan`: JSON keys, the plot, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-m", "hetcluster.cli.app", "memplan", *args],
                          capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.tensorflow
def test_memplan_json_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "memory.png"
    measured = tmp_path / "points.json"  # as benchmarks/memory.py --json writes them
    point = {"model": "small_cnn", "input_shape": [32, 32, 3], "classes": 10, "batch_size": 64, "label": "budget 0.9",
             "technique": "recompute_cost_aware", "measured_peak_bytes": 30 * 2**20, "predicted_peak_bytes": 29 * 2**20,
             "predicted_slowdown": 0.02, "measured_slowdown_cpu": 0.03, "measured_slowdown_wall": 0.04,
             "plain_measured_peak_bytes": 33 * 2**20}
    measured.write_text(json.dumps({"points": [point]}))
    result = run_cli("--model", "small_cnn", "--batch-size", "64", "--budget", "40MiB", "--input-shape", "32x32x3",
                     "--classes", "10", "--format", "json", "--plot", str(plot), "--measured", str(measured))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["budget_bytes"] == 40 * 2**20
    for key in ("fits", "predicted_peak_bytes", "baseline_peak_bytes", "liveness_peak_bytes",
                "technique_peaks_bytes", "predicted_slowdown", "actions", "segments", "technique", "needed_bytes",
                "margin", "frontier"):
        assert key in data
    assert data["predicted_peak_bytes"] <= data["liveness_peak_bytes"] <= data["baseline_peak_bytes"]
    assert data["needed_bytes"] <= data["budget_bytes"] and data["needed_bytes"] > data["predicted_peak_bytes"]
    peaks = [p["predicted_peak_bytes"] for p in data["frontier"]]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] == data["liveness_peak_bytes"]
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".memplot-")]


@pytest.mark.tensorflow
def test_memplan_table_says_when_nothing_fits() -> None:
    result = run_cli("--model", "small_cnn", "--batch-size", "8", "--budget", "1000", "--input-shape", "32x32x3")
    assert result.returncode == 0, result.stderr
    assert "does not fit" in result.stdout and "recompute" in result.stdout
    assert "it needs a budget of" in result.stdout and "memory/time frontier" in result.stdout


@pytest.mark.parametrize("args,needle", [
    (("--budget", "lots"), "memory size"),
    (("--budget", "0GiB"), "not positive"),
    (("--budget", "1GiB", "--device-kind", "tpu"), "device kind"),
    (("--budget", "1GiB", "--format", "xml"), "format"),
    (("--budget", "1GiB", "--input-shape", "32x32"), "HxWxC"),
    (("--budget", "1GiB", "--plot", "memory.xyz"), "Cannot write a plot as .xyz"),
    (("--budget", "1GiB", "--plot", "m.png", "--measured", "/nonexistent/points.json"), "Cannot read measured points"),
])
def test_memplan_bad_input_is_one_line(args: tuple[str, ...], needle: str) -> None:
    result = run_cli("--model", "small_cnn", *args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.stderr


def test_memplan_unknown_model_is_one_line() -> None:
    result = run_cli("--model", "resnet51", "--budget", "1GiB")
    assert result.returncode != 0 and "Unknown model" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.tensorflow
def test_memplan_plans_a_users_own_model_from_its_config() -> None:
    """--model-config instead of --model (in-process: the model is built here either way)."""
    from typer.testing import CliRunner

    from hetcluster.cli.app import app

    config = Path(__file__).parent / "data" / "models" / "user_net.json"
    result = CliRunner().invoke(
        app, ["memplan", "--model-config", str(config), "--batch-size", "64", "--budget", "1MiB", "--format", "json"]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    data = json.loads(result.stdout)
    assert data["model"] == "user_net" and data["batch_size"] == 64  # the layer graph has the Keras model's own name
    assert {"c1", "bn", "r", "gap", "logits"} <= {name for segment in data["segments"] for name in segment["layers"]}
    neither = CliRunner().invoke(app, ["memplan", "--budget", "1MiB"])  # the CLI's entry point prints it in one line
    assert "give --model NAME (a registry model) or --model-config FILE" in str(neither.exception)
