"""The layer graph the memory planner works on: pure data, no TensorFlow.

A `LayerGraph` is a DAG of `LayerNode`s in topological order, one node per layer call of a
functional Keras model (see `keras_graph.py`), each producing one activation tensor. Everything
the planner needs is here: output bytes at the planned batch size and dtype, parameter bytes and a
FLOPs estimate. Keeping this a plain dataclass lets the planner, the CLI and the training
coordinator reason about memory without importing TensorFlow, and lets tests build graphs by hand.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from hetcluster.errors import MemoryPlanError

# What the backward step of a layer of this kind reads besides the gradient of its output:
# (its inputs, its own output). Mirrors TensorFlow's registered gradients: Conv2D/MatMul read the
# input, Relu/Sigmoid/Softmax read the output, FusedBatchNorm reads the input, MaxPool both,
# Add/Concat/AvgPool/Reshape only shapes, Dropout its mask (counted as one output-sized tensor).
BACKWARD_NEEDS: dict[str, tuple[bool, bool]] = {
    "input": (False, False),
    "conv": (True, False),
    "depthwise": (True, False),
    "dense": (True, False),
    "bn": (True, False),
    "activation": (False, True),
    "maxpool": (True, True),
    "pool": (False, False),
    "add": (False, False),
    "multiply": (True, False),
    "concat": (False, False),
    "dropout": (False, True),
    "reshape": (False, False),
    "other": (True, True),
}

# Kinds whose outputs SuperNeurons keeps as checkpoints (plus forks and joins, found structurally).
CHECKPOINT_KINDS = frozenset({"conv", "depthwise", "dense", "add", "multiply", "concat", "input"})


@dataclass(frozen=True)
class LayerNode:
    """One layer call: its output tensor, weights and cost."""

    name: str
    kind: str
    inputs: tuple[str, ...] = ()
    output_bytes: int = 0
    param_bytes: int = 0
    trainable_param_bytes: int = 0
    flops: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in BACKWARD_NEEDS:
            raise MemoryPlanError(
                f"Layer {self.name!r} has unknown kind {self.kind!r}.",
                hint=f"use one of {sorted(BACKWARD_NEEDS)}.",
            )
        if self.output_bytes < 0 or self.param_bytes < 0:
            raise MemoryPlanError(f"Layer {self.name!r} has negative sizes.", hint="check the graph extraction.")


@dataclass(frozen=True)
class LayerGraph:
    """A DAG of layers in topological order, at one batch size and dtype."""

    nodes: tuple[LayerNode, ...]
    batch_size: int = 1
    dtype_bytes: int = 4
    name: str = "model"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                raise MemoryPlanError(f"Layer name {node.name!r} appears twice.", hint="give layers unique names.")
            for parent in node.inputs:
                if parent not in seen:
                    raise MemoryPlanError(
                        f"Layer {node.name!r} reads {parent!r}, which does not come before it.",
                        hint="list the nodes in topological order.",
                    )
            seen.add(node.name)
        if not self.nodes:
            raise MemoryPlanError("The layer graph is empty.", hint="pass a model with at least one layer.")

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def index(self) -> dict[str, int]:
        return {node.name: i for i, node in enumerate(self.nodes)}

    @cached_property
    def input_ids(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the indices of the nodes it reads."""
        return tuple(tuple(self.index[p] for p in node.inputs) for node in self.nodes)

    @cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the indices of the nodes that read it (in topological order)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for i, parents in enumerate(self.input_ids):
            for p in dict.fromkeys(parents):
                out[p].append(i)
        return tuple(tuple(c) for c in out)

    @cached_property
    def output_ids(self) -> tuple[int, ...]:
        """Nodes nobody reads: the model outputs (the loss reads them)."""
        return tuple(i for i, c in enumerate(self.consumers) if not c)

    def is_fork(self, i: int) -> bool:
        return len(self.consumers[i]) > 1

    def is_join(self, i: int) -> bool:
        return len(set(self.input_ids[i])) > 1

    def is_checkpoint_kind(self, i: int) -> bool:
        """SuperNeurons' checkpoints: conv, dense, join, fork and concat outputs."""
        return self.nodes[i].kind in CHECKPOINT_KINDS or self.is_fork(i) or self.is_join(i)

    def total(self, attribute: str, kind: str | None = None) -> float:
        """Sum of a node attribute over the graph (or over the nodes of one kind)."""
        return sum(getattr(n, attribute) for n in self.nodes if kind is None or n.kind == kind)

    forward_flops = property(lambda self: float(self.total("flops")))
    activation_bytes = property(lambda self: int(self.total("output_bytes")))
    param_bytes = property(lambda self: int(self.total("param_bytes")))
    trainable_param_bytes = property(lambda self: int(self.total("trainable_param_bytes")))
    input_bytes = property(lambda self: int(self.total("output_bytes", "input")))

    def largest_layer_bytes(self) -> int:
        """Memory one layer needs on its own in training: its inputs and output, and their gradients.

        SuperNeurons' lower bound on the peak: no schedule goes below the largest layer's need.
        """
        best = 0
        for i, node in enumerate(self.nodes):
            ins = sum(self.nodes[p].output_bytes for p in set(self.input_ids[i]))
            best = max(best, 2 * (ins + node.output_bytes))
        return best

    def scaled(self, batch_size: int) -> "LayerGraph":
        """The same graph at another batch size (activations and FLOPs scale, parameters do not)."""
        factor = batch_size / self.batch_size
        nodes = tuple(
            LayerNode(n.name, n.kind, n.inputs, int(round(n.output_bytes * factor)), n.param_bytes,
                      n.trainable_param_bytes, n.flops * factor)
            for n in self.nodes
        )
        return LayerGraph(nodes, batch_size, self.dtype_bytes, self.name, dict(self.meta))

    def to_dict(self) -> dict[str, Any]:
        """JSON-shaped (lists, not tuples), so it equals itself read back from a JSON file."""
        return {"name": self.name, "batch_size": self.batch_size, "dtype_bytes": self.dtype_bytes,
                "meta": dict(self.meta), "nodes": [{**asdict(n), "inputs": list(n.inputs)} for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LayerGraph":
        try:
            nodes = tuple(LayerNode(**{**n, "inputs": tuple(n.get("inputs", ()))}) for n in data["nodes"])
            return cls(nodes, int(data.get("batch_size", 1)), int(data.get("dtype_bytes", 4)),
                       str(data.get("name", "model")), dict(data.get("meta", {})))
        except (KeyError, TypeError) as exc:
            raise MemoryPlanError(f"Malformed layer graph: {exc}.", hint="write it with LayerGraph.to_dict().") from exc
