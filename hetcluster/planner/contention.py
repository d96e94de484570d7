"""Contention at the shared resource of asynchronous parameter-server training: two families.

Every worker pulls variables, computes and pushes gradients at its own pace (fast workers take
more steps); all share the parameter server, the coordinator and the links. A step costs s seconds
of that shared resource, s(n) = s·(1 + κ·(n − 1)) with n workers (per-worker overhead κ:
coordinator threads, heartbeats), so its capacity is C(n) = 1/s(n).

queue — the shared resource as a FIFO server in a closed queueing network, solved with the
    per-worker Bard–Schweitzer approximation. Worker i's cycle without waiting is
    z_i = 1/r_i + (s(n) − s) (its solo cycle 1/r_i already holds one visit of s); it waits
    w_i = s(n)·(Q − Q_i) behind the others' occupancy, with Q_i = (s(n) + w_i)/(z_i + w_i) its own
    and Q = Σ Q_i; x_i = 1/(z_i + w_i), R = Σ x_i. For one worker w = 0 and R = r_i.

waterfill — a hard capacity shared max-min fairly (CPU quotas on an oversubscribed host):
    x_i = min(r_i, θ), Σ x_i = min(Σ r_i, C(n)), θ exact from running sums over sorted rates.

Both give R ≈ Σ r_i under light load and R → C(n) under heavy load, slowing the fast workers
most; the utilisation u_i = x_i/r_i feeds the power model. Everything is vectorised over
configurations (rows) and units (devices or classes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetcluster.planner.configurations import row_sums
from hetcluster.planner.fleet import Units

CHUNK_ROWS = 1 << 12


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
    weighted_util: np.ndarray    # Σ_i W_i·g_i·u_i for the g given (e.g. dynamic power); rows × k
                                 # when g is a (units × k) matrix
    measurement_var: np.ndarray  # Σ_i W_i·(u_i σ_i)²


def utilisation(W: np.ndarray, rate: np.ndarray, model: Contention) -> np.ndarray:
    """u_i = x_i/r_i for each configuration row and unit (rows × units)."""
    if model.service_s <= 0.0:
        return np.ones_like(W)
    return utilisation_rows(W, rate, model.family, np.full(W.shape[0], model.service_s), model.per_worker)


def utilisation_rows(
    W: np.ndarray | None, rate: np.ndarray, family: str, service_s: np.ndarray, per_worker
) -> np.ndarray:
    """utilisation() with a service time (and κ) per row, so a whole parameter grid is one call.
    W None: ``rate`` is a (rows × k) matrix of members only (packed rows, weight 1 each)."""
    if W is None:
        if family == "waterfill":
            W = np.ones(rate.shape)
        n = np.full(rate.shape[0], float(rate.shape[1]))
    else:
        n = row_sums(W)
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


def _occupancy_terms(W, z, s, Q, with_slope: bool = True):
    """Per-customer Schweitzer terms at total occupancy Q: waits w_i, the row sums Σ W_i·Q_i and
    Σ W_i·dQ_i/dQ, and the slopes dQ_i/dQ (W None: every column is a member with weight 1).

    w_i is the non-negative root of w² + b·w + c = 0 with b = z_i + s − Q·s and
    c = s·(s − Q·z_i) (from w_i = s·(Q − Q_i)); where it is positive, Q_i = Q − w_i/s and
    dQ_i/dQ = 1 − (w_i + z_i)/√disc, else the worker never waits: Q_i = s/z_i, slope 0.
    Written with in-place operations: this is the planner's innermost loop (2^20 rows × members).
    """
    s_col = s[:, None]
    b = z + (s * (1.0 - Q))[:, None]
    disc = b * b
    tmp = z * (4.0 * s * Q)[:, None]
    disc += tmp
    disc -= (4.0 * s * s)[:, None]
    np.maximum(disc, 0.0, out=disc)
    root_disc = np.sqrt(disc, out=disc)
    w = np.subtract(root_disc, b, out=b)
    w *= 0.5
    np.maximum(w, 0.0, out=w)
    zw = np.add(z, w, out=tmp)
    occupancy = w + s_col                    # = Q − w/s where w > 0, s/z where it is 0
    occupancy /= zw
    occ_sum = row_sums(occupancy, W)
    if not with_slope:
        return w, occ_sum, None, None
    slope = np.divide(zw, np.maximum(root_disc, 1e-30, out=root_disc), out=zw)
    np.subtract(1.0, slope, out=slope)
    slope[w <= 0.0] = 0.0
    slope_sum = row_sums(slope, W)
    return w, occ_sum, slope_sum, slope


def _solve_waits(W: np.ndarray | None, z: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Per-worker queue waits w_i (rows × units) from the Bard–Schweitzer fixed point.

    Worker i waits behind the others' occupancy of the server, w_i = s·(Q − Q_i), with
    Q_i = (s + w_i)/(z_i + w_i) its own occupancy and z_i its cycle without waiting. For a given
    total Q that is a quadratic in w_i. H(Q) = Σ Q_i(Q) − Q is concave with H(0) > 0 ≥ H(n), so
    it has one root and Newton started at Q = n converges monotonically from the right; run in
    float32 for all rows at once; the waits are then computed in float64 at that Q. W None: every column of z
    is a member (packed rows), which spares the weighted sums.
    """
    z = np.broadcast_to(z, (len(s), z.shape[-1]))
    n = np.full(len(s), float(z.shape[1])) if W is None else row_sums(W)
    f32 = np.float32
    W32 = None if W is None else W.astype(f32)
    z32, s32 = z.astype(f32), s.astype(f32)
    # start right of the root, but closer than n: at the root every w_i = s·(Q − Q_i) ≤ s·Q and
    # Q_i = (s + w_i)/(z_i + w_i) grows with w_i (z_i ≥ s), so Q ≤ f(Q) = Σ (s + s·Q)/(z_i + s·Q);
    # f is increasing, so f(n) ≥ f(Q) ≥ Q bounds the root from above (and f(f(n)) more tightly)
    Q32 = n.astype(f32)
    for _ in range(2):
        sq = (s32 * Q32)[:, None]
        bound = (s32[:, None] + sq) / (z32 + sq)
        Q32 = np.minimum(Q32, row_sums(bound, W32))
    for _ in range(30):
        _, occ, slope, _ = _occupancy_terms(W32, z32, s32, Q32)
        Q_new = np.clip(Q32 - (occ - Q32) / np.minimum(slope - 1.0, -1e-6), 0.0, Q32).astype(f32)
        # Newton converges quadratically: after a step of 1e-3·Q the next would be near float32's
        # noise floor (~1e-6), and the float64 step below squares what is left again, so stop here
        # rather than spend an evaluation to see it (docs/decisions.md#queue-newton-stop)
        done = np.all(Q32 - Q_new <= 1e-3 * Q32 + 1e-12)
        Q32 = Q_new
        if done:
            break
    # one float64 Newton step, and the waits moved along with it to first order
    # (w_i = s·(Q − Q_i) → dw_i/dQ = s·(1 − dQ_i/dQ) where w_i > 0): float64 precision
    # for the price of one evaluation
    Q = Q32.astype(np.float64)
    z = np.ascontiguousarray(z, dtype=np.float64)
    w, occ, slope_sum, slope = _occupancy_terms(W, z, s, Q)
    Q_new = np.clip(Q - (occ - Q) / np.minimum(slope_sum - 1.0, -1e-12), 0.0, n)
    # slope holds 0 where w = 0, so those rows must stay at 0: mask by w > 0
    w += np.where(w > 0.0, (s * (Q_new - Q))[:, None] * (1.0 - slope), 0.0)
    np.maximum(w, 0.0, out=w)
    return w


def solve(weights: np.ndarray, units: Units, model, util_weights: np.ndarray | None = None) -> QueuePrediction:
    """R, Σ g_i·u_i and the measurement variance for every row of `weights` (configs × units).

    `model` is one Contention or a mixture ((weight, Contention), ...) whose predictions are
    averaged with those weights."""
    if not isinstance(model, Contention):
        parts = [(w, solve(weights, units, m, util_weights)) for w, m in model]
        return QueuePrediction(
            *(sum(w * getattr(q, f) for w, q in parts) for f in ("steps_per_s", "weighted_util", "measurement_var"))
        )
    rate = units.rate_steps_per_s
    g = np.zeros_like(rate) if util_weights is None else np.asarray(util_weights, dtype=np.float64)
    sigma2 = units.rate_std_steps_per_s ** 2
    rows = weights.shape[0]
    total, mvar = np.empty(rows), np.empty(rows)
    wutil = np.empty((rows,) + g.shape[1:])
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
    total, mvar = np.empty(W.shape[0]), np.empty(W.shape[0])
    wutil = np.empty((W.shape[0],) + g.shape[1:])
    present = W[:, by_rate] > 0
    sizes = row_sums(W).astype(np.int64)  # 0/1 rows: the member count
    for k in np.unique(sizes):
        rows = np.flatnonzero(sizes == k)
        # flat positions of the members, row-major: each row's k members in rate order
        members = by_rate[(np.flatnonzero(present[rows]) % W.shape[1]).reshape(rows.size, k)]
        packed_rate = rate[members]
        U = utilisation_rows(None, packed_rate, model.family,
                              np.full(rows.size, model.service_s), model.per_worker)
        total[rows] = np.einsum("ij,ij->i", U, packed_rate)
        wutil[rows] = np.einsum("ij,ij...->i...", U, g[members])
        mvar[rows] = np.einsum("ij,ij->i", U * U, sigma2[members])
    return total, wutil, mvar
