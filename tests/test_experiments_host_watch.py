"""experiments/host_watch.py: CPU spent on the host outside an experiment is counted, the
experiment's own (its children, and detached processes carrying its marker) is not."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

from host_watch import ForeignCpu, foreign_cpu_between  # noqa: E402

SPIN = "import sys, time\nwhile time.process_time() < {cpu_s}: pass\n"


def detached(code: str, *argv: str) -> None:
    """Start python in a shell that exits at once: the process is re-parented, not our descendant."""
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" "$@" >/dev/null 2>&1 &', code, *argv], check=True)


def test_foreign_cpu_counts_others_work_and_not_ours(tmp_path):
    marker = str(tmp_path / "fleet-state")
    with ForeignCpu(marker, interval_s=0.5) as watch:
        detached(SPIN.format(cpu_s=1.5))                        # someone else's work
        detached(SPIN.format(cpu_s=1.5), "--config", marker)    # an agent of ours, re-parented like `cluster up`'s
        child = subprocess.Popen([sys.executable, "-c", SPIN.format(cpu_s=1.5)])  # ours: a descendant
        child.wait(timeout=60)
        time.sleep(2.5)   # the detached ones finish too (1.5 s of CPU each on a 2-core host)
    record = watch.record()
    assert 1.0 < record["foreign_cpu_s"] < 2.6, record
    assert any("python" in h["command"] for h in record["heaviest_foreign"]), record
    # by their own CPU: init, which reaped both detached spinners, does not count them again
    assert sum(h["cpu_s"] for h in record["heaviest_foreign"]) < record["foreign_cpu_s"] + 0.5, record
    assert abs(sum(cpu_s for _, cpu_s in record["bins"]) - record["foreign_cpu_s"]) < 0.05
    whole = foreign_cpu_between(record, record["started_wall_s"], time.time())
    assert abs(whole - sum(cpu_s for _, cpu_s in record["bins"])) < 1e-6
    assert foreign_cpu_between(record, 0.0, record["started_wall_s"]) == 0.0


def test_foreign_cpu_between_cuts_bins_in_proportion():
    record = {"started_wall_s": 100.0, "interval_s": 2.0, "bins": [[102.0, 1.0], [104.0, 3.0], [106.0, 0.0]]}
    assert foreign_cpu_between(record, 101.0, 103.0) == 0.5 + 1.5
    assert foreign_cpu_between(record, 0.0, 1e9) == 4.0
    assert foreign_cpu_between(record, 104.0, 106.0) == 0.0
