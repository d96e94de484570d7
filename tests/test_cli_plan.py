"""`hetcluster plan` on a profile recorded from the emulated cluster (server, jetson-nano, rpi4;
small_cnn, batch 32): every objective picks its own optimum, bad input is one line and exit ≠ 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from recorded_fleet import DEVICES, PROFILE, write_inventory


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    return write_inventory(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="module")
def graphed_profile(tmp_path_factory) -> Path:
    """PROFILE with the layer graph pre-training now records (Profile.memory_graph): a `plan`
    subprocess given it builds no model and imports no TensorFlow, 1 s instead of 6-8 s each."""
    from hetcluster.memory.model_graph import graph_of

    data = json.loads(PROFILE.read_text())
    model = data["model"]
    data["memory_graph"] = graph_of(model["name"], 1, tuple(model["input_shape"]), model["classes"]).to_dict()
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    path.write_text(json.dumps(data))
    return path


def plan_json(inventory: Path, *args: str) -> dict:
    """In-process (TensorFlow, loaded for the memory fit, is imported once per test session)."""
    from typer.testing import CliRunner

    from hetcluster.cli.app import app

    command = ["plan", "--inventory", str(inventory), "--model", "small_cnn", "--profile", str(PROFILE),
               "--total-steps", "3000", "--format", "json", *args]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


def plan(inventory: Path, profile: Path, *args: str, python_flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        *python_flags,
        "-m",
        "hetcluster.cli.app",
        "plan",
        "--inventory",
        str(inventory),
        "--model",
        "small_cnn",
        "--profile",
        str(profile),
        "--total-steps",
        "3000",
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # the CLI's own default
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize(
    "objective, column", [("time", "time_s"), ("power", "power_w"), ("energy", "energy_j"), ("edp", "edp_js")]
)
def test_each_objective_chooses_its_minimum(inventory, objective, column):
    data = plan_json(inventory, "--objective", objective)
    assert data["objective"] == objective
    configurations = data["configurations"]
    assert len(configurations) == 2 ** len(DEVICES) - 1
    for row in configurations:
        assert {"devices", "time_s", "power_w", "energy_j", "edp_js", "feasible"} <= set(row)
    best = min((row for row in configurations if row["feasible"]), key=lambda row: row[column])
    assert sorted(data["chosen"]) == sorted(best["devices"])


def test_constraints_shape_the_choice(inventory):
    assert "server" not in plan_json(inventory, "--objective", "time", "--exclude", "server")["chosen"]
    assert "server" in plan_json(inventory, "--objective", "power", "--require", "server")["chosen"]


def test_infeasible_request_names_the_constraint(inventory, graphed_profile):
    result = plan(inventory, graphed_profile, "--objective", "edp", "--max-power", "0.5")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "power" in result.stderr.lower()
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, needle", [
    (("--objective", "speed"), "objective"),
    (("--require", "toaster"), "toaster"),
    (("--input-shape", "32x32"), "HxWxC"),
    (("--batch-size", "64"), "measured for batch size 32, not 64. To fix: pass --batch-size 32"),
    (("--input-shape", "64x64x3", "--classes", "100"), "To fix: pass --input-shape 32x32x3 --classes 10"),
    (("--plot", "pareto.xyz"), "Cannot write a plot as .xyz"),
])
def test_bad_input_is_one_line(inventory, graphed_profile, args, needle):
    result = plan(inventory, graphed_profile, *args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert needle in result.stderr


def test_csv_and_plot(inventory, graphed_profile, tmp_path):
    png = tmp_path / "pareto.png"
    result = plan(inventory, graphed_profile, "--format", "csv", "--plot", str(png))
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0]
    assert "time_s" in header and "energy_j" in header
    assert png.stat().st_size > 1000
    assert png.stat().st_mode & 0o777 == 0o644   # a plot is for reading, not a secret


def test_make_plan_plans_for_the_fleet_its_caller_loaded(tmp_path):
    """Train and evaluate check the agents of the inventory they loaded; the plan must be for that
    same fleet, not a second read of a file that may have changed (here: gone) since."""
    from hetcluster.cli import job_options as opt
    from hetcluster.cli.cmd_plan import make_plan
    from hetcluster.cli.console import make_console

    inventory = write_inventory(tmp_path)
    fleet = opt.load_fleet(inventory)
    inventory.unlink()
    planned = make_plan(objective="edp", inventory=inventory, model="small_cnn", input_shape="32x32x3", classes=10,
                        batch_size=32, data=None, total_steps=3000, pretrain_steps=10, warmup_steps=3,
                        workdir=tmp_path / "work", profile=PROFILE, deadline=None, max_power=None, max_energy=None,
                        require=None, exclude=None, device_kind=None, console=make_console(), fleet=fleet)
    assert set(planned.plan.chosen) <= set(DEVICES)


def test_the_table_says_which_solo_rates_the_sets_revised(inventory, graphed_profile):
    """The planner revises a device's solo rate by what the calibration sets measured of it
    (planner/solo_rates.py); the user sees which, from what window rate to what rate, on the
    console and for every device in the JSON."""
    from hetcluster.cli.plan_output import REVISION_SHOWN_FROM
    from hetcluster.planner import FittedModels
    from hetcluster.profiling.profile import load_profile, to_planner_inputs

    devices, runs, job = to_planner_inputs(load_profile(PROFILE), 3000)
    used = FittedModels.fit(devices, runs, job).throughput.devices
    revised = [d.name for d, u in zip(devices, used) if abs(u.steps_per_s / d.steps_per_s - 1) >= REVISION_SHOWN_FROM]
    assert revised, "the recorded profile's sets should revise a solo rate"
    result = plan(inventory, graphed_profile, "--objective", "edp")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("solo rates revised")]
    assert len(lines) == 1
    assert {d.name for d in devices if f" {d.name} " in lines[0]} == set(revised)
    rates = plan_json(inventory, "--objective", "edp")["solo_rates"]
    assert [r["device"] for r in rates] == [d.name for d in devices]
    assert [r["window_steps_per_s"] for r in rates] == pytest.approx([d.steps_per_s for d in devices])
    assert [r["used_steps_per_s"] for r in rates] == pytest.approx([u.steps_per_s for u in used])


def test_a_profile_with_its_layer_graph_replans_without_building_the_model(inventory, graphed_profile):
    """Pre-training records the layer graph its memory plans were made on (Profile.memory_graph);
    planning from that profile adopts it for the same model, input shape and classes, so it builds
    no model and imports no TensorFlow (about 5 s of a 6 s re-plan on a 2-core host), and plans
    exactly as building the model would. A profile without the graph (older ones) builds the model;
    a job of another input shape is not this profile's job at all (one-line error)."""
    def planned(profile: Path, *args: str) -> tuple[dict, bool]:
        result = plan(inventory, profile, "--objective", "edp", "--format", "json", *args,
                      python_flags=("-X", "importtime"))
        assert result.returncode == 0, result.stderr[-3000:]
        imported = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
        assert imported, "-X importtime wrote no import lines"
        return json.loads(result.stdout), any(line.split("|")[-1].strip() == "tensorflow" for line in imported)

    adopted, imported_tensorflow = planned(graphed_profile)
    assert not imported_tensorflow
    built, imported_tensorflow = planned(PROFILE)
    assert imported_tensorflow
    assert adopted["configurations"] == built["configurations"]
    assert all(row["memory_fits"] for row in adopted["configurations"])
    other_shape = plan(inventory, graphed_profile, "--input-shape", "16x16x3")
    assert other_shape.returncode != 0 and "Traceback" not in other_shape.stderr
    assert "measured for input shape 32x32x3, not 16x16x3" in other_shape.stderr


def test_a_fleet_that_is_down_is_replanned_from_its_profile(inventory, graphed_profile, tmp_path):
    """`cluster down` removes an emulated fleet's throwaway credentials. Planning from a profile needs
    no agent (the budgets are the inventory's; an agent it cannot ask leaves the device kind cpu),
    so it still plans, as it does with the credentials there; pre-training needs the agents, so
    without --profile the unreadable token file is one line."""
    down = write_inventory(tmp_path)
    (tmp_path / "token").unlink()
    offline = plan(down, graphed_profile, "--objective", "edp", "--format", "json")
    assert offline.returncode == 0, offline.stderr[-3000:]
    assert json.loads(offline.stdout)["configurations"] == plan_json(inventory, "--objective", "edp")["configurations"]
    command = [sys.executable, "-m", "hetcluster.cli.app", "plan", "--inventory", str(down), "--model", "small_cnn",
               "--total-steps", "3000", "--workdir", str(tmp_path / "work")]
    pretrain = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert pretrain.returncode != 0 and "Traceback" not in pretrain.stderr
    assert "token_file" in pretrain.stderr and len(pretrain.stderr.strip().splitlines()) == 1


def test_a_users_own_model_plans_from_its_config(inventory, graphed_profile, tmp_path):
    """--model-config instead of --model: the job's model is the user's tf_keras config (its input
    shape and classes are the config's). A profile measured for it re-plans as a registry model's
    does, without TensorFlow; the wrong model for a profile, two models, a config's classes
    contradicted, and a config carrying code are each one line before anything runs."""
    from hetcluster.memory.model_graph import graph_of
    from hetcluster.models.spec import ModelSpec

    config = Path(__file__).parent / "data" / "models" / "user_net.json"
    model = ModelSpec.from_keras_config(config.read_text(), batch_size=32)
    data = json.loads(graphed_profile.read_text())  # the same measurements, as if of this model
    data["model"] = model.to_dict()
    data["memory_graph"] = graph_of(model.name, 1, model.input_shape, model.classes).to_dict()
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(data))

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "hetcluster.cli.app",
            "plan",
            "--inventory",
            str(inventory),
            "--profile",
            str(profile),
            "--total-steps",
            "3000",
            "--objective",
            "edp",
            "--format",
            "json",
            *args,
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    planned = run("--model-config", str(config))
    assert planned.returncode == 0, planned.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in planned.stderr.splitlines() if line.startswith("import time:")}
    assert imported and "tensorflow" not in imported and "tf_keras" not in imported
    registry = plan(inventory, graphed_profile, "--objective", "edp", "--format", "json")
    assert json.loads(planned.stdout)["configurations"] == json.loads(registry.stdout)["configurations"]

    evil = json.loads(config.read_text())
    evil["config"]["layers"][3]["class_name"] = "Lambda"
    (tmp_path / "evil.json").write_text(json.dumps(evil))
    for args, needle in [
        (
            ("--model", "small_cnn"),
            f"measured for model {model.name}, input shape 16x16x3, classes 4 (a model config), "
            f"not small_cnn, 32x32x3, 10. To fix: pass --model-config with the config of {model.name}",
        ),
        (("--model", "small_cnn", "--model-config", str(config)), "name two models"),
        (("--model-config", str(config), "--classes", "10"), "has 4"),
        (("--model-config", str(tmp_path / "evil.json")), "Lambda layer"),
    ]:
        refused = run(*args)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        errors = [line for line in refused.stderr.splitlines() if not line.startswith("import time:")]
        assert len(errors) == 1 and needle in errors[0], errors[0]
