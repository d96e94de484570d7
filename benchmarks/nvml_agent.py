"""The device agent on a real NVIDIA GPU: its NVML power stream against NVML read directly.

Run on a host with an NVIDIA GPU and its driver (this development machine has none; it prints why
and exits 0):

    .venv/bin/python benchmarks/nvml_agent.py [--load-s 12] [--json out.json]

It starts ``hetcluster agent serve`` as a subprocess (as systemd would) with throwaway token + mTLS
credentials and ``power.source = "nvml"``, and prints:

(1) GetDeviceInfo: device kind, accelerators, every power source's probe, the active one, and
    what ``source = "auto"`` would open on this host;
(2) StreamPower at 10 Hz over three phases — idle, a GPU load (bf16 matrix products in a child
    process, through PyTorch or CuPy, whichever imports), idle again — each phase's mean of the
    stream beside ``nvmlDeviceGetPowerUsage`` polled by this process over the same seconds;
(3) energy over the whole stream three ways: the agent's ``energy_j`` (counter) difference, the
    trapezoid integral of its ``power_w``, and the NVML counter read by this process;
(4) the stream's delivered rate and sample-to-sample spread under steady load at 10, 50 and
    100 Hz (power taken as the energy counter's delta read 0 W and 3.5 kW in turn at 50 Hz on an
    H100, whose counter moves every 100 ms: docs/decisions.md#nvml-power-reading);
(5) under the same load, how often the driver updates the energy counter (a tight loop of reads:
    the intervals between changes, the joules per change, the cost of one read), and the spread
    of the driver's own power readings (GetPowerUsage, and the instant field where the driver
    has it) at 10 Hz for comparison.

What its figures decided: docs/decisions.md#nvml-power-reading.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")

from hetcluster.agent.client import AgentClient, energy_between  # noqa: E402
from hetcluster.agent.credentials import generate_credentials  # noqa: E402
from hetcluster.power import nvml  # noqa: E402
from hetcluster.power.detect import PowerConfig, open_source  # noqa: E402

#: A child process that keeps the GPU busy until killed: torch first, then CuPy.
LOAD_PROGRAM = r"""
import sys, time
n = 8192
try:
    import torch
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
    sync, mm, lib = torch.cuda.synchronize, torch.matmul, "torch"
except Exception:
    import cupy
    a = cupy.random.standard_normal((n, n), dtype=cupy.float32); b = cupy.random.standard_normal((n, n),
    dtype=cupy.float32)
    sync, mm, lib = cupy.cuda.Device().synchronize, cupy.matmul, "cupy"
print(lib, flush=True)
while True:
    for _ in range(20):
        c = mm(a, b)
    sync()
"""


def start_gpu_load() -> tuple[subprocess.Popen, str]:
    """The load child, once it has its matrices on the GPU; and the library it uses."""
    load = subprocess.Popen([sys.executable, "-c", LOAD_PROGRAM], stdout=subprocess.PIPE, text=True)
    return load, (load.stdout.readline().strip() if load.stdout else "?")


def stop_gpu_load(load: subprocess.Popen) -> None:
    load.kill()
    load.wait()


@contextlib.contextmanager
def gpu_load(settle_s: float = 3.0) -> Iterator[str]:
    """A steady GPU load for the block, past its first ``settle_s`` seconds (clocks and power ramp)."""
    load, lib = start_gpu_load()
    try:
        time.sleep(settle_s)
        yield lib
    finally:
        stop_gpu_load(load)


def wait_for_file(path: Path, process: subprocess.Popen, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        if process.poll() is not None:
            raise SystemExit(f"agent exited early:\n{process.stdout.read() if process.stdout else ''}")
        time.sleep(0.1)
    raise SystemExit(f"agent wrote no {path} in {timeout_s} s")


def start_agent(tmp: Path) -> tuple[subprocess.Popen, AgentClient]:
    creds = generate_credentials(tmp / "creds", ["127.0.0.1", "localhost"], 1)
    config = tmp / "agent.toml"
    config.write_text(
        '[agent]\nname = "gpu-host"\nlisten = "127.0.0.1:0"\nport_file = "addr"\nstate_dir = "state"\n'
        f'[auth]\ntoken_file = "{creds.token}"\ncert_file = "{creds.server_cert}"\n'
        f'key_file = "{creds.server_key}"\nclient_ca_file = "{creds.ca_cert}"\n'
        '[power]\nsource = "nvml"\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "hetcluster.cli.app", "agent", "serve", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    address = wait_for_file(tmp / "addr", process)
    client = AgentClient(address, token_file=creds.token, ca_file=creds.ca_cert,
                         cert_file=creds.client_cert, key_file=creds.client_key)
    return process, client


class DirectPoller:
    """nvmlDeviceGetPowerUsage (the driver's own average) of every GPU, summed, at a fixed rate."""

    def __init__(self, rate_hz: float = 10.0) -> None:
        self._lib = nvml.load_nvml()
        self._lib.nvmlInit()
        count = self._lib.nvmlDeviceGetCount()
        self._handles = [self._lib.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._period_s = 1.0 / rate_hz
        self.readings: list[tuple[float, float]] = []  # (monotonic_s, watts)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def energy_counter_j(self) -> float:
        return sum(self._lib.nvmlDeviceGetTotalEnergyConsumption(h) for h in self._handles) / 1000.0

    def _run(self) -> None:
        next_s = time.monotonic()
        while not self._stop.is_set():
            watts = sum(self._lib.nvmlDeviceGetPowerUsage(h) for h in self._handles) / 1000.0
            self.readings.append((time.monotonic(), watts))
            next_s += self._period_s
            self._stop.wait(max(0.0, next_s - time.monotonic()))

    def __enter__(self) -> "DirectPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._lib.nvmlShutdown()


def mean_in(pairs: list[tuple[float, float]], t0: float, t1: float) -> float:
    inside = [w for t, w in pairs if t0 <= t <= t1]
    return statistics.mean(inside) if inside else float("nan")


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and coefficient of variation (std/mean) of a phase's readings."""
    mean = statistics.mean(values)
    return mean, (statistics.pstdev(values) / mean if mean else float("nan"))


def print_device_info(client: AgentClient, result: dict) -> None:
    info = client.device_info()
    auto = open_source(PowerConfig(source="auto"))
    try:
        auto_name = f"{auto.name} ({auto.describe()})"
    finally:
        auto.close()
    print("(1) GetDeviceInfo")
    print(f"    device_kind {info.device_kind}; cpu {info.cpu_model} x{info.cpu_count}; "
          f"memory {info.memory_bytes / 2**30:.1f} GiB; agent {info.agent_version}")
    for acc in info.accelerators:
        print(f"    accelerator {acc.index}: {acc.vendor} {acc.name}, {acc.memory_bytes / 2**30:.1f} GiB, {acc.uuid}")
    for source in info.power_sources:
        print(f"    source {source.name:<16} available={source.available!s:<5} {source.detail}")
    print(f"    active: {info.active_power_source}; source = \"auto\" here opens: {auto_name}")
    result["device_info"] = {
        "device_kind": info.device_kind, "active_power_source": info.active_power_source, "auto_opens": auto_name,
        "accelerators": [acc.name for acc in info.accelerators],
        "available_sources": [s.name for s in info.power_sources if s.available],
    }


def phases_run(client: AgentClient, poller: DirectPoller, idle_s: float, load_s: float, result: dict) -> None:
    print(f"(2) StreamPower at 10 Hz: idle {idle_s:.0f} s, GPU load {load_s:.0f} s, idle {idle_s:.0f} s")
    counter_start_j = poller.energy_counter_j()
    stream = client.stream_power(rate_hz=10.0)
    samples = []
    load: subprocess.Popen | None = None
    marks: dict[str, float] = {"start": time.monotonic()}
    try:
        for sample in stream:
            samples.append(sample)
            now = time.monotonic()
            if load is None and "load_on" not in marks and now - marks["start"] >= idle_s:
                marks["load_on"] = now
                load, lib = start_gpu_load()
                print(f"    load via {lib}")
                marks["load_ready"] = time.monotonic()
            if load is not None and now - marks["load_ready"] >= load_s:
                stop_gpu_load(load)
                load = None
                marks["load_off"] = time.monotonic()
            if "load_off" in marks and now - marks["load_off"] >= idle_s:
                break
    finally:
        stream.cancel()
        if load is not None:
            stop_gpu_load(load)
    counter_end_j = poller.energy_counter_j()
    direct = poller.readings
    stream_pairs = [(s.monotonic_s, s.power_w) for s in samples]
    windows = {
        "idle before": (marks["start"] + 1.0, marks["load_on"]),
        "load": (marks["load_ready"] + 2.0, marks["load_off"]),
        "idle after": (marks["load_off"] + 2.0, samples[-1].monotonic_s),
    }
    print(f"    {'phase':<12} {'stream W':>9} {'direct W':>9} {'diff':>7}")
    result["phases"] = {}
    for name, (t0, t1) in windows.items():
        streamed, polled = mean_in(stream_pairs, t0, t1), mean_in(direct, t0, t1)
        print(f"    {name:<12} {streamed:9.1f} {polled:9.1f} {(streamed / polled - 1) * 100:+6.1f}%")
        result["phases"][name] = {"stream_w": streamed, "direct_w": polled, "seconds": t1 - t0}
    sources = sorted({s.source for s in samples})
    counter_j = (samples[-1].energy_j or 0.0) - (samples[0].energy_j or 0.0)
    wall0, wall1 = samples[0].wall_time_s, samples[-1].wall_time_s
    no_counter = [dataclasses.replace(s, energy_j=None) for s in samples]
    trapezoid_j = energy_between(no_counter, wall0, wall1)
    print(f"(3) energy over the stream's {wall1 - wall0:.1f} s ({len(samples)} samples, source {', '.join(sources)}, "
          f"measured={all(s.measured for s in samples)})")
    print(f"    agent counter difference {counter_j:9.1f} J")
    print(f"    trapezoid over power_w   {trapezoid_j:9.1f} J ({(trapezoid_j / counter_j - 1) * 100:+.2f}%)")
    print(
        f"    NVML counter, this process, from before the stream to after it: {counter_end_j - counter_start_j:9.1f} J"
    )
    result["energy"] = {"agent_counter_j": counter_j, "trapezoid_j": trapezoid_j,
                        "direct_counter_j": counter_end_j - counter_start_j, "stream_s": wall1 - wall0,
                        "sources": sources}


def rates_under_load(client: AgentClient, seconds: float, result: dict) -> None:
    """(4): run inside gpu_load()."""
    print(f"(4) StreamPower under steady GPU load, {seconds:.0f} s per rate")
    print(f"    {'asked Hz':>8} {'got Hz':>8} {'mean W':>8} {'CV':>7} {'min W':>8} {'max W':>8}")
    result["rates"] = {}
    for rate_hz in (10.0, 50.0, 100.0):
        samples = list(client.stream_power(rate_hz=rate_hz, duration_s=seconds))[1:]
        watts = [s.power_w for s in samples]
        got_hz = (len(samples) - 1) / (samples[-1].monotonic_s - samples[0].monotonic_s)
        mean, cv = spread(watts)
        print(f"    {rate_hz:8.0f} {got_hz:8.2f} {mean:8.1f} {cv * 100:6.1f}% {min(watts):8.1f} {max(watts):8.1f}")
        result["rates"][str(int(rate_hz))] = {"got_hz": got_hz, "mean_w": mean, "cv": cv,
                                              "min_w": min(watts), "max_w": max(watts)}


def counter_cadence(seconds: float, result: dict) -> None:
    """(5): run inside gpu_load()."""
    print(
        f"(5) the energy counter's update cadence under GPU load ({seconds:.0f} s tight loop), and the driver's power "
        "readings"
    )
    lib = nvml.load_nvml()
    lib.nvmlInit()
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(0)
        changes: list[tuple[float, int]] = []
        costs_s: list[float] = []
        last = lib.nvmlDeviceGetTotalEnergyConsumption(handle)
        end_s = time.monotonic() + seconds
        while time.monotonic() < end_s:
            t0 = time.perf_counter()
            value = lib.nvmlDeviceGetTotalEnergyConsumption(handle)
            costs_s.append(time.perf_counter() - t0)
            if value != last:
                changes.append((time.monotonic(), value - last))
                last = value
        gaps_ms = sorted((b[0] - a[0]) * 1e3 for a, b in zip(changes, changes[1:]))
        per_change_j = sorted(d / 1000.0 for _, d in changes)
        q = lambda xs, f: xs[min(len(xs) - 1, int(f * (len(xs) - 1)))]  # noqa: E731
        print(
            f"    {len(costs_s)} reads, {len(changes)} changes; read cost median "
            f"{statistics.median(costs_s) * 1e3:.3f} ms"
        )
        print(
            f"    interval between changes: median {q(gaps_ms, 0.5):.1f} ms, p10 {q(gaps_ms, 0.1):.1f}, p90 "
            f"{q(gaps_ms, 0.9):.1f}, "
            f"max {gaps_ms[-1]:.1f}; joules per change median {q(per_change_j, 0.5):.2f}"
        )
        result["counter"] = {"reads": len(costs_s), "changes": len(changes),
                             "read_cost_ms": statistics.median(costs_s) * 1e3,
                             "gap_ms_p10_p50_p90_max": [q(gaps_ms, 0.1), q(gaps_ms, 0.5), q(gaps_ms, 0.9), gaps_ms[-1]],
                             "joules_per_change_median": q(per_change_j, 0.5),
                             "changes_monotonic_s_delta_mj": changes}
        readers = {"GetPowerUsage": lambda: lib.nvmlDeviceGetPowerUsage(handle) / 1000.0}
        instant = getattr(lib, "NVML_FI_DEV_POWER_INSTANT", None)
        if instant is not None:
            readers["FI_DEV_POWER_INSTANT"] = lambda: (
                lib.nvmlDeviceGetFieldValues(handle, [instant])[0].value.uiVal / 1000.0
            )
        for name, read in readers.items():
            try:
                values = []
                for _ in range(40):
                    values.append(read())
                    time.sleep(0.1)
            except Exception as exc:  # a field this driver lacks
                print(f"    {name}: {exc}")
                continue
            mean, cv = spread(values)
            print(
                f"    {name:<22} at 10 Hz: mean {mean:7.1f} W, CV {cv * 100:5.1f}%, min {min(values):.1f}, max "
                f"{max(values):.1f}"
            )
            result[name] = {"mean_w": mean, "cv": cv}
    finally:
        lib.nvmlShutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle-s", type=float, default=6.0)
    parser.add_argument("--load-s", type=float, default=12.0)
    parser.add_argument("--rate-s", type=float, default=4.0, help="seconds per rate in (4)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    availability = nvml.probe()
    if not availability.available:
        print(f"no NVIDIA GPU here ({availability.detail}); nothing to measure")
        return
    result: dict = {"nvml": availability.detail}
    with tempfile.TemporaryDirectory() as tmp:
        agent, client = start_agent(Path(tmp))
        try:
            print_device_info(client, result)
            with DirectPoller() as poller:
                phases_run(client, poller, args.idle_s, args.load_s, result)
            with gpu_load():  # one steady load for (4) and (5)
                rates_under_load(client, args.rate_s, result)
                counter_cadence(2.0, result)
        finally:
            client.close()
            agent.terminate()
            agent.wait(timeout=15)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
