"""Plot a plan's memory per route step for every technique (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

from hetcluster.fileio import write_figure_atomic
from hetcluster.memory.plan import MemoryPlan

_ORDER = ("baseline", "liveness", "liveness_offload", "liveness_offload_recompute",
          "recompute_conv", "recompute_block", "recompute_sqrt", "chosen")


def plot_timelines(plan: MemoryPlan, path: Path) -> Path:
    """Write the per-step memory of each technique to `path` (atomically: temp file + replace)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    mib = 2**20
    for name in _ORDER:
        tl = plan.timelines.get(name)
        if tl is None:
            continue
        style = {"linewidth": 2.5, "color": "black"} if name == "chosen" else {"linewidth": 1.0}
        label = f"chosen ({plan.technique})" if name == "chosen" else name
        ax.plot(tl.total_bytes() / mib, label=f"{label}: peak {tl.peak_bytes / mib:.0f} MiB", **style)
    ax.axhline(plan.budget_bytes / mib, color="red", linestyle="--", label=f"budget {plan.budget_bytes / mib:.0f} MiB")
    ax.set_xlabel("route step (forward, then backward with recomputation)")
    ax.set_ylabel("device memory (MiB)")
    ax.set_title(f"{plan.model}, batch {plan.batch_size}, {plan.device_kind}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        path = write_figure_atomic(path, fig, dpi=110)
    finally:
        plt.close(fig)
    return path
