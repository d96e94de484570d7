"""The pure memory planner on hand-built graphs: liveness, timelines, recomputation, plan choice."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from hetcluster.errors import ConfigError, MemoryPlanError
from hetcluster.memory import DeviceAssumptions, LayerGraph, LayerNode, Overheads, PeakMargin, plan_for_budget
from hetcluster.memory.budget import parse_bytes
from hetcluster.memory.checkpoints import articulation_points, segments
from hetcluster.memory.liveness import offload_candidates, timeline
from hetcluster.memory.route import MEMORY, SPEED, Segment, build_route

N = LayerNode
NO_OVERHEAD = Overheads(optimizer="sgd", runtime_bytes=0, transients=False)


def chain() -> LayerGraph:
    return LayerGraph((N("x", "input", (), 100), N("a", "conv", ("x",), 100, flops=1000),
                       N("b", "bn", ("a",), 100, flops=10), N("c", "activation", ("b",), 100, flops=1),
                       N("d", "conv", ("c",), 100, flops=1000), N("e", "dense", ("d",), 10, flops=10)))


def diamond() -> LayerGraph:
    return LayerGraph((N("x", "input", (), 100), N("a", "conv", ("x",), 100), N("b", "conv", ("a",), 50),
                       N("c", "conv", ("a",), 50), N("d", "add", ("b", "c"), 50), N("e", "dense", ("d",), 10)))


def residual(blocks: int = 6, size: int = 1000) -> LayerGraph:
    """A ResNet-like graph: stem, then blocks of conv-bn-relu-conv-bn + skip add + relu."""
    nodes = [N("x", "input", (), size), N("stem", "conv", ("x",), size, 100, 100, 50.0 * size),
             N("stem_relu", "activation", ("stem",), size, flops=size)]
    prev = "stem_relu"
    for b in range(blocks):
        nodes += [N(f"b{b}c1", "conv", (prev,), size, 100, 100, 50.0 * size),
                  N(f"b{b}n1", "bn", (f"b{b}c1",), size, 16, 8, 8.0 * size),
                  N(f"b{b}r1", "activation", (f"b{b}n1",), size, flops=size),
                  N(f"b{b}c2", "conv", (f"b{b}r1",), size, 100, 100, 50.0 * size),
                  N(f"b{b}n2", "bn", (f"b{b}c2",), size, 16, 8, 8.0 * size),
                  N(f"b{b}add", "add", (prev, f"b{b}n2"), size, flops=size),
                  N(f"b{b}out", "activation", (f"b{b}add",), size, flops=size)]
        prev = f"b{b}out"
    nodes.append(N("logits", "dense", (prev,), 10, 40, 40, 1000.0))
    return LayerGraph(tuple(nodes), name="residual")


def test_chain_liveness_and_baseline_match_hand_computation() -> None:
    g = chain()
    route = build_route(g)
    live = timeline(g, route)
    assert live.step_bytes.tolist() == [100, 200, 300, 400, 400, 410, 420, 510, 500, 500, 400, 200]
    assert live.peak_bytes == 510
    # everything kept: all activations (510) and all gradients but the input's (410)
    assert timeline(g, route, keep_all=True).peak_bytes == 920


def test_diamond_fork_join_liveness() -> None:
    g = diamond()
    assert g.is_fork(1) and g.is_join(4) and not g.is_fork(2)
    live = timeline(g, build_route(g), fixed_bytes=7)
    # the add passes its gradient through (no buffer); the fork's two contributions and their
    # sum are live together at the S step, as with TensorFlow's AddN
    assert live.labels[8:12] == ("B:d", "B:c", "B:b", "S:a")
    assert live.step_bytes.tolist() == [100, 200, 250, 300, 350, 260, 270, 310, 250, 350, 450, 400, 200]
    assert live.peak_bytes == 457 and live.labels[live.peak_step] == "B:b"


def test_recompute_segment_replays_only_what_backward_reads() -> None:
    g = chain()
    route = build_route(g, (Segment(2, 5),))
    ops = [(s.op, g.nodes[s.layer].name) for s in route.steps]
    # bn's output is recomputed to rebuild relu's; the closing conv 'd' is never recomputed
    assert ("R", "b") in ops and ("R", "c") in ops and ("R", "d") not in ops
    assert ops.index(("R", "b")) > ops.index(("B", "e"))
    assert timeline(g, route).peak_bytes == 500


def test_memory_centric_segment_bisects_and_lowers_peak() -> None:
    nodes = [N("x", "input", (), 10)] + [N(f"l{i}", "activation", (f"l{i - 1}" if i else "x",), 100, flops=1)
                                        for i in range(8)] + [N("out", "dense", ("l7",), 10, flops=1)]
    g = LayerGraph(tuple(nodes))
    speed = build_route(g, (Segment(1, 9, SPEED),))
    memory = build_route(g, (Segment(1, 9, MEMORY),))
    assert len(memory.recomputed_layers) > len(speed.recomputed_layers)
    assert timeline(g, memory).peak_bytes < timeline(g, speed).peak_bytes
    assert timeline(g, speed).peak_bytes <= timeline(g, build_route(g)).peak_bytes


def test_articulation_points_are_block_outputs() -> None:
    g = residual(blocks=2)
    names = [g.nodes[p].name for p in articulation_points(g)]
    assert names == ["x", "stem", "stem_relu", "b0add", "b0out", "b1add", "b1out", "logits"]
    # conv segments end at checkpoints (conv/join/fork outputs) and never include the input
    for seg in segments(g, "conv"):
        assert g.is_checkpoint_kind(seg.stop - 1) and g.nodes[seg.start].kind != "input"


def test_segments_must_not_overlap() -> None:
    with pytest.raises(MemoryPlanError):
        build_route(chain(), (Segment(1, 3), Segment(2, 5)))


def test_plan_is_none_when_the_model_fits() -> None:
    g = residual()
    plan = plan_for_budget(g, 10**9, overheads=NO_OVERHEAD)
    assert plan.fits and plan.technique == "none" and not plan.segments and not plan.offloaded
    assert plan.predicted_peak_bytes == plan.liveness_peak_bytes < plan.baseline_peak_bytes
    assert plan.predicted_slowdown == 0.0


def test_plan_recomputes_when_needed_and_fits_the_budget() -> None:
    g = residual()
    free = plan_for_budget(g, 10**9, overheads=NO_OVERHEAD)
    budget = int(free.liveness_peak_bytes * 0.8)
    plan = plan_for_budget(g, budget, "cpu", overheads=NO_OVERHEAD)
    assert plan.fits and plan.technique.startswith("recompute") and plan.segments
    assert plan.predicted_peak_bytes <= budget and not plan.offloaded
    assert 0 < plan.predicted_slowdown < 1
    assert "recompute-speed" in plan.actions.values() or "recompute-memory" in plan.actions.values()
    # a tighter budget costs at least as much recomputation
    tighter = plan_for_budget(g, int(free.liveness_peak_bytes * 0.5), "cpu", overheads=NO_OVERHEAD)
    assert tighter.fits and tighter.predicted_slowdown >= plan.predicted_slowdown


def test_the_cost_aware_frontier_recomputes_cheap_layers_first_and_beats_the_fixed_granularities() -> None:
    g = residual(blocks=8)
    plan = plan_for_budget(g, 10**9, overheads=NO_OVERHEAD)
    frontier = plan.frontier
    # from plain TensorFlow, each point cheaper in memory and dearer in time than the one before
    assert frontier[0] == ("liveness", plan.liveness_peak_bytes, 0.0)
    assert all(a[1] > b[1] and a[2] <= b[2] for a, b in zip(frontier, frontier[1:]))
    assert len(frontier) >= 4 and {t for t, _, _ in frontier[1:]} == {"recompute_cost_aware"}
    # its first step recomputes only cheap layers (BN and activations: a few percent of this step)
    assert frontier[1][2] < 0.05 and frontier[1][1] < plan.liveness_peak_bytes
    # for a budget between plain and the smallest peak the frontier's plan is no slower than the
    # best of the fixed granularities (conv, block, sqrt) applied segment by segment
    for technique, peak, slowdown in frontier[1:]:
        chosen = plan_for_budget(g, peak, overheads=NO_OVERHEAD)
        assert chosen.fits and chosen.predicted_slowdown <= slowdown + 1e-12
    budget = (frontier[1][1] + frontier[-1][1]) // 2
    chosen = plan_for_budget(g, budget, overheads=NO_OVERHEAD)
    assert chosen.technique == "recompute_cost_aware" and chosen.predicted_peak_bytes <= budget


def test_offload_only_on_discrete_gpus() -> None:
    g = residual()
    fast_link = DeviceAssumptions(host_link_bytes_per_s=1e15)
    budget = int(plan_for_budget(g, 10**9, overheads=NO_OVERHEAD).liveness_peak_bytes * 0.8)
    gpu = plan_for_budget(g, budget, "discrete-gpu", overheads=NO_OVERHEAD, device=fast_link)
    assert gpu.fits and gpu.offloaded and gpu.technique == "offload"
    assert gpu.predicted_peak_bytes <= budget
    for kind in ("cpu", "unified"):
        for frac in (0.9, 0.6, 0.3, 0.01):
            plan = plan_for_budget(g, int(budget * frac), kind, overheads=NO_OVERHEAD, device=fast_link)
            assert not plan.offloaded and "offload" not in plan.technique


def test_offloaded_tensor_leaves_device_between_passes() -> None:
    g = residual(blocks=2)
    route = build_route(g)
    cands = offload_candidates(route)
    assert g.nodes[cands[0]].name in ("x", "stem")  # the earliest tensors wait longest
    plain = timeline(g, route)
    off = timeline(g, route, offloaded=frozenset(cands))
    assert off.peak_bytes < plain.peak_bytes
    assert np.all(off.step_bytes <= plain.step_bytes)


def test_nothing_fits_reports_the_smallest_peak() -> None:
    g = residual()
    plan = plan_for_budget(g, 1, "cpu", overheads=Overheads(optimizer="adam", runtime_bytes=0, transients=False))
    assert not plan.fits
    cpu_peaks = [v for k, v in plan.technique_peaks.items() if "offload" not in k and k != "baseline"]
    assert plan.predicted_peak_bytes == min(cpu_peaks)
    assert plan.predicted_peak_bytes >= plan.fixed_bytes == g.param_bytes + 3 * g.trainable_param_bytes


def test_fixed_bytes_count_state_and_transients() -> None:
    g = residual(blocks=1, size=1000)
    sgd = Overheads(optimizer="sgd", runtime_bytes=5)
    adam = Overheads(optimizer="adam", runtime_bytes=5)
    # weights + gradients (+ slots), the largest weight's update temporaries, the largest activation
    assert sgd.fixed_bytes(g) == g.param_bytes + g.trainable_param_bytes + 1 * 100 + 1000 + 5
    assert adam.fixed_bytes(g) == g.param_bytes + 3 * g.trainable_param_bytes + 3 * 100 + 1000 + 5
    with pytest.raises(MemoryPlanError):
        Overheads(optimizer="lion")


def test_plan_json_round_trip_keys() -> None:
    plan = plan_for_budget(residual(), 5000, "unified", overheads=NO_OVERHEAD)
    data = json.loads(json.dumps(plan.to_dict()))
    for key in ("budget_bytes", "fits", "predicted_peak_bytes", "baseline_peak_bytes", "technique_peaks_bytes",
                "predicted_slowdown", "actions", "segments"):
        assert key in data
    assert LayerGraph.from_dict(residual().to_dict()) == residual()


def test_bad_graphs_and_device_kinds_are_refused() -> None:
    with pytest.raises(MemoryPlanError):
        LayerGraph((N("a", "conv", ("missing",), 1),))
    with pytest.raises(MemoryPlanError):
        N("a", "warp-drive")
    with pytest.raises(MemoryPlanError):
        plan_for_budget(chain(), 100, "tpu")


@pytest.mark.parametrize("text,value", [("1GiB", 2**30), ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9),
                                        ("1048576", 2**20), ("1.5G", int(1.5 * 2**30))])
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "1XB", "-1GiB", "0", "one gig"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_bytes(text)


def test_planning_half_does_not_import_tensorflow() -> None:
    code = ("import sys; import hetcluster.memory, hetcluster.memory.plan, hetcluster.memory.fit, "
            "hetcluster.memory.liveness, hetcluster.memory.route, hetcluster.memory.checkpoints, "
            "hetcluster.memory.cost, hetcluster.memory.budget, hetcluster.memory.planning_utils, "
            "hetcluster.cli.cmd_memplan; assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_memory_fit_gives_the_plans_verdict_and_scales_the_batch() -> None:
    from hetcluster.memory.fit import memory_fit

    g = residual()
    roomy = memory_fit(g, 1, 10**9)
    assert roomy[0] is True and roomy[2] == 0.0
    plan = plan_for_budget(g, roomy[1] - 1, overheads=Overheads(), margin=PeakMargin())
    assert memory_fit(g, 1, roomy[1] - 1) == (plan.fits, plan.predicted_peak_bytes, plan.predicted_slowdown)
    # a larger batch needs more memory: the same budget no longer fits without recomputation
    fits, peak, slowdown = memory_fit(g, 4, roomy[1])
    assert peak <= roomy[1] if fits else peak > roomy[1]
    assert not fits or slowdown > 0


def test_the_fit_keeps_the_margin_between_prediction_and_budget() -> None:
    from hetcluster.memory.fit import plan_for

    g = residual()
    margin = PeakMargin()
    plain_peak = plan_for_budget(g, 10**9).liveness_peak_bytes
    # the raw model fits plain TensorFlow at its predicted peak; the fit needs the plain margin on top
    assert plan_for_budget(g, plain_peak).technique == "none"
    at_peak = plan_for(g, 1, plain_peak)
    assert at_peak.technique != "none"
    assert at_peak.predicted_peak_bytes * (1 + margin.scheduled) <= plain_peak
    needed = margin.needed_bytes(plain_peak, plain=True)
    assert plan_for(g, 1, needed).technique == "none" and plan_for(g, 1, needed).needed_bytes == needed
    assert plan_for(g, 1, needed - 1).technique != "none"
    # below the smallest plan plus its margin nothing fits, and the plan says what it would need
    smallest = plan_for(g, 1, 1)
    assert not smallest.fits and smallest.needed_bytes == margin.needed_bytes(smallest.predicted_peak_bytes, False)
    assert plan_for(g, 1, smallest.needed_bytes).fits and not plan_for(g, 1, smallest.needed_bytes - 1).fits
