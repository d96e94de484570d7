"""Pre-training on lanes (profiling/lane_phase.py) on real agents (in-process AgentServers starting
real TF workers) with small_cnn: devices alone at once, the fleet together, the budget kept, and a
known device not measured again."""

from __future__ import annotations

import pytest
from test_profiling_pretrain import running_fleet

from hetcluster.models import ModelSpec

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]


def _overlap(a, b) -> bool:
    return a.start_wall_s < b.end_wall_s and b.start_wall_s < a.end_wall_s


def test_devices_are_measured_alone_at_once_then_together_within_the_budget_and_not_again(tmp_path, monkeypatch):
    from hetcluster.profiling.known import store_path
    from hetcluster.profiling.lane_phase import ChoiceCheck
    from hetcluster.profiling.pretrain import PretrainSettings, run_pretraining
    from hetcluster.training.checkpoints import checkpoint_steps

    monkeypatch.setenv("HETCLUSTER_MEASUREMENTS", str(tmp_path / "known.jsonl"))
    spec = ModelSpec("small_cnn", (16, 16, 3), 4, 8)
    settings = PretrainSettings(steps_per_run=12, warmup_steps=2, idle_s=0.5, min_window_s=1.0, budget_share=0.2,
                                budget_steps=400)
    asked = []

    def clear(profile):
        asked.append(sorted(r.devices for r in profile.runs))
        return ChoiceCheck(False, 600.0, "a clear choice for edp")   # a long job: the budget affords a recheck

    devices = (("board-1", 1.0, 3.0, "board"), ("other", 2.0, 6.0, None), ("board-2", 1.5, 3.0, "board"))
    with running_fleet(tmp_path, devices) as fleet:
        events = []
        ckpt = str(tmp_path / "first" / "checkpoints")
        profile = run_pretraining(fleet, spec, ckpt, settings=settings, open_choice=clear,
                                  on_event=lambda kind, details: events.append((kind, details)))
        done = [d for kind, d in events if kind == "run_done"]
        # board-1 (for its class) and other alone, at the same time (separate machines: one group),
        # each on its own PS; then the fleet together, the fastest alone again (the budget affords
        # it); the next set skipped, the choice being clear
        assert [len(d["devices"]) for d in done] == [1, 1, 3, 1]
        solos = {d["devices"][0]: d["result"] for d in done[:2]}
        assert set(solos) == {"board-1", "other"} and _overlap(solos["board-1"], solos["other"])
        assert [sorted(d["devices"]) for d in done if len(d["devices"]) > 1] == [["board-1", "board-2", "other"]]
        fastest = max(solos, key=lambda name: solos[name].steps_per_s)
        assert done[3]["devices"] == [fastest] and len(profile.device(fastest).solo_rates_steps_per_s) == 2
        lines = [d["line"] for kind, d in events if kind == "plan"]
        assert any("alone at once: board-1, other" in line for line in lines)
        assert any("skipped: a clear choice for edp" in line for line in lines) and asked
        assert [sorted(r.devices) for r in profile.runs] == [["board-1", "board-2", "other"]]
        assert profile.device("board-2").measured_on == "board-1"
        # one line of training counts: the solo run with the more steps, then each later run's if it
        # stays within the budget (else its steps were measurement only)
        line = max(solos.values(), key=lambda r: r.steps_total).steps_total
        for later in (done[2]["result"], done[3]["result"]):
            assert later.steps_restored == line
            line = later.steps_total if later.steps_total <= settings.budget_steps else line
        assert profile.pretrain_steps == line
        assert profile.pretrain_steps <= settings.budget_steps
        assert checkpoint_steps(ckpt) == profile.pretrain_steps
        assert profile.loss_curve[-1]["last_step"] == profile.pretrain_steps
        assert not (tmp_path / "first" / ".pretrain-runs").exists()   # the scratch lines are gone

        # the same job again: board-1 and other are known, only the fleet trains
        events.clear()
        again = run_pretraining(fleet, spec, str(tmp_path / "second" / "checkpoints"), settings=settings,
                                open_choice=clear, on_event=lambda kind, details: events.append((kind, details)))
        assert [sorted(d["devices"]) for kind, d in events if kind == "run_start"] == [["board-1", "board-2", "other"]]
        lines = [d["line"] for kind, d in events if kind == "plan"]
        assert sum("known:" in line and "ago for this job" in line for line in lines) == 2
        for name in ("board-1", "other"):
            assert again.device(name).steps_per_s == profile.device(name).steps_per_s
            assert again.device(name).measured_wall_s > 0
        assert len(store_path().read_text().splitlines()) == 2   # known devices are not stored twice


def test_a_lines_steps_count_only_within_the_budget(tmp_path):
    """_Lanes.adopt: the run with the most steps within the budget becomes the line; a run past it
    was measurement only, and the line stays where it was."""
    from types import SimpleNamespace

    from hetcluster.profiling.lane_phase import _Lanes
    from hetcluster.profiling.pretrain import PretrainSettings

    phase = SimpleNamespace(settings=PretrainSettings(budget_share=0.2, budget_steps=100), checkpoint_path=None,
                            checkpoint_dir=str(tmp_path / "checkpoints"), steps_total=10, loss_curve=[])

    def result(steps_total):
        return SimpleNamespace(steps_total=steps_total, checkpoint_path=f"/x/ckpt-{steps_total}",
                               loss_curve=[{"last_step": steps_total}])

    lanes = _Lanes(phase, 2)
    assert lanes.adopt([result(60), result(90), result(150)]).steps_total == 90   # 80 of 100 used
    assert (lanes.line_steps, lanes.line_path, phase.loss_curve) == (90, "/x/ckpt-90", [{"last_step": 90}])
    assert lanes.adopt([result(200)]) is None and lanes.line_steps == 90
    assert lanes.adopt([result(110)]).steps_total == 110   # 100 steps past the phase's start: the budget


def test_a_device_is_known_for_the_same_job_and_hardware_within_its_age(tmp_path):
    from types import SimpleNamespace

    from hetcluster.profiling.known import age_text, fingerprint, job_key, known_devices, remember
    from hetcluster.profiling.profile import DeviceProfile

    store = tmp_path / "known.jsonl"
    model = {"name": "small_cnn", "input_shape": [16, 16, 3], "classes": 4, "batch_size": 8}
    job = job_key(model, {"data": {"kind": "npz", "path": "/a.npz"}, "optimizer": "sgd"})
    info = SimpleNamespace(hostname="h", cpu_model="x", cpu_count=4, memory_bytes=1 << 30, compute_share=0.25,
                           emulated=True, accelerators=())
    board = DeviceProfile("board", 5.0, 0.1, 3.0, 1.0, steps=20, time_s=4.0, energy_j=12.0)
    copy = DeviceProfile("copy", 5.0, 0.1, 3.0, 1.0, steps=20, time_s=4.0, energy_j=12.0, measured_on="board")
    keys = {"board": fingerprint("board", info), "copy": fingerprint("copy", info), "mute": fingerprint("mute", None)}
    assert keys["mute"] is None and keys["board"] != keys["copy"]
    assert remember([board, copy], job, keys, store) == 1   # a class copy was not measured itself
    found = known_devices(job, keys, path=store)
    assert list(found) == ["board"] and found["board"].steps_per_s == 5.0 and found["board"].measured_wall_s > 0
    assert remember(found.values(), job, keys, store) == 0   # known from before: not stored again
    # another batch size, another data kind, other hardware, or too old: not known
    assert known_devices(job_key({**model, "batch_size": 4}, {"data": {"kind": "npz"}}), keys, path=store) == {}
    assert known_devices(job_key(model, {"data": {"kind": "synthetic"}, "optimizer": "sgd"}), keys, path=store) == {}
    moved = {"board": fingerprint("board", SimpleNamespace(**{**vars(info), "compute_share": 0.5}))}
    assert known_devices(job, moved, path=store) == {}
    assert known_devices(job, keys, path=store, now=found["board"].measured_wall_s + 8 * 86400) == {}
    # the same data kind from another path is the same job; a damaged line is skipped
    with open(store, "a") as f:
        f.write("{not json\n")
    assert list(known_devices(job_key(model, {"data": {"kind": "npz", "path": "/b.npz"}}), keys, path=store))
    assert (age_text(30), age_text(600), age_text(3 * 3600), age_text(3 * 86400)) == ("30 s", "10 min", "3 h", "3 days")
