"""Liveness of tensor instances along a route, and the per-step memory timeline it gives.

An instance is live from the step that defines it to the last step that uses it (liveness), or to
the end of the step (the naive baseline that keeps everything). An offloaded activation is on the
device only from its definition to its last forward use, and again from its prefetch — one
backward segment ahead of its first backward use — to its last use; in between it lives in host
memory, which the timeline does not count.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from hetcluster.memory.graph import LayerGraph
from hetcluster.memory.route import Route, TensorKey


@dataclass(frozen=True)
class Timeline:
    """Bytes on the device during each route step: live tensors plus the fixed part."""

    step_bytes: np.ndarray  # tensor bytes live during each step (int64)
    fixed_bytes: int
    labels: tuple[str, ...]

    @property
    def peak_bytes(self) -> int:
        return int(self.fixed_bytes + (self.step_bytes.max() if len(self.step_bytes) else 0))

    @property
    def peak_step(self) -> int:
        return int(np.argmax(self.step_bytes))

    def total_bytes(self) -> np.ndarray:
        return self.step_bytes + self.fixed_bytes


def intervals(route: Route) -> dict[TensorKey, tuple[int, int]]:
    """(definition step, last use step) of every tensor instance in the route."""
    out: dict[TensorKey, list[int]] = {}
    for t, step in enumerate(route.steps):
        for key in step.defs:
            out.setdefault(key, [t, t])
        for key in step.uses:
            span = out.setdefault(key, [t, t])
            span[1] = max(span[1], t)
    return {k: (v[0], v[1]) for k, v in out.items()}


def offload_candidates(route: Route) -> list[int]:
    """Layers whose forward activation sits idle between the forward and the backward pass.

    Ordered by definition step, earliest first: those wait longest, so offloading them frees the
    most device memory for the longest time.
    """
    firsts: dict[int, int] = {}
    last_fwd: dict[int, int] = {}
    for t, step in enumerate(route.steps):
        for kind, layer, version in step.uses + step.defs:
            if kind != "A" or version != 0:
                continue
            if t < route.n_forward:
                last_fwd[layer] = t
            elif layer not in firsts:
                firsts[layer] = t
    return sorted((n for n in firsts if n in last_fwd and firsts[n] > last_fwd[n] + 1), key=lambda n: last_fwd[n])


def _prefetch_points(graph: LayerGraph, route: Route) -> list[int]:
    """Backward steps that start a checkpoint segment: where a prefetch can be issued."""
    return [t for t, s in enumerate(route.steps)
            if t >= route.n_forward and s.op == "B" and graph.is_checkpoint_kind(s.layer)]


def timeline(graph: LayerGraph, route: Route, *, keep_all: bool = False,
             offloaded: frozenset[int] = frozenset(), fixed_bytes: int = 0) -> Timeline:
    """Per-step device memory of `route`: liveness (default), or everything kept (`keep_all`)."""
    n_steps = len(route.steps)
    delta = np.zeros(n_steps + 1, dtype=np.int64)
    spans = intervals(route)
    points = _prefetch_points(graph, route) if offloaded else []
    for key, (first, last) in spans.items():
        size = graph.nodes[key[1]].output_bytes
        if keep_all:
            last = n_steps - 1
        pieces = [(first, last)]
        if key[0] == "A" and key[2] == 0 and key[1] in offloaded and not keep_all:
            pieces = _offloaded_pieces(route, key, first, last, points)
        for a, b in pieces:
            delta[a] += size
            delta[b + 1] -= size
    labels = tuple(f"{s.op}:{graph.nodes[s.layer].name}" for s in route.steps)
    return Timeline(np.cumsum(delta)[:n_steps], int(fixed_bytes), labels)


def _offloaded_pieces(route: Route, key: TensorKey, first: int, last: int,
                      points: list[int]) -> list[tuple[int, int]]:
    uses = [t for t, s in enumerate(route.steps) if key in s.uses]
    fwd = [t for t in uses if t < route.n_forward]
    bwd = [t for t in uses if t >= route.n_forward]
    if not bwd:
        return [(first, last)]
    fwd_end = max(fwd) if fwd else first
    k = bisect.bisect_right(points, bwd[0]) - 1  # segment holding the first backward use
    prefetch = points[k - 1] if k >= 1 else route.n_forward
    prefetch = max(min(prefetch, bwd[0]), fwd_end + 1)
    return [(first, fwd_end), (prefetch, last)]


def offloaded_transfer_bytes(graph: LayerGraph, offloaded: frozenset[int]) -> int:
    """Bytes moved over the host link per step: each offloaded activation goes out and comes back."""
    return int(2 * sum(graph.nodes[n].output_bytes for n in offloaded))
