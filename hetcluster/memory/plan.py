"""Choose the least intrusive memory plan that fits a budget: `plan_for_budget`.

Candidates, from least to most intrusive: nothing (plain TensorFlow frees tensors at their last
use, which is the liveness timeline); offloading kept activations to the host (discrete GPUs
only — on CPUs and unified-memory boards host memory *is* device memory); recomputation at conv,
block or sqrt(n) granularity, applied to as few segments as needed (best bytes-per-FLOP first),
combined with offloading on discrete GPUs; and the cost-aware frontier (`cost_aware_frontier`):
SuperNeurons' recomputation of the cheap layers everywhere, deepened step by step with sqrt(n)
segments where they save the most bytes per FLOP. The fitting candidate with the smallest
predicted slowdown wins; if none fits, the plan with the smallest achievable peak is returned with
``fits=False``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from hetcluster.memory import checkpoints
from hetcluster.memory.cost import (
    DeviceAssumptions,
    Overheads,
    PeakMargin,
    check_device_kind,
    recompute_slowdown,
)
from hetcluster.memory.graph import LayerGraph
from hetcluster.memory.liveness import Timeline, offload_candidates, offloaded_transfer_bytes, timeline
from hetcluster.memory.route import MEMORY, SPEED, Route, Segment, build_route

log = logging.getLogger(__name__)

COST_AWARE = "recompute_cost_aware"
MIN_DROP = 0.01  # a smaller drop only moves the peak elsewhere (docs/decisions.md#cost-aware-frontier)


@dataclass(frozen=True)
class PlannedSegment:
    layers: tuple[str, ...]
    mode: str


@dataclass(frozen=True)
class MemoryPlan:
    """A chosen schedule, its prediction, and the peaks of every technique for comparison."""

    model: str
    batch_size: int
    device_kind: str
    budget_bytes: int
    technique: str
    fits: bool
    predicted_peak_bytes: int
    baseline_peak_bytes: int
    liveness_peak_bytes: int
    predicted_slowdown: float
    recompute_flops: float
    offloaded_bytes: int
    fixed_bytes: int
    optimizer: str
    segments: tuple[PlannedSegment, ...]
    offloaded: tuple[str, ...]
    actions: dict[str, str]
    technique_peaks: dict[str, int]
    timelines: dict[str, Timeline] = field(default_factory=dict, compare=False, repr=False)
    # (technique, predicted peak bytes, predicted slowdown) of every plan on the memory/time
    # frontier: none of them has both a lower peak and a lower slowdown than another
    frontier: tuple[tuple[str, int, float], ...] = field(default=(), compare=False, repr=False)
    # the budget the chosen plan needs: its predicted peak plus the fit's margin (PeakMargin)
    needed_bytes: int = 0
    margin: float = 0.0

    @property
    def recompute_layers(self) -> list[str]:
        return [name for seg in self.segments for name in seg.layers]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "batch_size": self.batch_size,
            "device_kind": self.device_kind,
            "budget_bytes": self.budget_bytes,
            "technique": self.technique,
            "fits": self.fits,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "baseline_peak_bytes": self.baseline_peak_bytes,
            "liveness_peak_bytes": self.liveness_peak_bytes,
            "technique_peaks_bytes": dict(self.technique_peaks),
            "predicted_slowdown": self.predicted_slowdown,
            "recompute_flops": self.recompute_flops,
            "offloaded_bytes": self.offloaded_bytes,
            "fixed_bytes": self.fixed_bytes,
            "needed_bytes": self.needed_bytes,
            "margin": self.margin,
            "optimizer": self.optimizer,
            "segments": [{"layers": list(s.layers), "mode": s.mode} for s in self.segments],
            "offloaded": list(self.offloaded),
            "actions": dict(self.actions),
            "frontier": [{"technique": t, "predicted_peak_bytes": p, "predicted_slowdown": d}
                         for t, p, d in self.frontier],
        }


@dataclass(frozen=True)
class _Candidate:
    technique: str
    segments: tuple[Segment, ...]
    offloaded: frozenset[int]
    route: Route
    timeline: Timeline
    slowdown: float
    recompute_flops: float

    @property
    def peak_bytes(self) -> int:
        return self.timeline.peak_bytes


class _Evaluator:
    def __init__(self, graph: LayerGraph, overheads: Overheads, device: DeviceAssumptions) -> None:
        self.g = graph
        self.fixed = overheads.fixed_bytes(graph)
        self.device = device

    def __call__(self, technique: str, segs: tuple[Segment, ...] = (), offload_count: int = 0,
                 offload_all: bool = False) -> _Candidate:
        route = build_route(self.g, tuple(sorted(segs, key=lambda s: s.start)))
        offloaded: frozenset[int] = frozenset()
        if offload_count or offload_all:
            cands = offload_candidates(route)
            offloaded = frozenset(cands if offload_all else cands[:offload_count])
        tl = timeline(self.g, route, offloaded=offloaded, fixed_bytes=self.fixed)
        flops = float(sum(self.g.nodes[s.layer].flops for s in route.steps if s.op == "R"))
        slowdown = recompute_slowdown(self.g, flops)
        if offloaded:
            slowdown += self.device.transfer_slowdown(self.g, offloaded_transfer_bytes(self.g, offloaded))
        return _Candidate(technique, tuple(segs), offloaded, route, tl, slowdown, flops)


def _smallest_fitting(n: int, make: Callable[[int], _Candidate], budget: int) -> _Candidate | None:
    """Binary search on how many items (segments, offloads) to apply; peak falls as k grows. At
    least one: applying none is plain TensorFlow, which fits under its own margin."""
    if n < 1:
        return None
    best = make(n)
    if best.peak_bytes > budget:
        return None
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi) // 2
        cand = make(mid)
        if cand.peak_bytes <= budget:
            hi, best = mid, cand
        else:
            lo = mid + 1
    return best


def technique_candidates(graph: LayerGraph, evaluate: _Evaluator) -> dict[str, _Candidate]:
    """Every technique applied in full: the per-technique peaks of the report and the plot."""
    out = {
        "liveness": evaluate("liveness"),
        "liveness_offload": evaluate("liveness_offload", offload_all=True),
        "liveness_offload_recompute": evaluate(
            "liveness_offload_recompute", tuple(checkpoints.segments(graph, "conv")), offload_all=True),
    }
    for strategy in checkpoints.STRATEGIES:
        out[f"recompute_{strategy}"] = evaluate(f"recompute_{strategy}", tuple(checkpoints.segments(graph, strategy)))
    return out


def cost_aware_frontier(graph: LayerGraph, evaluate: _Evaluator) -> list[_Candidate]:
    """Plans from cheapest to smallest peak: SuperNeurons' cost-aware recomputation, deepened.

    It starts from the conv segmentation everywhere: conv outputs kept, the cheap layers after
    them (BN, activations, pooling) recomputed, almost free in FLOPs. Each step then takes the
    better, in bytes of peak saved per unit of slowdown, of two moves: cover the next sqrt(n)
    segment (best bytes-per-FLOP first) as one speed-centric segment, which drops the conv outputs
    inside it for one extra forward of it; or, where the peak sits inside a speed-centric
    segment's recomputation, cut that segment in two at an articulation tensor (keeping that
    tensor, at no extra FLOPs) or bisect it (memory-centric: its first half recomputed twice). Where no move
    lowers the peak (two places of the step share it), the cheapest is taken and the point is
    stepped over, not kept.
    """
    cheap = checkpoints.segments(graph, "conv")
    deep = checkpoints.by_benefit(graph, checkpoints.segments(graph, "sqrt"))
    cuts = checkpoints.articulation_points(graph)

    def build(applied: tuple[Segment, ...]) -> _Candidate:
        covered = {i for s in applied for i in range(s.start, s.stop)}
        rest = tuple(s for s in cheap if covered.isdisjoint(range(s.start, s.stop)))
        return evaluate(COST_AWARE, applied + rest)

    applied: tuple[Segment, ...] = ()
    current = build(applied)
    points = [current]
    taken = 0
    for _ in range(2 * len(deep)):
        moves: list[tuple[tuple[Segment, ...], int]] = []
        if taken < len(deep):
            moves.append(((*applied, Segment(deep[taken].start, deep[taken].stop, SPEED)), taken + 1))
        peak = current.route.steps[current.timeline.peak_step].layer
        inside = [s for s in applied if s.mode == SPEED and s.start <= peak < s.stop and s.stop - s.start > 2]
        if inside:
            seg = inside[0]
            rest = tuple(s for s in applied if s != seg)
            moves.append(((*rest, Segment(seg.start, seg.stop, MEMORY)), taken))
            halves = _halves(graph, seg, cuts)
            if halves:
                moves.append(((*rest, *halves), taken))
        if not moves:
            break
        tried = [(build(segs), segs, k) for segs, k in moves]
        falling = [t for t in tried if t[0].peak_bytes < current.peak_bytes * (1 - MIN_DROP)]

        def gain(t: tuple[_Candidate, tuple[Segment, ...], int]) -> float:
            return (current.peak_bytes - t[0].peak_bytes) / max(t[0].slowdown - current.slowdown, 1e-9)

        # where no single move lowers the peak (two places share it), the cheapest move goes first
        current, applied, taken = (max(falling, key=gain) if falling else
                                   min(tried, key=lambda t: (t[0].slowdown, t[0].peak_bytes)))
        if current.peak_bytes < points[-1].peak_bytes:
            points.append(current)
    return points


def _halves(graph: LayerGraph, seg: Segment, points: list[int]) -> tuple[Segment, Segment] | None:
    """``seg`` cut in two speed-centric segments at the articulation tensor inside it that best
    halves its activation bytes (None where no cut leaves two layers on each side)."""
    inside = [p for p in points if seg.start + 1 <= p <= seg.stop - 3]
    if not inside:
        return None
    total = sum(graph.nodes[i].output_bytes for i in range(seg.start, seg.stop))

    def imbalance(p: int) -> float:
        return abs(2 * sum(graph.nodes[i].output_bytes for i in range(seg.start, p + 1)) - total)

    cut = min(inside, key=imbalance)
    return Segment(seg.start, cut + 1, SPEED), Segment(cut + 1, seg.stop, SPEED)


def pareto(points: list[_Candidate]) -> list[_Candidate]:
    """The candidates no other beats on both peak and slowdown, by rising slowdown."""
    out: list[_Candidate] = []
    for c in sorted(points, key=lambda c: (c.slowdown, c.peak_bytes)):
        if not out or c.peak_bytes < out[-1].peak_bytes:
            out.append(c)
    return out


def plan_for_budget(graph: LayerGraph, budget_bytes: int, device_kind: str = "cpu", *,
                    overheads: Overheads | None = None,
                    device: DeviceAssumptions | None = None, margin: PeakMargin | None = None) -> MemoryPlan:
    """The least intrusive plan whose predicted peak, plus ``margin`` (none by default: the raw
    model), fits `budget_bytes` on a `device_kind` device."""
    check_device_kind(device_kind)
    margin = margin or PeakMargin.none()
    plain_limit = margin.usable_bytes(budget_bytes, plain=True)
    limit = margin.usable_bytes(budget_bytes, plain=False)
    overheads = overheads or Overheads()
    evaluate = _Evaluator(graph, overheads, device or DeviceAssumptions())
    full = technique_candidates(graph, evaluate)
    baseline = timeline(graph, full["liveness"].route, keep_all=True, fixed_bytes=evaluate.fixed)
    offload_ok = device_kind == "discrete-gpu"

    fitting: list[_Candidate] = []
    plain = full["liveness"]
    frontier = cost_aware_frontier(graph, evaluate)
    full[COST_AWARE] = min(frontier, key=lambda c: (c.peak_bytes, c.slowdown))
    if plain.peak_bytes <= plain_limit:
        fitting.append(plain)
    else:
        fitting += [c for c in frontier if c.peak_bytes <= limit]
        if offload_ok:
            n_off = len(offload_candidates(plain.route))
            c = _smallest_fitting(n_off, lambda k: evaluate("offload", (), k), limit)
            if c:
                fitting.append(c)
        for strategy in checkpoints.STRATEGIES:
            segs = checkpoints.by_benefit(graph, checkpoints.segments(graph, strategy))
            name = f"recompute_{strategy}"
            c = _smallest_fitting(len(segs), lambda k, s=segs, n=name: evaluate(n, tuple(s[:k])), limit)
            if c:
                fitting.append(c)
            elif offload_ok:
                route = build_route(graph, tuple(sorted(segs, key=lambda s: s.start)))
                n_off = len(offload_candidates(route))
                c = _smallest_fitting(n_off, lambda k, s=segs, n=name: evaluate(n + "+offload", tuple(s), k),
                                      limit)
                if c:
                    fitting.append(c)
    if fitting:
        chosen = min(fitting, key=lambda c: (c.slowdown, c.peak_bytes))
    else:
        pool = [c for name, c in full.items() if offload_ok or "offload" not in name]
        if offload_ok:
            pool.append(
                evaluate("recompute_sqrt+offload", tuple(checkpoints.segments(graph, "sqrt")), offload_all=True)
            )
        chosen = min(pool, key=lambda c: (c.peak_bytes, c.slowdown))
    log.debug("memory plan for %s: %s peak %d of budget %d", graph.name, chosen.technique,
              chosen.peak_bytes, budget_bytes)
    timelines = {"baseline": baseline, **{k: c.timeline for k, c in full.items()}, "chosen": chosen.timeline}
    peaks = {"baseline": baseline.peak_bytes, **{k: c.peak_bytes for k, c in full.items()}}
    return MemoryPlan(
        model=graph.name, batch_size=graph.batch_size, device_kind=device_kind, budget_bytes=int(budget_bytes),
        technique="none" if chosen is plain else chosen.technique,
        fits=bool(fitting), predicted_peak_bytes=chosen.peak_bytes, baseline_peak_bytes=baseline.peak_bytes,
        liveness_peak_bytes=plain.peak_bytes, predicted_slowdown=float(chosen.slowdown),
        recompute_flops=chosen.recompute_flops, offloaded_bytes=offloaded_transfer_bytes(graph, chosen.offloaded) // 2,
        fixed_bytes=evaluate.fixed, optimizer=overheads.optimizer,
        segments=tuple(PlannedSegment(tuple(graph.nodes[i].name for i in range(s.start, s.stop)), s.mode)
                       for s in chosen.segments),
        offloaded=tuple(graph.nodes[i].name for i in sorted(chosen.offloaded)),
        actions=_actions(graph, chosen), technique_peaks=peaks, timelines=timelines,
        frontier=tuple((c.technique, c.peak_bytes, float(c.slowdown)) for c in pareto([plain, *frontier])),
        needed_bytes=margin.needed_bytes(chosen.peak_bytes, chosen is plain), margin=margin.of(chosen is plain),
    )


def strategy_curves(graph: LayerGraph, overheads: Overheads | None = None,
                    device: DeviceAssumptions | None = None) -> dict[str, list[tuple[int, float]]]:
    """(predicted peak bytes, predicted slowdown) of every plan each recompute technique offers,
    for the frontier plot: each fixed granularity applied to its first k segments (best bytes per
    FLOP first), and the cost-aware frontier."""
    evaluate = _Evaluator(graph, overheads or Overheads(), device or DeviceAssumptions())
    curves = {}
    for strategy in checkpoints.STRATEGIES:
        segs = checkpoints.by_benefit(graph, checkpoints.segments(graph, strategy))
        curves[f"recompute_{strategy}"] = [(c.peak_bytes, float(c.slowdown)) for c in pareto(
            [evaluate(strategy, tuple(segs[:k])) for k in range(len(segs) + 1)])]
    plain = evaluate("liveness")
    curves[COST_AWARE] = [(c.peak_bytes, float(c.slowdown))
                          for c in pareto([plain, *cost_aware_frontier(graph, evaluate)])]
    return curves


def _actions(graph: LayerGraph, cand: _Candidate) -> dict[str, str]:
    """Per layer: keep, offload, or recompute-speed / recompute-memory (inputs: input)."""
    actions = {n.name: ("input" if n.kind == "input" else "keep") for n in graph.nodes}
    for seg in cand.segments:
        for i in range(seg.start, seg.stop):
            kept_outside = any(not (seg.start <= c < seg.stop) for c in graph.consumers[i]) or not graph.consumers[i]
            if not kept_outside:
                actions[graph.nodes[i].name] = f"recompute-{seg.mode}"
    for i in cand.offloaded:
        actions[graph.nodes[i].name] = "offload"
    return actions
