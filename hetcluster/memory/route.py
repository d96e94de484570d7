"""The execution route of one training step: forward, loss, backward, with recomputation inserted.

A route is the exact sequence of steps a scheduled train step runs. Each step defines and uses
tensor *instances* — (kind, layer, version) with kind "A" (activation) or "G" (gradient of that
activation) — so that a recomputed activation is a new instance, live only while its backward
needs it. Liveness (`liveness.py`) is then the same computation for every plan.

Segments are contiguous runs of the topological order. A segment's forward keeps only the tensors
read outside it; its backward first recomputes what its layers' gradients read (speed-centric:
everything at once), or bisects the segment (memory-centric: recompute the first half's boundary,
do the second half's backward, then the first half's), which is what the executor's nested
`custom_gradient` segments do. A recomputed layer whose output no gradient reads is not counted:
TensorFlow prunes it from the function (a conv closing a segment is never recomputed).
"""

from __future__ import annotations

from dataclasses import dataclass

from hetcluster.errors import MemoryPlanError
from hetcluster.memory.graph import BACKWARD_NEEDS, LayerGraph

TensorKey = tuple[str, int, int]  # ("A" | "G", layer index, version)

SPEED = "speed"
MEMORY = "memory"


@dataclass(frozen=True)
class Segment:
    """Layers [start, stop) of the topological order, recomputed in the backward pass."""

    start: int
    stop: int
    mode: str = SPEED

    def __post_init__(self) -> None:
        if self.stop - self.start < 2:
            raise MemoryPlanError(f"Segment [{self.start}, {self.stop}) is shorter than two layers.",
                                  hint="recompute segments need at least two layers.")
        if self.mode not in (SPEED, MEMORY):
            raise MemoryPlanError(f"Unknown recompute mode {self.mode!r}.", hint="use 'speed' or 'memory'.")


@dataclass(frozen=True)
class Step:
    """One step of the route: F forward, L loss, R recompute, S gradient sum, B backward of `layer`."""

    op: str
    layer: int
    defs: tuple[TensorKey, ...]
    uses: tuple[TensorKey, ...]


@dataclass(frozen=True)
class Route:
    steps: tuple[Step, ...]
    n_forward: int  # steps [0, n_forward) are the forward pass and the loss

    @property
    def recomputed_layers(self) -> list[int]:
        return [s.layer for s in self.steps if s.op == "R"]


class _Builder:
    def __init__(self, graph: LayerGraph) -> None:
        self.g = graph
        self.steps: list[Step] = []
        self.version = [0] * len(graph)
        self.next_version = 1
        self.grads: dict[int, list[TensorKey]] = {}  # gradient contributions per layer

    def a(self, layer: int) -> TensorKey:
        return ("A", layer, self.version[layer])

    def forward(self, layer: int, op: str = "F") -> None:
        uses = tuple(self.a(p) for p in dict.fromkeys(self.g.input_ids[layer]))
        if op == "R":
            self.version[layer] = self.next_version
            self.next_version += 1
        self.steps.append(Step(op, layer, (self.a(layer),), uses))

    def new_key(self, kind: str, layer: int) -> TensorKey:
        self.next_version += 1
        return (kind, layer, self.next_version)

    def gradient(self, layer: int) -> list[TensorKey]:
        """The gradient of `layer`'s output; several contributions (a fork) are summed first.

        TensorFlow's tape keeps every contribution until the producing op's turn, then AddN
        allocates their sum: contributions and sum are live together for that moment.
        """
        parts = list(dict.fromkeys(self.grads.get(layer, [])))
        if len(parts) <= 1:
            return parts
        total = self.new_key("G", layer)
        self.steps.append(Step("S", layer, (total,), tuple(parts)))
        return [total]

    def backward(self, layer: int) -> None:
        node = self.g.nodes[layer]
        if node.kind == "input":
            return
        needs_in, needs_out = BACKWARD_NEEDS[node.kind]
        parents = tuple(dict.fromkeys(self.g.input_ids[layer]))
        uses: list[TensorKey] = self.gradient(layer)
        if needs_in:
            uses += [self.a(p) for p in parents]
        if needs_out:
            uses.append(self.a(layer))
        defs: list[TensorKey] = []
        for p in parents:
            if self.g.nodes[p].kind == "input":
                continue
            if node.kind == "add" and uses[:1]:
                # Add's gradient is its incoming gradient itself: no new buffer (TF's _AddGrad)
                self.grads.setdefault(p, []).append(uses[0])
                continue
            key = self.new_key("G", p)
            defs.append(key)
            self.grads.setdefault(p, []).append(key)
        self.steps.append(Step("B", layer, tuple(defs), tuple(uses)))

    def recompute(self, targets: set[int], layers: list[int]) -> None:
        """Recompute the layers of `layers` that `targets` depend on, in order."""
        inside = set(layers)
        needed = set(targets) & inside
        for node in reversed(layers):
            if node in needed:
                needed.update(p for p in self.g.input_ids[node] if p in inside)
        for node in layers:
            if node in needed:
                self.forward(node, op="R")

    def read_by_backward(self, layers: list[int]) -> set[int]:
        out: set[int] = set()
        for node in layers:
            needs_in, needs_out = BACKWARD_NEEDS[self.g.nodes[node].kind]
            if needs_in:
                out.update(self.g.input_ids[node])
            if needs_out:
                out.add(node)
        return out

    def segment_backward(self, layers: list[int], mode: str) -> None:
        if mode == SPEED or len(layers) <= 2:
            self.recompute(self.read_by_backward(layers), layers)
            for node in reversed(layers):
                self.backward(node)
            return
        half = len(layers) // 2
        first, second = layers[:half], layers[half:]
        second_set = set(second)
        boundary = {node for node in first if any(c in second_set for c in self.g.consumers[node])}
        self.recompute(boundary, first)
        self.segment_backward(second, mode)
        self.segment_backward(first, mode)


def build_route(graph: LayerGraph, segments: tuple[Segment, ...] = ()) -> Route:
    """The step sequence of one training step of `graph` with `segments` recomputed."""
    n = len(graph)
    by_last: dict[int, Segment] = {}
    covered = [False] * n
    for seg in sorted(segments, key=lambda s: s.start):
        if seg.stop > n or any(covered[seg.start:seg.stop]):
            raise MemoryPlanError(f"Segment [{seg.start}, {seg.stop}) overlaps another or leaves the graph.",
                                  hint="segments must be disjoint runs of the topological order.")
        covered[seg.start:seg.stop] = [True] * (seg.stop - seg.start)
        by_last[seg.stop - 1] = seg
    b = _Builder(graph)
    for i in range(n):
        b.forward(i)
    outs = graph.output_ids
    loss_grads = tuple(b.new_key("G", o) for o in outs)
    b.steps.append(Step("L", outs[-1], loss_grads, tuple(b.a(o) for o in outs)))
    for o, key in zip(outs, loss_grads):
        b.grads[o] = [key]
    n_forward = len(b.steps)
    i = n - 1
    while i >= 0:
        seg = by_last.get(i)
        if seg is None:
            b.backward(i)
            i -= 1
        else:
            b.segment_backward(list(range(seg.start, seg.stop)), seg.mode)
            i = seg.start - 1
    return Route(tuple(b.steps), n_forward)
