"""`hetcluster train --elastic` on the emulated fleet (real agents, cgroup/duty-cycle slowed), a device
leaving or joining while the job trains: the job re-plans its remaining steps, switches only when
the saving beats the switch's cost, and ends with exactly the steps asked for.

Each test drives the real CLI in a subprocess, strikes at a checkpoint (`cluster add`, or an agent
killed), and reads the report and the ledger.
"""

from __future__ import annotations

import os
import signal

import pytest
from elastic_fleet import (
    add_device,
    agent_pid,
    cli,
    elastic_fleet,
    finish,
    ledger_of,
    report_of,
    train,
    wait_for_steps,
    write_profile,
)

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]


def _kinds(workdir, kind):
    return [e for e in ledger_of(workdir)["elastic"]["events"] if e["kind"] == kind]


def test_an_agent_killed_at_40_percent_is_survived_with_one_replan_named_in_the_timeline(tmp_path):
    total = 900
    with elastic_fleet(tmp_path / "fleet", "ea") as fleet:
        workdir = tmp_path / "job"
        process = train(fleet, workdir, write_profile(tmp_path / "profile.json"), total, "--objective", "time",
                        "--elastic", "--elastic-poll-s", "1")
        wait_for_steps(workdir, int(0.4 * total), process)
        assert ledger_of(workdir)["chosen"] == ["dev-a", "dev-b"]
        os.kill(agent_pid(fleet, "dev-b"), signal.SIGKILL)
        out = finish(process)
    report = report_of(workdir)
    assert report["steps_total"] == total and report["stopped"] is False
    [left] = _kinds(workdir, "left")
    assert left["device"] == "dev-b" and left["training"] and 0.3 * total < left["step"] < total
    [replan] = _kinds(workdir, "replan")            # re-planned once
    assert replan["decision"]["switch"] is False and replan["decision"]["chosen"] == ["dev-a"]
    assert not _kinds(workdir, "switch")
    assert "dev-b left at step" in out and "staying on dev-a" in out
    timeline = report["timeline"]
    assert [(row["kind"], row.get("device")) for row in timeline if row["kind"] == "left"] == [("left", "dev-b")]
    [segment] = [row for row in timeline if row["kind"] == "segment"]
    assert segment["lost_workers"] == ["dev-b"] and segment["steps_to"] == total
    assert segment["predicted_time_s"] > 0
    assert report["lost_workers"] == ["dev-b"] and report["steps_per_worker"]["dev-a"] > 0


def test_a_fast_device_added_at_30_percent_is_measured_and_switched_to(tmp_path):
    total = 1200
    with elastic_fleet(tmp_path / "fleet", "eb") as fleet:
        profile = write_profile(tmp_path / "profile.json")
        elastic = tmp_path / "elastic"
        process = train(fleet, elastic, profile, total, "--objective", "time", "--exclude", "dev-a", "--elastic",
                        "--elastic-poll-s", "1")
        wait_for_steps(elastic, int(0.3 * total), process)
        add_device(fleet, "dev-c")
        out = finish(process)
        assert cli("cluster", "remove", "--device", "dev-c", "--state-dir", str(fleet / "state")).returncode == 0
        baseline = tmp_path / "baseline"
        finish(train(fleet, baseline, profile, total, "--objective", "time", "--exclude", "dev-a"))
    report, plain = report_of(elastic), report_of(baseline)
    assert report["steps_total"] == plain["steps_total"] == total
    [figures] = _kinds(elastic, "figures")
    assert figures["device"] == "dev-c" and figures["source"] == "measured now" and figures["steps_per_s"] > 0
    assert "measuring dev-c alone" in out
    [switch] = _kinds(elastic, "switch")
    assert switch["source"] == ["dev-b"] and "dev-c" in switch["target"]
    assert switch["measured_to_first_step_s"] > 0 and switch["predicted"]["to_first_step_s"] > 0
    assert "saves" in switch["why"] and "switching costs" in switch["why"]
    segments = [row for row in report["timeline"] if row["kind"] == "segment"]
    assert [s["devices"] for s in segments] == [["dev-b"], switch["target"]]
    assert segments[0]["stopped"] and segments[1]["steps_to"] == total
    assert report["steps_per_worker"]["dev-c"] > 0 and report["run"]["switches"] == 1
    gain_s = plain["measured"]["time_s"] - report["measured"]["time_s"]
    print(f"elastic {report['measured']['time_s']:.1f} s against {plain['measured']['time_s']:.1f} s without "
          f"--elastic: {gain_s:+.1f} s ({gain_s / plain['measured']['time_s']:+.0%}); the switch took "
          f"{switch['measured_to_first_step_s']:.1f} s to the first step (predicted "
          f"{switch['predicted']['to_first_step_s']:.1f} s)")


def test_a_device_whose_saving_is_below_the_switch_cost_is_not_switched_to(tmp_path):
    total = 800
    with elastic_fleet(tmp_path / "fleet", "ec") as fleet:
        # dev-d is in the job's profile (measured before): its figures need no measurement
        profile = write_profile(tmp_path / "profile.json", ("dev-a", "dev-b", "dev-d"))
        workdir = tmp_path / "job"
        process = train(fleet, workdir, profile, total, "--objective", "time", "--exclude", "dev-b", "--elastic",
                        "--elastic-poll-s", "1")
        wait_for_steps(workdir, int(0.4 * total), process)
        add_device(fleet, "dev-d")
        out = finish(process)
    report = report_of(workdir)
    assert report["steps_total"] == total
    [figures] = _kinds(workdir, "figures")
    assert figures["device"] == "dev-d" and figures["source"] == "this job's profile"
    [replan] = _kinds(workdir, "replan")
    decision = replan["decision"]
    assert decision["switch"] is False and decision["chosen"] == ["dev-a"]
    assert decision["candidate"]["devices"] == ["dev-a", "dev-d"]
    assert 0 < decision["saving"] < decision["switch_cost"]
    assert "would save" in replan["line"] and "switching would cost" in replan["line"]
    assert "staying on dev-a" in out and "would save" in out
    assert not _kinds(workdir, "switch") and report["chosen"] == ["dev-a"]
