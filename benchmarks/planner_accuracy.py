"""How often the planner picks the truly best configuration on random fleets it was not tuned on.

Ground truth comes from synthetic contention models that are NOT the planner's own queue model:

  waterfill   hard capacity C shared max-min fairly (CPU quotas on an oversubscribed host):
              x_i = min(r_i, θ) with Σ x_i = min(Σ r_i, C)
  overhead    waterfill whose capacity shrinks by a fraction κ per extra worker (coordinator
              threads, heartbeats): C_n = C·(1 − κ(n − 1))
  fcfs        a discrete-event simulation: each worker computes for its own time, then queues
              FIFO at one parameter server with a fixed service time per step

Power in every truth: p_i + (P_i − p_i)·x_i/r_i (a waiting device draws less). Pre-training is
simulated like the profiler does it: every device alone and three multi-device runs (all devices,
the two fastest, all but the fastest; or with --sets profiler the sets hetcluster.profiling
chooses), each with 3 % multiplicative noise (--noise). The truth is evaluated
without noise. Prints the hit rate (chosen == truly best) and the mean regret per objective.

    .venv/bin/python benchmarks/planner_accuracy.py [--fleets 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from hetcluster.planner import DeviceMeasurement, FittedModels, JobSpec, RunMeasurement, choose, estimate
from hetcluster.planner.throughput import waterfill  # exact max-min shares (the truth's own arithmetic)

OBJECTIVES = ("time", "power", "energy", "edp")
SETS = "spread"  # or "profiler": hetcluster.profiling.sets.calibration_sets
NAIVE = False     # --naive: ignore the multi-device runs (R = Σ r_i, P = Σ busy), for comparison


def fcfs(rates: np.ndarray, service_s: float, steps: int = 1500, seed: int = 0) -> np.ndarray:
    """Per-worker steps/s of workers that compute 1/r_i − s, then queue FIFO for s seconds."""
    rng = np.random.default_rng(seed)
    compute = np.maximum(1.0 / rates - service_s, 1e-6)
    ready = compute * rng.uniform(0.0, 1.0, rates.size)  # staggered start
    server_free, done = 0.0, np.zeros(rates.size)
    for _ in range(steps):
        i = int(np.argmin(ready))
        start = max(ready[i], server_free)
        server_free = start + service_s
        done[i] += 1
        ready[i] = server_free + compute[i] * rng.uniform(0.9, 1.1)
    return done / server_free


class Truth:
    def __init__(self, kind: str, rng: np.random.Generator, rates: np.ndarray):
        self.kind = kind
        total = rates.sum()
        self.capacity = float(rng.uniform(0.3, 1.2) * total)
        self.capacity = max(self.capacity, 1.05 * rates.max())
        self.kappa = float(rng.uniform(0.02, 0.08))
        self.service_s = float(rng.uniform(0.2, 1.0) / max(self.capacity, rates.max()))
        self.service_s = min(self.service_s, 0.9 / rates.max())

    def per_device(self, rates: np.ndarray) -> np.ndarray:
        if self.kind == "waterfill":
            return waterfill(rates, self.capacity)
        if self.kind == "overhead":
            cap = self.capacity * max(1.0 - self.kappa * (rates.size - 1), 0.2)
            return waterfill(rates, max(cap, 0.5 * rates.max()))
        return fcfs(rates, self.service_s)


def random_fleet(rng: np.random.Generator, n: int):
    kinds = [  # (rate, idle, busy) ranges modelled on server / Jetson / Pi / phone
        ((10, 40), (40, 90), (150, 300)),
        ((3, 10), (3, 6), (10, 20)),
        ((1, 4), (1.5, 3), (5, 10)),
        ((0.4, 1.5), (2, 3), (5, 7)),
        ((0.3, 1.2), (0.5, 1.5), (3, 6)),
    ]
    devices = []
    for i in range(n):
        (r0, r1), (i0, i1), (b0, b1) = kinds[int(rng.integers(0, len(kinds)))]
        devices.append((f"d{i}", rng.uniform(r0, r1), rng.uniform(i0, i1), rng.uniform(b0, b1)))
    return devices


def simulate(truth: Truth, fleet, subset, noise: float, rng) -> tuple[float, float, dict]:
    """(aggregate steps/s, summed power, per-device steps/s) of one run; with noise, every
    device's throughput is jittered (so the aggregate is the sum of the jittered ones)."""
    rates = np.array([fleet[i][1] for i in subset])
    x = truth.per_device(rates)
    power = sum(fleet[i][2] + (fleet[i][3] - fleet[i][2]) * xi / fleet[i][1] for i, xi in zip(subset, x))
    if noise:
        x = x * np.exp(rng.normal(0.0, noise, x.size))
        power *= float(np.exp(rng.normal(0.0, noise)))
    return float(x.sum()), power, {fleet[i][0]: xi for i, xi in zip(subset, x)}


def one_fleet(seed: int, kind: str, n: int, idle_counts: bool, noise: float = 0.03):
    rng = np.random.default_rng(seed)
    fleet = random_fleet(rng, n)
    truth = Truth(kind, rng, np.array([f[1] for f in fleet]))
    devices = [
        DeviceMeasurement(
            name,
            r * float(np.exp(rng.normal(0, noise))),
            busy * float(np.exp(rng.normal(0, noise))),
            idle,
            steps_per_s_std=noise * r,
        )
        for name, r, idle, busy in fleet
    ]
    order = np.argsort([-f[1] for f in fleet])
    if SETS == "profiler":
        from hetcluster.profiling.sets import calibration_sets

        index = {f[0]: i for i, f in enumerate(fleet)}
        chosen_sets = calibration_sets({d.name: d.steps_per_s for d in devices})
        calibration = [tuple(sorted(index[name] for name in names)) for names in chosen_sets]
    elif SETS == "half":
        calibration = [tuple(range(n)), tuple(sorted(order[:2])), tuple(sorted(order[: (n + 1) // 2]))]
    else:
        calibration = [tuple(range(n)), tuple(sorted(order[:2])), tuple(sorted(order[1:]))]
    runs = []
    for subset in calibration:
        steps_per_s, power_w, per_dev = simulate(truth, fleet, subset, noise, rng)
        t = 100 / steps_per_s
        runs.append(RunMeasurement(tuple(fleet[i][0] for i in subset), 100, t, steps_per_s, power_w,
                                   per_device_steps={k: int(round(v * t)) for k, v in per_dev.items()}))
    job = JobSpec(total_steps=5000, idle_power_counts=idle_counts)
    table = estimate(devices, runs, job, models=FittedModels.fit(devices, [] if NAIVE else runs, job))
    # ground truth for every configuration (noise-free)
    truth_rows = {}
    for k in range(1, n + 1):
        for subset in itertools.combinations(range(n), k):
            steps_per_s, power_w, _ = simulate(truth, fleet, subset, 0.0, rng)
            if idle_counts:
                power_w += sum(fleet[i][2] for i in range(n) if i not in subset)
            t = 5000 / steps_per_s
            truth_rows[tuple(fleet[i][0] for i in subset)] = {"time": t, "power": power_w, "energy": power_w * t,
                                                               "edp": power_w * t * t}
    result = {}
    for objective in OBJECTIVES:
        chosen = choose(table, objective).chosen
        best = min(truth_rows.values(), key=lambda row: row[objective])[objective]
        got = truth_rows[tuple(chosen)][objective]
        result[objective] = (got <= best * (1 + 1e-9), got / best - 1.0)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleets", type=int, default=30, help="fleets per truth model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=6)
    parser.add_argument("--noise", type=float, default=0.03, help="relative measurement noise of pre-training")
    parser.add_argument("--sets", choices=("spread", "half", "profiler"), default="spread",
                        help="calibration sets: all/two fastest/all but fastest (spread), all/two fastest/faster "
                             "half (half), or the profiler's own choice")
    parser.add_argument("--truths", default="waterfill,overhead,fcfs", help="comma-separated truth models")
    parser.add_argument("--naive", action="store_true", help="baseline: plan without the multi-device runs")
    args = parser.parse_args()
    global SETS, NAIVE
    SETS, NAIVE = args.sets, args.naive
    started = time.perf_counter()
    totals = {o: [] for o in OBJECTIVES}
    kinds = [k.strip() for k in args.truths.split(",") if k.strip()]
    for kind in kinds:
        per_kind = {o: [] for o in OBJECTIVES}
        for f in range(args.fleets):
            res = one_fleet(args.seed * 100003 + f, kind, args.devices, idle_counts=bool(f % 2), noise=args.noise)
            for o in OBJECTIVES:
                per_kind[o].append(res[o])
                totals[o].append(res[o])
        line = "  ".join(
            f"{o}: {100 * np.mean([h for h, _ in v]):5.1f}% (regret {100 * np.mean([r for _, r in v]):4.1f}%)"
            for o, v in per_kind.items()
        )
        print(f"{kind:10s} {line}")
    hits = [h for v in totals.values() for h, _ in v]
    print(
        f"overall hit rate {100 * np.mean(hits):.1f}% over {len(hits)} choices "
        f"({args.fleets} fleets × {len(kinds)} truths × 4 objectives, {args.devices} devices, noise {args.noise:g}) "
        f"in {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
