"""Calibration of the contention model on the measured multi-device runs.

For each family, s (and for the "+κ" variants, κ) is fitted by least squares on log R and, where
recorded, on each device's log x_i, over vectorised parameter grids. The variant (queue, queue+κ,
waterfill, waterfill+κ; the κ variants only with three or more multi-device runs) is scored by a
BIC-like criterion over all aggregate and per-device observations (n·log(SSE/n) + k·log n):
with only a handful of runs, leave-one-out over the runs was too noisy to tell the families
apart, while the per-device slowdowns separate them well. A ridge regression (scikit-learn,
imported here only) on the log-residual log(R_meas/R_model), with features that vanish for one
worker [log n, log(Σr/max r), 1 − min r/max r], corrects what the family misses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetcluster.planner.contention import Contention, solve, utilisation, utilisation_rows
from hetcluster.planner.fleet import Units, run_weights
from hetcluster.planner.inputs import RunMeasurement

KAPPA_GRID = (0.0, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)


def residual_features(weights: np.ndarray, units: Units) -> np.ndarray:
    """Features of a configuration for the residual regression; all vanish for one worker."""
    rate = units.rate_steps_per_s
    n = weights.sum(axis=1)
    demand = weights @ rate
    present = weights > 0
    rmax = np.where(present, rate[None, :], 0.0).max(axis=1)
    rmin = np.where(present, rate[None, :], np.inf).min(axis=1)
    return np.column_stack([np.log(np.maximum(n, 1.0)), np.log(demand / rmax), 1.0 - rmin / rmax])


@dataclass(frozen=True)
class RunData:
    """Measured multi-device runs as arrays (weights, aggregate and per-device throughputs)."""

    weights: np.ndarray
    measured: np.ndarray
    dev_rows: np.ndarray
    dev_units: np.ndarray
    dev_rates: np.ndarray

    @classmethod
    def of(cls, units: Units, runs: list[RunMeasurement]) -> "RunData":
        W = run_weights(units, [r.devices for r in runs])
        index = {name: u for u, names in enumerate(units.members) for name in names}
        rows, us, xs = [], [], []
        for row, r in enumerate(runs):
            if r.time_s > 0:
                for name, steps in r.per_device_steps.items():
                    if name in index and steps > 0:
                        rows.append(row), us.append(index[name]), xs.append(steps / r.time_s)
        return cls(W, np.array([r.steps_per_s for r in runs], dtype=np.float64),
                   np.array(rows, dtype=np.int64), np.array(us, dtype=np.int64), np.array(xs, dtype=np.float64))

    def take(self, keep: np.ndarray) -> "RunData":
        rows = np.flatnonzero(keep)
        remap = -np.ones(len(keep), dtype=np.int64)
        remap[rows] = np.arange(rows.size)
        dev = keep[self.dev_rows] if self.dev_rows.size else np.zeros(0, bool)
        return RunData(
            self.weights[rows], self.measured[rows], remap[self.dev_rows[dev]], self.dev_units[dev], self.dev_rates[dev]
        )


def _grid_losses(data: RunData, units: Units, family: str, service_s: np.ndarray, per_worker: np.ndarray) -> np.ndarray:
    """Fit loss for each (s, κ) pair at once: squared log-errors of every run's throughput plus,
    weighted 1/2 and averaged, of every recorded per-device throughput."""
    runs = len(data.measured)
    rate = units.rate_steps_per_s
    W = np.tile(data.weights, (service_s.size, 1))
    U = utilisation_rows(W, rate, family, np.repeat(service_s, runs), np.repeat(per_worker, runs))
    pred = ((W * U) @ rate).reshape(service_s.size, runs)
    loss = np.sum((np.log(pred) - np.log(data.measured)[None, :]) ** 2, axis=1)
    if data.dev_rows.size:
        rows = np.arange(service_s.size)[:, None] * runs + data.dev_rows[None, :]
        x_pred = U[rows, data.dev_units[None, :]] * rate[data.dev_units][None, :]
        loss += 0.5 * np.mean((np.log(x_pred) - np.log(data.dev_rates)[None, :]) ** 2, axis=1) * runs
    return loss


def fit_variant(data: RunData, units: Units, family: str, with_kappa: bool) -> Contention:
    """Least-squares (s, κ) for one family: a log grid on s × the κ grid, then two finer grids on
    s around the best point (each grid is one vectorised evaluation)."""
    if len(data.measured) == 0:
        return Contention(family)
    s_max = 1.0 / float(units.rate_steps_per_s.max())
    s_grid = np.concatenate([[0.0], s_max * np.logspace(-3, 0, 37)])
    kappas = np.array(KAPPA_GRID if with_kappa else (0.0,))
    S, K = np.meshgrid(s_grid, kappas, indexing="ij")
    losses = _grid_losses(data, units, family, S.ravel(), K.ravel())
    best = int(np.argmin(losses))
    s_best, kappa = float(S.ravel()[best]), float(K.ravel()[best])
    if s_best <= 0:
        return Contention(family, 0.0, kappa)
    i = int(np.searchsorted(s_grid, s_best))
    lo, hi = s_grid[max(i - 1, 0)], s_grid[min(i + 1, s_grid.size - 1)]
    loss_best = float(losses[best])
    for _ in range(2):
        fine = np.linspace(lo, hi, 25)
        fine_losses = _grid_losses(data, units, family, fine, np.full(fine.size, kappa))
        j = int(np.argmin(fine_losses))
        if fine_losses[j] < loss_best:
            s_best, loss_best = float(fine[j]), float(fine_losses[j])
        step = (hi - lo) / 24
        lo, hi = max(s_best - step, 0.0), min(s_best + step, s_max)  # s ≤ 1/max r: a solo cycle holds its visit
    return Contention(family, s_best, kappa)


VARIANTS = (("queue", False), ("waterfill", False), ("queue", True), ("waterfill", True))


def capped_correction(regression, weights: np.ndarray, units: Units, analytic_steps_per_s: np.ndarray) -> np.ndarray:
    """The regression's correction factor exp(ŷ), capped where it would lift the analytic R(S)
    above Σ r_i of the members: no worker trains faster beside others than alone."""
    factor = np.exp(regression.predict(residual_features(weights, units)))
    return np.minimum(factor, weights @ units.rate_steps_per_s / np.maximum(analytic_steps_per_s, 1e-300))


def member_rates(data: RunData, rate: np.ndarray, model) -> np.ndarray:
    """Each recorded member's rate x_i = u_i·r_i in its run (aligned with data.dev_rates), under a
    Contention or a BIC mixture ((weight, Contention), ...), whose predictions are averaged."""
    parts = ((1.0, model),) if isinstance(model, Contention) else model
    return (
        sum(w * utilisation(data.weights, rate, m)[data.dev_rows, data.dev_units] for w, m in parts)
        * rate[data.dev_units]
    )


def predict_runs(data: RunData, units: Units, model: Contention, regression=None) -> np.ndarray:
    pred = solve(data.weights, units, model).steps_per_s
    if regression is not None:  # as ThroughputModel predicts
        pred = pred * capped_correction(regression, data.weights, units, pred)
    return pred


@dataclass(frozen=True)
class ResidualRegression:
    """The fitted scikit-learn pipeline, and its coefficients on the raw features: predicting
    2^20 configurations is then one matrix product instead of 256 pipeline calls."""

    pipeline: object
    coef: np.ndarray

    def predict(self, features: np.ndarray) -> np.ndarray:
        return features @ self.coef


def fit_regression(data: RunData, units: Units, model) -> ResidualRegression:
    """Ridge on the log-residuals; features vanish for one worker, so no intercept is needed."""
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    y = np.log(data.measured) - np.log(solve(data.weights, units, model).steps_per_s)
    pipeline = make_pipeline(StandardScaler(with_mean=False), Ridge(alpha=1.0, fit_intercept=False))
    pipeline.fit(residual_features(data.weights, units), y)
    scaler, ridge = pipeline[0], pipeline[-1]
    return ResidualRegression(pipeline, np.asarray(ridge.coef_, dtype=np.float64) / scaler.scale_)


def loo_error(
    data: RunData, units: Units, family: str, with_kappa: bool, with_regression: bool, per_device: bool = False
) -> float:
    """Leave-one-out RMS log-error over the runs, refitting everything each time.

    per_device adds the held-out run's per-device errors (mean square, weight 1/2, as in the fit):
    they separate the families (a water-filled slow device keeps its solo rate, a queued one
    does not) far better than a handful of aggregate throughputs can.
    """
    errors = []
    for j in range(len(data.measured)):
        keep = np.ones(len(data.measured), bool)
        keep[j] = False
        train, held = data.take(keep), data.take(~keep)
        model = fit_variant(train, units, family, with_kappa)
        regression = fit_regression(train, units, model) if with_regression else None
        err = float(np.log(predict_runs(held, units, model, regression)[0]) - np.log(held.measured[0])) ** 2
        if per_device and held.dev_rows.size:
            x_pred = member_rates(held, units.rate_steps_per_s, model)
            err += 0.5 * float(np.mean((np.log(x_pred) - np.log(held.dev_rates)) ** 2))
        errors.append(err)
    return float(np.sqrt(np.mean(errors))) if errors else float("nan")


def selection_score(data: RunData, units: Units, family: str, with_kappa: bool) -> tuple[float, Contention]:
    """BIC-like score of a variant fitted to all runs: observations are the aggregate and the
    per-device throughputs (the latter separate the families), parameters are s (and κ)."""
    model = fit_variant(data, units, family, with_kappa)
    U = utilisation(data.weights, units.rate_steps_per_s, model)
    resid = [np.log((data.weights * U) @ units.rate_steps_per_s) - np.log(data.measured)]
    if data.dev_rows.size:
        resid.append(np.log(member_rates(data, units.rate_steps_per_s, model)) - np.log(data.dev_rates))
    r = np.concatenate(resid)
    n_obs = r.size
    sse = max(float(np.sum(r ** 2)), n_obs * 1e-6)  # 0.1 % noise floor: exact fits do not win by luck
    return n_obs * np.log(sse / n_obs) + (2 if with_kappa else 1) * np.log(n_obs), model


def variant_name(family: str, kappa: bool) -> str:
    return f"{family}+κ" if kappa else family
