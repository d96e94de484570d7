"""Train each configuration for real from the same pre-training checkpoint and measure it.

Every configuration starts from a copy of the pre-training checkpoint (so no run sees another's
updates) and trains exactly the job's remaining steps through the same coordinator path as
`hetcluster train` (``run_on_devices``: agents start the workers, a local PS, one fresh process
per run, power streams integrated over the run). The measurement of a whole job is then built the
same way as `hetcluster train` builds it (``report.measured_metrics``: pre-training + run).
A configuration whose launch or run fails is recorded with its error and the harness goes on.

Trained R times (``evaluate --repeats R``), a configuration's runs are merged by
:func:`merge_repeats`: the measurement is built from the mean run time and mean run energy, each
run's own whole-job figures are kept (``repeats``), and ``details["runs"]`` holds every run's
record (``details["run"]`` stays the first, as with one run).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hetcluster.errors import HetclusterError
from hetcluster.evaluation.scoring import ConfigurationResult
from hetcluster.training.coordinator import copy_checkpoint
from hetcluster.training.report import JobMetrics, measured_metrics
from hetcluster.training.spec import TrainSpec

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.inventory import Inventory

log = logging.getLogger(__name__)


def configuration_label(devices: Sequence[str]) -> str:
    return "+".join(devices)


def measure_configuration(fleet: Inventory, devices: Sequence[str], predicted: JobMetrics, spec: TrainSpec, *,
                          pretrain: dict[str, float], pretrain_checkpoint: str | None, workdir: Path,
                          run: Callable[..., Any], warmup_steps: int = 0, **run_options: Any) -> ConfigurationResult:
    """Copy the pre-training checkpoint (by its path), train the remaining steps on ``devices`` with ``run`` "
    "(run_on_devices), measure.

    The run's record keeps, beside its totals, what the planner predicted it from (see
    :func:`worker_timings`, with the pre-training's ``warmup_steps``)."""
    checkpoint_dir = copy_checkpoint(pretrain_checkpoint, workdir / "configs" / configuration_label(devices))
    spec = dataclasses.replace(spec, checkpoint_dir=str(checkpoint_dir))
    try:
        measured_run = run(fleet, list(devices), spec, **run_options)
    except HetclusterError as error:
        log.warning("configuration %s failed: %s", configuration_label(devices), error)
        return ConfigurationResult(tuple(devices), predicted, None, error=str(error))
    result = measured_run.result
    metrics = measured_metrics(pretrain["time_s"], pretrain["energy_j"], measured_run.time_s, measured_run.energy_j)
    details = {"run": {"time_s": measured_run.time_s, "energy_j": measured_run.energy_j,
                       "launch_s": measured_run.launch_s, "steps_applied": result.steps_applied,
                       "steps_total": result.steps_total, "steps_per_s": result.steps_per_s,
                       "steps_per_worker": result.steps_per_worker, "lost_workers": result.lost_workers,
                       "energy_per_device_j": measured_run.energy_per_device_j,
                       "final_loss": result.final_loss, "memory_plan": result.memory_plan,
                       **worker_timings(result, warmup_steps)}}
    return ConfigurationResult(tuple(devices), predicted, metrics, details=details)


def worker_timings(result: Any, warmup_steps: int) -> dict[str, dict[str, float]]:
    """Each worker's first step (``first_step_s``: from the run's start to its first completion) and
    steady rate (``steady_steps_per_s``: past its share of ``warmup_steps``, RunResult.worker_steps_per_s),
    the two things pre-training measures per device (DeviceProfile.first_step_s and steps_per_s),
    so a whole-run miss can be told apart into start-up and rate. Workers without two steady
    steps have no steady rate."""
    first: dict[str, float] = {}
    for _, end, worker in sorted(result.step_times, key=lambda row: row[1]):
        first.setdefault(worker, end - result.start_wall_s)
    steady = dataclasses.replace(result, warmup_steps=warmup_steps).worker_steps_per_s(steady_only=True)
    return {"first_step_s": first, "steady_steps_per_s": steady}


def merge_repeats(runs: Sequence[ConfigurationResult], pretrain: dict[str, float]) -> ConfigurationResult:
    """One configuration's repeated measurements as one result: measured from the mean run time and
    run energy of the runs that succeeded; the error of a failed run is kept beside them."""
    if len(runs) == 1:
        return runs[0]
    ok = [r for r in runs if r.measured is not None]
    errors = [r.error for r in runs if r.error]
    first = runs[0]
    if not ok:
        return ConfigurationResult(first.devices, first.predicted, None, error="; ".join(errors))
    records = [r.details["run"] for r in ok]
    mean_time_s = sum(rec["time_s"] for rec in records) / len(records)
    mean_energy_j = sum(rec["energy_j"] for rec in records) / len(records)
    metrics = measured_metrics(pretrain["time_s"], pretrain["energy_j"], mean_time_s, mean_energy_j)
    return ConfigurationResult(first.devices, first.predicted, metrics, error="; ".join(errors) or None,
                               details={"run": records[0], "runs": records}, repeats=[r.measured for r in ok])
