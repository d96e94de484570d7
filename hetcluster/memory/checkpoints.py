"""Where to cut the network into recompute segments: three granularities, finest first.

- ``conv``  — SuperNeurons: every conv, dense, join, fork and concat output is a checkpoint; the
  cheap layers after a checkpoint are recomputed together with the next checkpoint layer (whose
  own recomputation TensorFlow prunes, since no gradient reads a conv's output).
- ``block`` — only articulation tensors are kept: the single tensor through which everything flows
  at that point of the topological order (ResNet block outputs, DenseNet transitions).
- ``sqrt``  — Chen et al.'s sublinear schedule: consecutive blocks merged into segments of about
  sqrt(n) layers, cut only at articulation tensors so a segment is a function of one tensor.

Each segment's mode follows SuperNeurons: speed-centric (keep the recomputed tensors) when its
activations fit in the largest layer's need, memory-centric (bisect) otherwise.
"""

from __future__ import annotations

import math

from hetcluster.memory.graph import LayerGraph
from hetcluster.memory.route import MEMORY, SPEED, Segment

STRATEGIES = ("conv", "block", "sqrt")


def _segments_ending_at(graph: LayerGraph, cuts: list[int]) -> list[tuple[int, int]]:
    """Ranges (previous cut, cut] of length >= 2 that contain no input node."""
    out = []
    prev = -1
    for cut in cuts:
        start = prev + 1
        while start <= cut and graph.nodes[start].kind == "input":
            start += 1
        if cut - start + 1 >= 2:
            out.append((start, cut + 1))
        prev = cut
    return out


def articulation_points(graph: LayerGraph) -> list[int]:
    """Positions p where the only tensor produced at or before p and read after p is p's own."""
    last_reader = [max(c) if c else len(graph) for c in graph.consumers]
    points = []
    open_count = 0
    closing: dict[int, int] = {}
    for p in range(len(graph)):
        # tensors whose last reader is p close before p's own output opens
        open_count -= closing.pop(p, 0)
        open_count += 1
        closing[last_reader[p]] = closing.get(last_reader[p], 0) + 1
        if open_count == 1:
            points.append(p)
    return points


def _mode(graph: LayerGraph, start: int, stop: int) -> str:
    seg_bytes = sum(graph.nodes[i].output_bytes for i in range(start, stop))
    return SPEED if seg_bytes <= graph.largest_layer_bytes() else MEMORY


def segments(graph: LayerGraph, strategy: str) -> list[Segment]:
    """All recompute segments of `strategy`, in topological order."""
    if strategy == "conv":
        cuts = [i for i in range(len(graph)) if graph.is_checkpoint_kind(i)]
    elif strategy == "block":
        cuts = articulation_points(graph)
    elif strategy == "sqrt":
        points = articulation_points(graph)
        target = max(2, math.ceil(math.sqrt(len(graph))))
        cuts, last = [], -1
        for p in points:
            if p - last >= target:
                cuts.append(p)
                last = p
        if points and (not cuts or cuts[-1] != points[-1]):
            cuts.append(points[-1])
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    if cuts and cuts[-1] != len(graph) - 1:
        cuts.append(len(graph) - 1)
    return [Segment(a, b, _mode(graph, a, b)) for a, b in _segments_ending_at(graph, cuts)]


def saved_bytes(graph: LayerGraph, seg: Segment) -> int:
    """Activation bytes a segment stops keeping: those read only inside it."""
    return sum(graph.nodes[i].output_bytes for i in range(seg.start, seg.stop)
               if all(seg.start <= c < seg.stop for c in graph.consumers[i]) and graph.consumers[i])


def by_benefit(graph: LayerGraph, segs: list[Segment]) -> list[Segment]:
    """Segments ordered by bytes saved per recomputed FLOP, best first (greedy partial plans)."""
    def key(seg: Segment) -> float:
        flops = sum(graph.nodes[i].flops for i in range(seg.start, seg.stop - 1)) + 1.0
        return -saved_bytes(graph, seg) / flops
    return sorted(segs, key=key)
