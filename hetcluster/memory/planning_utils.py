"""Small pure helpers that turn a plan into settings for the runtime."""

from __future__ import annotations

from hetcluster.memory.plan import MemoryPlan

MIB = 2**20


def cudnn_workspace_limit_mb(plan: MemoryPlan, floor_mb: int = 0) -> int:
    """MiB left under the budget after the plan's predicted peak: cuDNN may use that as scratch."""
    return max(floor_mb, (plan.budget_bytes - plan.predicted_peak_bytes) // MIB)
