"""What a training step needs besides activations, and what a plan costs in time.

Fixed bytes (counted at every step): parameters (all weights, BN moving statistics included), one
gradient per trainable weight, the optimizer's slots per trainable weight, and two transients
that coincide with the backward peak in practice:

- optimizer-update temporaries: inside one traced step TensorFlow applies a variable's update as
  soon as its gradient exists, i.e. during the backward pass of the earlier layers; the update of
  the largest variable allocates a few temporaries of its size (2 for SGD with momentum);
- kernel scratch: oneDNN reorders a layer's input into its blocked layout during the backward,
  about one copy of the largest activation.

Plus a runtime constant (`runtime_bytes`, 0 by default). The input batch is not here: it is the
activation of the graph's input nodes. These terms were calibrated on this project's CPU machine
(TF 2.20, oneDNN) against `tf.config.experimental.get_memory_info('CPU:0')['peak']` of plain and
scheduled train steps of ResNet-50, VGG-16 and CIFAR ResNets: see docs/memory.md and
`benchmarks/memory.py` (VGG-16's 67 MB fc2 kernel is what exposed the update temporaries).

Slowdown = recomputed FLOPs / step FLOPs (a step is forward + backward, counted as 3x the forward
FLOPs), plus the host-link transfer time of offloaded tensors over the step time, both estimated
from assumed device figures. Transfers are counted as not hidden behind compute (conservative).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetcluster.errors import MemoryPlanError
from hetcluster.memory.graph import LayerGraph

# Optimizer state per trainable weight, in copies of the weight.
OPTIMIZER_SLOTS: dict[str, int] = {
    "sgd": 0,
    "sgd-momentum": 1,
    "momentum": 1,
    "adagrad": 1,
    "rmsprop": 1,
    "adam": 2,
    "adamw": 2,
}

DEVICE_KINDS = ("cpu", "unified", "discrete-gpu")

# Temporaries of one variable's update, in copies of the variable.
UPDATE_TEMP_COPIES: dict[str, int] = {
    "sgd": 1,
    "sgd-momentum": 2,
    "momentum": 2,
    "adagrad": 2,
    "rmsprop": 2,
    "adam": 3,
    "adamw": 3,
}

# TensorFlow's own bytes beyond what the plan models (calibrated, see module docstring).
DEFAULT_RUNTIME_BYTES = 0


@dataclass(frozen=True)
class Overheads:
    """What the prediction adds to the activations. The default optimizer is SGD with momentum."""

    optimizer: str = "sgd-momentum"
    runtime_bytes: int = DEFAULT_RUNTIME_BYTES
    transients: bool = True  # count update temporaries and kernel scratch

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZER_SLOTS:
            raise MemoryPlanError(
                f"Unknown optimizer {self.optimizer!r}.", hint=f"use one of {sorted(OPTIMIZER_SLOTS)}."
            )

    def fixed_bytes(self, graph: LayerGraph) -> int:
        trainable = graph.trainable_param_bytes
        state = graph.param_bytes + trainable * (1 + OPTIMIZER_SLOTS[self.optimizer])
        return int(state + self.transient_bytes(graph) + self.runtime_bytes)

    def transient_bytes(self, graph: LayerGraph) -> int:
        """Update temporaries of the largest variable plus one copy of the largest activation."""
        if not self.transients:
            return 0
        largest_weight = max((n.trainable_param_bytes for n in graph.nodes), default=0)
        largest_activation = max((n.output_bytes for n in graph.nodes if n.kind != "input"), default=0)
        return int(UPDATE_TEMP_COPIES[self.optimizer] * largest_weight + largest_activation)


# Headroom between a predicted peak and the budget, as a fraction of the prediction: above the
# largest under-prediction measured, per kind of step (docs/decisions.md#memory-peak-margin).
PLAIN_PEAK_MARGIN = 0.12
SCHEDULED_PEAK_MARGIN = 0.08


@dataclass(frozen=True)
class PeakMargin:
    """What a plan must leave free under its budget: plain TensorFlow's step, whose peak the model
    under-predicts most (allocator and kernel scratch it does not see), and a scheduled step."""

    plain: float = PLAIN_PEAK_MARGIN
    scheduled: float = SCHEDULED_PEAK_MARGIN

    @classmethod
    def none(cls) -> "PeakMargin":
        """No headroom: a plan fits when its predicted peak does (the raw model, for analysis)."""
        return cls(0.0, 0.0)

    def of(self, plain: bool) -> float:
        return self.plain if plain else self.scheduled

    def needed_bytes(self, peak_bytes: int, plain: bool) -> int:
        """The budget a step of this predicted peak needs."""
        return int(-(-peak_bytes * (1.0 + self.of(plain)) // 1))

    def usable_bytes(self, budget_bytes: int, plain: bool) -> int:
        """The largest predicted peak whose needed_bytes fit ``budget_bytes``."""
        peak = int(budget_bytes / (1.0 + self.of(plain)))
        while self.needed_bytes(peak + 1, plain) <= budget_bytes:  # float rounding, either way
            peak += 1
        while peak > 0 and self.needed_bytes(peak, plain) > budget_bytes:
            peak -= 1
        return peak


@dataclass(frozen=True)
class DeviceAssumptions:
    """Figures used only to turn offloaded bytes into time (no device is measured here)."""

    host_link_bytes_per_s: float = 12e9  # PCIe 3.0 x16, effective
    device_flops_per_s: float = 10e12  # sustained training FLOP rate of a discrete GPU

    def transfer_slowdown(self, graph: LayerGraph, transfer_bytes: int) -> float:
        step_s = step_flops(graph) / self.device_flops_per_s
        if step_s <= 0:
            return 0.0
        return (transfer_bytes / self.host_link_bytes_per_s) / step_s


def step_flops(graph: LayerGraph) -> float:
    """FLOPs of one plain training step: forward plus a backward of twice the forward."""
    return 3.0 * graph.forward_flops


def recompute_slowdown(graph: LayerGraph, recompute_flops: float) -> float:
    total = step_flops(graph)
    return recompute_flops / total if total > 0 else 0.0


def check_device_kind(device_kind: str) -> str:
    if device_kind not in DEVICE_KINDS:
        raise MemoryPlanError(f"Unknown device kind {device_kind!r}.", hint=f"use one of {', '.join(DEVICE_KINDS)}.")
    return device_kind
