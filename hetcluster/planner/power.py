"""Power P(S) of a configuration while it trains, calibrated on multi-device runs.

A device's power rises from idle p_i to its solo busy power P_i in proportion to how busy it is.
Under contention a worker waits at the shared resource part of each step, so its utilisation is
u_i = x_i(S)/r_i = 1/(1 + w(S)·r_i) (from the throughput model) and

    P(S) = γ_n · Σ_{i∈S} [p_i + (P_i − p_i)·u_i]  (+ Σ_{i∉S} p_i when idle devices count)

("utilisation" form). The "flat" form Σ_{i∈S} P_i ignores waiting. Whichever predicts the measured
multi-device runs better is used (utilisation when there is nothing to compare, which equals flat
when no contention was measured). γ_n (1 for one device) is a multiplicative correction for a
systematic difference in multi-device runs: the geometric mean of measured/predicted, shrunk
towards 1 by k/(k+1) for k runs. Relative uncertainty: the RMS of the remaining log-residuals
(prior 0.10 with fewer than two multi-device runs), for one device as for several: a solo window is
not a whole training (docs/decisions.md#single-device-uncertainty).

A set in which no member trained steadily (the step cap came first: no per-device rate recorded,
while other sets have them) is left out of this fit: each member's power is then the mean over the
whole run, set-up and the engine's joins included, not its training power
(docs/decisions.md#power-fit-steady-sets).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from hetcluster.planner.configurations import row_sums
from hetcluster.planner.fleet import Units, run_weights
from hetcluster.planner.throughput import ThroughputModel

log = logging.getLogger(__name__)

PRIOR_POWER_STD = 0.10


@dataclass(frozen=True)
class PowerModel:
    form: str = "utilisation"     # or "flat"
    multi_factor: float = 1.0     # γ for configurations of more than one device
    model_std: float = PRIOR_POWER_STD

    @classmethod
    def fit(cls, throughput: ThroughputModel, runs=()) -> "PowerModel":
        multi = [r for r in runs if len(r.devices) > 1 and r.power_w > 0]
        if any(r.any_member_steady for r in multi):  # the runs record who trained steadily
            multi = [r for r in multi if r.any_member_steady]
        if not multi:
            return cls()
        units = throughput.measured_units()
        W = run_weights(units, [r.devices for r in multi])
        measured = np.array([r.power_w for r in multi])
        best = None
        for form in ("utilisation", "flat"):
            pred = cls(form=form).raw_power(throughput, W, units)
            resid = np.log(measured) - np.log(np.maximum(pred, 1e-12))
            k = resid.size
            shift = resid.mean() * k / (k + 1.0)
            rest = resid - shift
            score = float(np.sqrt(np.mean(rest ** 2)))
            if best is None or score < best[0] - 1e-9:
                best = (score, form, float(np.exp(shift)))
        score, form, gamma = best
        std = max(score * np.sqrt(len(multi) / max(len(multi) - 1, 1)), 0.01) if len(multi) >= 2 else PRIOR_POWER_STD
        log.info("power model: form=%s, multi-device factor=%.3f, std=%.3f", form, gamma, std)
        return cls(form=form, multi_factor=gamma, model_std=std)

    def raw_power(self, throughput: ThroughputModel, weights: np.ndarray, units: Units) -> np.ndarray:
        """Σ over members only (no γ, no idle devices) — used to fit γ and the form."""
        _, _, q, factor = throughput.predict_weights(weights, units, units.busy_power_w - units.idle_power_w)
        return self.combine(weights, units, q.weighted_util, factor)

    def _above_idle(self, weights: np.ndarray, units: Units, weighted_util: np.ndarray, factor: np.ndarray,
                    flat_w: np.ndarray | None = None) -> np.ndarray:
        """Σ over members of their power above idle while training (no γ). weighted_util is
        Σ W_i·g_i·u_i for a per-unit g, flat_w that g (default busy − idle)."""
        if self.form == "flat":
            return weights @ (units.busy_power_w - units.idle_power_w if flat_w is None else flat_w)
        return weighted_util * np.minimum(factor, 1.0)

    def _with_multi_factor(self, n: np.ndarray, values: np.ndarray) -> np.ndarray:
        """γ applied to the rows of more than one device (n: devices per row)."""
        return np.where(n > 1, values * self.multi_factor, values)

    def combine(self, weights: np.ndarray, units: Units, weighted_util: np.ndarray, factor: np.ndarray) -> np.ndarray:
        return weights @ units.idle_power_w + self._above_idle(weights, units, weighted_util, factor)

    def members_weighted(self, weights: np.ndarray, units: Units, weighted_util: np.ndarray, factor: np.ndarray,
                         per_watt: np.ndarray) -> np.ndarray:
        """Σ_{i∈S} P_i(S)·c_i, each member's power in S (γ included, as predict() has it) weighted by a
        per-unit c; weighted_util must be Σ W_i·(busy − idle)_i·c_i·u_i."""
        above = self._above_idle(
            weights, units, weighted_util, factor, (units.busy_power_w - units.idle_power_w) * per_watt
        )
        return self._with_multi_factor(row_sums(weights), weights @ (units.idle_power_w * per_watt) + above)

    def dynamic(self, weights: np.ndarray, units: Units, weighted_util: np.ndarray, factor: np.ndarray) -> np.ndarray:
        """The members' power above their idle power while they train (γ included)."""
        return self._with_multi_factor(row_sums(weights), self._above_idle(weights, units, weighted_util, factor))

    def predict(self, weights, units, weighted_util, factor, idle_power_counts: bool):
        """(power_w, relative std) for each configuration."""
        n = row_sums(weights)
        members = self._with_multi_factor(n, self.combine(weights, units, weighted_util, factor))
        total = members
        if idle_power_counts:
            total = members + (units.counts @ units.idle_power_w + units.outside_idle_w - weights @ units.idle_power_w)
        rel = self.model_std * members / np.maximum(total, 1e-300)
        return total, rel
