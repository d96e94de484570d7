"""Per-worker memory scheduler in the style of SuperNeurons (Wang et al., PPoPP 2018).

The planning half — `graph`, `route`, `liveness`, `checkpoints`, `cost`, `plan`, `fit` — is pure
(numpy only) so the planner and the CLI can use it without TensorFlow. `keras_graph` (layer graph
of a tf_keras functional model) and `executor` (the scheduled train step) import TensorFlow and
must be imported explicitly.
"""

from hetcluster.memory.cost import DEVICE_KINDS, DeviceAssumptions, Overheads, PeakMargin
from hetcluster.memory.graph import LayerGraph, LayerNode
from hetcluster.memory.plan import MemoryPlan, PlannedSegment, plan_for_budget

__all__ = ["DEVICE_KINDS", "DeviceAssumptions", "LayerGraph", "LayerNode", "MemoryPlan", "Overheads",
           "PeakMargin", "PlannedSegment", "plan_for_budget"]
