"""What the device agent delivers: power-stream rate and jitter, RPC latency, task start/stop time.

A real agent (in this process, on 127.0.0.1:0) with throwaway credentials: token over plaintext,
and token + mTLS. The power source is the CPU-utilization model of this host (what emulated and
sensorless devices use; a measured source adds its own read time). Printed:
(1) StreamPower at 10/50/100 Hz for 2 s each over mTLS: delivered rate, interval mean/p99/max;
(2) GetDeviceInfo round trip (200 calls) per transport: median and p95;
(3) StartTask -> RUNNING (TF server imported and listening; its CPU time and resident memory then)
    and StopTask, 3 runs.

Run: .venv/bin/python benchmarks/agent.py [--skip-tasks]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")

from hetcluster.agent.client import AgentClient  # noqa: E402
from hetcluster.agent.config import AgentConfig  # noqa: E402
from hetcluster.agent.credentials import generate_credentials  # noqa: E402
from hetcluster.agent.server import AgentServer  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def make_server(tmp: Path, creds, mtls: bool) -> AgentServer:
    auth = {"token_file": str(creds.token)}
    if mtls:
        auth.update(cert_file=str(creds.server_cert), key_file=str(creds.server_key), client_ca_file=str(creds.ca_cert))
    config = AgentConfig.from_mapping(
        {"agent": {"name": "bench", "listen": "127.0.0.1:0", "state_dir": str(tmp / ("m" if mtls else "p"))},
         "auth": auth, "power": {"source": "model", "idle_w": 5.0, "busy_w": 20.0}},
        tmp,
    )
    return AgentServer(config).start()


def client_for(server: AgentServer, creds, mtls: bool) -> AgentClient:
    if mtls:
        return AgentClient(server.address, token_file=creds.token, ca_file=creds.ca_cert,
                           cert_file=creds.client_cert, key_file=creds.client_key)
    return AgentClient(server.address, token_file=creds.token)


def bench_stream(client: AgentClient) -> None:
    print("(1) StreamPower over token + mTLS, 2 s per rate")
    print(f"    {'asked Hz':>8} {'samples':>8} {'got Hz':>8} {'mean ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for rate_hz in (10.0, 50.0, 100.0):
        samples = list(client.stream_power(rate_hz=rate_hz, duration_s=2.0))
        gaps_ms = [(b.monotonic_s - a.monotonic_s) * 1e3 for a, b in zip(samples, samples[1:])]
        got_hz = (len(samples) - 1) / (samples[-1].monotonic_s - samples[0].monotonic_s)
        print(f"    {rate_hz:8.0f} {len(samples):8d} {got_hz:8.2f} {statistics.mean(gaps_ms):8.2f} "
              f"{percentile(gaps_ms, 0.99):8.2f} {max(gaps_ms):8.2f}")


def bench_latency(client: AgentClient, label: str) -> None:
    client.device_info()
    times_ms = []
    for _ in range(200):
        t0 = time.perf_counter()
        client.device_info()
        times_ms.append((time.perf_counter() - t0) * 1e3)
    print(f"    {label:<16} median {statistics.median(times_ms):6.2f} ms   p95 {percentile(times_ms, 0.95):6.2f} ms")


def bench_tasks(client: AgentClient) -> None:
    print("(3) TF server task: StartTask -> RUNNING, and StopTask")
    for run in range(3):
        address = client.reserve_port()
        t0 = time.monotonic()
        task = client.start_task("worker", 0, {"worker": [address]}, task_id=f"bench-{run}")
        while (info := client.task_status(task.task_id)[0]).state != "running":
            time.sleep(0.05)
        t_running = time.monotonic() - t0
        t1 = time.monotonic()
        stopped = client.stop_task(task.task_id)
        t_stop = time.monotonic() - t1
        print(f"    run {run}: running after {t_running:5.2f} s ({info.cpu_time_s:4.1f} CPU s, "
              f"{info.rss_bytes / 2**20:4.0f} MiB resident), stopped ({stopped.state}) in {t_stop:5.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-tasks", action="store_true", help="skip the TF server part (needs TensorFlow)")
    args = parser.parse_args()
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        creds = generate_credentials(tmp / "creds")
        plain, mtls = make_server(tmp, creds, mtls=False), make_server(tmp, creds, mtls=True)
        try:
            with client_for(plain, creds, False) as plain_client, client_for(mtls, creds, True) as mtls_client:
                bench_stream(mtls_client)
                print("(2) GetDeviceInfo round trip, 200 calls")
                bench_latency(plain_client, "token, plaintext")
                bench_latency(mtls_client, "token + mTLS")
                if not args.skip_tasks:
                    bench_tasks(mtls_client)
        finally:
            plain.stop()
            mtls.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
