"""What a device's own power stream costs its training: solo runs alternating without and with one.

A diagnostic for the emulated fleet: on a fresh fleet it launches one device's TF servers once and
trains it alone in consecutive runs of ``--steps`` steps (each continues one checkpoint), every
other run with a power stream from the device's agent at ``--power-hz`` (pre-training streams at
10 Hz, training at 2 Hz). It prints each run's rate past its warm-up and the two conditions'
means, the first run (the worker's cold start) left out. Alternating in one fleet keeps the
host's drift out of the difference; the run-to-run spread of such runs is several per cent, so
read a difference against the spread it prints.

    .venv/bin/python -m experiments.investigations.stream_cost --device phone --runs 9

Results: ``rows.json`` (run, power_hz, steps_per_s, mean_step_s) and ``machine.json`` under
--out-dir (default experiments/results/stream_cost/<model>-<device>, not kept in the repository). It
trains: run it with nothing else on the host.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from experiments.common import RESULTS, emulated_fleet, machine_info, write_json


def run_rate(result: Any) -> tuple[float, float]:
    """A solo run's rate past its warm-up as pre-training reads it (``RunResult.steps_per_s``) and
    its mean step's duration on the worker (s, ``RunResult.step_durations_s``)."""
    durations = result.step_durations_s()
    if len(durations) < 2:
        raise SystemExit("error: too few steps past the warm-up; raise --steps.")
    return result.steps_per_s, statistics.fmean(durations)


def rates_by_condition(rows: list[dict]) -> dict[float, list[float]]:
    """Each power rate's run rates, the first run (cold worker) left out."""
    by_rate: dict[float, list[float]] = {}
    for row in rows[1:]:
        by_rate.setdefault(row["power_hz"], []).append(row["steps_per_s"])
    return by_rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="phone", help="the emulated device (catalog name)")
    parser.add_argument("--runs", type=int, default=9, help="runs in all, alternating: without, with, without…")
    parser.add_argument("--steps", type=int, default=40, help="steps per run")
    parser.add_argument("--power-hz", type=float, default=10.0, help="the stream's rate in the runs with one")
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--input-shape", default="32x32x3")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--out-dir", type=Path)
    args = parser.parse_args(argv)
    if args.runs < 3 or args.steps <= args.warmup_steps + 1 or not args.power_hz > 0:
        parser.error("--runs must be at least 3, --steps above --warmup-steps + 1, --power-hz positive")

    from hetcluster.agent.client import PowerRecorder
    from hetcluster.inventory import load_inventory
    from hetcluster.models.datasets import DataSource
    from hetcluster.models.spec import ModelSpec, parse_input_shape
    from hetcluster.training.launch import launch_cluster
    from hetcluster.training.run_job import run_in_subprocess
    from hetcluster.training.spec import TrainSpec

    out_dir = args.out_dir or RESULTS / "stream_cost" / f"{args.model}-{args.device}"
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "machine.json", {"before": machine_info(), "command": sys.argv})
    model = ModelSpec(args.model, parse_input_shape(args.input_shape), 10, args.batch_size)
    rows: list[dict] = []
    with emulated_fleet(Path(tempfile.gettempdir()) / "hetcluster-stream-cost", [args.device],
                        name="streamcost") as inventory_path:
        inventory = load_inventory(inventory_path)
        device = inventory.device(args.device)
        steps_total = 0
        with tempfile.TemporaryDirectory(prefix="stream-cost-") as checkpoint_dir, \
                launch_cluster([device], inventory.parameter_server_host) as shared:
            for run in range(args.runs):
                power_hz = args.power_hz if run % 2 else 0.0
                client = device.client() if power_hz else None
                recorder = PowerRecorder(client, rate_hz=power_hz).start() if client else None
                spec = TrainSpec(model=model, total_steps=steps_total + args.steps, data=DataSource(),
                                 checkpoint_dir=checkpoint_dir, warmup_steps=args.warmup_steps)
                try:
                    result = run_in_subprocess(spec, shared.addresses.subset([args.device]), timeout_s=1800,
                                               plane=shared.plane)
                finally:
                    if recorder is not None:
                        recorder.stop()
                        client.close()
                steps_total = result.steps_total
                rate, mean_step_s = run_rate(result)
                rows.append({"run": run, "power_hz": power_hz, "steps_per_s": rate, "mean_step_s": mean_step_s})
                print(f"run {run}: {'%g Hz stream' % power_hz if power_hz else 'no stream':<14} "
                      f"{rate:.3f} steps/s, mean step {1000 * mean_step_s:.0f} ms", flush=True)
    write_json(out_dir / "rows.json", rows)
    for power_hz, rates in sorted(rates_by_condition(rows).items()):
        print(f"{'%g Hz stream' % power_hz if power_hz else 'no stream':<14} mean {statistics.fmean(rates):.3f} "
              f"steps/s over {len(rates)} runs (min {min(rates):.3f}, max {max(rates):.3f}), first run left out")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
