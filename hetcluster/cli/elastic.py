"""`hetcluster train --elastic`: watch the fleet while the job trains, re-plan the remaining steps
when a device leaves or joins, and switch configuration when the saving beats the cost.

TensorFlow's ClusterCoordinator fixes its workers when it is built, so a configuration cannot grow
in place: a switch asks the running segment to stop at its next round (it checkpoints), stops its
servers and trains on from that checkpoint on the new configuration — the segment loop of
`cmd_train.train_ledger`, which already resumes a job from its checkpoint with the exact total. A
device lost mid-segment is survived in place by the engine (its closures re-run elsewhere); the
re-plan only decides whether to go on as the old configuration minus that device or to switch.

``ElasticJob`` holds what the job knows (its profile, the devices measured since, each device's
measured relaunch time, what every segment and switch cost) and writes every event to the ledger
(``ledger.data["elastic"]``), so the report can tell the story and ``--resume`` carries on. During a
segment a thread of its own polls the fleet (``FleetWatcher``), measures a joining device beside
the running job (cli/joining.py) and re-plans (planner/replan.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from hetcluster.inventory import Inventory
    from hetcluster.planner.replan import Replan, SwitchCost
    from hetcluster.profiling.profile import DeviceProfile
    from hetcluster.training.coordinator import JobLedger

log = logging.getLogger(__name__)

POLL_S = 2.0
# rounds of about this long: a switch waits for the round in progress (half of one on average),
# and each round costs one join of the workers
ELASTIC_ROUND_S = 4.0
# checkpoint and stop, before this job has stopped a segment it could time
FIRST_STOP_S = 2.0


class ElasticJob:
    """The elastic side of one job (see the module docstring)."""

    def __init__(self, fleet: Inventory, ledger: JobLedger, console: Console, *, poll_s: float = POLL_S) -> None:
        from hetcluster.cli.pretraining import DeviceBudgets, _adopt_memory_graph
        from hetcluster.profiling.profile import DeviceProfile, load_profile
        from hetcluster.training.coordinator import check_agents
        from hetcluster.training.fleetwatch import FleetWatcher
        from hetcluster.training.spec import TrainSpec

        self.ledger, self.console = ledger, console
        self.record = ledger.data.setdefault("elastic", {})
        self.record.setdefault("events", [])
        self.record.setdefault("measured", {})
        self.record.setdefault("launch_s", {})
        self.poll_s = float(self.record.setdefault("poll_s", poll_s))
        self.spec = TrainSpec.from_dict(ledger.data["train_spec"])
        self.profile = load_profile(Path(ledger.path).parent / "profile.json")
        _adopt_memory_graph(self.profile, self.spec.model)   # memory plans without building the model here
        self.measured = {name: DeviceProfile(**data) for name, data in self.record["measured"].items()}
        for switch in self.record["events"]:
            if switch.get("kind") == "switch" and switch.get("gap_s") is None:
                # a coordinator killed during this switch: only its stop is known; the time until
                # the resume was an outage, not the switch's cost
                stopped, ended = switch.get("stopped_wall_s"), switch.get("old_end_wall_s")
                switch.update(interrupted=True, gap_s=max(0.0, stopped - ended) if stopped and ended else 0.0,
                              gap_energy_j=float(switch.get("stop_energy_j") or 0.0))
        down = check_agents(fleet, fleet.names)
        self.watcher = FleetWatcher(fleet, [n for n in fleet.names if n not in down])
        self.budgets = DeviceBudgets(fleet)
        self._budget_fleet = fleet
        self.decision: Replan | None = None
        self.decided_wall_s = 0.0
        self._lock = threading.Lock()
        self._chosen: list[str] = []
        self.lost: set[str] = set()
        self._restored = 0
        self._live = (0, 0.0, 0.0)   # steps applied in the segment, its seconds, its energy so far (estimate)
        self._last: tuple[float, float] | None = None
        self._stop: threading.Event | None = None
        self._first_step_said = False

    # -- what the job knows -----------------------------------------------------------------
    @property
    def fleet(self) -> Inventory:
        return self.watcher.fleet

    def _budgets(self) -> Any:
        from hetcluster.cli.pretraining import DeviceBudgets

        if self.fleet is not self._budget_fleet:   # the inventory changed: ask the new devices
            self.budgets, self._budget_fleet = DeviceBudgets(self.fleet), self.fleet
        return self.budgets

    def figures(self, name: str) -> DeviceProfile | None:
        from hetcluster.cli.joining import known_figures

        if name not in self.fleet.names:
            return None
        known = known_figures(name, self.fleet, self.profile, self.measured)
        return known.device if known is not None else None

    def available(self) -> list[str]:
        """Devices that answer and whose figures the job has (measured, in its profile, or of its class)."""
        return [n for n in self.watcher.up if self.figures(n) is not None]

    def planner_inputs(self, names: list[str]) -> tuple[Any, Any]:
        """(DeviceMeasurements, RunMeasurements) of ``names``, memory fits filled in."""
        from hetcluster.cli.pretraining import planner_inputs

        devices = [self.figures(n) for n in names]
        runs = [r for r in self.profile.runs if set(r.devices) <= set(names)]
        profile = dataclasses.replace(self.profile, devices=devices, runs=runs)
        measurements, run_measurements, _ = planner_inputs(profile, self.fleet, self.spec.model,
                                                           self.spec.total_steps, self._budgets())
        return measurements, run_measurements

    def on_ready(self, launch_s: float) -> None:
        """The segment's servers are up after ``launch_s``: its slowest member's launch, a bound on
        each member's (a device keeps the shortest it has shown; a solo measurement's is its own)."""
        with self.ledger.lock:
            launch = self.record["launch_s"]
            for name in self._chosen:
                launch[name] = min(float(launch.get(name, math.inf)), launch_s)
            self.ledger.save()

    def launch_estimates(self) -> dict[str, float]:
        """Each device's relaunch time, as far as this job has seen it start (on_ready, measurements)."""
        with self.ledger.lock:
            return {name: float(seconds) for name, seconds in self.record["launch_s"].items()}

    def stop_estimate_s(self) -> float:
        """Checkpoint and stop: the last segment's, from its last step to its servers stopped."""
        for segment in reversed(self.ledger.segments):
            if segment.get("stopped_wall_s") and segment.get("end_wall_s"):
                return max(0.0, float(segment["stopped_wall_s"]) - float(segment["end_wall_s"]))
        return FIRST_STOP_S

    def switch_cost(self, current: list[str]) -> SwitchCost:
        from hetcluster.planner.replan import SwitchCost

        launch = self.launch_estimates()
        drain_s = 0.0
        if current:
            rate = self.predict(current, max(1, self.spec.total_steps - self.steps_done()))["steps_per_s"]
            drain_s = 0.5 * self.round_steps(current) / rate if rate > 0 else 0.0
        return SwitchCost(drain_s=drain_s, stop_s=self.stop_estimate_s(), launch_s=launch,
                          default_launch_s=max(launch.values(), default=30.0))

    def predict(self, names: list[str], remaining: int) -> dict[str, float]:
        """The planner's fresh run of ``names`` for ``remaining`` steps: throughput, time, energy,
        power and start-up (what the segment's record compares with)."""
        from hetcluster.planner import JobSpec, estimate

        devices, runs = self.planner_inputs(list(names))
        job = JobSpec(total_steps=max(1, remaining), idle_power_counts=self.fleet.idle_power_counts)
        table = estimate(devices, runs, job, mode="devices" if len(devices) <= 20 else "classes", first=tuple(names))
        row = table[[frozenset(d) == frozenset(names) for d in table["devices"]]].iloc[0]
        rate = float(row["steps_per_s"])
        return {"steps": int(remaining), "steps_per_s": rate, "time_s": float(row["time_s"]),
                "energy_j": float(row["energy_j"]), "power_w": float(row["power_w"]),
                "startup_s": max(0.0, float(row["time_s"]) - remaining / rate)}

    def round_steps(self, names: list[str]) -> int:
        """Steps per round for a segment of ``names``: about ELASTIC_ROUND_S at the predicted rate (0:
        the engine's default, where no rate can be predicted)."""
        from hetcluster.errors import HetclusterError

        try:
            rate = self.predict(names, max(1, self.spec.total_steps - self._restored))["steps_per_s"]
        except (HetclusterError, IndexError) as error:
            log.warning("no predicted rate for %s (%s): the engine's default rounds", "+".join(names), error)
            return 0
        return max(4 * len(names), math.ceil(ELASTIC_ROUND_S * rate))

    # -- progress -----------------------------------------------------------------------------
    def steps_done(self) -> int:
        with self._lock:
            return self._restored + self._live[0]

    def on_progress(self, done: int, to_do: int, elapsed_s: float, power_w: float) -> None:
        """The running segment's live progress (LiveProgress.update's arguments)."""
        with self._lock:
            energy_j = self._live[2]
            if self._last is not None:
                energy_j += 0.5 * (power_w + self._last[1]) * max(0.0, elapsed_s - self._last[0])
            self._last = (elapsed_s, power_w)
            self._live = (done, elapsed_s, energy_j)
        if done > 0 and not self._first_step_said and self.record["events"] and \
                self.record["events"][-1].get("kind") == "switch":
            self._first_step_said = True
            switch = self.record["events"][-1]
            self.say(f"first step on {'+'.join(self._chosen)} {time.time() - switch['decided_wall_s']:.1f} s after the "
                     f"decision (predicted {switch['predicted']['to_first_step_s']:.1f} s)")

    def progress(self) -> Any:
        """Where the job stands: pre-training, every segment and switch gap so far, and this segment."""
        from hetcluster.planner.replan import JobProgress

        pre = self.ledger.data["pretrain"]
        finished = [s for s in self.ledger.segments if not s.get("partial")]
        with self.ledger.lock:
            gaps = [e for e in self.record["events"] if e.get("kind") == "switch" and e.get("gap_s") is not None]
        with self._lock:
            done, elapsed_s, energy_j = self._live
        return JobProgress(total_steps=self.spec.total_steps, steps_done=self._restored + done,
                           elapsed_s=float(pre["time_s"]) + sum(float(s["time_s"]) for s in finished)
                           + sum(float(e["gap_s"]) for e in gaps) + elapsed_s,
                           energy_j=float(pre["energy_j"]) + sum(float(s["energy_j"]) for s in finished)
                           + sum(float(e.get("gap_energy_j") or 0.0) for e in gaps) + energy_j,
                           idle_power_counts=self.fleet.idle_power_counts)

    # -- events -------------------------------------------------------------------------------
    def say(self, line: str) -> None:
        self.console.print(f"[bold cyan]elastic:[/] {line}", highlight=False)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        entry = {"kind": kind, "wall_s": time.time(), "step": self.steps_done(), **fields}
        with self.ledger.lock:
            self.record["events"].append(entry)
            self.ledger.save()
        return entry

    # -- a segment ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def watching(self, chosen: list[str], restored: int, stop: threading.Event) -> Iterator["ElasticJob"]:
        """While a segment trains ``chosen`` from ``restored`` steps: poll the fleet, re-plan on each
        change, and set ``stop`` when the job should switch (``self.decision`` then says to what)."""
        with self._lock:
            self._chosen, self._restored, self._stop = list(chosen), restored, stop
            self._live, self._last = (0, 0.0, 0.0), None
        self.lost, self.decision, self._first_step_said = set(), None, False
        ended = threading.Event()
        thread = threading.Thread(target=self._watch, args=(ended,), name="fleet-watch", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            ended.set()
            thread.join()

    def _watch(self, ended: threading.Event) -> None:
        while not ended.wait(self.poll_s):
            if self.decision is not None:
                continue   # the segment is stopping for a switch: the next one watches again
            try:
                changes = self.watcher.poll()
                if changes:
                    self._on_changes(changes, ended)
            except Exception as error:  # noqa: BLE001 - a failed poll or re-plan must not end the job
                log.exception("elastic: watching the fleet failed")
                self.say(f"[yellow]could not re-plan:[/] {error}")

    def _on_changes(self, changes: list[Any], ended: threading.Event) -> None:
        from hetcluster.errors import HetclusterError

        relevant = False
        for change in changes:
            training = change.device in self._chosen and change.device not in self.lost
            self.event(change.kind, device=change.device, reason=change.reason, training=training)
            self.say(f"{change.device} {change.kind} at step {self.steps_done()} ({change.reason})")
            if change.kind == "left":
                if training:
                    self.lost.add(change.device)
                    relevant = True
                continue
            if ended.is_set():
                continue
            try:
                relevant |= self._learn(change.device)
            except HetclusterError as error:
                self.event("unmeasured", device=change.device, reason=str(error))
                self.say(f"[yellow]{change.device} could not be measured[/] ({error}); planning without it")
        if relevant and not ended.is_set():
            self.decide()

    def _learn(self, name: str) -> bool:
        """Make sure the job has ``name``'s figures (measuring it alone if it must); True when it has."""
        from hetcluster.cli.joining import known_figures, measure_alone

        known = known_figures(name, self.fleet, self.profile, self.measured)
        if known is None:
            self.say(f"measuring {name} alone (a worker and a parameter server of its own; the job trains on)")
            known = measure_alone(name, self.fleet, self.spec, self.profile, self._budgets(),
                                  Path(self.ledger.path).parent, self.say)
            self.measured[name] = known.device
            with self.ledger.lock:
                self.record["measured"][name] = dataclasses.asdict(known.device)
                if known.launch_s is not None:
                    launch = self.record["launch_s"]
                    launch[name] = min(float(launch.get(name, math.inf)), known.launch_s)
        self.event("figures", device=name, source=known.source, steps_per_s=known.device.steps_per_s,
                   busy_power_w=known.device.busy_power_w, energy_j=known.energy_j)
        self.say(f"{name}: {known.device.steps_per_s:.2f} steps/s alone, {known.device.busy_power_w:.1f} W "
                 f"({known.source})")
        return True

    def decide(self) -> Replan:
        """Re-plan the remaining steps now; on a switch, set the segment's stop."""
        from hetcluster.cli.job_options import ledger_constraints
        from hetcluster.planner.replan import replan

        available = self.available()
        current = [n for n in self._chosen if n not in self.lost and n in available]
        devices, runs = self.planner_inputs(available)
        decision = replan(devices, runs, self.progress(), current, self.ledger.data["objective"],
                          ledger_constraints(self.ledger.data, available), self.switch_cost(current))
        self.event("replan", line=decision.line(), decision=decision.to_dict(), available=available,
                   lost=sorted(self.lost))
        self.say(decision.line())
        if decision.switch:
            self.decision, self.decided_wall_s = decision, time.time()
            if self._stop is not None:
                self._stop.set()
        return decision

    def fresh_plan(self) -> list[str]:
        """No configuration to continue (a job resumed whose devices are gone): the best of the
        available devices for the remaining steps, every option a fresh launch."""
        from hetcluster.cli.job_options import ledger_constraints
        from hetcluster.errors import TrainingError
        from hetcluster.planner.replan import replan
        from hetcluster.training.checkpoints import checkpoint_steps

        self._restored = checkpoint_steps(self.spec.checkpoint_dir)
        available = self.available()
        if not available:
            raise TrainingError("No device of the job answers.", hint="start the agents, then --resume again.")
        devices, runs = self.planner_inputs(available)
        decision = replan(devices, runs, self.progress(), [], self.ledger.data["objective"],
                          ledger_constraints(self.ledger.data, available), self.switch_cost([]))
        self.event("replan", line=decision.line(), decision=decision.to_dict(), available=available, lost=[])
        self.say(decision.line())
        if not decision.chosen:
            raise TrainingError(f"No configuration of {', '.join(available)} can train the job: {decision.reason}",
                                hint="relax the job's constraints, or start more devices.")
        return list(decision.chosen)

    def adopt(self, target: list[str]) -> Any:
        """Make ``target`` the job's configuration in its ledger, each member under its own memory
        plan, before anything is launched (a coordinator killed from here resumes on it);
        returns the job's TrainSpec as it now stands."""
        from hetcluster.training.spec import TrainSpec

        memory = self._budgets().training_memory(self.spec.model, target)
        self.console.print(memory.describe())
        with self.ledger.lock:
            self.ledger.data["chosen"] = list(target)
            self.ledger.data["train_spec"].update(memory_budget_bytes=0, **memory.spec_fields())
            self.ledger.save()
        self.spec = TrainSpec.from_dict(self.ledger.data["train_spec"])
        return self.spec

    # -- a switch -------------------------------------------------------------------------------
    def begin_switch(self, stopped_segment: dict[str, Any] | None) -> list[str]:
        """After the segment stopped for ``self.decision``: record the switch and return the new
        configuration (the caller writes it to the ledger before launching it)."""
        decision = self.decision
        assert decision is not None
        target = list(decision.chosen)
        cost = decision.cost
        first_step_s = min((self.figures(n).first_step_s for n in target), default=0.0)
        drain_s = cost.drain_s if decision.current is not None else 0.0
        predicted = {"drain_s": drain_s, "stop_s": cost.stop_s, "launch_s": decision.candidate.launch_s,
                     "first_step_s": first_step_s}
        predicted["to_first_step_s"] = sum(predicted.values())
        old = self._chosen
        self.event("switch", source=old, target=target, decided_wall_s=self.decided_wall_s, predicted=predicted,
                   why=decision.line(), stopped_wall_s=(stopped_segment or {}).get("stopped_wall_s"),
                   old_end_wall_s=(stopped_segment or {}).get("end_wall_s"),
                   stop_energy_j=(stopped_segment or {}).get("stop_energy_j"), gap_s=None)
        self.say(f"switching {'+'.join(old) or '(none)'} → {'+'.join(target)}: checkpoint at step "
                 f"{self.steps_done()}, relaunching")
        self.decision = None
        return target

    def finish_switch(self, segment: dict[str, Any]) -> None:
        """The first segment after a switch has ended: record the switch's measured cost."""
        switch = next((e for e in reversed(self.record["events"]) if e.get("kind") == "switch"), None)
        if switch is None or switch.get("gap_s") is not None:
            return
        start = segment.get("start_wall_s")
        first = segment.get("first_step_wall_s")
        if switch.get("old_end_wall_s") and start:
            switch["gap_s"] = max(0.0, float(start) - float(switch["old_end_wall_s"]))
        switch["gap_energy_j"] = (float(segment.get("launch_energy_j") or 0.0)
                                  + float(switch.get("stop_energy_j") or 0.0))
        if first:
            switch["measured_to_first_step_s"] = float(first) - float(switch["decided_wall_s"])
        self.ledger.save()

    def segment_notes(self, chosen: list[str], restored: int) -> dict[str, Any]:
        """What a segment's record keeps beside its measurement: the planner's prediction for it
        and why it started."""
        switch = next((e for e in reversed(self.record["events"]) if e.get("kind") == "switch"), None)
        why = switch["why"] if switch is not None and switch.get("gap_s") is None and \
            list(switch["target"]) == list(chosen) else "the plan"
        try:
            predicted = self.predict(list(chosen), self.spec.total_steps - restored)
        except Exception as error:  # noqa: BLE001 - a device of the segment without figures: no prediction
            log.warning("no prediction for the segment on %s: %s", "+".join(chosen), error)
            predicted = None
        return {"predicted": predicted, "why": why}
