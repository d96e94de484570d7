"""Memory fit of a model on a device, for the planner's memory-fit column and the CLI (pure).

Every function takes the model's layer graph; ``memory.model_graph.graph_of`` makes one from a
model's name (building the tf_keras model: TensorFlow), once per (name, input shape, classes)
per process, and keeps it here (``remember_graph``), as a profile's record of the graph
pre-training planned on does. Graphs are kept at batch 1 and scaled, since activations and FLOPs
are linear in the batch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from hetcluster.memory.cost import Overheads
from hetcluster.memory.graph import LayerGraph
from hetcluster.memory.plan import MemoryPlan, plan_for_budget

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.models.spec import ModelSpec


# (name, input shape, classes) → the model's layer graph at batch 1: extracted at most once per
# process, or adopted from a profile (remember_graph), so re-planning from a profile needs no TensorFlow
_GRAPHS: dict[tuple[str, tuple[int, ...], int], LayerGraph] = {}


def _key(name: str, input_shape: Any, classes: int) -> tuple[str, tuple[int, ...], int]:
    return name, tuple(int(s) for s in input_shape), int(classes)


def extracted_graph(name: str, input_shape: Any, classes: int) -> LayerGraph | None:
    """The batch-1 graph this process already has for the model (None: not extracted here)."""
    return _GRAPHS.get(_key(name, input_shape, classes))


def remember_graph(name: str, input_shape: Any, classes: int, graph: LayerGraph) -> None:
    """Adopt ``graph`` (at batch 1) as the model's: a profile's record of the graph it was planned on."""
    if graph.batch_size != 1:
        graph = graph.scaled(1)
    _GRAPHS[_key(name, input_shape, classes)] = graph


def plan_for(graph: LayerGraph, batch_size: int, budget_bytes: int, device_kind: str = "cpu", *,
             overheads: Overheads | None = None) -> MemoryPlan:
    """The best plan of the model of ``graph`` at ``batch_size`` for a budget and device kind."""
    if graph.batch_size != batch_size:
        graph = graph.scaled(batch_size)
    return plan_for_budget(graph, budget_bytes, device_kind, overheads=overheads)


def memory_fit(graph: LayerGraph, batch_size: int, budget_bytes: int, device_kind: str = "cpu", *,
               overheads: Overheads | None = None) -> tuple[bool, int, float]:
    """(fits, predicted peak bytes, predicted slowdown) of the best plan for this device."""
    plan = plan_for(graph, batch_size, budget_bytes, device_kind, overheads=overheads)
    return plan.fits, plan.predicted_peak_bytes, plan.predicted_slowdown


@dataclasses.dataclass(frozen=True)
class TrainingMemory:
    """The memory plan a training runs under: ``TrainSpec.memory_budget_bytes`` and
    ``memory_device_kind``, the device whose budget set them, and its plan (None: no budget known)."""

    budget_bytes: int = 0
    device_kind: str = "cpu"
    device: str = ""
    plan: MemoryPlan | None = None

    @property
    def slowdown(self) -> float:
        """The plan's predicted step-time multiplier (1.0 for plain TensorFlow)."""
        return 1.0 + float(self.plan.predicted_slowdown) if self.budget_bytes else 1.0

    @property
    def technique(self) -> str:
        """The memory scheduler's technique the step runs under ("": plain TensorFlow)."""
        return self.plan.technique if self.budget_bytes else ""

    def describe(self) -> str:
        if self.plan is None:
            return "memory: no chosen device has a known budget; plain TensorFlow"
        budget = f"{self.device}'s {self.plan.budget_bytes / 2**20:.1f} MiB"
        if not self.budget_bytes:
            return f"memory: plain TensorFlow fits every chosen device (the tightest: {budget})"
        return (f"memory: every worker trains under the plan for {budget}: {self.plan.technique}, "
                f"predicted {self.plan.predicted_slowdown:+.1%} step time")


def training_memory(spec: ModelSpec, budgets: dict[str, tuple[int, str]], devices: Sequence[str],
                    graph: LayerGraph) -> TrainingMemory:
    """The memory plan for training ``devices``: the tightest device's (smallest known budget;
    ``budgets``: name → (budget bytes, device kind), e.g. cli.pretraining.DeviceBudgets.of), on
    ``graph``, the model's layer graph.

    One traced step serves every worker under ParameterServerStrategy, so one plan must fit them
    all (docs/memory.md); the planner admitted each device by its own plan, so the tightest one's
    fits. Where plain TensorFlow fits that budget (technique "none") the budget stays 0: the
    step is the plain one pre-training measured, not the scheduler's replay of the same graph.
    """
    known = [(*budgets[name], name) for name in devices if name in budgets]
    if not known:
        return TrainingMemory()
    budget, kind, name = min(known)
    plan = plan_for(graph, spec.batch_size, budget, kind)
    if plan.technique == "none":
        return TrainingMemory(device=name, plan=plan)
    return TrainingMemory(budget, kind, name, plan)
