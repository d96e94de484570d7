"""Pre-training's wall time: the sequential protocol against pre-training on lanes, side by side.

The sequential protocol is one run at a time: an unmeasured opening run of every device, each
device alone, up to three calibration sets, the fastest device alone again. On lanes, devices
that share nothing are measured alone at the same time, then the fleet together, and a further
set only while the choice is a near-tie and the budget affords it (profiling/lane_phase.py).
Each case brings up its emulated fleet once and runs both protocols in interleaved pairs (A B,
then B A, ...) through the CLI a user runs, each on a fresh workdir with no known devices; prints
every run's wall time (the profile's ``pretrain_time_s``) and steps, and per case the median
ratio lanes / sequential (target: a third or less).

    .venv/bin/python benchmarks/pretraining_cost.py [--cases demo,mobilenet] [--pairs 1]

Cases: ``demo`` is `make demo`'s job (server, jetson-nano, rpi4; small_cnn on digits at 32x32x1,
batch 32, 3000 steps, planned by EDP); ``mobilenet`` is jetson-xavier, rpi4 and phone with
mobilenet_v2 at 32x32x3, batch 8, 300 steps, profiled for every objective as `evaluate` does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROTOCOLS = ("sequential", "lanes")


def _cases(data: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Each case's devices and the CLI command that pre-trains (without --inventory and --workdir)."""
    return {
        "demo": (["server", "jetson-nano", "rpi4"],
                 ["plan", "--objective", "edp", "--model", "small_cnn", "--input-shape", "32x32x1", "--classes", "10",
                  "--batch-size", "32", "--total-steps", "3000", "--data", str(data), "--eval-split", "0.2"]),
        "mobilenet": (["jetson-xavier", "rpi4", "phone"],
                      ["profile", "--model", "mobilenet_v2", "--input-shape", "32x32x3", "--classes", "10",
                       "--batch-size", "8", "--total-steps", "300"]),
    }


def one_run(command: list[str], inventory: Path, workdir: Path, protocol: str) -> dict:
    env = dict(os.environ, HETCLUSTER_MEASUREMENTS="off")   # every device measured: nothing known before
    done = subprocess.run([sys.executable, "-m", "hetcluster.cli.app", *command, "--inventory", str(inventory),
                           "--workdir", str(workdir), "--pretrain-protocol", protocol],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{protocol} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads((workdir / "profile.json").read_text())


def measure(case: str, devices: list[str], command: list[str], pairs: int, root: Path) -> float:
    from hetcluster.emulation.catalog import load_catalog
    from hetcluster.emulation.cluster import cluster_down, cluster_up

    catalog = load_catalog()
    inventory = root / case / "cluster.toml"
    cluster_up([catalog[d] for d in devices], inventory, name=f"pc{case[:4]}", state_dir=root / case / "state")
    ratios = []
    try:
        for pair in range(pairs):
            seconds = {}
            for protocol in (PROTOCOLS if pair % 2 == 0 else PROTOCOLS[::-1]):
                profile = one_run(command, inventory, root / case / f"{protocol}-{pair}", protocol)
                seconds[protocol] = profile["pretrain_time_s"]
                print(f"{case} pair {pair}: {protocol:>10} {seconds[protocol]:6.1f} s, "
                      f"{profile['pretrain_steps']} steps counted, {len(profile['runs'])} calibration sets", flush=True)
            ratios.append(seconds["lanes"] / seconds["sequential"])
            print(f"{case} pair {pair}: lanes / sequential {ratios[-1]:.3f}", flush=True)
    finally:
        cluster_down(root / case / "state")
    median = statistics.median(ratios)
    print(f"{case}: median lanes / sequential {median:.3f} over {len(ratios)} interleaved pairs on {'+'.join(devices)} "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="demo,mobilenet")
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    from hetcluster.models.digits import write_digits_npz

    with tempfile.TemporaryDirectory(prefix="hetcluster-pretraining-cost-") as tmp:
        root = Path(tmp)
        cases = _cases(write_digits_npz(root / "digits.npz"))
        for case in args.cases.split(","):
            devices, command = cases[case]
            measure(case, devices, command, args.pairs, root)


if __name__ == "__main__":
    main()
