"""What a solo run costs the coordinator's host beside its device, and what running solos at once does.

A diagnostic for pre-training on lanes (profiling/lanes.py): on a fresh emulated fleet it trains
each device alone, twice, and reads the CPU its training process, parameter server and the plane
took over the run's measured window (every process this one started, and itself), in cores and in
milliseconds per step. Then it trains every device alone at the same time, each on its own lane,
and prints each one's rate against its rate alone: on a shared host, runs at once are faithful
only while the devices' shares and these costs fit its cores.

    .venv/bin/python -m experiments.investigations.lane_host_cost --devices server,jetson-nano,rpi4

It trains: run it with nothing else on the host. Prints only; nothing is kept.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from experiments.common import emulated_fleet


class _ChildCpu:
    """CPU seconds of this process and every process it started, those that ended included."""

    def __init__(self) -> None:
        import psutil

        self.me, self.seen = psutil.Process(), {}

    def read(self) -> float:
        import psutil

        for child in self.me.children(recursive=True):
            try:
                self.seen[child.pid] = sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return sum(self.me.cpu_times()[:2]) + sum(self.seen.values())


def _solo(cluster: Any, name: str, spec: Any, lane: int = 0) -> Any:
    from hetcluster.training.run_job import run_in_subprocess

    return run_in_subprocess(spec, cluster.lane([name], lane), plane=cluster.plane, timeout_s=900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="server,jetson-nano,rpi4")
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--window-s", type=float, default=6.0)
    args = parser.parse_args()
    from hetcluster.inventory import load_inventory
    from hetcluster.models.spec import ModelSpec
    from hetcluster.training.launch import launch_cluster
    from hetcluster.training.spec import TrainSpec

    devices = args.devices.split(",")
    model = ModelSpec(args.model, (32, 32, 3), 10, 32)
    with tempfile.TemporaryDirectory() as tmp, emulated_fleet(Path(tmp) / "state", devices, "lanecost") as path:
        inventory = load_inventory(path)

        def spec() -> TrainSpec:
            return TrainSpec(model=model, total_steps=20, checkpoint_dir=tempfile.mkdtemp(dir=tmp), warmup_steps=5,
                             warmup_s=3.0, min_window_s=args.window_s, min_window_steps=10, max_steps=100_000)

        with launch_cluster([inventory.device(n) for n in devices], inventory.parameter_server_host,
                            num_ps=len(devices), lanes=len(devices)) as cluster:
            alone = {}
            for name in devices:
                for _ in range(2):
                    cpu, marks, stop = _ChildCpu(), [], threading.Event()

                    def sample(cpu: _ChildCpu = cpu, marks: list = marks, stop: threading.Event = stop) -> None:
                        while not stop.is_set():
                            marks.append((time.time(), cpu.read()))
                            time.sleep(0.2)

                    sampler = threading.Thread(target=sample)
                    sampler.start()
                    result = _solo(cluster, name, spec())
                    stop.set()
                    sampler.join()
                    t0, t1, _ = result.measurement_window()
                    inside = [(t, c) for t, c in marks if t0 <= t <= t1]
                    cores = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
                    alone[name] = result.steps_per_s
                    print(f"{name:14s} alone {result.steps_per_s:7.2f} steps/s; its run's host processes "
                          f"{cores:.2f} cores, {1000 * cores / result.steps_per_s:.1f} ms per step", flush=True)
            results: dict[str, Any] = {}
            threads = [threading.Thread(target=lambda n=n, i=i: results.__setitem__(n, _solo(cluster, n, spec(), i)))
                       for i, n in enumerate(devices)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for name in devices:
                print(f"{name:14s} at once {results[name].steps_per_s:7.2f} steps/s, "
                      f"{results[name].steps_per_s / alone[name]:.2f} of alone", flush=True)


if __name__ == "__main__":
    main()
