"""How far the host's CPU counters (/proc/stat, sampled each tick) stray from a task's own run time.

experiments/host_watch.py keeps, as "unattributed", the host's process time less what every
process spent; this measures one cause of it on this host. A child process runs a pattern of
spins and sleeps for ``--seconds``; over the same interval are read, by host_watch's own readers:
the host's busy time (``host_cpu_s``: user + nice + system; the idle host's own share is printed
first) and the child's utime + stime (``process_cpu_s``); and the child's scheduler run time
(/proc/<pid>/task/*/schedstat, ns, exact).
Run it on an idle host: anything else running shows in the host's figure.

Run: .venv/bin/python benchmarks/tick_accounting.py [--seconds 12]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "experiments"))

from host_watch import host_cpu_s, process_cpu_s  # noqa: E402

PATTERNS = {   # name → (spin ms, sleep ms); (0, 0) spins without a pause
    "steady spin": (0.0, 0.0),
    "1 ms spin, 3 ms sleep": (1.0, 3.0),
    "0.3 ms spin, 1 ms sleep": (0.3, 1.0),
}
CHILD = """import sys, time
spin_s, sleep_s, end = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3, time.time() + float(sys.argv[3])
while time.time() < end:
    start = time.perf_counter()
    while time.perf_counter() - start < spin_s or not sleep_s:
        if time.time() >= end:
            break
    if sleep_s:
        time.sleep(sleep_s)
"""


def run_time_s(pid: int) -> float:
    """The process's scheduler run time, summed over its threads."""
    total_ns = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as stats:
            total_ns += int(stats.read().split()[0])
    return total_ns / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="measured interval per pattern")
    args = parser.parse_args()
    start_s = host_cpu_s()[0]
    time.sleep(args.seconds)
    print(f"idle host, {args.seconds:.0f} s: busy {host_cpu_s()[0] - start_s:.2f} s")
    print(f"{'pattern':26} {'host busy s':>12} {'utime+stime s':>14} {'run time s':>11} {'host/run':>9}")
    for name, (spin_ms, sleep_ms) in PATTERNS.items():
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(spin_ms), str(sleep_ms), str(args.seconds + 1.0)])
        process = psutil.Process(child.pid)
        time.sleep(0.5)   # past the interpreter's start
        host0, cpu0, run0 = host_cpu_s()[0], process_cpu_s(process)[0], run_time_s(child.pid)
        time.sleep(args.seconds)
        host1, cpu1, run1 = host_cpu_s()[0], process_cpu_s(process)[0], run_time_s(child.pid)
        child.wait()
        host, cpu, run = host1 - host0, cpu1 - cpu0, run1 - run0
        print(f"{name:26} {host:12.2f} {cpu:14.2f} {run:11.2f} {host / run - 1:+9.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
