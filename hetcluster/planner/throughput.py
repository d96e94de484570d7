"""Throughput R(S) of a configuration under asynchronous parameter-server training.

Every worker pulls variables, computes and pushes gradients at its own pace (fast workers take
more steps); all share the parameter server, the coordinator and the links. Two contention
families describe that sharing; each has a capacity C(n) of the shared resource that may shrink
with the number of workers n (per-worker overhead κ: coordinator threads, heartbeats):

    s(n) = s·(1 + κ·(n − 1))         service time of one step at the shared resource, C(n) = 1/s(n)

queue (the parameter server as a FIFO server; closed queueing network, Bard–Schweitzer MVA)
    The solo cycle 1/r_i already contains one visit of s. Together, a step also pays the extra
    service Δ = s(n) − s and waits w behind the others:
        x_i = 1/(1/r_i + Δ + w),  R = Σ x_i,  w = s(n)·a·ρ/(1 − a·ρ),  ρ = s(n)·R,  a = 1 − 1/n
    (a removes a worker's own share of the queue, so R({i}) = r_i). h(w) = w(1 − aρ) − s(n)aρ is
    convex and increasing past its root, so Newton from the right converges monotonically; it is
    run for all configurations at once (float32, then one float64 step).

waterfill (a hard capacity shared max-min fairly, e.g. CPU quotas on an oversubscribed host)
        x_i = min(r_i, θ),  Σ x_i = min(Σ r_i, C(n))
    θ = max_j (C − Σ_{k<j} r_k)/|{k ≥ j}| over members sorted by r (exact, two cumulative sums).

Both give R({i}) = r_i, R ≈ Σ r_i under light load, R → C(n) under heavy load, fast workers
slowed most; the utilisation u_i = x_i/r_i feeds the power model.

Calibration
-----------
For each family, s (and for the "+κ" variants, κ) is fitted to the multi-device runs by least
squares on log R and, where recorded, on each device's log x_i. The variant (queue, queue+κ,
waterfill, waterfill+κ; the κ variants only with three or more multi-device runs) is chosen by
a BIC-like score over all aggregate and per-device observations (n·log(SSE/n) + k·log n; queue
when there are fewer than two runs) — with only a handful of runs, leave-one-out over the runs
was too noisy to tell the families apart, while the per-device slowdowns separate them well.
When several variants are plausible, predictions are their BIC-weighted average (weights
exp(−ΔBIC/2), those under 0.05 dropped): a soft knee where the runs cannot tell a hard capacity
from a queue, and per-worker overhead only in proportion to the evidence for it. With at least three multi-device runs, a ridge regression
(scikit-learn) on the log-residual log(R_meas/R_model), with features that vanish for one worker
[log n, log(Σr/max r), 1 − min r/max r], corrects what the family misses; it is kept only when
its leave-one-out error beats the analytic model's.

Uncertainty (relative, on R): sqrt(Σ(u_i·σ_i)²/R² + σ_model²·[n > 1]) with σ_i the solo spread
and σ_model the leave-one-out RMS log-error of the chosen model (0.15 with fewer than two runs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from hetcluster.errors import PlanningError
from hetcluster.planner.fleet import Units, class_units, device_units, run_weights
from hetcluster.planner.inputs import DeviceMeasurement, JobSpec, RunMeasurement, usable_runs, validate_inputs

log = logging.getLogger(__name__)

CHUNK_ROWS = 1 << 12
PRIOR_MODEL_STD = 0.15
MIN_RUNS_FOR_REGRESSION = 3
MIXTURE_MIN_WEIGHT = 0.05
FIT_ON_CLASSES_ABOVE = 20
KAPPA_GRID = (0.0, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)


@dataclass(frozen=True)
class Contention:
    """One contention hypothesis: family, service time per step s, per-worker overhead κ."""

    family: str = "queue"       # "queue" | "waterfill"
    service_s: float = 0.0
    per_worker: float = 0.0

    def service_for(self, n: np.ndarray) -> np.ndarray:
        return self.service_s * (1.0 + self.per_worker * np.maximum(n - 1.0, 0.0))


@dataclass(frozen=True)
class QueuePrediction:
    """Analytic prediction for a batch of configurations."""

    steps_per_s: np.ndarray      # R(S)
    weighted_util: np.ndarray    # Σ_i W_i·g_i·u_i for the g given (e.g. dynamic power)
    measurement_var: np.ndarray  # Σ_i W_i·(u_i σ_i)²


def utilisation(W: np.ndarray, rate: np.ndarray, model: Contention) -> np.ndarray:
    """u_i = x_i/r_i for each configuration row and unit (rows × units)."""
    if model.service_s <= 0.0:
        return np.ones_like(W)
    return _utilisation_rows(W, rate, model.family, np.full(W.shape[0], model.service_s), model.per_worker)


def _utilisation_rows(W: np.ndarray, rate: np.ndarray, family: str, service_s: np.ndarray, per_worker) -> np.ndarray:
    """utilisation() with a service time (and κ) per row, so a whole parameter grid is one call."""
    n = W.sum(axis=1)
    s_n = service_s * (1.0 + per_worker * np.maximum(n - 1.0, 0.0))
    rate_m = rate if rate.ndim == 2 else rate[None, :]
    if family == "waterfill":
        capacity = np.divide(1.0, s_n, out=np.full_like(s_n, np.inf), where=s_n > 0)
        return np.minimum(1.0, _waterfill_level(W, rate, capacity)[:, None] / rate_m)
    z = 1.0 / rate_m + (s_n - service_s)[:, None]
    return (1.0 / rate_m) / (z + _solve_waits(W, z, s_n))


def _waterfill_level(W: np.ndarray, rate: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """θ with Σ W_i·min(r_i, θ) = capacity (inf where Σ W_i r_i ≤ capacity).

    θ = max_j (C − Σ_{k<j} W_k r_k)/Σ_{k≥j} W_k over units sorted by rate: each term bounds θ
    from below and the right split attains it. `rate` is one vector for all rows, or a
    (rows × k) matrix already sorted ascending along each row (packed members). Works on the
    transposed (units × rows) layout, where the running sums are contiguous vector adds.
    """
    if rate.ndim == 1:
        order = np.argsort(rate)
        Wt = np.ascontiguousarray(W[:, order].T)
        rs = rate[order][:, None]
    else:
        Wt, rs = np.ascontiguousarray(W.T), np.ascontiguousarray(rate.T)
    before = np.zeros(W.shape[0])                 # Σ_{k<j} W_k r_k
    suffix = Wt.sum(axis=0)                       # Σ_{k≥j} W_k
    theta = np.full(W.shape[0], -np.inf)
    for j in range(Wt.shape[0]):  # a loop over units: np.cumsum along the short axis is 10× slower
        # past the last member suffix = 0 and C − Σr < 0 (contended rows), so the level is
        # negative there and never the maximum; uncontended rows are set to inf below
        np.maximum(theta, (capacity - before) / np.maximum(suffix, 0.5), out=theta)
        before += Wt[j] * rs[j]
        suffix -= Wt[j]
    return np.where(before <= capacity, np.inf, theta)


def waterfill(rates, capacity: float) -> np.ndarray:
    """Max-min fair shares of one capacity: min(r_i, θ) with Σ = min(Σ r_i, capacity) (exact)."""
    rates = np.asarray(rates, dtype=np.float64)
    theta = _waterfill_level(np.ones((1, rates.size)), rates, np.array([float(capacity)]))[0]
    return np.minimum(rates, theta)


def _occupancy_terms(W, z, s, Q):
    """Per-customer Schweitzer terms at total occupancy Q: waits w_i, occupancies Q_i, dQ_i/dQ.

    w_i is the non-negative root of w² + b·w + c = 0 with b = z_i + s − Q·s and
    c = s·(s − Q·z_i) (from w_i = s·(Q − Q_i)); where it is positive, Q_i = Q − w_i/s and
    dQ_i/dQ = 1 − (w_i + z_i)/√disc, else the worker never waits: Q_i = s/z_i, slope 0.
    """
    s_col, Q_col = s[:, None], Q[:, None]
    b = z + s_col * (1.0 - Q_col)
    root_disc = np.sqrt(np.maximum(b * b - (4.0 * s_col) * (s_col - Q_col * z), 0.0))
    w = np.maximum(0.5 * (root_disc - b), 0.0)
    zw = z + w
    occupancy = (s_col + w) / zw            # = Q − w/s where w > 0, s/z where it is 0
    slope = (w > 0.0) * (1.0 - zw / np.maximum(root_disc, 1e-30))
    return w, occupancy, slope


def _solve_waits(W: np.ndarray, z: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Per-worker queue waits w_i (rows × units) from the Bard–Schweitzer fixed point.

    Worker i waits behind the others' occupancy of the server, w_i = s·(Q − Q_i), with
    Q_i = (s + w_i)/(z_i + w_i) its own occupancy and z_i its cycle without waiting. For a given
    total Q that is a quadratic in w_i. H(Q) = Σ Q_i(Q) − Q is concave with H(0) > 0 ≥ H(n), so
    it has one root and Newton started at Q = n converges monotonically from the right; run in
    float32 for all rows at once, then polished by one float64 step.
    """
    n = W.sum(axis=1)
    z = np.broadcast_to(z, W.shape)
    f32 = np.float32
    W32, z32, s32 = W.astype(f32), z.astype(f32), s.astype(f32)
    Q32 = n.astype(f32)
    for _ in range(30):
        _, occ, slope = _occupancy_terms(W32, z32, s32, Q32)
        H = np.einsum("ij,ij->i", W32, occ) - Q32
        dH = np.einsum("ij,ij->i", W32, slope) - 1.0
        Q_new = np.clip(Q32 - H / np.minimum(dH, -1e-6), 0.0, Q32).astype(f32)
        done = np.all(Q32 - Q_new <= 1e-4 * Q32 + 1e-12)  # float32 noise floor is ~1e-6; the
        # float64 step below squares the remaining error
        Q32 = Q_new
        if done:
            break
    Q = np.minimum(Q32.astype(np.float64) * (1.0 + 1e-5) + 1e-12, n)  # right of the root again
    _, occ, slope = _occupancy_terms(W, z, s, Q)
    H = np.einsum("ij,ij->i", W, occ) - Q
    dH = np.einsum("ij,ij->i", W, slope) - 1.0
    Q = np.clip(Q - H / np.minimum(dH, -1e-12), 0.0, n)
    w, _, _ = _occupancy_terms(W, z, s, Q)
    return w


def solve(weights: np.ndarray, units: Units, model, util_weights: np.ndarray | None = None) -> QueuePrediction:
    """R, Σ g_i·u_i and the measurement variance for every row of `weights` (configs × units).

    `model` is one Contention or a mixture ((weight, Contention), ...) whose predictions are
    averaged with those weights."""
    if not isinstance(model, Contention):
        parts = [(w, solve(weights, units, m, util_weights)) for w, m in model]
        return QueuePrediction(*(sum(w * getattr(q, f) for w, q in parts) for f in ("steps_per_s", "weighted_util", "measurement_var")))
    rate = units.rate_steps_per_s
    g = np.zeros_like(rate) if util_weights is None else np.asarray(util_weights, dtype=np.float64)
    sigma2 = units.rate_std_steps_per_s ** 2
    rows = weights.shape[0]
    total, wutil, mvar = (np.empty(rows) for _ in range(3))
    by_rate = np.argsort(rate, kind="stable")
    for start in range(0, rows, CHUNK_ROWS):
        sl = slice(start, start + CHUNK_ROWS)
        W = np.asarray(weights[sl], dtype=np.float64)
        if model.service_s > 0 and not units.is_classes:
            total[sl], wutil[sl], mvar[sl] = _solve_packed(W, by_rate, rate, g, sigma2, model)
            continue
        U = utilisation(W, rate, model)
        WU = W * U
        total[sl] = WU @ rate
        wutil[sl] = WU @ g
        mvar[sl] = (WU * U) @ sigma2
    return QueuePrediction(total, wutil, mvar)


def _solve_packed(W, by_rate, rate, g, sigma2, model: Contention):
    """solve() for 0/1 rows, on members only: rows with k members become (rows × k) matrices of
    their own rates (in rate order), so no work is spent on absent devices (half the matrix on
    average). estimate() orders configurations by size, so a chunk holds one or two sizes."""
    total, wutil, mvar = (np.empty(W.shape[0]) for _ in range(3))
    present = W[:, by_rate] > 0
    sizes = present.sum(axis=1)
    for k in np.unique(sizes):
        rows = np.flatnonzero(sizes == k)
        # flat positions of the members, row-major: each row's k members in rate order
        members = by_rate[(np.flatnonzero(present[rows]) % W.shape[1]).reshape(rows.size, k)]
        packed_rate = rate[members]
        U = _utilisation_rows(np.ones((rows.size, k)), packed_rate, model.family,
                              np.full(rows.size, model.service_s), model.per_worker)
        total[rows] = np.einsum("ij,ij->i", U, packed_rate)
        wutil[rows] = np.einsum("ij,ij->i", U, g[members])
        mvar[rows] = np.einsum("ij,ij->i", U * U, sigma2[members])
    return total, wutil, mvar


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
class _RunData:
    """Measured multi-device runs as arrays (weights, aggregate and per-device throughputs)."""

    weights: np.ndarray
    measured: np.ndarray
    dev_rows: np.ndarray
    dev_units: np.ndarray
    dev_rates: np.ndarray

    @classmethod
    def of(cls, units: Units, runs: list[RunMeasurement]) -> "_RunData":
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

    def take(self, keep: np.ndarray) -> "_RunData":
        rows = np.flatnonzero(keep)
        remap = -np.ones(len(keep), dtype=np.int64)
        remap[rows] = np.arange(rows.size)
        dev = keep[self.dev_rows] if self.dev_rows.size else np.zeros(0, bool)
        return _RunData(self.weights[rows], self.measured[rows], remap[self.dev_rows[dev]], self.dev_units[dev], self.dev_rates[dev])


def _grid_losses(data: _RunData, units: Units, family: str, service_s: np.ndarray, per_worker: np.ndarray) -> np.ndarray:
    """Fit loss for each (s, κ) pair at once: squared log-errors of every run's throughput plus,
    weighted 1/2 and averaged, of every recorded per-device throughput."""
    runs = len(data.measured)
    rate = units.rate_steps_per_s
    W = np.tile(data.weights, (service_s.size, 1))
    U = _utilisation_rows(W, rate, family, np.repeat(service_s, runs), np.repeat(per_worker, runs))
    pred = ((W * U) @ rate).reshape(service_s.size, runs)
    loss = np.sum((np.log(pred) - np.log(data.measured)[None, :]) ** 2, axis=1)
    if data.dev_rows.size:
        rows = np.arange(service_s.size)[:, None] * runs + data.dev_rows[None, :]
        x_pred = U[rows, data.dev_units[None, :]] * rate[data.dev_units][None, :]
        loss += 0.5 * np.mean((np.log(x_pred) - np.log(data.dev_rates)[None, :]) ** 2, axis=1) * runs
    return loss


def _fit_variant(data: _RunData, units: Units, family: str, with_kappa: bool) -> Contention:
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
        lo, hi = max(s_best - step, 0.0), s_best + step
    return Contention(family, s_best, kappa)


VARIANTS = (("queue", False), ("waterfill", False), ("queue", True), ("waterfill", True))


def _predict_runs(data: _RunData, units: Units, model: Contention, regression=None) -> np.ndarray:
    pred = solve(data.weights, units, model).steps_per_s
    if regression is not None:
        pred = pred * np.exp(regression.predict(residual_features(data.weights, units)))
    return pred


def _fit_regression(data: _RunData, units: Units, model: Contention):
    """Ridge on the log-residuals; features vanish for one worker, so no intercept is needed."""
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    y = np.log(data.measured) - np.log(solve(data.weights, units, model).steps_per_s)
    pipeline = make_pipeline(StandardScaler(with_mean=False), Ridge(alpha=1.0, fit_intercept=False))
    pipeline.fit(residual_features(data.weights, units), y)
    return pipeline


def _loo(data: _RunData, units: Units, family: str, with_kappa: bool, with_regression: bool, per_device: bool = False) -> float:
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
        model = _fit_variant(train, units, family, with_kappa)
        regression = _fit_regression(train, units, model) if with_regression else None
        err = float(np.log(_predict_runs(held, units, model, regression)[0]) - np.log(held.measured[0])) ** 2
        if per_device and held.dev_rows.size:
            U = utilisation(held.weights, units.rate_steps_per_s, model)
            x_pred = U[held.dev_rows, held.dev_units] * units.rate_steps_per_s[held.dev_units]
            err += 0.5 * float(np.mean((np.log(x_pred) - np.log(held.dev_rates)) ** 2))
        errors.append(err)
    return float(np.sqrt(np.mean(errors))) if errors else float("nan")


def _selection_score(data: _RunData, units: Units, family: str, with_kappa: bool) -> tuple[float, Contention]:
    """BIC-like score of a variant fitted to all runs: observations are the aggregate and the
    per-device throughputs (the latter separate the families), parameters are s (and κ)."""
    model = _fit_variant(data, units, family, with_kappa)
    U = utilisation(data.weights, units.rate_steps_per_s, model)
    resid = [np.log((data.weights * U) @ units.rate_steps_per_s) - np.log(data.measured)]
    if data.dev_rows.size:
        resid.append(np.log(U[data.dev_rows, data.dev_units] * units.rate_steps_per_s[data.dev_units]) - np.log(data.dev_rates))
    r = np.concatenate(resid)
    n_obs = r.size
    sse = max(float(np.sum(r ** 2)), n_obs * 1e-6)  # 0.1 % noise floor: exact fits do not win by luck
    return n_obs * np.log(sse / n_obs) + (2 if with_kappa else 1) * np.log(n_obs), model


@dataclass
class ThroughputModel:
    """Analytic async-PS throughput with an optional residual regression; see the module docstring."""

    devices: tuple[DeviceMeasurement, ...]
    contention: Contention = field(default_factory=Contention)
    regression: object | None = None          # fitted sklearn pipeline on residual_features, or None
    model_std: float = PRIOR_MODEL_STD        # relative error of multi-worker predictions
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
    def fit(cls, devices, runs=(), *, use_regression: bool | None = None, variant: tuple[str, bool] | None = None) -> "ThroughputModel":
        """Fit the contention family and parameters, and the residual regression when it helps.

        use_regression: None decides by leave-one-out error; True/False forces it.
        variant: (family, with κ) forces a family (tests, ablations); None selects by leave-one-out.
        """
        devices = tuple(devices)
        validate_inputs(devices, (), JobSpec(total_steps=1))
        runs = list(usable_runs(devices, runs))
        # big fleets fit on classes: the same numbers for identical devices, 12 columns not 1000
        units = class_units(devices) if len(devices) > FIT_ON_CLASSES_ABOVE else device_units(devices)
        multi = [r for r in runs if len(r.devices) > 1]
        data = _RunData.of(units, multi)
        loo: dict[str, float] = {}
        selection: dict[str, float] = {}
        choice = variant or ("queue", False)
        mixture: tuple = ()
        if variant is None and len(multi) >= 2:
            candidates = VARIANTS if len(multi) >= 3 else VARIANTS[:2]
            scored = {v: _selection_score(data, units, *v) for v in candidates}
            choice = min(candidates, key=lambda v: (round(scored[v][0], 4), VARIANTS.index(v)))
            selection = {_name(*v): float(e) for v, (e, _) in scored.items()}
            best = scored[choice][0]
            weights = {v: float(np.exp(-0.5 * (e - best))) for v, (e, _) in scored.items()}
            kept = {v: w for v, w in weights.items() if w >= MIXTURE_MIN_WEIGHT}
            if len(kept) > 1:
                total = sum(kept.values())
                mixture = tuple((w / total, scored[v][1]) for v, w in kept.items())
        contention = _fit_variant(data, units, *choice)
        model = cls(devices=devices, contention=contention, n_calibration_runs=len(multi), loo_errors=loo,
                    selection_scores=selection, mixture=mixture)
        model._units["classes" if units.is_classes else "devices"] = units
        if len(multi) >= 2:
            loo[_name(*choice)] = _loo(data, units, *choice, False)
        model_std = loo.get(_name(*choice))
        want = use_regression if use_regression is not None else len(multi) >= MIN_RUNS_FOR_REGRESSION
        if want and len(multi) >= 2:
            loo["regression"] = _loo(data, units, *choice, True)
            if use_regression is True or loo["regression"] < loo[_name(*choice)]:
                model.regression = _fit_regression(data, units, model.analytic)
                model_std = loo["regression"]
        if model_std is not None and np.isfinite(model_std):
            model.model_std = max(float(model_std), 0.01)
        log.info(
            "throughput model: %s s=%.4g s κ=%.3g, regression=%s, model std=%.3f, %d multi-device runs, LOO %s, BIC %s",
            contention.family, contention.service_s, contention.per_worker, model.regression is not None,
            model.model_std, len(multi), loo, selection,
        )
        return model

    def units(self, classes: bool) -> Units:
        key = "classes" if classes else "devices"
        if key not in self._units:
            self._units[key] = class_units(self.devices) if classes else device_units(self.devices)
        return self._units[key]

    def predict_weights(self, weights: np.ndarray, units: Units, util_weights: np.ndarray | None = None):
        """(steps_per_s, relative std, QueuePrediction, correction factor) for a weight matrix."""
        q = solve(weights, units, self.analytic, util_weights)
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


def _name(family: str, kappa: bool) -> str:
    return f"{family}+κ" if kappa else family
