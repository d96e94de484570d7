"""Steps/s of a job trained through hetcluster's coordinator against a bare TF ParameterServerStrategy
loop on the SAME servers in the same run.

One cluster is launched through the agents of a fixed subset (``launch_cluster``: a TF worker on
each device, the PS here). On those servers, alternately:

* **hetcluster** — ``coordinator.train_on``: what `hetcluster train` runs once the servers are up
  (PowerRecorders streaming every chosen device's power at TRAIN_POWER_RATE_HZ, the engine in a fresh process
  via ``run_in_subprocess`` with its progress relay, exact-step gating and timestamps);
* **bare** — the textbook PSS loop (``benchmarks/training_engine_overhead.bare_loop``) in a fresh
  process.

Both train small_cnn (32x32x3, batch 32) with 20 warm-up steps and then time ``--steps`` steps.
Prints each pair and the median ratio hetcluster / bare (target >= 0.97).

    .venv/bin/python benchmarks/ps_overhead.py --inventory cluster.toml --devices server,jetson-nano [--steps 300]
    [--reps 3]

``--no-power`` leaves the PowerRecorders out, to tell their cost from the engine's.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

WARMUP_STEPS = 20


def bare_steps_per_s(launched, steps: int) -> float:
    """The bare loop of training_engine_overhead.py in a fresh process, the chief on the launched
    cluster's training plane (one PS cluster per process)."""
    from training_engine_overhead import bare_steps_per_s as bare  # this folder: the script's own

    return bare(launched.addresses, steps, launched.plane)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, default=Path("cluster.toml"))
    parser.add_argument("--devices", default="server,jetson-nano", help="The fixed subset (comma-separated).")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--power-rate-hz", type=float, default=0.0,
                        help="PowerRecorder rate during the hetcluster runs (default: what `hetcluster train` uses).")
    parser.add_argument("--no-power", action="store_true",
                        help="Diagnosis: no PowerRecorders during the hetcluster runs (engine path alone).")
    args = parser.parse_args()
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")

    from hetcluster.inventory import load_inventory
    from hetcluster.models.spec import ModelSpec
    from hetcluster.training.coordinator import TRAIN_POWER_RATE_HZ, PowerMeter, train_on
    from hetcluster.training.launch import launch_cluster
    from hetcluster.training.spec import TrainSpec

    args.power_rate_hz = args.power_rate_hz or TRAIN_POWER_RATE_HZ
    inventory = load_inventory(args.inventory)
    chosen = [name.strip() for name in args.devices.split(",") if name.strip()]
    spec = TrainSpec(model=ModelSpec("small_cnn", (32, 32, 3), 10, 32), total_steps=args.steps + WARMUP_STEPS,
                     warmup_steps=WARMUP_STEPS)
    ratios = []
    with launch_cluster([inventory.device(n) for n in chosen], inventory.parameter_server_host) as launched:
        for rep in range(args.reps):
            bare = bare_steps_per_s(launched, args.steps)
            with PowerMeter(inventory, [] if args.no_power else chosen, rate_hz=args.power_rate_hz) as meter:
                result = train_on(launched, chosen, spec, meter, on_progress=lambda *_: None, run_timeout_s=900)
            ratios.append(result.steps_per_s / bare)
            print(f"rep {rep}: bare PSS loop {bare:.2f} steps/s, hetcluster {result.steps_per_s:.2f} steps/s "
                  f"({', '.join(f'{w} {s}' for w, s in result.steps_per_worker.items())}), ratio {ratios[-1]:.3f}",
                  flush=True)
    print(f"median ratio hetcluster/bare: {statistics.median(ratios):.3f} over {len(ratios)} pairs "
          f"(small_cnn 32x32x3, batch 32, workers {'+'.join(chosen)}, {args.steps} timed steps, "
          f"power recorders {'off' if args.no_power else f'at {args.power_rate_hz:g} Hz'}; "
          f"load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
