"""The choice-accuracy tables: exact and within-5% rates, MAPE and overhead, from evaluation JSONs.

Hand-made evaluation dicts in the `hetcluster evaluate` format (issue 5), so the arithmetic is
checked without training; the rendering path of experiments/choice_accuracy.py (--render-only)
writes the CSVs and PNGs from a raw/ folder like a real run leaves.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments import accuracy, choice_accuracy

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def metrics(time_s: float, power_w: float) -> dict[str, float]:
    return {"time_s": time_s, "power_w": power_w, "energy_j": time_s * power_w, "edp_js": time_s * time_s * power_w}


def evaluation(chosen: dict[str, list[str]], regrets: dict[str, float], mape_time: float, overhead: float) -> dict:
    """A minimal evaluate result: the measured best is always ["a"]; regret 0 means exact."""
    objectives = {name: {"chosen": devices, "best": ["a"], "exact": regrets[name] == 0.0, "regret": regrets[name]}
                  for name, devices in chosen.items()}
    configs = [{"devices": ["a"], "predicted": metrics(10, 5), "measured": metrics(10, 5)},
               {"devices": ["a", "b"], "predicted": metrics(8, 9), "measured": metrics(9, 10)},
               {"devices": ["b"], "predicted": metrics(30, 2), "measured": None, "error": "lost worker"}]
    return {"configurations": configs, "objectives": objectives,
            "pretrain": {"steps": 40, "time_s": 4.0, "overhead": overhead},
            "mape": {"time_s": mape_time, "energy_j": 0.2, "power_w": 0.1},
            "mape_training_phase": {"time_s": mape_time * 2, "energy_j": 0.3}}


RUNS = [
    ("m1", {"input_shape": "16x16x3", "batch_size": 8, "total_steps": 100, "wall_s": 12.0},
     evaluation({"time": ["a"], "power": ["b"], "energy": ["a", "b"], "edp": ["a"]},
                {"time": 0.0, "power": 0.0, "energy": 0.03, "edp": 0.0}, 0.10, 0.2)),
    ("m2", {"input_shape": "32x32x3", "batch_size": 4, "total_steps": 50, "wall_s": 20.0},
     evaluation({"time": ["a", "b"], "power": ["b"], "energy": ["a"], "edp": ["b"]},
                {"time": 0.5, "power": 0.0, "energy": 0.0, "edp": 0.049}, 0.30, 0.4)),
]


def test_choice_rows_mark_exact_and_within_tolerance() -> None:
    frames = accuracy.tables(RUNS, 0.7667)
    choices = frames["choices"]
    assert len(choices) == 8
    row = choices[(choices["model"] == "m2") & (choices["objective"] == "edp")].iloc[0]
    assert not row["exact"] and row["within_5pct"]  # 4.9% regret: not the best, but within 5%
    row = choices[(choices["model"] == "m2") & (choices["objective"] == "time")].iloc[0]
    assert not row["exact"] and not row["within_5pct"]
    assert row["chosen"] == "a+b" and row["best"] == "a"


def test_summary_rates_per_objective_and_overall() -> None:
    summary = accuracy.tables(RUNS, 0.7667)["summary"].set_index("scope")
    assert summary.loc["all", "cases"] == 8
    assert summary.loc["all", "exact"] == pytest.approx(5 / 8)
    assert summary.loc["all", "within_5pct"] == pytest.approx(7 / 8)
    assert summary.loc["time", "exact"] == pytest.approx(0.5)
    assert summary.loc["power", "exact"] == pytest.approx(1.0)
    assert summary.loc["all", "mape_time"] == pytest.approx(0.2)
    assert summary.loc["all", "mape_time_training"] == pytest.approx(0.4)
    assert summary.loc["all", "pretrain_overhead"] == pytest.approx(0.3)
    assert summary.loc["reference paper", "exact"] == pytest.approx(0.7667)
    assert pd.isna(summary.loc["all", "within_noise"])  # trained once: the truth's noise is unknown


def test_a_group_scope_scores_only_its_models_choices() -> None:
    summary = accuracy.tables(RUNS, 0.7667, {"unseen": ["m2"]})["summary"].set_index("scope")
    # m2: time (regret 0.5) and edp (0.049) missed, power and energy exact
    assert summary.loc["unseen", "cases"] == 4
    assert summary.loc["unseen", "exact"] == pytest.approx(0.5)
    assert summary.loc["unseen", "within_5pct"] == pytest.approx(0.75)
    assert summary.loc["all", "cases"] == 8 and summary.loc["all", "exact"] == pytest.approx(5 / 8)
    assert list(summary.index) == ["time", "power", "energy", "edp", "all", "unseen", "reference paper"]


def test_the_markdown_table_gives_each_scope_its_counts_all_first() -> None:
    summary = accuracy.tables(RUNS, 0.7667, {"unseen": ["m2"]})["summary"]
    lines = accuracy.markdown_table(summary).splitlines()
    assert lines[0] == "| " + " | ".join(accuracy.MARKDOWN_COLUMNS) + " |"
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| **all**", "| unseen", "| time", "| power", "| energy",
                                                          "| EDP"]
    assert lines[2].startswith("| **all** | **8** | **5 (62 %)** |")   # 5 of 8 exact: bold, with its count
    assert lines[3].startswith("| unseen | 4 | 2 (50 %) |")
    assert lines[3].endswith("| – | – | – | – | – | – | – |")  # no repeated truth, no near-ties recorded
    summary.loc[summary["scope"] == "all", ["separated_cases", "exact_when_separated", "rounds_agree"]] = [
        4,
        0.75,
        0.81,
    ]
    assert "| **3 of 4 (75 %)** |" in accuracy.markdown_table(summary).splitlines()[2]
    assert accuracy.markdown_table(summary).splitlines()[2].endswith("| **90.0 %** |")   # sqrt(0.81)


def test_the_readme_columns_are_a_choice_of_the_full_table_s_with_the_reference_last() -> None:
    def cells(table: str) -> list[list[str]]:
        return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]

    summary = accuracy.tables(RUNS, 0.7667, {"unseen": ["m2"]})["summary"]
    full = cells(accuracy.markdown_table(summary))
    short = cells(accuracy.markdown_table(summary, accuracy.README_COLUMNS, reference=True))
    kept = [accuracy.MARKDOWN_COLUMNS.index(c) for c in accuracy.README_COLUMNS]
    assert short[:-1] == [[row[i] for i in kept] for row in full]
    assert short[-1] == ["reference paper", "", "76.67 %", "", ""]


def test_within_noise_rate_counts_the_objectives_that_measured_it() -> None:
    ev = evaluation({"time": ["a", "b"], "edp": ["b"]}, {"time": 0.02, "edp": 0.2}, 0.1, 0.1)
    ev["objectives"]["time"]["within_noise"] = True
    ev["objectives"]["edp"]["within_noise"] = False
    summary = accuracy.tables([("m", {}, ev)], 0.7667)["summary"].set_index("scope")
    assert summary.loc["all", "exact"] == 0.0 and summary.loc["all", "within_noise"] == pytest.approx(0.5)
    assert summary.loc["time", "within_noise"] == 1.0


def test_exact_when_clear_counts_only_the_choices_the_plan_named_no_near_tie_for() -> None:
    ev = evaluation({"time": ["a", "b"], "power": ["b"], "energy": ["a"], "edp": ["a"]},
                    {"time": 0.02, "power": 0.3, "energy": 0.0, "edp": 0.0}, 0.1, 0.1)
    near = {"time": [["a"]], "power": [], "energy": [], "edp": [["b"], ["a", "b"]]}
    for name, ties in near.items():
        ev["objectives"][name].update(near_ties=ties, best_among_near_ties=ev["objectives"][name]["exact"]
                                      or ["a"] in ties)
    frames = accuracy.tables([("m", {}, ev)], 0.7667)
    assert frames["choices"]["near_ties"].tolist() == [1, 0, 0, 2]
    summary = frames["summary"].set_index("scope")
    # clear: power (wrong) and energy (exact) → 1 of 2; the best is among the near-ties for time, energy, edp
    assert summary.loc["all", "clear_cases"] == 2 and summary.loc["all", "exact_when_clear"] == pytest.approx(0.5)
    assert summary.loc["all", "best_among_near_ties"] == pytest.approx(3 / 4)
    assert summary.loc["time", "clear_cases"] == 0 and pd.isna(summary.loc["time", "exact_when_clear"])
    assert pd.isna(
        accuracy.tables(RUNS, 0.7667)["summary"].set_index("scope").loc["all", "clear_cases"]
    )  # not recorded


def test_unmeasured_choice_counts_as_unknown_not_wrong() -> None:
    ev = evaluation({"time": ["b"]}, {"time": 0.0}, 0.1, 0.1)
    ev["objectives"]["time"].update({"exact": None, "regret": None})
    frames = accuracy.tables([("m", {}, ev)], 0.7667)
    summary = frames["summary"].set_index("scope")
    assert pd.isna(summary.loc["all", "exact"]) and summary.loc["all", "cases"] == 1


def test_models_and_configurations_tables() -> None:
    frames = accuracy.tables(RUNS, 0.7667)
    models = frames["models"].set_index("model")
    assert models.loc["m1", "configurations"] == 3 and models.loc["m1", "measured"] == 2
    assert models.loc["m2", "pretrain_overhead"] == pytest.approx(0.4)
    configs = frames["configurations"]
    failed = configs[(configs["model"] == "m1") & (configs["devices"] == "b")].iloc[0]
    assert failed["error"] == "lost worker" and pd.isna(failed["measured_time_s"])
    assert failed["predicted_time_s"] == 30


def write_raw_results(out_dir: Path) -> tuple:
    """RUNS as a choice-accuracy run leaves them in OUT_DIR/raw/; returns the matching settings."""
    raw = out_dir / "raw"
    raw.mkdir()
    for model, setting, ev in RUNS:
        (raw / f"{model}.json").write_text(json.dumps(ev))
        (raw / f"{model}.setting.json").write_text(json.dumps({"model": model, **setting}))
    return tuple(choice_accuracy.Setting(m, s["input_shape"], s["batch_size"], s["total_steps"]) for m, s, _ in RUNS)


def test_render_only_writes_tables_and_figures(tmp_path: Path) -> None:
    frames = choice_accuracy.render(tmp_path, write_raw_results(tmp_path))
    for name in ("choices", "models", "configurations", "summary"):
        assert pd.read_csv(tmp_path / f"{name}.csv").shape[0] == len(frames[name])
    for name in ("accuracy", "errors", "predicted_vs_measured"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_render_only_without_results_says_what_to_run(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    with pytest.raises(SystemExit, match="run without --render-only"):
        choice_accuracy.render(tmp_path, choice_accuracy.REDUCED)


def test_unknown_model_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        choice_accuracy.main(["--reduced", "--models", "alexnet", "--out-dir", str(tmp_path), "--render-only"])
    assert exit_info.value.code == 2
    assert "alexnet" in capsys.readouterr().err


def test_full_configuration_has_five_models_on_three_platforms() -> None:
    from experiments.common import PLATFORMS

    assert len({s.model for s in choice_accuracy.FULL}) == 5
    assert PLATFORMS == ("server", "jetson-nano", "phone")


def test_machine_records_of_earlier_runs_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "machine.json"
    assert choice_accuracy.previous_runs(path) == []
    path.write_text(json.dumps({"command": "old format", "before": {}}))
    assert choice_accuracy.previous_runs(path) == [{"command": "old format", "before": {}}]
    path.write_text(json.dumps({"runs": [{"command": "a"}, {"command": "b"}]}))
    assert [r["command"] for r in choice_accuracy.previous_runs(path)] == ["a", "b"]


def test_job_scale_multiplies_total_steps_and_rejects_nonsense() -> None:
    longer = choice_accuracy.scaled(choice_accuracy.FULL, 4)
    assert [s.total_steps for s in longer] == [4 * s.total_steps for s in choice_accuracy.FULL]
    assert [s.pretrain_steps for s in longer] == [s.pretrain_steps for s in choice_accuracy.FULL]
    with pytest.raises(SystemExit, match="job-scale"):
        choice_accuracy.scaled(choice_accuracy.FULL, 0)


def test_repeats_name_their_results_and_reject_nonsense(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        choice_accuracy.main(["--repeats", "0", "--render-only", "--out-dir", str(tmp_path)])
    assert "--repeats must be 1 or more" in capsys.readouterr().err


def test_fleet_name_is_a_valid_cluster_name_for_any_results_folder() -> None:
    from hetcluster.emulation.cluster import _NAME_RE

    for folder in ("full", "full-x10-r2", "full-x4-r3", "My Results_2026-11-21 long", "___"):
        name = choice_accuracy.fleet_name(Path("/results") / folder)
        assert _NAME_RE.match(name), (folder, name)
    assert choice_accuracy.fleet_name(Path("/results/full-x10-r2")) == "accuracy-full-x10-r2"


def test_a_failed_hetcluster_command_ends_the_run_with_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_run_all(*args, **kwargs):
        raise RuntimeError("`hetcluster cluster up` failed with exit 2:\nerror: no agent answered")

    monkeypatch.setattr(choice_accuracy, "run_all", failing_run_all)
    with pytest.raises(SystemExit, match="no agent answered"):
        choice_accuracy.main(["--models", "small_cnn", "--out-dir", str(tmp_path)])


def test_exact_when_separated_counts_only_cases_the_repeated_truth_separated() -> None:
    ev = evaluation({"time": ["a", "b"], "power": ["b"], "energy": ["a"], "edp": ["a"]},
                    {"time": 0.02, "power": 0.3, "energy": 0.0, "edp": 0.0}, 0.1, 0.1)
    for name, separated in {"time": False, "power": True, "energy": True, "edp": False}.items():
        ev["objectives"][name]["separated"] = separated
    frames = accuracy.tables([("m", {}, ev)], 0.7667)
    assert frames["choices"]["separated"].tolist() == [False, True, True, False]
    summary = frames["summary"].set_index("scope")
    # separated: power (wrong) and energy (exact) → 1 of 2; time and edp overlap in the truth
    assert summary.loc["all", "separated_cases"] == 2 and summary.loc["all", "exact_when_separated"] == pytest.approx(
        0.5
    )
    assert summary.loc["time", "separated_cases"] == 0 and pd.isna(summary.loc["time", "exact_when_separated"])
    assert pd.isna(
        accuracy.tables(RUNS, 0.7667)["summary"].set_index("scope").loc["all", "separated_cases"]
    )  # trained once


def test_the_summary_sets_the_choice_against_one_round_beside_how_often_rounds_agree() -> None:
    ev = evaluation({"time": ["a", "b"], "power": ["b"], "energy": ["a"], "edp": ["a"]},
                    {"time": 0.02, "power": 0.3, "energy": 0.0, "edp": 0.0}, 0.1, 0.1)
    for name, (per_round, agree) in {"time": (0.5, False), "power": (0.0, True), "energy": (1.0, True),
                                     "edp": (1.0, True)}.items():
        ev["objectives"][name].update(exact_per_round=per_round, rounds_agree=agree)
    summary = accuracy.tables([("m", {}, ev)], 0.7667)["summary"].set_index("scope")
    assert summary.loc["all", "exact_vs_one_round"] == pytest.approx(2.5 / 4)
    assert summary.loc["all", "rounds_agree"] == pytest.approx(0.75)
    assert summary.loc["time", "rounds_agree"] == 0.0 and summary.loc["energy", "exact_vs_one_round"] == 1.0
    assert pd.isna(
        accuracy.tables(RUNS, 0.7667)["summary"].set_index("scope").loc["all", "rounds_agree"]
    )  # trained once


def test_a_fleet_that_did_not_come_up_is_not_taken_down(tmp_path, monkeypatch):
    # the `up` fails when another run's fleet is up in the same state dir: a `down` then would stop it
    from experiments import common

    calls = []

    def run_cli(args, log_path=None):
        calls.append(args[1])
        if args[1] == "up" and len(calls) == 1:
            raise RuntimeError("a cluster is already up")

    monkeypatch.setattr(common, "run_cli", run_cli)
    with pytest.raises(RuntimeError, match="already up"):
        with common.emulated_fleet(tmp_path):
            pass
    assert calls == ["up"]
    with pytest.raises(ValueError):   # once up, the fleet comes down whatever happens inside
        with common.emulated_fleet(tmp_path):
            raise ValueError("an experiment failed")
    assert calls == ["up", "up", "down"]


UNTUNED = EXPERIMENTS / "catalog_untuned.toml"


@pytest.mark.parametrize(
    "path, new",
    [
        (UNTUNED, ("laptop", "jetson-orin-nx", "rpi5", "tablet")),
        (EXPERIMENTS / "catalog_untuned2.toml", ("desktop", "mini-pc", "odroid-n2", "pixel")),
        (EXPERIMENTS / "catalog_untuned3.toml", ("jetson-agx-orin", "nuc8", "rock5b", "ipad-m1")),
    ],
)
def test_the_committed_user_catalogs_hold_new_devices_with_their_rationale(path, new):
    from hetcluster.emulation.catalog import check_fleet_fits, load_catalog

    # four devices no other catalog has, each number with its rationale, all four emulable together
    # on a 2-core host
    builtin = set(load_catalog())
    catalog = load_catalog(path)   # the built-in profiles and the file's
    others = {name for other in EXPERIMENTS.glob("catalog_*.toml") if other != path for name in load_catalog(other)}
    assert set(catalog) - builtin == set(new) and not set(new) & (others | builtin)
    assert all(set(catalog[name].rationale) == {"compute_share", "memory_budget_bytes", "idle_w", "busy_w",
                                                 "link_bandwidth_mbit_per_s", "link_latency_ms"} for name in new)
    assert check_fleet_fits(catalog.select(new), cores=2.0) <= 2.0


def test_a_catalog_of_new_devices_is_checked_up_front_and_recorded_with_the_fleet(tmp_path, monkeypatch):
    profiles = choice_accuracy.fleet_profiles(("laptop", "rpi5*2", "server"), UNTUNED)
    assert list(profiles) == ["laptop", "rpi5-1", "rpi5-2", "server"]
    assert profiles["rpi5-2"]["compute_share"] == 0.2 and profiles["server"]["busy_w"] == 260.0
    assert profiles["rpi5-2"]["profile_name"] == "rpi5" and "rationale" not in profiles["laptop"]

    # a name no catalog has ends the run with the catalog's one-line error, before anything starts
    started = []
    monkeypatch.setattr(choice_accuracy, "run_all", lambda *a, **k: started.append(a))
    with pytest.raises(SystemExit, match="no device profile 'laptop'.*--catalog"):
        choice_accuracy.main(["--models", "small_cnn", "--devices", "laptop,rpi5", "--out-dir", str(tmp_path / "a")])
    assert not started and not (tmp_path / "a").exists()

    # with the catalog, run_all gets it and the profiles it resolved
    monkeypatch.setattr(choice_accuracy, "render", lambda *a, **k: {"summary": pd.DataFrame()})
    choice_accuracy.main(["--models", "small_cnn", "--devices", "laptop,rpi5", "--catalog", str(UNTUNED),
                          "--out-dir", str(tmp_path / "b")])
    [args] = started
    resolved = choice_accuracy.fleet_profiles(("laptop", "rpi5"), UNTUNED)
    assert args[6:] == (("laptop", "rpi5"), UNTUNED, resolved, "loopback")

    # and machine.json records them with the run
    monkeypatch.undo()
    run = _machine_record_of_a_finished_run(tmp_path, 2, ("laptop", "rpi5"), UNTUNED, resolved)
    assert run["device_profiles"] == resolved and run["models_run_now"] == []


def _machine_record_of_a_finished_run(tmp_path: Path, *args, **kwargs) -> dict:
    """choice_accuracy.run_all(..., *args, **kwargs) of small_cnn into a folder whose raw/ already holds
    it (nothing left to train: no fleet comes up); the machine record it writes."""
    out = tmp_path / "c"
    (out / "raw").mkdir(parents=True)
    (out / "raw" / "small_cnn.setting.json").write_text("{}")
    setting = next(s for s in choice_accuracy.FULL if s.model == "small_cnn")
    choice_accuracy.run_all((setting,), out, tmp_path / "state", False, ["test"], *args, **kwargs)
    [run] = json.loads((out / "machine.json").read_text())["runs"]
    return run


def test_the_fleet_comes_up_from_the_catalog_given(tmp_path, monkeypatch):
    from experiments import common

    calls = []
    monkeypatch.setattr(common, "run_cli", lambda args, log_path=None: calls.append(args))
    with common.emulated_fleet(tmp_path, ("laptop", "rpi5"), catalog=Path("experiments/catalog_untuned.toml")):
        pass
    up = calls[0]
    assert (
        up[:2] == ["cluster", "up"]
        and up[up.index("--catalog") + 1] == Path("experiments/catalog_untuned.toml").resolve()
    )
    with common.emulated_fleet(tmp_path):
        pass
    assert "--catalog" not in calls[2] and calls[2][calls[2].index("--network") + 1] == "loopback"


def test_a_shaped_fleet_is_asked_of_cluster_up_named_in_the_results_and_recorded(tmp_path, monkeypatch):
    from experiments import common

    calls = []
    monkeypatch.setattr(common, "run_cli", lambda args, log_path=None: calls.append(args))
    with common.emulated_fleet(tmp_path, ("server", "rpi4"), network="shaped"):
        pass
    assert calls[0][calls[0].index("--network") + 1] == "shaped"

    started = []
    monkeypatch.setattr(choice_accuracy, "run_all", lambda *a, **k: started.append(a))
    monkeypatch.setattr(choice_accuracy, "render", lambda *a, **k: {"summary": pd.DataFrame()})
    monkeypatch.setattr(choice_accuracy, "RESULTS", tmp_path)
    choice_accuracy.main(["--models", "small_cnn", "--devices", "server,rpi4", "--network", "shaped"])
    [args] = started
    assert args[1] == (tmp_path / "choice_accuracy" / "full-2dev-shaped").resolve() and args[-1] == "shaped"

    monkeypatch.undo()
    assert _machine_record_of_a_finished_run(tmp_path, network="shaped")["network"] == "shaped"
