"""Time to plan: exact enumeration of n = 10, 15, 20 devices, and 1000 devices in 12 classes.

Targets (issue 4, on the 2-core development machine): ≤ 1 s for n = 20, ≤ 2 s for 1000 devices.
Each fleet gets solo measurements plus three multi-device runs generated from a contention model
of the given family, so the planner fits that family (the queue family costs a per-configuration
Newton solve, the water-filling family two cumulative sums). Prints figures; asserts nothing.

    .venv/bin/python benchmarks/planner_scale.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from hetcluster.planner import DeviceMeasurement, FittedModels, JobSpec, RunMeasurement, choose, estimate, plan
from hetcluster.planner.throughput import Contention, utilisation


def fleet(n: int, classes: int | None, rng: np.random.Generator):
    kinds = classes or n
    rate = rng.uniform(0.5, 25.0, kinds)
    idle = rng.uniform(1.0, 60.0, kinds)
    busy = idle + rng.uniform(2.0, 150.0, kinds)
    devices = []
    for i in range(n):
        k = i % kinds
        devices.append(DeviceMeasurement(f"d{i}", float(rate[k]), float(busy[k]), float(idle[k]),
                                         class_key=f"k{k}" if classes else None))
    return devices


def runs_for(devices, family: str, rng) -> list[RunMeasurement]:
    """Three calibration runs (all, the two fastest, the fastest half) from a known contention."""
    rates = np.array([d.steps_per_s for d in devices])
    order = np.argsort(-rates)
    truth = Contention(family, 1.0 / (0.5 * rates[order[: max(2, len(rates) // 4)]].sum() + rates.max()))
    runs = []
    for subset in (order, order[:2], order[: len(order) // 2]):
        W = np.zeros((1, len(devices)))
        W[0, subset] = 1.0
        x = utilisation(W, rates, truth)[0] * rates
        total = float(x[subset].sum()) * float(np.exp(rng.normal(0, 0.02)))
        power = float(
            sum(
                devices[i].idle_power_w + (devices[i].busy_power_w - devices[i].idle_power_w) * x[i] / rates[i]
                for i in subset
            )
        )
        names = tuple(devices[i].name for i in subset)
        runs.append(RunMeasurement(names, 100, 100 / total, total, power,
                                   per_device_steps={devices[i].name: int(round(x[i] * 100 / total)) for i in subset}))
    return runs


def timed(fn, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    job = JobSpec(total_steps=20000)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs (shared machine)")
    print(f"{'fleet':<28}{'family':<11}{'configs':>10}{'fit s':>8}{'estimate s':>12}{'choose s':>10}{'plan s':>9}")
    for family in ("waterfill", "queue"):
        for n in (10, 15, 20):
            devices = fleet(n, None, rng)
            runs = runs_for(devices, family, rng)
            fit_s, models = timed(lambda: FittedModels.fit(devices, runs, job), args.repeat)
            est_s, table = timed(lambda: estimate(devices, runs, job, models=models), args.repeat)
            choose_s, _ = timed(lambda: choose(table, "edp"), args.repeat)
            print(f"{f'{n} devices (exact)':<28}{models.throughput.contention.family:<11}{len(table):>10}"
                  f"{fit_s:>8.3f}{est_s:>12.3f}{choose_s:>10.3f}{fit_s + est_s + choose_s:>9.3f}")
        devices = fleet(1000, 12, rng)
        runs = runs_for(devices, family, rng)
        fit_s, models = timed(lambda: FittedModels.fit(devices, runs, job), 1)
        plan_s, result = timed(lambda: plan(devices, runs, job, "edp", models=models), args.repeat)
        total = result.table.attrs.get("configurations_total", len(result.table))
        print(
            f"{'1000 devices, 12 classes':<28}{models.throughput.contention.family:<11}{len(result.table):>10}"
            f"{fit_s:>8.3f}{'(search)':>12}{'':>10}{fit_s + plan_s:>9.3f}   searched {len(result.table)} of "
            f"{total:.3g} count vectors"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
