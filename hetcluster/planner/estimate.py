"""Estimate: one row of predictions per configuration (the planner's only table).

    T(S) = t_pretrain + t_run(S)                             time_s (memory-plan slowdown is in R:
                                                              every r_i divided by the largest
                                                              member's plan slowdown, fleet.py)
    t_run(S) = max((N_rem + Σ_{i∈S} x_i·L_i) / R(S), max_{i∈S} F_i)     for N_rem = N − N_pre > 0
    P(S) = see power.py                                       power_w
    E(S) = E_pretrain + E_run(S), E_run ≈ P(S) · t_run(S)     energy_j (pre-training energy is the
                                                              same for every row: already spent)
    EDP  = E(S) · T(S)                                        edp_js

t_run is a fluid model of a fresh run: worker i completes steps along x_i·(t − L_i), its steady
rate x_i = u_i·r_i in S (contention.py) shifted by its start-up L_i (graph set-up and first steps,
measured alone in pre-training, DeviceProfile.startup_s); the run ends when the N_rem steps are
done, and never before every member's first step F_i has come back (a slow board whose first step
outlasts the others' whole share holds the end of the run: docs/decisions.md#startup-term).
Without start-up measurements (L = F = 0) it is N_rem / R(S). Between the fluid end and that
first step the other members wait idle, so the run's energy drops their dynamic power over that
tail. During its start-up L_i a member draws its start-up power Q_i (measured alone in
pre-training, DeviceProfile.startup_power_w) instead of its power in S, P_i(S) = γ·(p_i + u_i·(P_i − p_i)):

    E_run(S) = P(S)·t_run − tail − Σ_{i∈S} (P_i(S) − Q_i)·L_i

(members without a measured Q_i keep P_i(S)), and power_w is the run's mean E_run/t_run, as a
meter over the run would read it.

Relative uncertainties: σ_T = σ_R on the remaining part; σ_E = sqrt(σ_P² + σ_R²) on the remaining
part; σ_EDP = σ_E + σ_T (relative, added rather than in quadrature because E and T share the
throughput error).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from hetcluster.errors import PlanningError
from hetcluster.planner.configurations import (
    DeviceSetArray,
    class_configurations,
    count_class_configurations,
    enumerate_configurations,
    labels_for_counts,
    membership,
    names_for_counts,
    row_sums,
)
from hetcluster.planner.fleet import Units
from hetcluster.planner.inputs import JobSpec, usable_runs, validate_inputs
from hetcluster.planner.power import PowerModel
from hetcluster.planner.solo_rates import revise_solo_rates
from hetcluster.planner.throughput import ThroughputModel

log = logging.getLogger(__name__)

EXACT_MAX_DEVICES = 20
MAX_TABLE_ROWS = 4_000_000
COLUMN_ORDER = ("n_workers", "steps_per_s", "steps_per_s_std", "time_s", "time_s_std", "power_w", "power_w_std",
                "energy_j", "energy_j_std", "edp_js", "edp_js_std", "demand_steps_per_s", "memory_fits")


@dataclass(frozen=True)
class FittedModels:
    """Everything estimation needs, fitted once before any configuration is evaluated."""

    throughput: ThroughputModel
    power: PowerModel
    job: JobSpec

    @classmethod
    def fit(cls, devices, runs, job: JobSpec, *, use_regression: bool | None = None,
            revise_rates: bool = True) -> "FittedModels":
        """revise_rates: revise the solo rates by the sets' measurements of each member
        (solo_rates.py) and fit the contention again on them; False keeps the solo windows."""
        devices = tuple(devices)
        validate_inputs(devices, (), job)
        runs = usable_runs(devices, runs)
        throughput = ThroughputModel.fit(devices, runs, use_regression=use_regression)
        if revise_rates and throughput.n_calibration_runs:
            revised = revise_solo_rates(devices, runs, throughput)
            if revised != devices:   # no set measured a member: the fit stands
                throughput = ThroughputModel.fit(revised, runs, use_regression=use_regression)
        return cls(throughput, PowerModel.fit(throughput, runs), job)


def weights_of(units: Units, configs: np.ndarray) -> np.ndarray:
    """Bit masks (device units) or count vectors (class units) → float weight matrix."""
    if units.is_classes:
        return np.asarray(configs, dtype=np.float64)
    return membership(np.asarray(configs, dtype=np.int64), units.size)


def evaluate(
    models: FittedModels, units: Units, configs: np.ndarray, chunk_rows: int = 1 << 12
) -> dict[str, np.ndarray]:
    """Predict every column for configurations (masks or count vectors), chunk by chunk so the
    weight matrices stay small and in cache. Each member's rate is its own under its own memory
    plan (every worker trains under its device's plan: Units.rate_steps_per_s)."""
    if len(configs) == 0:
        raise PlanningError("No configurations to evaluate.")
    out: dict[str, np.ndarray] = {}
    floats = None
    for start in range(0, len(configs), chunk_rows):
        where = slice(start, start + chunk_rows)
        part = _evaluate_under(models, units, weights_of(units, configs[where]))
        if floats is None:  # the float columns share one row-major block: no copy into pandas
            names = [k for k, v in part.items() if v.dtype == np.float64]
            floats = np.empty((len(configs), len(names)))
            out = {k: floats[:, i] for i, k in enumerate(names)}
            out.update({k: np.empty(len(configs), dtype=v.dtype) for k, v in part.items() if k not in out})
        for key, value in part.items():
            out[key][where] = value
    return out


def _evaluate_under(models: FittedModels, units: Units, weights: np.ndarray) -> dict[str, np.ndarray]:
    job = models.job
    dynamic_w = units.busy_power_w - units.idle_power_w
    startup = units.has_startup and job.remaining_steps > 0
    if startup:  # Σ W_i·u_i·g_i for g = power above idle, steps lost to start-up r_i·L_i, and (P_i − p_i)·L_i
        # over the members whose start-up power was measured (the others' start-up stays priced at P_i(S))
        start_s, start_w = units.measured_startup()
        util_weights = np.column_stack([dynamic_w, units.rate_steps_per_s * units.startup_s, dynamic_w * start_s])
    else:
        util_weights = dynamic_w
    steps, rel_r, q, factor = models.throughput.predict_weights(weights, units, util_weights)
    dynamic_util = q.weighted_util[:, 0] if startup else q.weighted_util
    power, rel_p = models.power.predict(weights, units, dynamic_util, factor, job.idle_power_counts)
    steady_s = job.remaining_steps / steps
    remaining_s = steady_s
    rest_j = power * remaining_s
    if startup:  # Σ x_i·L_i = Σ u_i·r_i·L_i·factor; the slowest first step over the members
        lagged_s = (job.remaining_steps + q.weighted_util[:, 1] * factor) / steps
        first = np.where(weights > 0, units.first_step_s[None, :], -np.inf)
        straggler = first.argmax(axis=1)
        remaining_s = np.maximum(lagged_s, first[np.arange(len(straggler)), straggler])
        # past the fluid end only the straggler's first step runs: the others wait idle
        busy_w = models.power.dynamic(weights, units, dynamic_util, factor)
        tail_w = np.maximum(busy_w - dynamic_w[straggler], 0.0)
        # during its start-up L_i a member draws its measured start-up power, not its power in S
        # (members without a measured start-up power keep the training power: both terms 0)
        start_gap_j = (models.power.members_weighted(weights, units, q.weighted_util[:, 2], factor, start_s)
                       - weights @ (start_w * start_s))
        rest_j = power * remaining_s - tail_w * (remaining_s - lagged_s) - start_gap_j
        power = rest_j / np.maximum(remaining_s, 1e-300)  # the run's mean power, as measured
    time_s = job.pretrain_time_s + remaining_s
    energy_j = job.pretrain_energy_j + rest_j
    if units.memory_fits.all():
        fits = np.ones(weights.shape[0], dtype=bool)
    else:
        fits = weights @ (~units.memory_fits).astype(np.float64) == 0.0
    time_std = steady_s * rel_r
    energy_std = rest_j * np.sqrt(rel_p ** 2 + rel_r ** 2)
    rel_t = time_std / time_s
    rel_e = energy_std / np.maximum(energy_j, 1e-300)
    return {
        "n_workers": row_sums(weights).astype(np.int64),
        "demand_steps_per_s": weights @ units.rate_steps_per_s,  # Σ r_i: throughput without contention
        "steps_per_s": steps,
        "steps_per_s_std": steps * rel_r,
        "time_s": time_s,
        "time_s_std": time_std,
        "power_w": power,
        "power_w_std": power * rel_p,
        "energy_j": energy_j,
        "energy_j_std": energy_std,
        "edp_js": energy_j * time_s,
        "edp_js_std": energy_j * time_s * (rel_e + rel_t),  # E and T share the throughput error
        "memory_fits": fits,
    }


def table_from(units: Units, configs: np.ndarray, columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """The estimate DataFrame for masks (device units) or count vectors (class units)."""
    if units.is_classes:
        head = {
            "devices": names_for_counts(configs, units.members),
            "classes": labels_for_counts(configs, units.labels),
        }
    else:
        head = {"devices": DeviceSetArray(configs, units.labels), "mask": configs}
    bases = {id(v.base): v.base for v in columns.values() if isinstance(v.base, np.ndarray) and v.base.ndim == 2}
    block = next(iter(bases.values())) if len(bases) == 1 else None
    if block is not None:  # evaluate()'s shared float block: hand it to pandas without a copy
        names = [k for k in columns if columns[k].base is block]
        frame = pd.DataFrame(block, columns=names, copy=False)
        rest = {k: v for k, v in columns.items() if k not in names}
        table = pd.concat([pd.DataFrame({**head, **rest}), frame], axis=1)
    else:
        table = pd.DataFrame({**head, **columns})
    table = table[
        list(head) + [k for k in COLUMN_ORDER if k in columns] + [k for k in columns if k not in COLUMN_ORDER]
    ]
    table.attrs["mode"] = "classes" if units.is_classes else "devices"
    table.attrs["device_names"] = units.labels if not units.is_classes else tuple(n for m in units.members for n in m)
    return table


def resolve_mode(devices, mode: str) -> bool:
    """True for class aggregation. mode: auto | devices | classes. auto groups classes when there are
    more than 20 devices, or when devices share a class_key: their measurements are one (pre-training
    measured one of them alone), so listing rpi4-1+x and rpi4-2+x apart would only repeat rows."""
    if mode not in ("auto", "devices", "classes"):
        raise PlanningError(f"Unknown planning mode {mode!r}.", hint="use auto, devices or classes.")
    n_devices = len(devices)
    if mode == "devices" and n_devices > EXACT_MAX_DEVICES + 4:
        raise PlanningError(
            f"Exact enumeration of {n_devices} devices ({2 ** n_devices - 1} configurations) is too large.",
            hint="use mode 'classes' and give identical devices the same class_key.",
        )
    keys = [d.class_key for d in devices if d.class_key is not None]
    shared = len(set(keys)) < len(keys)
    return mode == "classes" or (mode == "auto" and (n_devices > EXACT_MAX_DEVICES or shared))


def estimate(
    devices,
    runs,
    job: JobSpec,
    *,
    mode: str = "auto",
    models: FittedModels | None = None,
    first: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Predict time, power, energy and EDP (with stds) for every configuration of the fleet.

    `first` orders devices inside a class (required devices picked first). Raises PlanningError
    when class aggregation still leaves too many count vectors: use planner.plan() there.
    """
    devices = tuple(devices)
    models = models or FittedModels.fit(devices, runs, job)
    classes = resolve_mode(devices, mode)
    if classes:
        from hetcluster.planner.fleet import class_units

        units = class_units(devices, first=first)
        total = count_class_configurations(units.counts)
        if total > MAX_TABLE_ROWS:
            raise PlanningError(
                f"{len(devices)} devices in {units.size} classes have {total} configurations, too many to list.",
                hint="use planner.plan() with an objective (it searches count vectors), or group more devices into "
                     "classes.",
            )
        configs = class_configurations(units.counts)
    else:
        units = models.throughput.units(classes=False)
        configs = enumerate_configurations(units.size)
        # by size, so each solve chunk packs rows of one or two sizes (the table is re-sorted
        # by the objective anyway; `mask` keeps each row's identity)
        configs = configs[np.argsort(np.bitwise_count(configs), kind="stable")]
    columns = evaluate(models, units, configs)
    log.debug("estimated %d configurations (%s)", len(configs), "classes" if classes else "devices")
    return table_from(units, configs, columns)
