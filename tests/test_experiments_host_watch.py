"""experiments/host_watch.py: CPU spent on the host outside an experiment is counted, the
experiment's own (its children, once each, and detached processes carrying its marker) is not,
short-lived commands no sample saw are counted from their parent, and the kernel's threads,
interrupt and stolen time are kept apart from it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import namedtuple

import pytest

from experiments import choice_accuracy, host_watch
from experiments.host_watch import ForeignCpu, host_cpu_between

# every process of another test running beside these would be someone else's work to them
pytestmark = pytest.mark.serial

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
    assert sum(h["cpu_s"] for h in record["heaviest_foreign"]) < record["foreign_cpu_s"] + 0.05, record
    assert abs(sum(b[1] for b in record["bins"]) - record["foreign_cpu_s"]) < 0.05
    whole = host_cpu_between(record, record["started_wall_s"], 1e12)   # a bin end is rounded: up to 5 ms past now
    assert abs(whole - sum(b[1] for b in record["bins"])) < 1e-6
    assert host_cpu_between(record, 0.0, record["started_wall_s"]) == 0.0


def test_host_cpu_between_cuts_bins_in_proportion():
    record = {"started_wall_s": 100.0, "interval_s": 2.0, "bins": [[102.0, 1.0], [104.0, 3.0], [106.0, 0.0]]}
    assert host_cpu_between(record, 101.0, 103.0) == 0.5 + 1.5
    assert host_cpu_between(record, 0.0, 1e9) == 4.0
    assert host_cpu_between(record, 104.0, 106.0) == 0.0


def test_interrupt_and_stolen_time_is_kept_apart_from_other_work(monkeypatch):
    """Interrupt time is charged to no process (most of it the fleet's own loopback traffic) and
    steal is another guest's: a host whose only extra time is those reads no other work."""
    CpuTimes = namedtuple("CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
    ticks = iter(range(10**6))

    def cpu_times():   # only interrupts (0.1 s) and steal (0.05 s) grow, with guest time inside user
        n = next(ticks)
        return CpuTimes(100.0, 0.0, 50.0, 1000.0 + n, 0.0, 1.0, 2.0 + 0.1 * n, 0.05 * n, 7.0, 0.0)

    monkeypatch.setattr(host_watch.psutil, "cpu_times", cpu_times)
    ours = host_watch.psutil.Process()
    monkeypatch.setattr(host_watch.psutil, "process_iter", lambda: iter([ours]))   # no other process runs
    with ForeignCpu("no-such-marker", interval_s=0.1) as watch:
        time.sleep(0.6)
    record = watch.record()
    samples = len(record["bins"])
    assert record["foreign_cpu_s"] == 0.0 and record["kernel_cpu_s"] == 0.0, record
    # the host's process time stood still while ours ran: the rest no process holds reads negative
    assert record["unattributed_cpu_s"] <= 0.0, record
    assert abs(record["interrupt_cpu_s"] - 0.1 * samples) < 1e-6 and abs(record["steal_s"] - 0.05 * samples) < 1e-6
    assert abs(host_cpu_between(record, 0.0, 1e12, "interrupts") - record["interrupt_cpu_s"]) < 1e-6
    old_record = {"started_wall_s": 100.0, "interval_s": 2.0, "bins": [[102.0, 1.0]]}   # before interrupts were kept
    assert host_cpu_between(old_record, 0.0, 1e9, "interrupts") == 0.0


def test_short_lived_commands_of_another_are_counted_from_their_parent():
    """Commands that start and end between two samples (a shell's loop of short runs) are seen by
    no sample: their CPU is read from the parent's children time, less what samples counted."""
    loop = f'for i in 1 2 3 4 5 6; do "{sys.executable}" -c "$0"; done'
    with ForeignCpu("no-such-marker", interval_s=1.0) as watch:
        subprocess.run(["sh", "-c", f"sh -c '{loop}' \"$0\" >/dev/null 2>&1 &", SPIN.format(cpu_s=0.3)], check=True)
        time.sleep(5.0)   # six runs of 0.3 s of CPU each, one after another, then a sample after them
    record = watch.record()
    assert 1.7 < record["foreign_cpu_s"] < 3.0, record
    ended = {h["command"]: h["cpu_s"] for h in record["heaviest_foreign"]}.get(host_watch.ENDED_CHILDREN, 0.0)
    assert ended > 0.6, record


class FakeProcess:
    """What ForeignCpu reads of a process, with CPU times the test sets."""

    Times = namedtuple("Times", "user system children_user children_system")

    def __init__(self, pid: int, ppid: int, own_s: float = 0.0, children_s: float = 0.0) -> None:
        self.pid, self._ppid, self.own_s, self.children_s = pid, ppid, own_s, children_s

    def create_time(self) -> float:
        return 1000.0 + self.pid

    def ppid(self) -> int:
        return self._ppid

    def cpu_times(self):
        return self.Times(self.own_s, 0.0, self.children_s, 0.0)

    def cmdline(self) -> list[str]:
        return ["someone-else", str(self.pid)]

    def name(self) -> str:
        return "someone-else"


def test_a_child_read_as_ended_before_its_parent_reaped_it_is_counted_once(monkeypatch):
    """The parent is read before its child; a child reaped in between reads as ended while the
    parent's children time does not hold it yet. What comes off waits for the parent's next sample:
    dropped, the child's CPU would count twice (its own samples, then the parent's children time)."""
    parent, child = FakeProcess(500, 1), FakeProcess(501, 500, own_s=1.0)
    listed = [parent, child]
    monkeypatch.setattr(host_watch.psutil, "process_iter", lambda: iter(list(listed)))
    watch = ForeignCpu("no-such-marker")
    watch._sample(first=True)        # the baselines: the child has spent 1.0 s
    child.own_s = 2.0
    assert watch._sample()[0] == 1.0   # its own second
    listed.remove(child)             # reaped after the parent was read: the parent's time lags
    assert watch._sample()[0] == 0.0
    parent.children_s = 2.0          # the parent's children time now holds all 2 s of it
    assert watch._sample()[0] == 0.0
    parent.children_s = 2.5          # a short-lived command no sample saw
    assert watch._sample()[0] == 0.5


def test_kernel_threads_are_kept_apart_from_other_work():
    """Kthreadd (pid 2) and its children are the kernel's; every other process is another's work."""
    kthreadd, init = (host_watch.KTHREADD_PID, 0.0), (1, 0.0)
    assert ForeignCpu._kind(kthreadd, None) == "kernel"
    assert ForeignCpu._kind((4321, 5.0), kthreadd) == "kernel"
    assert ForeignCpu._kind((4321, 5.0), init) == "foreign" and ForeignCpu._kind(init, None) == "foreign"
    with ForeignCpu("no-such-marker", interval_s=0.5) as watch:
        time.sleep(1.2)
    record = watch.record()
    assert len(record["bins"][-1]) == 1 + len(host_watch.BIN_FIELDS) and record["kernel_cpu_s"] >= 0.0, record


class FakeKernelThread(FakeProcess):
    """A child of kthreadd: no command line, only a name."""

    def cmdline(self) -> list[str]:
        return []

    def name(self) -> str:
        return "kdamond.0"


def test_kernel_threads_are_listed_apart_from_other_commands(monkeypatch):
    """The heaviest other commands hold only other work (what the pre-training warning quotes); the
    kernel's threads, their own children no sample saw included, are listed under heaviest_kernel."""
    kthreadd, kdamond = FakeProcess(host_watch.KTHREADD_PID, 0), FakeKernelThread(77, host_watch.KTHREADD_PID)
    other = FakeProcess(600, 1)
    monkeypatch.setattr(host_watch.psutil, "process_iter", lambda: iter([kthreadd, kdamond, other]))
    watch = ForeignCpu("no-such-marker")
    watch._sample(first=True)
    kdamond.own_s, kthreadd.children_s, other.own_s = 3.0, 0.5, 1.0
    foreign_s, *_, kernel_s, _ = watch._sample()
    record = watch.record()
    assert (foreign_s, kernel_s) == (1.0, 3.5)
    assert record["heaviest_foreign"] == [{"command": "someone-else 600", "cpu_s": 1.0}], record
    assert record["heaviest_kernel"] == [{"command": "kdamond.0", "cpu_s": 3.0},
                                         {"command": host_watch.ENDED_CHILDREN, "cpu_s": 0.5}], record


def test_a_child_of_ours_that_ends_is_not_counted_twice():
    """A child sampled while it runs, then reaped: its parent's children time takes all of its CPU;
    counted twice, ours would read what the child spent once more than the host did, and the rest
    no process holds would fall that far below 0 (the other work beside it still reads its own)."""
    with ForeignCpu("no-such-marker", interval_s=1.0) as watch:
        detached(SPIN.format(cpu_s=3.0))                        # someone else's, past our child's end
        child = subprocess.Popen([sys.executable, "-c", SPIN.format(cpu_s=2.0)])  # ours, over two bins
        child.wait(timeout=60)
        time.sleep(2.0)
    record = watch.record()
    assert 2.6 < record["foreign_cpu_s"] < 4.0, record
    assert record["unattributed_cpu_s"] > -1.0, record   # not the child's 2 s a second time


def test_phases_report_other_work_apart_from_interrupts_and_steal(caplog):
    """A recording's setting gets each kind per phase; only other work warns about a pre-training."""
    record = {"started_wall_s": 100.0, "interval_s": 2.0, "heaviest_foreign": [],
              "bins": [[102.0, 0.0, 4.0, 0.5], [104.0, 0.0, 4.0, 0.5], [106.0, 1.0, 0.2, 0.0]]}
    profile = {"created_wall_s": 104.0, "pretrain_time_s": 4.0}
    phases = choice_accuracy.host_cpu_of_phases(record, profile, warn_above_s=5.0)
    assert phases["foreign_cpu_s"]["pretraining"] == 0.0 and phases["interrupt_cpu_s"]["pretraining"] == 8.0
    assert phases["steal_s"]["pretraining"] == 1.0 and phases["foreign_cpu_s"]["trainings"] == 1.0
    assert (
        phases["kernel_cpu_s"]["pretraining"] == 0.0 and phases["unattributed_cpu_s"]["trainings"] == 0.0
    )  # older bins
    assert "other work" not in caplog.text   # 8 s of interrupts during pre-training: no warning
    record["bins"][0][1] = 6.0
    choice_accuracy.host_cpu_of_phases(record, profile, warn_above_s=5.0)
    assert "other work took 6.0 CPU s" in caplog.text
