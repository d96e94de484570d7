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

from hetcluster.errors import MemoryPlanError
from hetcluster.memory.cost import Overheads, PeakMargin
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
             overheads: Overheads | None = None, margin: PeakMargin | None = None) -> MemoryPlan:
    """The best plan of the model of ``graph`` at ``batch_size`` for a budget and device kind,
    keeping the calibrated ``margin`` (cost.PeakMargin) between its predicted peak and the budget."""
    if graph.batch_size != batch_size:
        graph = graph.scaled(batch_size)
    return plan_for_budget(graph, budget_bytes, device_kind, overheads=overheads, margin=margin or PeakMargin())


def memory_fit(graph: LayerGraph, batch_size: int, budget_bytes: int, device_kind: str = "cpu", *,
               overheads: Overheads | None = None) -> tuple[bool, int, float]:
    """(fits, predicted peak bytes, predicted slowdown) of the best plan for this device."""
    plan = plan_for(graph, batch_size, budget_bytes, device_kind, overheads=overheads)
    return plan.fits, plan.predicted_peak_bytes, plan.predicted_slowdown


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


@dataclasses.dataclass(frozen=True)
class WorkerMemory:
    """One worker's device budget and kind and the plan it trains under."""

    device: str
    budget_bytes: int
    device_kind: str
    plan: MemoryPlan

    @property
    def planned(self) -> bool:
        """Whether the worker needs the scheduler (else it runs the plain step)."""
        return self.plan.technique != "none"

    @property
    def slowdown(self) -> float:
        """The plan's predicted step-time multiplier (1.0 for plain TensorFlow)."""
        return 1.0 + float(self.plan.predicted_slowdown) if self.planned else 1.0

    @property
    def technique(self) -> str:
        return self.plan.technique if self.planned else ""

    def check_fits(self) -> None:
        """A MemoryPlanError, before any step runs, when no plan keeps this worker's peak under its budget."""
        if not self.plan.fits:
            plan = self.plan
            raise MemoryPlanError(
                f"{self.device} cannot train {plan.model} at batch {plan.batch_size} in its "
                f"{_mib(self.budget_bytes)} memory budget: it needs at least {_mib(plan.needed_bytes)} "
                f"(the smallest plan, {plan.technique}, predicts {_mib(plan.predicted_peak_bytes)} "
                f"plus a {plan.margin:.0%} margin).",
                hint="leave the device out, give it a larger budget, or use a smaller batch size.")

    def describe(self) -> str:
        plan = self.plan
        if not self.planned:
            return (f"{self.device}: plain TensorFlow (predicted peak {_mib(plan.predicted_peak_bytes)} "
                    f"of its {_mib(self.budget_bytes)} budget)")
        saved = 1.0 - plan.predicted_peak_bytes / plan.liveness_peak_bytes
        return (f"{self.device}: {plan.technique}, predicted peak {_mib(plan.predicted_peak_bytes)} of its "
                f"{_mib(self.budget_bytes)} budget ({saved:.0%} under plain TensorFlow's "
                f"{_mib(plan.liveness_peak_bytes)}), {plan.predicted_slowdown:+.1%} step time")


@dataclasses.dataclass(frozen=True)
class TrainingMemory:
    """The memory plans a training runs under, one per worker with a known budget: each worker
    trains under its own device's plan (one traced step selects it by the worker's index:
    executor.per_worker_gradients), and plain TensorFlow where that fits its budget."""

    workers: tuple[WorkerMemory, ...] = ()

    def of(self, device: str) -> WorkerMemory | None:
        return next((w for w in self.workers if w.device == device), None)

    @property
    def planned(self) -> tuple[WorkerMemory, ...]:
        return tuple(w for w in self.workers if w.planned)

    @property
    def slowdowns(self) -> dict[str, float]:
        """Each worker's predicted step-time multiplier (1.0: plain TensorFlow)."""
        return {w.device: w.slowdown for w in self.workers}

    @property
    def slowdown(self) -> float:
        """The largest member's multiplier (a single worker's own)."""
        return max(self.slowdowns.values(), default=1.0)

    @property
    def technique(self) -> str:
        """The scheduler's techniques the workers train under ("": plain TensorFlow everywhere)."""
        return "+".join(dict.fromkeys(w.technique for w in self.planned))

    def spec_fields(self) -> dict[str, dict[str, Any]]:
        """TrainSpec's per-worker memory fields: the budget and kind of each worker that needs a
        plan (the others run the plain step, which pre-training measured)."""
        return {"worker_budgets_bytes": {w.device: w.budget_bytes for w in self.planned},
                "worker_device_kinds": {w.device: w.device_kind for w in self.planned}}

    def describe(self) -> str:
        if not self.workers:
            return "memory: no chosen device has a known budget; plain TensorFlow"
        if not self.planned:
            tightest = min(self.workers, key=lambda w: w.budget_bytes)
            return (f"memory: plain TensorFlow fits every chosen device (the tightest: {tightest.device}'s "
                    f"{_mib(tightest.budget_bytes)})")
        return "memory, per worker:" + "".join(f"\n  {w.describe()}" for w in self.workers)


def worker_memory(spec: ModelSpec, budgets: dict[str, tuple[int, str]], devices: Sequence[str],
                  graph: LayerGraph) -> TrainingMemory:
    """Each of ``devices`` with a known budget (``budgets``: name → (budget bytes, device kind),
    e.g. cli.pretraining.DeviceBudgets.of) and its own plan on ``graph``, the model's layer graph."""
    workers = tuple(WorkerMemory(name, *budgets[name], plan_for(graph, spec.batch_size, *budgets[name]))
                    for name in devices if name in budgets)
    return TrainingMemory(workers)


def training_memory(spec: ModelSpec, budgets: dict[str, tuple[int, str]], devices: Sequence[str],
                    graph: LayerGraph) -> TrainingMemory:
    """The memory plans for training ``devices`` (worker_memory), refused with a MemoryPlanError
    naming the budget it would need when some device's smallest plan does not fit its budget:
    before any server starts, not an out-of-memory kill in the middle of the job."""
    memory = worker_memory(spec, budgets, devices, graph)
    for worker in memory.workers:
        worker.check_fits()
    return memory
