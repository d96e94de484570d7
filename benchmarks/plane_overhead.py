"""Throughput of a job on the closed training plane against the same job with the plane open.

The closed plane is what every hetcluster cluster runs on: each TF server in a network namespace of
its own, its traffic forwarded between hosts over mutual TLS (hetcluster.plane). The open plane is
the developer-only switch: TensorFlow's servers on their own ports, as TF alone has them. On an
emulated fleet (``--network shaped`` by default, root: each device behind its own rate-shaped link)
that this script brings up with agents that accept the switch, each model trains in interleaved
pairs (closed then open, then open then closed, ...): a fresh cluster per run, ``--warmup`` steps
left out, then ``--steps`` timed steps (RunResult.steps_per_s, power recorders on as
`hetcluster train` has them). Prints every run, and per model the median of the pairs' ratios
closed / open (target >= 0.95).

    sudo .venv/bin/python benchmarks/plane_overhead.py [--devices server,jetson-nano] [--pairs 3]
        [--models small_cnn,vgg16] [--network shaped|loopback] [--inventory FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

# model -> (input, batch, timed steps, warm-up steps): vgg16 moves ~130 MB of parameters each way per step
JOBS = {"small_cnn": ((32, 32, 3), 32, 300, 20), "vgg16": ((32, 32, 3), 8, 30, 5)}


def one_run(inventory, devices: list[str], spec, open_plane: bool) -> float:
    from hetcluster.training.coordinator import TRAIN_POWER_RATE_HZ, PowerMeter, train_on
    from hetcluster.training.launch import launch_cluster

    with launch_cluster([inventory.device(n) for n in devices], inventory.parameter_server_host,
                        open_plane=open_plane, isolation=inventory.tf_plane_isolation) as launched, \
            PowerMeter(inventory, devices, rate_hz=TRAIN_POWER_RATE_HZ) as meter:
        result = train_on(launched, devices, spec, meter, on_progress=lambda *_: None, run_timeout_s=1800)
    return result.steps_per_s


def measure(inventory, devices: list[str], models: list[str], pairs: int) -> None:
    from hetcluster.models.spec import ModelSpec
    from hetcluster.training.spec import TrainSpec

    for model in models:
        shape, batch, steps, warmup = JOBS[model]
        spec = TrainSpec(model=ModelSpec(model, shape, 10, batch), total_steps=steps + warmup, warmup_steps=warmup)
        ratios = []
        for pair in range(pairs):
            rates = {}
            for open_plane in ((False, True) if pair % 2 == 0 else (True, False)):
                rates[open_plane] = one_run(inventory, devices, spec, open_plane)
                print(
                    f"{model} pair {pair}: {'open' if open_plane else 'closed'} plane {rates[open_plane]:.2f} steps/s",
                    flush=True,
                )
            ratios.append(rates[False] / rates[True])
            print(f"{model} pair {pair}: ratio closed/open {ratios[-1]:.3f}", flush=True)
        print(f"{model}: median ratio closed/open {statistics.median(ratios):.3f} over {len(ratios)} interleaved pairs "
              f"({shape[0]}x{shape[1]}x{shape[2]}, batch {batch}, {steps} timed steps on {'+'.join(devices)}; "
              f"load average {os.getloadavg()[0]:.1f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="server,jetson-nano")
    parser.add_argument("--models", default="small_cnn,vgg16")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--network", default="shaped", help="shaped (root) or loopback")
    parser.add_argument("--inventory", type=Path,
                        help="an emulated fleet already up with --dev-allow-open-plane (else one is brought up)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from hetcluster.emulation.catalog import load_catalog
    from hetcluster.emulation.cluster import cluster_down, cluster_up
    from hetcluster.inventory import load_inventory

    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.inventory:
        measure(load_inventory(args.inventory), devices, models, args.pairs)
        return
    with tempfile.TemporaryDirectory(prefix="plane-overhead-") as tmp:
        inventory = cluster_up(load_catalog(None).select(devices), Path(tmp) / "cluster.toml", name="planebench",
                               network=args.network, state_dir=Path(tmp) / "state", allow_open_plane=True)
        try:
            measure(inventory, devices, models, args.pairs)
        finally:
            cluster_down(Path(tmp) / "state")


if __name__ == "__main__":
    main()
