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

    @property
    def errors(self) -> dict[str, float | None]:
        return relative_errors(self.predicted, self.measured)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["predicted"] = self.predicted.to_dict()
        data["measured"] = self.measured.to_dict()
        data["errors"] = self.errors
        data["definitions"] = {
            "time_s": "pre-training wall time + training run wall time (server start-up excluded, see run.launch_s)",
            "energy_j": "pre-training energy + chosen devices' power streams integrated over the run"
                        " (+ other devices' streams when idle power counts)",
            "power_w": "training run energy / training run time",
            "edp_js": "energy_j * time_s",
            "errors": "(predicted - measured) / measured",
        }
        return data
