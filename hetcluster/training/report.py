"""Predicted against measured for one training job: the numbers, their errors, JSON and a table.

Both sides describe the SAME whole job, so they can be compared directly:

* ``time_s`` = pre-training wall time (the whole phase, as the planner counts it) + the training
  run's wall time (from the restored checkpoint to the last applied step; server start-up is not
  in it — it is reported apart as ``launch_s``);
* ``energy_j`` = pre-training energy (the participating devices' metered energy, as the profile
  records it) + the training run's energy: every chosen device's power stream integrated over the
  run (+ every other device's stream over the same span when the inventory says idle power
  counts);
* ``power_w`` = the training run's energy / the training run's time (the planner's P(S): the
  average draw while the job trains, pre-training not included);
* ``edp_js`` = energy_j × time_s.

Kept free of TensorFlow and gRPC: the CLI, the evaluation harness and tests build it from plain data;
hetcluster/cli/train_output.py renders it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

METRICS = ("time_s", "power_w", "energy_j", "edp_js")


@dataclass(frozen=True)
class JobMetrics:
    """Time, average power, energy and energy-delay product of a whole job."""

    time_s: float
    power_w: float
    energy_j: float
    edp_js: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> "JobMetrics":
        """From a planner table row (or any mapping holding the four metric keys)."""
        return cls(**{name: float(row[name]) for name in METRICS})


def measured_metrics(pretrain_time_s: float, pretrain_energy_j: float, run_time_s: float,
                     run_energy_j: float) -> JobMetrics:
    """The whole job's measured metrics (see the module docstring for what each includes)."""
    time_s = pretrain_time_s + run_time_s
    energy_j = pretrain_energy_j + run_energy_j
    power_w = run_energy_j / run_time_s if run_time_s > 0 else 0.0
    return JobMetrics(time_s=time_s, power_w=power_w, energy_j=energy_j, edp_js=energy_j * time_s)


def relative_errors(predicted: JobMetrics, measured: JobMetrics) -> dict[str, float | None]:
    """(predicted − measured) / measured per metric; None where the measurement is zero."""
    errors: dict[str, float | None] = {}
    for name in METRICS:
        truth, guess = getattr(measured, name), getattr(predicted, name)
        errors[name] = (guess - truth) / truth if truth and math.isfinite(truth) else None
    return errors


@dataclass
class TrainReport:
    """What `hetcluster train` tells the user (and writes as JSON)."""

    objective: str
    chosen: list[str]
    predicted: JobMetrics
    measured: JobMetrics
    steps_total: int
    steps_per_worker: dict[str, int]
    lost_workers: list[str]
    final_loss: float | None
    steps_restored: int = 0
    steps_applied: int = 0
    steps_unattributed: int = 0
    pretrain: dict[str, float] = field(default_factory=dict)
    run: dict[str, float] = field(default_factory=dict)
    energy_per_device_j: dict[str, float] = field(default_factory=dict)
    stopped: bool = False
    checkpoint_path: str | None = None
    segments: int = 1
    memory_plan: str = ""  # the memory scheduler's technique the step ran under ("" = plain TensorFlow)
    loss_curve: list[dict[str, float]] = field(default_factory=list)   # every segment's, in step order
    model_path: str | None = None       # the exported model (tf_keras.models.load_model), once trained
    weights_path: str | None = None
    held_out: dict[str, Any] | None = None   # the exported model's loss, accuracy, examples, source
    # the job's story, in order: each segment trained (job_timeline) and, for an elastic job, each
    # device that left or joined, each re-plan and each switch
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def errors(self) -> dict[str, float | None]:
        return relative_errors(self.predicted, self.measured)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["predicted"] = self.predicted.to_dict()
        data["measured"] = self.measured.to_dict()
        data["errors"] = self.errors
        data["definitions"] = {
            "time_s": "pre-training wall time + training run wall time (server start-up excluded, see run.launch_s; "
                      "an elastic switch's whole gap included, see run.switch_s)",
            "energy_j": "pre-training energy + chosen devices' power streams integrated over the run"
                        " (+ other devices' streams when idle power counts; + an elastic job's switch gaps and"
                        " measurements of joining devices, see run)",
            "power_w": "training run energy / training run time",
            "timeline": "segments trained and the elastic job's events, in order; a segment's predicted time and "
                        "energy are the planner's for the steps it applied (its start-up + steps / R)",
            "edp_js": "energy_j * time_s",
            "errors": "(predicted - measured) / measured",
        }
        return data


EVENT_KINDS = ("left", "joined", "figures", "unmeasured", "replan", "switch")


def segment_row(segment: Mapping[str, Any]) -> dict[str, Any]:
    """A segment of the job's timeline: what trained it, from which step to which, its measured
    time and energy, and the planner's for the steps it applied (start-up + steps / R)."""
    steps = int(segment.get("steps_applied", 0))
    restored = int(segment.get("steps_restored", 0))
    row: dict[str, Any] = {
        "kind": "segment", "devices": list(segment.get("devices", [])), "steps_from": restored,
        "steps_to": restored + steps, "steps": steps, "time_s": float(segment.get("time_s", 0.0)),
        "energy_j": float(segment.get("energy_j", 0.0)), "launch_s": float(segment.get("launch_s", 0.0)),
        "lost_workers": list(segment.get("lost_workers", [])), "stopped": bool(segment.get("stopped", False)),
        "why": segment.get("why", ""), "wall_s": segment.get("start_wall_s"),
        "predicted_time_s": None, "predicted_energy_j": None,
    }
    predicted = segment.get("predicted")
    if predicted and predicted.get("steps_per_s"):
        time_s = float(predicted["startup_s"]) + steps / float(predicted["steps_per_s"])
        row.update(predicted_time_s=time_s, predicted_energy_j=float(predicted["power_w"]) * time_s)
    return row


def job_timeline(segments: list[Mapping[str, Any]], events: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The segments (finished ones) and an elastic job's events, in the order they happened."""
    rows = [segment_row(s) for s in segments if not s.get("partial")]
    order = [(float(r["wall_s"] or 0.0), i, r) for i, r in enumerate(rows)]
    order += [(float(e.get("wall_s", 0.0)), len(rows) + i, _event_row(e))
              for i, e in enumerate(events) if e.get("kind") in EVENT_KINDS]
    return [row for *_, row in sorted(order, key=lambda item: (item[0], item[1]))]


def _event_row(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event as the timeline keeps it: a re-plan's decision in brief (the options it weighed
    stay in the ledger)."""
    row = {k: v for k, v in event.items() if k != "decision"}
    decision = event.get("decision")
    if decision:
        candidate = decision.get("candidate") or {}
        row.update(switch=decision["switch"], chosen=decision["chosen"], candidate=candidate.get("devices"),
                   saving=decision["saving"], switch_cost=decision["switch_cost"], unit=decision["unit"])
    return row
