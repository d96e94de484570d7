"""Constraints as objects: each returns a boolean mask over the estimate table and how far each
row is from satisfying it (relative, 0 when satisfied) so an infeasible request can name the
nearest configuration."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from hetcluster.errors import PlanningError


class Constraint:
    """Base: `mask(table)` (True = allowed), `violation(table)` (≥ 0), `describe()`."""

    flag = ""

    def mask(self, table: pd.DataFrame) -> np.ndarray:
        return self.violation(table) <= 0.0

    def violation(self, table: pd.DataFrame) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class _Limit(Constraint):
    limit: float

    column = ""
    label = ""
    unit = ""

    def __post_init__(self) -> None:
        if not (np.isfinite(self.limit) and self.limit > 0):
            raise PlanningError(
                f"{self.label} must be a positive number, got {self.limit!r}.",
                hint=f"pass {self.flag} with a value > 0.",
            )

    def violation(self, table: pd.DataFrame) -> np.ndarray:
        values = table[self.column].to_numpy(dtype=np.float64)
        return np.maximum(values / self.limit - 1.0, 0.0)

    def describe(self) -> str:
        return f"{self.label} {self.limit:.6g} {self.unit} ({self.flag})"


@dataclass(frozen=True)
class Deadline(_Limit):
    column, label, unit, flag = "time_s", "deadline", "s", "--deadline"


@dataclass(frozen=True)
class MaxPower(_Limit):
    column, label, unit, flag = "power_w", "power cap", "W", "--max-power"


@dataclass(frozen=True)
class MaxEnergy(_Limit):
    column, label, unit, flag = "energy_j", "energy budget", "J", "--max-energy"


def _membership(table: pd.DataFrame, names: tuple[str, ...]) -> np.ndarray:
    """(rows × len(names)) bool: does each configuration include each name."""
    known = table.attrs.get("device_names")
    if known is not None:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise PlanningError(
                f"Unknown device(s): {', '.join(unknown)}.", hint=f"use names from the fleet: {', '.join(known)}."
            )
    if "mask" in table.columns and table.attrs.get("mode") == "devices" and known is not None:
        masks = table["mask"].to_numpy(dtype=np.int64)
        return np.column_stack([(masks >> known.index(n)) & 1 for n in names]).astype(bool)
    rows = table["devices"].to_numpy()
    return np.array([[n in row for n in names] for row in rows], dtype=bool).reshape(len(rows), len(names))


@dataclass(frozen=True)
class _Names(Constraint):
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        names = (self.names,) if isinstance(self.names, str) else tuple(self.names)
        object.__setattr__(self, "names", names)

    def _present(self, table: pd.DataFrame) -> np.ndarray:
        """How many of the names each configuration includes."""
        if not self.names:
            return np.zeros(len(table))
        return _membership(table, self.names).sum(axis=1).astype(np.float64)

    def describe(self) -> str:
        return f"{self.flag[2:]} {', '.join(self.names)} ({self.flag})"


@dataclass(frozen=True)
class Require(_Names):
    """Every named device must take part."""

    flag = "--require"

    def violation(self, table: pd.DataFrame) -> np.ndarray:
        return len(self.names) - self._present(table)


@dataclass(frozen=True)
class Exclude(_Names):
    """No named device may take part."""

    flag = "--exclude"

    def violation(self, table: pd.DataFrame) -> np.ndarray:
        return self._present(table)


@dataclass(frozen=True)
class MemoryFit(Constraint):
    """Every member's memory plan fits its budget (always applied)."""

    flag = "memory plan"

    def violation(self, table: pd.DataFrame) -> np.ndarray:
        return (~table["memory_fits"].to_numpy(dtype=bool)).astype(np.float64)

    def describe(self) -> str:
        return "memory fit (the memory plan of a member does not fit its budget)"
