"""The engine's rounds on a simulated cluster: how many closures each round schedules, and what the
start barrier does to a run with a slow-starting worker.

TensorFlow's ClusterCoordinator hands each closure to whichever worker is free; the simulation
does the same with step durations in simulated seconds, so the engine's own loop (rounds, the
barrier, the window extension) is what is tested. The real distribution is checked on TF servers
in test_training_engine.py.
"""

from __future__ import annotations

import time
import types

import pytest

from hetcluster.models import ModelSpec
from hetcluster.training import engine
from hetcluster.training.spec import ClusterAddresses, TrainSpec

pytestmark = pytest.mark.tensorflow   # run_training imports TensorFlow for its error type

MODEL = ModelSpec("small_cnn", (16, 16, 3), classes=4, batch_size=8)
CLUSTER = ClusterAddresses(workers={"server": "localhost:1", "board": "localhost:2"}, ps=["localhost:3"],
                           chief="localhost:4")


class _SimulatedTrainer:
    """Each worker's first step takes ``first_s``, the others ``step_s``; a round's closures go to
    the worker free earliest, and the round ends when its last step does (the join)."""

    memory_plans: dict = {}  # as _Trainer: plain TensorFlow, no memory plan

    def __init__(self, first_s: dict[int, float], step_s: dict[int, float]) -> None:
        self.first_s, self.step_s = first_s, step_s
        self.clock_s = 0.0
        self.steps_done = {w: 0 for w in first_s}
        self.applied = 0
        self.rounds: list[int] = []

    def restore(self) -> int:
        return 0

    def save(self) -> None:
        return None

    def iterations(self) -> int:
        return self.applied

    def lost_workers(self) -> list[str]:
        return []

    def run_round(self, count: int, target: int, on_poll) -> list[engine._Stamp]:
        self.rounds.append(count)
        free_at = {w: self.clock_s for w in self.first_s}
        stamps = []
        for _ in range(count):
            worker = min(free_at, key=lambda w: (free_at[w], w))
            duration = self.step_s[worker] if self.steps_done[worker] else self.first_s[worker]
            start = free_at[worker]
            free_at[worker] = start + duration
            self.steps_done[worker] += 1
            self.applied += 1
            stamps.append(engine._Stamp(0.5, True, start, start + duration, worker))
        self.clock_s = max(s.end_s for s in stamps)
        return stamps


def _run(monkeypatch, spec: TrainSpec) -> tuple[_SimulatedTrainer, object]:
    # the server (worker 0) sets up in 0.5 s and steps in 0.1 s; the board takes 10 s to set up
    trainer = _SimulatedTrainer(first_s={0: 0.5, 1: 10.0}, step_s={0: 0.1, 1: 1.0})
    # the engine's wall clock is the simulation's (round starts are compared with the step stamps)
    monkeypatch.setattr(engine, "time", types.SimpleNamespace(time=lambda: trainer.clock_s, monotonic=time.monotonic,
                                                              sleep=time.sleep))
    monkeypatch.setattr(engine, "connect", lambda cluster: (None, None))
    monkeypatch.setattr(engine, "_Trainer", lambda *args: trainer)
    return trainer, engine.run_training(spec, CLUSTER, round_steps=40)


def _server_steps_before_board_started(result) -> int:
    board_first_end = min(end for _, end, w in result.step_times if w == "board")
    return sum(1 for start, _, w in result.step_times if w == "server" and start < board_first_end)


def test_the_start_barrier_makes_fast_workers_wait_for_a_slow_first_step(monkeypatch):
    trainer, result = _run(monkeypatch, TrainSpec(model=MODEL, total_steps=60, start_barrier=True))
    assert trainer.rounds == [2, 40, 18]   # one closure per worker, joined, then the usual rounds
    assert result.steps_applied == 60
    # the server took its one first step while the board set up (39 steps without the barrier)
    assert _server_steps_before_board_started(result) == 1
    assert result.steps_per_worker["board"] >= 2


def test_without_the_barrier_the_fast_worker_trains_through_the_slow_set_up(monkeypatch):
    trainer, result = _run(monkeypatch, TrainSpec(model=MODEL, total_steps=60))
    assert trainer.rounds == [40, 20]
    # the board's 10 s first step: the server takes the first round's other 39 closures meanwhile
    assert _server_steps_before_board_started(result) == 39


def test_a_measurement_run_with_the_barrier_still_fills_its_window(monkeypatch):
    spec = TrainSpec(model=MODEL, total_steps=20, warmup_steps=2, min_window_s=3.0, max_steps=400, start_barrier=True)
    trainer, result = _run(monkeypatch, spec)
    assert trainer.rounds[:3] == [2, 2, 16], "one barrier round per warm-up step, then the rest"
    # the server's steps before the board's warm-up was over: its own two, no more
    board_warm_end = sorted(end for _, end, w in result.step_times if w == "board")[1]
    assert sum(1 for start, _, w in result.step_times if w == "server" and start < board_warm_end) == 2
    steady = result.steady_rates()
    assert steady is not None, "every worker trains steadily in a common window"
    t0, t1, rates = steady
    assert t1 - t0 >= 3.0
    # the window's rates are the simulated steady rates (10/s and 1/s), not a set-up transient
    assert rates["server"] == pytest.approx(10.0, rel=0.15) and rates["board"] == pytest.approx(1.0, rel=0.35)
    assert len(trainer.rounds) > 2, "the window spans joins (rounds of 40 closures)"
    # nor what the server waited at each join for the board's last step: its steady rate exactly
    assert rates["server"] == pytest.approx(10.0, rel=1e-6)


class _OneWorkerTakesAll(_SimulatedTrainer):
    """A barrier round in which the server finished its closure before the board took the other."""

    def run_round(self, count: int, target: int, on_poll) -> list[engine._Stamp]:
        stamps = super().run_round(count, target, on_poll)
        return [engine._Stamp(s.loss, s.applied, s.start_s, s.end_s, 0) for s in stamps]


def test_the_barrier_warns_when_a_worker_took_no_first_step_and_only_then(monkeypatch, caplog):
    monkeypatch.setattr(engine, "connect", lambda cluster: (None, None))
    monkeypatch.setattr(engine, "_Trainer", lambda *args: _OneWorkerTakesAll({0: 0.5, 1: 10.0}, {0: 0.1, 1: 1.0}))
    with caplog.at_level("WARNING", logger=engine.__name__):
        engine.run_training(TrainSpec(model=MODEL, total_steps=4, start_barrier=True), CLUSTER)
    assert "start barrier: board took no step" in caplog.text
    caplog.clear()
    # one step left for two workers: the round cannot give both a first step, so no warning
    trainer, result = _run(monkeypatch, TrainSpec(model=MODEL, total_steps=1, start_barrier=True))
    assert trainer.rounds == [1] and result.steps_applied == 1
    assert "start barrier" not in caplog.text
