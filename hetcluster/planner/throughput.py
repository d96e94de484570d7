"""Throughput R(S) of a configuration under asynchronous parameter-server training.

Analytic part (a closed queueing network, solved with the Bard–Schweitzer approximation)
----------------------------------------------------------------------------------------
Each worker i repeats: compute, then one exclusive visit to the shared resource (parameter
server + coordinator + links) that costs s seconds per step. Alone it runs at its measured solo
rate r_i (memory-plan slowdown applied), so its solo cycle 1/r_i already contains one visit s.
Together, a step may also wait w(S) behind the other workers' visits:

    x_i(S) = 1 / (1/r_i + w(S))          (applied steps/s of worker i; fast workers lose more)
    R(S)   = Σ_{i∈S} x_i(S)
    w(S)   = s·a·ρ / (1 − a·ρ),  ρ = s·R(S) (utilisation of the shared resource), a = 1 − 1/n

(a removes the worker's own share of the queue, so w = 0 for one worker and R({i}) = r_i). The
fixed point is unique (h(w) = w(1 − aρ(w)) − s·a·ρ(w) is convex and increasing past its root) and
Newton's method started right of the root converges monotonically; it is run for all
configurations at once. R ≤ 1/s = C, the capacity of the shared resource; s = 0 gives R = Σ r_i.

Calibration
-----------
s is fitted to the multi-device runs (least squares on log R and, where recorded, on each
device's log x_i) by a bounded 1-D search (0 ≤ s ≤ 1/max r_i). With at least three
multi-device runs, a ridge regression (scikit-learn) on the log-residual log(R_meas/R_analytic)
with features that vanish for one worker [log n, log(Σr/max r), 1 − min r/max r] corrects what
the queue misses (per-worker overheads, CPU contention on a shared host); it is kept only when
its leave-one-out error beats the analytic model's own leave-one-out error.

Uncertainty (relative, on R): sqrt(Σ(u_i·σ_i)² / R² + σ_model²·[n > 1]) with σ_i the solo
measurement spread, u_i = x_i/r_i, and σ_model the leave-one-out RMS log-error of the chosen
model over the multi-device runs (a prior of 0.15 when fewer than two exist).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from hetcluster.errors import PlanningError
from hetcluster.planner.fleet import Units, class_units, device_units, run_weights
from hetcluster.planner.inputs import DeviceMeasurement, RunMeasurement, validate_inputs

log = logging.getLogger(__name__)

CHUNK_ROWS = 1 << 12
PRIOR_MODEL_STD = 0.15
MIN_RUNS_FOR_REGRESSION = 3


@dataclass(frozen=True)
class QueuePrediction:
    """Analytic prediction for a batch of configurations."""

    steps_per_s: np.ndarray     # R(S)
    wait_s: np.ndarray          # w(S)
    weighted_util: np.ndarray   # Σ_i W_i·g_i·x_i/r_i for the g given (e.g. dynamic power)
    measurement_var: np.ndarray  # Σ_i W_i·(u_i σ_i)²


def solve_queue(weights: np.ndarray, units: Units, service_s: float, util_weights: np.ndarray | None = None) -> QueuePrediction:
    """Solve the Schweitzer fixed point for every row of `weights` (configurations × units).

    Newton runs in float32 on chunks that stay in cache, then one float64 Newton step (quadratic
    convergence) restores full precision before the outputs are computed.
    """
    rate = units.rate_steps_per_s
    g = np.zeros_like(rate) if util_weights is None else np.asarray(util_weights, dtype=np.float64)
    rows = weights.shape[0]
    total, wait, wutil, mvar = (np.empty(rows) for _ in range(4))
    for start in range(0, rows, CHUNK_ROWS):
        sl = slice(start, start + CHUNK_ROWS)
        W = np.asarray(weights[sl], dtype=np.float64)
        w = _solve_wait(W, rate, float(service_s))
        U = 1.0 / (1.0 + w[:, None] * rate[None, :])          # utilisation x_i / r_i
        total[sl] = W @ rate if service_s <= 0 else np.einsum("ij,ij->i", W, U * rate[None, :])
        wait[sl] = w
        wutil[sl] = np.einsum("ij,ij->i", W, U * g[None, :])
        mvar[sl] = np.einsum("ij,ij->i", W, U * U * (units.rate_std_steps_per_s ** 2)[None, :])
    return QueuePrediction(total, wait, wutil, mvar)


def _newton_step(W, inv_rate, w, a, s):
    Y = 1.0 / (inv_rate[None, :] + w[:, None])
    R = np.einsum("ij,ij->i", W, Y)
    dR = -np.einsum("ij,ij->i", W, Y * Y)
    rho, drho = s * R, s * dR
    h = w * (1.0 - a * rho) - s * a * rho
    dh = 1.0 - a * rho - a * drho * (w + s)
    return np.maximum(w - h / dh, 0.0)


def _solve_wait(W: np.ndarray, rate: np.ndarray, s: float) -> np.ndarray:
    """w(S) for each row: root of h(w) = w(1 − aρ(w)) − s·a·ρ(w)."""
    n = W.sum(axis=1)
    if s <= 0.0:
        return np.zeros(W.shape[0])
    a = 1.0 - 1.0 / np.maximum(n, 1.0)
    # Start right of the root (h > 0), where Newton on the convex increasing h converges
    # monotonically: w1 = s·a·ρ0/(1 − a·ρ0) with ρ0 = s·Σr when a·ρ0 < 1, else 2·s·a·n.
    load = a * s * (W @ rate)
    w = np.where(load < 0.999, s * load / np.maximum(1.0 - load, 1e-3), 2.0 * s * a * n)
    w = np.minimum(w, 2.0 * s * a * n) + 1e-15
    W32, inv32, a32, s32 = W.astype(np.float32), (1.0 / rate).astype(np.float32), a.astype(np.float32), np.float32(s)
    w32 = w.astype(np.float32)
    for _ in range(40):
        w_new = _newton_step(W32, inv32, w32, a32, s32)
        done = np.all(np.abs(w_new - w32) <= 1e-6 * w32 + 1e-12)
        w32 = w_new
        if done:
            break
    w = np.maximum(w32.astype(np.float64) * (1 + 1e-5), 0.0) + 1e-15  # nudge right of the root again
    return _newton_step(W, 1.0 / rate, w, a, s)


def residual_features(weights: np.ndarray, units: Units) -> np.ndarray:
    """Features of a configuration for the residual regression; all vanish for one worker."""
    rate = units.rate_steps_per_s
    n = weights.sum(axis=1)
    demand = weights @ rate
    present = weights > 0
    rmax = np.where(present, rate[None, :], 0.0).max(axis=1)
    rmin = np.where(present, rate[None, :], np.inf).min(axis=1)
    return np.column_stack([np.log(np.maximum(n, 1.0)), np.log(demand / rmax), 1.0 - rmin / rmax])


def _run_arrays(units: Units, runs: list[RunMeasurement]):
    W = run_weights(units, [r.devices for r in runs])
    measured = np.array([r.steps_per_s for r in runs], dtype=np.float64)
    return W, measured


def _fit_service(units: Units, runs: list[RunMeasurement]) -> float:
    """Least-squares s over aggregate and per-device log-throughputs; 0 when nothing shows contention."""
    multi = [r for r in runs if len(r.devices) > 1]
    if not multi:
        return 0.0
    W, measured = _run_arrays(units, multi)
    index = {name: u for u, names in enumerate(units.members) for name in names}
    per_device = []  # (run row, unit, measured x)
    for row, r in enumerate(multi):
        if r.time_s > 0:
            for name, steps in r.per_device_steps.items():
                if name in index and steps > 0:
                    per_device.append((row, index[name], steps / r.time_s))
    s_max = 1.0 / float(units.rate_steps_per_s.max())

    def loss(s: float) -> float:
        q = solve_queue(W, units, s)
        err = np.sum((np.log(q.steps_per_s) - np.log(measured)) ** 2)
        if per_device:
            rows, us, xs = (np.array(v) for v in zip(*per_device))
            x_pred = 1.0 / (1.0 / units.rate_steps_per_s[us.astype(int)] + q.wait_s[rows.astype(int)])
            err += 0.5 * np.mean((np.log(x_pred) - np.log(xs)) ** 2) * len(multi)
        return float(err)

    grid = np.concatenate([[0.0], s_max * np.logspace(-4, 0, 61)])
    losses = np.array([loss(s) for s in grid])
    best = int(np.argmin(losses))
    lo = grid[max(best - 1, 0)]
    hi = grid[min(best + 1, grid.size - 1)]
    phi = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    for _ in range(30):  # golden-section refinement inside the bracketing grid cell
        c, d = b - phi * (b - a), a + phi * (b - a)
        if loss(c) < loss(d):
            b = d
        else:
            a = c
    s = 0.5 * (a + b)
    return s if loss(s) <= losses[best] else float(grid[best])


@dataclass
class ThroughputModel:
    """Analytic async-PS throughput with an optional residual regression; see the module docstring."""

    devices: tuple[DeviceMeasurement, ...]
    service_s: float = 0.0
    regression: object | None = None          # fitted sklearn pipeline on residual_features, or None
    model_std: float = PRIOR_MODEL_STD        # relative error of multi-worker predictions
    loo_error_analytic: float | None = None   # leave-one-out RMS log-error, analytic only
    loo_error_calibrated: float | None = None  # ... with the regression
    n_calibration_runs: int = 0
    _units: dict = field(default_factory=dict, repr=False)

    @property
    def capacity_steps_per_s(self) -> float:
        """C = 1/s, the throughput the shared resource cannot exceed (inf without contention)."""
        return float("inf") if self.service_s <= 0 else 1.0 / self.service_s

    @classmethod
    def fit(cls, devices, runs=(), *, use_regression: bool | None = None) -> "ThroughputModel":
        """Fit s (and the residual regression when enough multi-device runs exist).

        use_regression: None decides by leave-one-out error; True/False forces it (tests).
        """
        devices = tuple(devices)
        runs = list(runs)
        validate_inputs(devices, runs, _dummy_job())
        units = device_units(devices)
        multi = [r for r in runs if len(r.devices) > 1]
        model = cls(devices=devices, service_s=_fit_service(units, runs), n_calibration_runs=len(multi))
        model._units["devices"] = units
        if len(multi) >= 2:
            model.loo_error_analytic = _loo_error(units, runs, with_regression=False)
        want = use_regression
        if want is None:
            want = len(multi) >= MIN_RUNS_FOR_REGRESSION
        if want and len(multi) >= 2:
            model.loo_error_calibrated = _loo_error(units, runs, with_regression=True)
            keep = use_regression is True or (
                model.loo_error_calibrated < (model.loo_error_analytic or np.inf)
            )
            if keep:
                model.regression = _fit_regression(units, runs, model.service_s)
        chosen = model.loo_error_calibrated if model.regression is not None else model.loo_error_analytic
        if chosen is not None:
            model.model_std = max(float(chosen), 0.01)
        log.info(
            "throughput model: s=%.4g s (capacity %.4g steps/s), regression=%s, model std=%.3f, runs=%d",
            model.service_s, model.capacity_steps_per_s, model.regression is not None, model.model_std, len(multi),
        )
        return model

    def units(self, classes: bool) -> Units:
        key = "classes" if classes else "devices"
        if key not in self._units:
            self._units[key] = class_units(self.devices) if classes else device_units(self.devices)
        return self._units[key]

    def predict_weights(self, weights: np.ndarray, units: Units, util_weights: np.ndarray | None = None):
        """(steps_per_s, relative std, QueuePrediction, correction factor) for a weight matrix."""
        q = solve_queue(weights, units, self.service_s, util_weights)
        factor = np.ones(weights.shape[0])
        if self.regression is not None:
            factor = np.exp(self.regression.predict(residual_features(weights, units)))
        steps = q.steps_per_s * factor
        n = weights.sum(axis=1)
        rel_var = q.measurement_var * factor ** 2 / np.maximum(steps, 1e-300) ** 2 + np.where(n > 1, self.model_std ** 2, 0.0)
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
        steps, rel, _, _ = self.predict_weights(weights, units)
        return steps, steps * rel


def _dummy_job():
    from hetcluster.planner.inputs import JobSpec

    return JobSpec(total_steps=1)


def _fit_regression(units: Units, runs: list[RunMeasurement], service_s: float):
    """Ridge on the log-residual of every measured run (solo runs anchor it at zero)."""
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    W, measured = _run_arrays(units, runs)
    q = solve_queue(W, units, service_s)
    X = residual_features(W, units)
    y = np.log(measured) - np.log(q.steps_per_s)
    solo = W.sum(axis=1) <= 1
    y = np.where(solo, 0.0, y)  # solo runs: the feature vector is zero; keep them as anchors at 0
    pipeline = make_pipeline(StandardScaler(with_mean=False), Ridge(alpha=1.0, fit_intercept=False))
    X_safe = X.copy()
    pipeline.fit(X_safe, y)
    return pipeline


def _loo_error(units: Units, runs: list[RunMeasurement], *, with_regression: bool) -> float:
    """Leave-one-out RMS log-error over the multi-device runs (everything refitted each time)."""
    errors = []
    for j, held in enumerate(runs):
        if len(held.devices) <= 1:
            continue
        rest = [r for i, r in enumerate(runs) if i != j]
        s = _fit_service(units, rest)
        W, measured = _run_arrays(units, [held])
        pred = solve_queue(W, units, s).steps_per_s
        if with_regression and sum(len(r.devices) > 1 for r in rest) >= 1:
            reg = _fit_regression(units, rest, s)
            pred = pred * np.exp(reg.predict(residual_features(W, units)))
        errors.append(float(np.log(pred[0]) - np.log(measured[0])))
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else float("nan")
