"""Plot a plan: memory per route step for every technique, and the memory/time frontier
(matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hetcluster.fileio import write_figure_atomic
from hetcluster.memory.plan import MemoryPlan

_ORDER = ("baseline", "liveness", "liveness_offload", "liveness_offload_recompute",
          "recompute_conv", "recompute_block", "recompute_sqrt", "recompute_cost_aware", "chosen")
MIB = 2**20


def plot_plan(plan: MemoryPlan, path: Path, curves: dict[str, list[tuple[int, float]]] | None = None,
              measured: Sequence[dict[str, Any]] = ()) -> Path:
    """Write the plan's figure to `path` (atomically): the per-step memory of each technique and,
    given ``curves`` (plan.strategy_curves), the frontier of predicted peak against predicted
    step-time overhead, with ``measured`` points (benchmarks/memory.py --json) on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if curves is None:
        fig, ax = plt.subplots(figsize=(10, 5))
        axes = [ax]
    else:
        fig, axes = plt.subplots(1, 2, figsize=(16, 5.5), gridspec_kw={"width_ratios": [3, 2]})
    _timelines(axes[0], plan)
    if curves is not None:
        _frontier(axes[1], plan, curves, measured)
    fig.tight_layout()
    try:
        path = write_figure_atomic(path, fig, dpi=110)
    finally:
        plt.close(fig)
    return path


def _timelines(ax: Any, plan: MemoryPlan) -> None:
    for name in _ORDER:
        tl = plan.timelines.get(name)
        if tl is None:
            continue
        style = {"linewidth": 2.5, "color": "black"} if name == "chosen" else {"linewidth": 1.0}
        label = f"chosen ({plan.technique})" if name == "chosen" else name
        ax.plot(tl.total_bytes() / MIB, label=f"{label}: peak {tl.peak_bytes / MIB:.0f} MiB", **style)
    ax.axhline(plan.budget_bytes / MIB, color="red", linestyle="--", label=f"budget {plan.budget_bytes / MIB:.0f} MiB")
    ax.set_xlabel("route step (forward, then backward with recomputation)")
    ax.set_ylabel("device memory (MiB)")
    ax.set_title(f"{plan.model}, batch {plan.batch_size}, {plan.device_kind}")
    ax.legend(fontsize=7)


def _frontier(ax: Any, plan: MemoryPlan, curves: dict[str, list[tuple[int, float]]],
              measured: Sequence[dict[str, Any]]) -> None:
    for name, points in curves.items():
        style = {"linewidth": 2.5, "color": "black", "marker": "o"} if name == "recompute_cost_aware" else \
            {"linewidth": 1.0, "marker": "."}
        ax.plot([100 * s for _, s in points], [p / MIB for p, _ in points], label=f"{name} (predicted)", **style)
    if measured:
        plain = measured[0]["plain_measured_peak_bytes"] / MIB
        ax.scatter([0.0], [plain], color="tab:red", marker="s", zorder=5, label="plain TF (measured)")
        ax.scatter([100 * p["measured_slowdown_cpu"] for p in measured],
                   [p["measured_peak_bytes"] / MIB for p in measured],
                   color="tab:red", marker="x", s=60, zorder=5, label="measured (CPU time, allocator peak)")
        for p in measured:
            ax.annotate(p["label"], (100 * p["measured_slowdown_cpu"], p["measured_peak_bytes"] / MIB), fontsize=6,
                        xytext=(4, 4), textcoords="offset points")
    ax.axhline(plan.budget_bytes / MIB, color="red", linestyle="--", label=f"budget {plan.budget_bytes / MIB:.0f} MiB")
    ax.scatter([100 * plan.predicted_slowdown], [plan.predicted_peak_bytes / MIB], s=120, facecolors="none",
               edgecolors="black", zorder=6, label=f"chosen: {plan.technique}")
    ax.set_xlabel("step-time overhead (%)")
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title("memory/time frontier")
    ax.legend(fontsize=7)


def measured_points(data: dict[str, Any], plan: MemoryPlan, input_shape: Sequence[int]) -> list[dict[str, Any]]:
    """The points of a benchmarks/memory.py --json file measured on this plan's model, input shape
    and batch size."""
    return [p for p in data.get("points", [])
            if p.get("model") == plan.model and list(p.get("input_shape", ())) == list(input_shape)
            and p.get("batch_size") == plan.batch_size]
