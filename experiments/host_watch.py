"""Other work on the host while an experiment measures: CPU seconds not spent by the experiment.

The emulated devices share this host's cores, so anything else that runs during a recording —
above all during its short pre-training windows — reads every rate low (docs/experiments.md, "Setup").
`ForeignCpu` samples, every ``interval_s``, the host's CPU time (psutil.cpu_times) and that of the
experiment's own processes: this process and its descendants, and every process whose command
line holds ``marker`` (the fleet's state dir: the agents, started by `cluster up` and re-parented
to init) with theirs.

- **foreign**: what other processes spent (user and system time), each by its own CPU between
  samples, and what their children spent that no sample saw — short-lived commands, a child's last
  seconds — read from the parent's children time (what earlier samples counted of a child that
  ended comes off it). That is other users' work, a test run, an analysis script, the sandbox's own
  agent. A process of ours counts its reaped children too (user + system + children_user +
  children_system), so a short-lived child of ours is not taken for another's; when one of ours
  that earlier samples saw ends and a parent of ours reaps it, what they counted comes off again.
  The heaviest other commands are kept (``heaviest_foreign``), each by its own CPU time, and the
  children no sample saw together under ENDED_CHILDREN.
- **kernel**: the kernel's threads (kdamond, ksoftirqd, kworker: kthreadd's children), by the same
  count — about 0.01 CPU s per second whatever runs, most of it kdamond. The heaviest are kept
  apart (``heaviest_kernel``).
- **interrupts** (irq and softirq): charged to no process in /proc/stat, and mostly the fleet's
  own traffic — gRPC and the parameter server over loopback are served in softirq, a few hundredths
  of a CPU second per second of a pre-training and none on an idle host.
- **steal**: time the hypervisor gave to other guests.
- **unattributed**: the host's process time less everything processes spent, signed. It reads
  negative while the fleet trains (a few CPU seconds over minutes of a resnet50 training, beside
  about as much of interrupts and kernel threads). Two causes: without CONFIG_IRQ_TIME_ACCOUNTING a
  task's run time holds the interrupts served while it ran, which /proc/stat counts as irq and
  softirq instead; and /proc/stat samples each tick, so it misses a task that wakes after a tick and
  sleeps again before the next, the fleet's many short waits, which the task's own run time counts
  (`benchmarks/tick_accounting.py` measures how far, either way, with the pattern of waits). A
  process's last seconds before init or a gone parent reaped it land here too.

Counting other work from the other processes themselves, rather than as the host's process time
less ours, keeps both of those out of it: the difference would read low on a busy host and high
where ours read low. The record keeps every bin ([end wall time, *BIN_FIELDS]) and the totals;
records of an earlier version, whose bins stop after steal, read 0 for the fields they lack
(host_cpu_between).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from typing import Any

import psutil

TOTAL_KEYS = {"foreign": "foreign_cpu_s", "interrupts": "interrupt_cpu_s", "steal": "steal_s",
              "kernel": "kernel_cpu_s", "unattributed": "unattributed_cpu_s"}  # each field's total in a record
BIN_FIELDS = tuple(TOTAL_KEYS)   # a bin: [end wall time, *these in CPU seconds]; older records stop after steal
KTHREADD_PID = 2                 # Linux: the kernel's threads are kthreadd's children
ENDED_CHILDREN = "(ended children of other processes)"   # heaviest_foreign's name for what no sample saw


def host_cpu_s() -> tuple[float, float, float]:
    """The host's CPU seconds so far: (in processes, in interrupts, stolen by the hypervisor). Linux
    counts guest time inside user time, so it is not added again."""
    times = psutil.cpu_times()
    process_s = times.user + getattr(times, "nice", 0.0) + times.system
    return process_s, getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0), getattr(times, "steal", 0.0)


def process_cpu_s(process: psutil.Process) -> tuple[float, float]:
    """(its own CPU seconds, with its reaped children's)."""
    times = process.cpu_times()
    own_s = times.user + times.system
    return own_s, own_s + times.children_user + times.children_system


class ForeignCpu:
    """Context manager: a thread that records the host's CPU seconds spent outside the experiment,
    per bin of ``interval_s`` (module docstring). ``record()`` is the JSON-ready result."""

    def __init__(self, marker: str, interval_s: float = 2.0, top: int = 5) -> None:
        self.marker, self.interval_s, self.top = marker, interval_s, top
        self.started_wall_s = time.time()
        self.bins: list[tuple[float, ...]] = []   # (end wall time, *BIN_FIELDS)
        self._own_pid = os.getpid()
        self._ours: dict[tuple[int, float], bool] = {}     # (pid, create_time) → ours?
        self._last: dict[tuple[int, float], tuple[float, float]] = {}   # its process_cpu_s at the last sample
        self._parent_of: dict[tuple[int, float], tuple[int, float] | None] = {}   # each process's parent then
        self._by_command = {"foreign": Counter(), "kernel": Counter()}  # kind → command → CPU s
        self._owed: dict[
            tuple[int, float], float
        ] = {}  # a parent's ended children counted before its children time grew
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="foreign-cpu", daemon=True)
        self._last_host_s = (0.0, 0.0, 0.0)

    def __enter__(self) -> "ForeignCpu":
        self.started_wall_s = time.time()
        self._last_host_s = host_cpu_s()
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._add_bin()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._add_bin()

    def _add_bin(self) -> None:
        self.bins.append((time.time(), *self._sample()))

    def _is_ours(self, process: psutil.Process, key: tuple[int, float], parent: tuple[int, float] | None) -> bool:
        if key not in self._ours:
            try:
                marked = self.marker in " ".join(process.cmdline())
            except psutil.Error:
                marked = False
            self._ours[key] = key[0] == self._own_pid or marked or bool(parent and self._ours.get(parent))
        return self._ours[key]

    def _sample(self, first: bool = False) -> tuple[float, ...]:
        """BIN_FIELDS' CPU seconds since the previous sample (zeros for the first, which sets the
        baselines): other processes' by what each spent, interrupts and steal from the host's
        counters, and what the host counted beyond every process (unattributed, signed)."""
        host_s = host_cpu_s()
        processes = []
        for process in psutil.process_iter():
            try:
                processes.append((process, (process.pid, process.create_time())))
            except psutil.Error:
                continue
        parents = {key[0]: key for _, key in processes}
        spent = {"ours": 0.0, "foreign": 0.0, "kernel": 0.0}
        reaped: dict[tuple[int, float], float] = {}   # a process not ours → its children time's growth
        seen, parent_of = {}, {}
        for process, key in sorted(processes, key=lambda item: item[1][1]):   # parents before their children
            try:
                cpu_s = process_cpu_s(process)
                parent_of[key] = parents.get(process.ppid())
                ours = self._is_ours(process, key, parent_of[key])
            except psutil.Error:
                continue
            last_own_s, last_with_children_s = self._last.get(key, (0.0, 0.0) if not first else cpu_s)
            seen[key] = cpu_s
            if ours:
                spent["ours"] += cpu_s[1] - last_with_children_s
                continue
            if cpu_s[0] > last_own_s:
                kind = self._kind(key, parent_of[key])
                spent[kind] += cpu_s[0] - last_own_s
                self._add_process(kind, process, cpu_s[0] - last_own_s)
            reaped[key] = (cpu_s[1] - cpu_s[0]) - (last_with_children_s - last_own_s)
        # A process that ended since the last sample: its parent's children time now holds its whole
        # CPU, of which what the earlier samples counted comes off again. What is left of a parent
        # not ours is its children's CPU no sample saw (short-lived commands, a child's last
        # seconds): theirs, unless a child of ours is among those it reaped (init reaping the
        # fleet's agents), whose last seconds are ours and stay unattributed.
        reaped_ours = set()
        for key, (_, last_with_children_s) in self._last.items():
            parent = self._parent_of.get(key)
            if key in seen or parent not in seen:
                continue
            if not self._ours.get(parent):
                reaped[parent] = reaped.get(parent, 0.0) - last_with_children_s
                if self._ours.get(key):
                    reaped_ours.add(parent)
            elif self._ours.get(key):
                spent["ours"] -= last_with_children_s
        # A child read as ended before its parent's children time held it (the parent is read first,
        # the child reaped in between): what comes off waits for the parent's next samples.
        for parent, owed_s in self._owed.items():
            if parent in reaped:
                reaped[parent] += owed_s
        self._owed = {parent: cpu_s for parent, cpu_s in reaped.items() if cpu_s < 0}
        for parent, cpu_s in reaped.items():
            if cpu_s > 0 and parent not in reaped_ours:
                kind = self._kind(parent, parent_of.get(parent))
                spent[kind] += cpu_s
                self._credit(kind, ENDED_CHILDREN, cpu_s)
        self._last, self._parent_of = seen, parent_of
        self._ours = {key: value for key, value in self._ours.items() if key in seen}
        process_s, interrupt_s, steal_s = (now - last for now, last in zip(host_s, self._last_host_s))
        self._last_host_s = host_s
        if first:
            return (0.0,) * len(BIN_FIELDS)
        unattributed_s = process_s - spent["ours"] - spent["foreign"] - spent["kernel"]
        return spent["foreign"], interrupt_s, steal_s, spent["kernel"], unattributed_s

    @staticmethod
    def _kind(key: tuple[int, float], parent: tuple[int, float] | None) -> str:
        """"kernel" for the kernel's threads (kthreadd, pid 2, and its children), else "foreign"."""
        return "kernel" if key[0] == KTHREADD_PID or (parent is not None and parent[0] == KTHREADD_PID) else "foreign"

    def _add_process(self, kind: str, process: psutil.Process, cpu_s: float) -> None:
        """Credit ``cpu_s`` to the process's command under ``kind`` (its command line is read only for
        the few processes not ours that ran)."""
        try:
            command = " ".join(process.cmdline()[:3])[:120] or process.name()
        except psutil.Error:
            return
        self._credit(kind, command, cpu_s)

    def _credit(self, kind: str, command: str, cpu_s: float) -> None:
        self._by_command[kind][command] += cpu_s

    def _heaviest(self, kind: str) -> list[dict[str, Any]]:
        return [{"command": c, "cpu_s": round(s, 2)} for c, s in self._by_command[kind].most_common(self.top)]

    def record(self) -> dict[str, Any]:
        totals = {TOTAL_KEYS[field]: round(sum(b[1 + i] for b in self.bins), 2) for i, field in enumerate(BIN_FIELDS)}
        return {"started_wall_s": self.started_wall_s, "interval_s": self.interval_s, **totals,
                "bins": [[round(end_s, 2), *(round(x, 3) for x in rest)] for end_s, *rest in self.bins],
                "heaviest_foreign": self._heaviest("foreign"), "heaviest_kernel": self._heaviest("kernel")}


def host_cpu_between(record: dict[str, Any], start_wall_s: float, end_wall_s: float, field: str = "foreign") -> float:
    """A ForeignCpu record's CPU seconds of ``field`` (one of BIN_FIELDS) within [start, end], bins
    cut in proportion (0 for a field a record from before it was kept does not have)."""
    column = 1 + BIN_FIELDS.index(field)
    total, bin_start = 0.0, record["started_wall_s"]
    for values in record["bins"]:
        bin_end, cpu_s = values[0], (values[column] if len(values) > column else 0.0)
        overlap = min(bin_end, end_wall_s) - max(bin_start, start_wall_s)
        if overlap > 0 and bin_end > bin_start:
            total += cpu_s * overlap / (bin_end - bin_start)
        bin_start = bin_end
    return total
