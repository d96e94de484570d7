"""Each device's solo rate r_i, revised by what the calibration sets measured of it.

Pre-training times a device alone over a window of a few seconds, and a device's rate moves from
one run to the next about as much as a window misses it
(docs/experiments.md#a-solo-window-against-the-run-to-run-spread). Every
calibration set measures each member's own rate too (RunMeasurement.per_device_steps), through
the contention the set adds. So ρ_i = log r_i is estimated from both, the solo window as a prior:

    minimise  (ρ_i − ρ_i⁰)² / σ_solo,i²  +  Σ_j (log x_ij − log x̂_ij(ρ))² / σ_set²

with ρ_i⁰ the solo window, σ_solo,i its relative spread (steps_per_s_std / r_i, at least
SOLO_FLOOR), x_ij the member's rate measured in set j, x̂_ij the fitted contention model's
(contention.py; the BIC mixture where there is one) and σ_set the RMS log-residual of every
member's rate in every set (at least SET_FLOOR: the noise of the very observations used). One
Gauss–Newton step per device, the others held, with the elasticity g_ij = ∂log x̂_ij/∂ρ_i (1 for
a member the shared resource does not hold back, towards 0 for one it caps: a set whose parameter
server bounds a device says little of that device's own rate) and e_ij = log(x_ij/x̂_ij):

    δ_i = (Σ_j g_ij·e_ij / σ_set²) / (Σ_j g_ij² / σ_set² + 1/σ_solo,i²),    r_i ← r_i·e^{δ_i}

A device in no set keeps its window (δ = 0). The estimator (FittedModels.fit) then fits the
contention again on the revised rates. Big fleets revise per class (Units of class_units): every
member of a class takes its class's δ. The spread steps_per_s_std is left as measured.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

import numpy as np

from hetcluster.planner.calibration import RunData, member_rates
from hetcluster.planner.inputs import DeviceMeasurement, RunMeasurement

log = logging.getLogger(__name__)

# a window and a set reading each trusted to 5 % at best (docs/decisions.md#solo-rate-revision)
SOLO_FLOOR = 0.05
SET_FLOOR = 0.05
ELASTICITY_STEP = 0.01


def revise_solo_rates(
    devices: tuple[DeviceMeasurement, ...], runs: Sequence[RunMeasurement], throughput
) -> tuple[DeviceMeasurement, ...]:
    """``devices`` with each steps_per_s revised by the sets (module docstring); ``throughput`` is
    the ThroughputModel fitted on the solo windows. Unchanged where no set measured a member."""
    units = throughput.measured_units()
    data = RunData.of(units, [r for r in runs if len(r.devices) > 1])
    if not data.dev_rows.size:
        return devices
    rate = units.rate_steps_per_s
    predicted = member_rates(data, rate, throughput.analytic)
    residual = np.log(data.dev_rates) - np.log(predicted)
    sigma_set = max(float(np.sqrt(np.mean(residual ** 2))), SET_FLOOR)
    sigma_solo = np.maximum(units.rate_std_steps_per_s / rate, SOLO_FLOOR)
    delta = np.zeros(units.size)
    for unit in np.unique(data.dev_units):
        bumped = rate.copy()
        bumped[unit] *= 1.0 + ELASTICITY_STEP
        own = data.dev_units == unit
        elasticity = (np.log(member_rates(data, bumped, throughput.analytic)[own]) - np.log(predicted[own])) / np.log1p(
            ELASTICITY_STEP
        )
        delta[unit] = (elasticity @ residual[own] / sigma_set**2) / (
            elasticity @ elasticity / sigma_set**2 + 1.0 / sigma_solo[unit] ** 2
        )
    factor = {name: float(np.exp(d)) for d, names in zip(delta, units.members) for name in names}
    log.info("solo rates revised by the sets (σ_set %.3f): %s", sigma_set,
             ", ".join(f"{label} {d:+.1%}" for label, d in zip(units.labels, np.expm1(delta)) if d))
    return tuple(replace(d, steps_per_s=d.steps_per_s * factor.get(d.name, 1.0)) for d in devices)


__all__ = ["SET_FLOOR", "SOLO_FLOOR", "revise_solo_rates"]
