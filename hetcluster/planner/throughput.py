"""Throughput R(S) of a configuration: the fitted contention model, its calibration, its error.

R(S) comes from contention.py (queue or waterfill family, or their BIC-weighted mixture when the
runs cannot tell them apart: weights exp(−ΔBIC/2), those under 0.05 dropped — a soft knee where a
hard capacity and a queue fit equally, per-worker overhead only in proportion to the evidence),
fitted by calibration.py. The residual ridge regression is used when at least three multi-device
runs measured every member's own rate (RunMeasurement.every_member_steady) and its leave-one-out
error beats the analytic model's: a set the step cap ended before its slow members trained
steadily still enters the contention fit (its throughput, its fast members' rates) but says little
about what the slow ones cost, and a correction fitted on such sets extrapolates. No worker trains
faster beside others than alone, so R(S) never exceeds the members' solo rates' sum Σ r_i: the
regression's correction factor is capped there, and the start-up lag, the power and the
uncertainty that scale by it see the capped one (docs/decisions.md#throughput-cap).

Uncertainty (relative, on R): sqrt(Σ(u_i·σ_i)²/R² + σ_model²) with σ_i the solo spread and
σ_model the leave-one-out RMS log-error of the chosen model (0.15 with fewer than two runs), for one
device as for several: a window of a few seconds misses the rate the device then trains at by
about as much as the model misses a set (docs/decisions.md#single-device-uncertainty).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import numpy as np

from hetcluster.errors import PlanningError
from hetcluster.planner.calibration import (
    VARIANTS,
    RunData,
    capped_correction,
    fit_regression,
    fit_variant,
    loo_error,
    selection_score,
    variant_name,
)
from hetcluster.planner.contention import Contention, QueuePrediction, solve, utilisation, waterfill
from hetcluster.planner.fleet import Units, class_units, device_units
from hetcluster.planner.inputs import DeviceMeasurement, JobSpec, usable_runs, validate_inputs

__all__ = ["Contention", "QueuePrediction", "ThroughputModel", "solve", "utilisation", "waterfill"]

log = logging.getLogger(__name__)

PRIOR_MODEL_STD = 0.15
MIN_RUNS_FOR_REGRESSION = 3   # regress only on steady sets, three at least (docs/decisions.md#throughput-cap)
MIXTURE_MIN_WEIGHT = 0.05
FIT_ON_CLASSES_ABOVE = 20


@dataclass
class ThroughputModel:
    """Analytic async-PS throughput with an optional residual regression; see the module docstring."""

    devices: tuple[DeviceMeasurement, ...]
    contention: Contention = field(default_factory=Contention)
    regression: object | None = None          # fitted sklearn pipeline on residual_features, or None
    model_std: float = PRIOR_MODEL_STD        # relative error of a prediction, from the multi-worker runs
    loo_errors: dict = field(default_factory=dict)  # chosen variant / "regression" → leave-one-out RMS log-error
    selection_scores: dict = field(default_factory=dict)  # variant → BIC-like score (lower is better)
    n_calibration_runs: int = 0
    mixture: tuple = ()   # ((BIC weight, Contention), ...) when several variants are plausible
    _units: dict = field(default_factory=dict, repr=False)

    @property
    def analytic(self):
        """What solve() evaluates: the BIC-weighted mixture, or the single chosen variant."""
        return self.mixture or self.contention

    @property
    def service_s(self) -> float:
        return self.contention.service_s

    @property
    def capacity_steps_per_s(self) -> float:
        """C = 1/s, the throughput the shared resource cannot exceed with two workers (inf without contention)."""
        return float("inf") if self.service_s <= 0 else 1.0 / self.service_s

    @classmethod
    def fit(
        cls, devices, runs=(), *, use_regression: bool | None = None, variant: tuple[str, bool] | None = None
    ) -> "ThroughputModel":
        """Fit the contention family and parameters, and the residual regression when it helps.

        use_regression: None decides by leave-one-out error; True/False forces it.
        variant: (family, with κ) forces a family (tests, ablations); None selects by the BIC-like
        score (and averages the plausible variants).
        """
        devices = tuple(devices)
        validate_inputs(devices, (), JobSpec(total_steps=1))
        runs = list(usable_runs(devices, runs))
        units = _as_measured_units(devices)
        multi = [r for r in runs if len(r.devices) > 1]
        data = RunData.of(units, multi)
        loo: dict[str, float] = {}
        selection: dict[str, float] = {}
        choice = variant or ("queue", False)
        mixture: tuple = ()
        if variant is None and (len(multi) >= 2 or data.dev_rows.size >= 2):  # per-device data tell the families apart
            candidates = VARIANTS if len(multi) >= 3 else VARIANTS[:2]
            scored = {v: selection_score(data, units, *v) for v in candidates}
            choice = min(candidates, key=lambda v: (round(scored[v][0], 4), VARIANTS.index(v)))
            selection = {variant_name(*v): float(e) for v, (e, _) in scored.items()}
            best = scored[choice][0]
            weights = {v: float(np.exp(-0.5 * (e - best))) for v, (e, _) in scored.items()}
            kept = {v: w for v, w in weights.items() if w >= MIXTURE_MIN_WEIGHT}
            if len(kept) > 1:
                total = sum(kept.values())
                mixture = tuple((w / total, scored[v][1]) for v, w in kept.items())
        contention = fit_variant(data, units, *choice)
        model = cls(devices=devices, contention=contention, n_calibration_runs=len(multi), loo_errors=loo,
                    selection_scores=selection, mixture=mixture)
        if len(multi) >= 2:
            loo[variant_name(*choice)] = loo_error(data, units, *choice, False)
        model_std = loo.get(variant_name(*choice))
        steady_runs = sum(r.every_member_steady for r in multi)
        want = use_regression if use_regression is not None else steady_runs >= MIN_RUNS_FOR_REGRESSION
        if want and len(multi) >= 2:
            loo["regression"] = loo_error(data, units, *choice, True)
            if use_regression is True or loo["regression"] < loo[variant_name(*choice)]:
                model.regression = fit_regression(data, units, model.analytic)
                model_std = loo["regression"]
        if model_std is not None and np.isfinite(model_std):
            model.model_std = max(float(model_std), 0.01)
        log.info(
            "throughput model: %s s=%.4g s κ=%.3g, regression=%s, model std=%.3f, %d multi-device runs, LOO %s, BIC %s",
            contention.family, contention.service_s, contention.per_worker, model.regression is not None,
            model.model_std, len(multi), loo, selection,
        )
        return model

    def measured_units(self) -> Units:
        """Units as pre-training measured them (no memory-plan slowdown), for fitting runs."""
        return _as_measured_units(self.devices)

    def units(self, classes: bool) -> Units:
        key = "classes" if classes else "devices"
        if key not in self._units:
            self._units[key] = class_units(self.devices) if classes else device_units(self.devices)
        return self._units[key]

    def predict_weights(self, weights: np.ndarray, units: Units, util_weights: np.ndarray | None = None):
        """(steps_per_s, relative std, QueuePrediction, correction factor) for a weight matrix; the
        factor is the regression's, capped where it would lift R(S) above Σ r_i."""
        q = solve(weights, units, self.analytic, util_weights)
        factor = np.ones(weights.shape[0])
        if self.regression is not None:  # capped so that R(S) ≤ Σ r_i: what uses the factor (the
            # start-up lag, power, the uncertainty) sees the same correction as R(S)
            factor = capped_correction(self.regression, weights, units, q.steps_per_s)
        steps = q.steps_per_s * factor
        rel_var = q.measurement_var * factor ** 2 / np.maximum(steps, 1e-300) ** 2 + self.model_std ** 2
        return steps, np.sqrt(rel_var), q, factor

    def predict(self, configurations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bit masks (1-D, over `devices` in order) or count vectors (2-D, over classes) →
        (steps_per_s, absolute std)."""
        from hetcluster.planner.configurations import membership

        configurations = np.asarray(configurations)
        if configurations.ndim == 1:
            units = self.units(classes=False)
            weights = membership(configurations.astype(np.int64), units.size)
        elif configurations.ndim == 2:
            units = self.units(classes=True)
            if configurations.shape[1] != units.size:
                raise PlanningError(
                    f"Count vectors have {configurations.shape[1]} columns but the fleet has {units.size} classes."
                )
            weights = configurations.astype(np.float64)
        else:
            raise PlanningError("Configurations must be a 1-D array of masks or a 2-D array of count vectors.")
        steps, rel, _, _ = self.predict_weights(weights, units)  # each member under its own memory plan
        return steps, steps * rel


def _as_measured_units(devices: tuple[DeviceMeasurement, ...]) -> Units:
    """Units with the solo rates as plain TensorFlow trains (what pre-training measured, a run
    under a memory plan multiplied back by its slowdown: profile.to_planner_inputs), so the
    contention is fitted on those rates and the plans' slowdowns only enter predictions.
    Big fleets fit on classes: the same numbers for identical devices, a dozen columns not 1000."""
    measured = tuple(replace(d, memory_slowdown=1.0) for d in devices)
    return class_units(measured) if len(devices) > FIT_ON_CLASSES_ABOVE else device_units(measured)
