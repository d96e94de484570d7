"""`hetcluster profile --total-steps N` sizes pre-training for that job (its budget, a share of it),
as `plan` does when it pre-trains; without it, the settings' defaults; a job too short for its
budget is refused before anything runs. The phase itself is replaced by one that records the
settings it was given and returns a recorded profile."""

from __future__ import annotations

from pathlib import Path

import pytest
from recorded_fleet import PROFILE, write_inventory

from hetcluster.profiling.profile import load_profile


@pytest.fixture()
def inventory(tmp_path) -> Path:
    return write_inventory(tmp_path)


@pytest.fixture()
def given_settings(monkeypatch) -> list:
    import hetcluster.profiling.pretrain as pretrain

    seen = []

    def recorded_phase(inventory, model, checkpoint_dir, *, settings, **_):
        seen.append(settings)
        return load_profile(PROFILE)

    monkeypatch.setattr(pretrain, "run_pretraining", recorded_phase)
    return seen


def profile(inventory: Path, workdir: Path, *args: str):
    from typer.testing import CliRunner

    from hetcluster.cli.app import app

    return CliRunner().invoke(app, ["profile", "--inventory", str(inventory), "--model", "small_cnn",
                                    "--pretrain-steps", "10", "--warmup-steps", "3", "--workdir", str(workdir), *args])


def test_total_steps_gives_pretraining_its_budget_stated_up_front(inventory, tmp_path, given_settings):
    result = profile(inventory, tmp_path / "job", "--total-steps", "5000", "--pretrain-budget", "0.1")
    assert result.exit_code == 0, (result.output, result.exception)
    settings = given_settings[-1]
    assert (settings.protocol, settings.budget_share, settings.budget_steps) == ("lanes", 0.1, 500)
    assert "at most 500 of its 5000 steps count toward it" in result.output
    assert (tmp_path / "job" / "profile.json").exists()
    # the sequential protocol keeps its own caps: 3 devices alone + 3 sets share 5000 // 3 steps
    result = profile(inventory, tmp_path / "seq", "--total-steps", "5000", "--pretrain-protocol", "sequential")
    assert result.exit_code == 0, (result.output, result.exception)
    assert (given_settings[-1].step_cap, given_settings[-1].max_phase_steps) == (277, 1666)


def test_without_total_steps_the_defaults_hold(inventory, tmp_path, given_settings):
    result = profile(inventory, tmp_path / "job")
    assert result.exit_code == 0, (result.output, result.exception)
    assert (given_settings[-1].budget_steps, given_settings[-1].budget_share) == (0, 0.0)


def test_a_job_too_short_for_its_budget_or_a_budget_out_of_range_is_refused_before_pretraining(
        inventory, tmp_path, given_settings):
    from hetcluster.errors import ConfigError

    # a third of 30 steps is 10: fewer than a measured window's 3 warm-up and 10 measured steps
    result = profile(inventory, tmp_path / "job", "--total-steps", "30")
    assert isinstance(result.exception, ConfigError)
    assert "too short to plan" in str(result.exception) and "--total-steps 39 or more" in result.exception.hint
    for share in ("0", "1.5"):
        result = profile(inventory, tmp_path / "job", "--total-steps", "4000", "--pretrain-budget", share)
        assert isinstance(result.exception, ConfigError) and "--pretrain-budget" in str(result.exception)
    assert given_settings == []


def test_a_non_positive_total_is_refused_before_pretraining(inventory, tmp_path, given_settings):
    from hetcluster.errors import ConfigError

    # in process the ConfigError comes back as is; the CLI's entry point prints it as one line
    # (tests/test_cli_plan.py::test_bad_input_is_one_line)
    result = profile(inventory, tmp_path / "job", "--total-steps", "0")
    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError)
    assert "--total-steps 0 must be positive" in str(result.exception)
    assert given_settings == []


def test_negative_warmup_and_an_unwritable_workdir_are_refused_before_pretraining(inventory, tmp_path, given_settings):
    from hetcluster.errors import ConfigError, ProfileError

    result = profile(inventory, tmp_path / "job", "--warmup-steps", "-1")
    assert isinstance(result.exception, ProfileError) and "--warmup-steps" in str(result.exception)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = profile(inventory, blocker / "job")
    assert isinstance(result.exception, ConfigError) and "is not a folder" in str(result.exception)
    assert given_settings == []
