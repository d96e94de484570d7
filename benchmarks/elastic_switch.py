"""What an elastic switch costs, measured against its prediction, and what elasticity gains a job.

An emulated fleet of three devices (dev-a half a core, dev-b a quarter, dev-c a whole core) is
pre-trained once (`hetcluster profile`: small_cnn 32x32x3, batch 32); then two scenarios, each run
with `train --elastic` and then as the same job without it, from the same profile:

* join: the job starts without dev-c on dev-b (dev-a excluded, objective time), from the profile
  without dev-c (the fleet as it was); dev-c is added (`cluster add`) at 30 % of the job. The
  elastic job measures it alone (its own parameter server) and re-plans; the plain job trains on as
  it started.
* leave: the job starts on the fastest configuration under a power cap (dev-b + dev-c); dev-c is
  taken out (`cluster remove`) at 40 %. The plain job goes on without it (the engine survives the
  loss); the elastic job re-plans, and switches if the rest is better trained otherwise.

For every switch it prints the measured cost (seconds from the decision to the new
configuration's first step) against the one predicted when deciding, and for every scenario the
whole job's measured time (`report.measured.time_s`: pre-training, every segment and switch gap)
with and without --elastic, and their ratio. Run it with nothing else on the host: it times real
training.

    .venv/bin/python benchmarks/elastic_switch.py [--steps-join 1200] [--steps-leave 1500] [--only join|leave]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL_ARGS = ["--model", "small_cnn", "--input-shape", "32x32x3", "--classes", "4", "--batch-size", "32"]
CATALOG = """
[profiles.dev-a]
compute_share = 0.5
memory_budget_bytes = 2147483648
idle_w = 5.0
busy_w = 15.0
link_bandwidth_mbit_per_s = 1000.0
link_latency_ms = 0.1

[profiles.dev-b]
compute_share = 0.25
memory_budget_bytes = 2147483648
idle_w = 2.0
busy_w = 6.0
link_bandwidth_mbit_per_s = 1000.0
link_latency_ms = 0.1

[profiles.dev-c]
compute_share = 1.0
memory_budget_bytes = 2147483648
idle_w = 10.0
busy_w = 40.0
link_bandwidth_mbit_per_s = 1000.0
link_latency_ms = 0.1
"""


def hetcluster(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "hetcluster.cli.app", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"hetcluster {' '.join(args[:2])} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


def checkpoint_steps(workdir: Path) -> int:
    from hetcluster.training.checkpoints import checkpoint_steps as steps

    return steps(workdir / "checkpoints")


class Fleet:
    def __init__(self, root: Path) -> None:
        self.root, self.state = root, root / "state"
        self.catalog = root / "catalog.toml"
        self.catalog.write_text(CATALOG)
        self.inventory = root / "cluster.toml"

    def up(self) -> None:
        hetcluster("cluster", "up", "--devices", "dev-a,dev-b,dev-c", "--catalog", str(self.catalog), "--out",
                   str(self.inventory), "--state-dir", str(self.state), "--name", f"bes{os.getpid() % 10000}")

    def add(self, name: str) -> None:
        hetcluster("cluster", "add", "--devices", name, "--catalog", str(self.catalog), "--state-dir", str(self.state))

    def remove(self, name: str) -> None:
        hetcluster("cluster", "remove", "--device", name, "--state-dir", str(self.state))

    def down(self) -> None:
        hetcluster("cluster", "down", "--state-dir", str(self.state), check=False)


def job(fleet: Fleet, workdir: Path, profile: Path, steps: int, options: list[str], *, elastic: bool,
        strike_at: float, strike) -> dict:
    """Train the job, call ``strike()`` once its checkpoint reaches ``strike_at`` of it; its report."""
    cmd = [sys.executable, "-m", "hetcluster.cli.app", "train", "--inventory", str(fleet.inventory), "--workdir",
           str(workdir), "--report", str(workdir / "report.json"), "--profile", str(profile), *MODEL_ARGS,
           "--total-steps", str(steps), "--checkpoint-every", str(max(20, steps // 30)), *options]
    if elastic:
        cmd += ["--elastic", "--elastic-poll-s", "1"]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "COLUMNS": "200"})
    while checkpoint_steps(workdir) < strike_at * steps and process.poll() is None:
        time.sleep(0.25)
    strike()
    out, _ = process.communicate()
    if process.returncode != 0:
        failed = [line for line in out.splitlines() if line.startswith("error:")]
        print(f"  ({'--elastic' if elastic else 'without --elastic'}: the job failed: "
              f"{failed[-1] if failed else out[-600:]})")
        return {"failed": True}
    report = json.loads((workdir / "report.json").read_text())
    report["ledger"] = json.loads((workdir / "train_state.json").read_text())
    return report


def describe(name: str, elastic: dict, plain: dict) -> None:
    print(f"\n== {name}")
    if elastic.get("failed"):
        return
    events = elastic["ledger"].get("elastic", {}).get("events", [])
    for event in events:
        if event["kind"] == "replan":
            print(f"  at step {event['step']}: {event['line']}")
    for event in (e for e in events if e["kind"] == "switch"):
        measured, predicted = event.get("measured_to_first_step_s"), event["predicted"]
        parts = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in predicted.items() if k != "to_first_step_s")
        shown = "-" if measured is None else f"{measured:.1f} s"
        print(f"  switch {'+'.join(event['source'])} -> {'+'.join(event['target'])}: decision to first step "
              f"measured {shown}, predicted {predicted['to_first_step_s']:.1f} s ({parts}); gap between the "
              f"segments {event.get('gap_s') or 0.0:.1f} s")
    if not any(e["kind"] == "switch" for e in events):
        print("  no switch")
    if plain.get("failed"):
        print(f"  whole job: --elastic {elastic['measured']['time_s']:.1f} s; without it the job failed")
        return
    t_elastic, t_plain = elastic["measured"]["time_s"], plain["measured"]["time_s"]
    print(f"  whole job: --elastic {t_elastic:.1f} s ({elastic['measured']['energy_j']:.0f} J), without "
          f"{t_plain:.1f} s ({plain['measured']['energy_j']:.0f} J): ratio {t_elastic / t_plain:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-join", type=int, default=1200)
    parser.add_argument("--steps-leave", type=int, default=1500)
    parser.add_argument("--max-power", type=float, default=50.0, help="the leave scenario's cap (W)")
    parser.add_argument("--only", choices=("join", "leave"), help="run one scenario")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        root = Path(tmp)
        fleet = Fleet(root)
        fleet.up()
        try:
            started = time.monotonic()
            hetcluster("profile", "--inventory", str(fleet.inventory), *MODEL_ARGS, "--total-steps",
                       str(args.steps_join), "--workdir", str(root / "pretrain"))
            profile = root / "pretrain" / "profile.json"
            measured = json.loads(profile.read_text())["devices"]
            rates = ", ".join(f"{d['name']} {d['steps_per_s']:.1f}/s" for d in measured)
            print(f"pre-training: {time.monotonic() - started:.0f} s; solo rates {rates}")
            if args.only != "leave":
                join(fleet, root, profile, args.steps_join)
            if args.only != "join":
                leave(fleet, root, profile, args.steps_leave, args.max_power)
        finally:
            fleet.down()


def join(fleet: Fleet, root: Path, profile: Path, steps: int) -> None:
    without = json.loads(profile.read_text())   # the profile of the fleet before dev-c joins
    without["devices"] = [d for d in without["devices"] if d["name"] != "dev-c"]
    without["runs"] = [r for r in without["runs"] if "dev-c" not in r["devices"]]
    before = root / "profile-without-dev-c.json"
    before.write_text(json.dumps(without))
    options = ["--objective", "time", "--exclude", "dev-a"]
    fleet.remove("dev-c")
    elastic = job(fleet, root / "join-elastic", before, steps, options, elastic=True, strike_at=0.3,
                  strike=lambda: fleet.add("dev-c"))
    fleet.remove("dev-c")
    plain = job(fleet, root / "join-plain", before, steps, options, elastic=False, strike_at=0.3,
                strike=lambda: fleet.add("dev-c"))
    describe("a fast device joins at 30 %", elastic, plain)


def leave(fleet: Fleet, root: Path, profile: Path, steps: int, max_power: float) -> None:
    options = ["--objective", "time", "--max-power", str(max_power)]
    elastic = job(fleet, root / "leave-elastic", profile, steps, options, elastic=True, strike_at=0.4,
                  strike=lambda: fleet.remove("dev-c"))
    fleet.add("dev-c")
    plain = job(fleet, root / "leave-plain", profile, steps, options, elastic=False, strike_at=0.4,
                strike=lambda: fleet.remove("dev-c"))
    fleet.add("dev-c")
    if not elastic.get("failed"):
        print(f"(leave: the job started on {'+'.join(elastic['timeline'][0]['devices'])})")
    describe("a device of the configuration leaves at 40 %", elastic, plain)


if __name__ == "__main__":
    main()
