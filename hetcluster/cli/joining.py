"""What an elastic job knows of a device that joins it: the figures the planner needs.

In order: what this job measured of it before (it left and came back), the job's own profile
(pre-training measured it; it was down when the plan was made), a device of its class (the
inventory's ``device_class``: identical devices train alike, as pre-training takes one of a class
for all), else a short solo measurement with pre-training's own machinery (``run_pretraining`` on
that device alone: its own throwaway parameter server and checkpoint, so the running job's state
is never touched; the idle power first, then one solo run).
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.cli.pretraining import DeviceBudgets
    from hetcluster.inventory import Inventory
    from hetcluster.profiling.profile import DeviceProfile, Profile
    from hetcluster.training.spec import TrainSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Known:
    """A device's figures and where they came from ("measured now", "this job's profile", "its
    class", "measured earlier in this job"); ``launch_s`` and ``energy_j``: its server's start and
    the measurement's energy, when measured now."""

    device: DeviceProfile
    source: str
    launch_s: float | None = None
    energy_j: float = 0.0    # what measuring it now drew (metered on the device, idle power included)


def known_figures(name: str, fleet: Inventory, profile: Profile, measured: dict[str, DeviceProfile]) -> Known | None:
    """The device's figures without measuring it, when the job has them (None: it must be measured)."""
    if name in measured:
        return Known(measured[name], "measured earlier in this job")
    for device in profile.devices:
        if device.name == name:
            return Known(device, "this job's profile")
    device_class = fleet.device(name).device_class
    if device_class:
        for device in [*profile.devices, *measured.values()]:
            if device.device_class == device_class and not device.measured_on:
                return Known(dataclasses.replace(device, name=name, measured_on=device.name),
                             f"its class ({device_class}, measured on {device.name})")
    return None


def measure_alone(name: str, fleet: Inventory, spec: TrainSpec, profile: Profile, budgets: DeviceBudgets,
                  workdir: Path, on_line: Callable[[str], None] = lambda line: None) -> Known:
    """Measure ``name`` alone as pre-training measures a device (its idle power, then one solo run
    of the job's model, data and optimizer, under the memory plan training would give it), on a
    throwaway parameter server and checkpoint. Raises HetclusterError when it cannot be measured."""
    from hetcluster.profiling.pretrain import PretrainSettings, run_pretraining

    steps = max(profile.steps_per_run or 20, profile.warmup_steps + 2)
    settings = PretrainSettings(steps_per_run=steps, warmup_steps=profile.warmup_steps,
                                warmup_s=profile.warmup_s or PretrainSettings.warmup_s, max_sets=0,
                                recheck_fastest=False, opening_s=0.0, optimizer=spec.optimizer,
                                learning_rate=spec.learning_rate, protocol="sequential")
    launched: dict[str, float] = {}

    def on_event(kind: str, details: dict[str, Any]) -> None:
        if kind == "launched":
            launched["s"] = float(details["launch_s"])
            on_line(f"{name}: its worker and a parameter server of its own are up ({details['launch_s']:.1f} s)")
        elif kind == "run_done":
            on_line(f"{name}: {details['steps_per_s']:.2f} steps/s alone")

    def memory(names: Any) -> Any:
        return budgets.training_memory(spec.model, names)

    with tempfile.TemporaryDirectory(prefix=f"measure-{name}-", dir=workdir) as scratch:
        measured = run_pretraining(fleet, spec.model, str(Path(scratch) / "checkpoints"), data=spec.data,
                                   settings=settings, device_names=[name], on_event=on_event, memory=memory)
    return Known(measured.device(name), "measured now", launched.get("s"), measured.pretrain_energy_j)
