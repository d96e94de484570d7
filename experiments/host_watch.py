"""Other work on the host while an experiment measures: CPU seconds not spent by the experiment.

The emulated devices share this host's cores, so anything else that runs during a recording —
above all during its short pre-training windows — reads every rate low (docs/experiments.md).
`ForeignCpu` samples, every ``interval_s``, the host's CPU time (psutil.cpu_times) and that of the
experiment's own processes: this process and its descendants, and every process whose command
line holds ``marker`` (the fleet's state dir: the agents, started by `cluster up` and re-parented
to init) with theirs.

- **foreign**: what processes spent (user, nice and system time) beyond ours — other users' work,
  a test run, an analysis script, and the kernel's own threads (kdamond, ksoftirqd: a fraction of
  a per cent). A process of ours counts its reaped children too (user + system + children_user +
  children_system), so a short-lived child of ours is not taken for another's; when one of ours
  that earlier samples saw ends and a parent of ours reaps it, what they counted comes off again
  (the parent's children time now holds all of it). The heaviest foreign commands are kept, each
  by its own CPU time (init reaps every orphan, the fleet's agents too, and a shell its commands:
  counting reaped children there would count those twice).
- **interrupts** (irq and softirq): charged to no process, and mostly the fleet's own traffic —
  gRPC and the parameter server over loopback are served in softirq, about 0.04 s per second of a
  pre-training here and none on the idle host (/proc/stat, 2026-11-29).
- **steal**: time the hypervisor gave to other guests.

The record keeps every bin ([end wall time, foreign, interrupts, steal]) and the totals. Until
2026-11-29 evening interrupts counted as foreign (a four-device pre-training of 210 s read 5.1 s
with nothing else running), and a reaped server of ours was counted twice, which lost its bin's
other work: the foreign figures recorded before then are under-counts over a recording's
trainings (densenet121-xtn: 18.0 s in all, interrupts included, where its five heaviest other
commands alone took 26.5), and during a pre-training, whose TF servers stay up to its end, by the
few bins where one of its runs' clients ended.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import psutil


TOTAL_KEYS = {"foreign": "foreign_cpu_s", "interrupts": "interrupt_cpu_s", "steal": "steal_s"}  # each field's total in a record
BIN_FIELDS = tuple(TOTAL_KEYS)   # a bin: [end wall time, *these in CPU seconds]


def _host_s() -> tuple[float, float, float]:
    """The host's CPU seconds so far: (in processes, in interrupts, stolen by the hypervisor). Linux
    counts guest time inside user time, so it is not added again."""
    times = psutil.cpu_times()
    process_s = times.user + getattr(times, "nice", 0.0) + times.system
    return process_s, getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0), getattr(times, "steal", 0.0)


def _cpu_s(process: psutil.Process) -> tuple[float, float]:
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
        self.bins: list[tuple[float, float, float, float]] = []   # (end wall time, *BIN_FIELDS)
        self._own_pid = os.getpid()
        self._ours: dict[tuple[int, float], bool] = {}     # (pid, create_time) → ours?
        self._last: dict[tuple[int, float], tuple[float, float]] = {}   # its _cpu_s at the last sample
        self._parent_of: dict[tuple[int, float], tuple[int, float] | None] = {}   # an ours process's parent then
        self._foreign_by_command: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="foreign-cpu", daemon=True)
        self._last_host_s = (0.0, 0.0, 0.0)

    def __enter__(self) -> "ForeignCpu":
        self.started_wall_s = time.time()
        self._last_host_s = _host_s()
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

    def _is_ours(self, process: psutil.Process, key: tuple[int, float], parents: dict[int, tuple[int, float]]) -> bool:
        if key not in self._ours:
            parent = parents.get(process.ppid())
            try:
                marked = self.marker in " ".join(process.cmdline())
            except psutil.Error:
                marked = False
            self._ours[key] = key[0] == self._own_pid or marked or bool(parent and self._ours.get(parent))
        return self._ours[key]

    def _sample(self, first: bool = False) -> tuple[float, float, float]:
        """(foreign, interrupt, stolen) CPU seconds since the previous sample (zeros for the first,
        which sets the baselines)."""
        host_s = _host_s()
        processes = []
        for process in psutil.process_iter():
            try:
                processes.append((process, (process.pid, process.create_time())))
            except psutil.Error:
                continue
        parents = {key[0]: key for _, key in processes}
        ours_s = 0.0
        seen, parent_of = {}, {}
        for process, key in sorted(processes, key=lambda item: item[1][1]):   # parents before their children
            try:
                cpu_s = _cpu_s(process)
                ours = self._is_ours(process, key, parents)
            except psutil.Error:
                continue
            last_own_s, last_with_children_s = self._last.get(key, (0.0, 0.0) if not first else cpu_s)
            seen[key] = cpu_s
            if ours:
                ours_s += cpu_s[1] - last_with_children_s
                with contextlib.suppress(psutil.Error):
                    parent_of[key] = parents.get(process.ppid())
            elif cpu_s[0] > last_own_s:   # its own: init reaps every orphan, ours too, and a shell its commands
                self._add_foreign(process, cpu_s[0] - last_own_s)
        # A process of ours that ended and was reaped by a parent of ours: the parent's children
        # time now holds its whole CPU, of which what the earlier samples counted comes off again.
        for key, (_, last_with_children_s) in self._last.items():
            parent = self._parent_of.get(key)
            if key not in seen and self._ours.get(key) and parent in seen and self._ours.get(parent):
                ours_s -= last_with_children_s
        self._last, self._parent_of = seen, parent_of
        self._ours = {key: value for key, value in self._ours.items() if key in seen}
        process_s, interrupt_s, steal_s = (now - last for now, last in zip(host_s, self._last_host_s))
        self._last_host_s = host_s
        if first:
            return 0.0, 0.0, 0.0
        return max(process_s - ours_s, 0.0), interrupt_s, steal_s

    def _add_foreign(self, process: psutil.Process, cpu_s: float) -> None:
        """Credit ``cpu_s`` to the process's command (read only for the few foreign processes that ran)."""
        try:
            command = " ".join(process.cmdline()[:3])[:120] or process.name()
        except psutil.Error:
            return
        self._foreign_by_command[command] = self._foreign_by_command.get(command, 0.0) + cpu_s

    def record(self) -> dict[str, Any]:
        heaviest = sorted(self._foreign_by_command.items(), key=lambda item: -item[1])[: self.top]
        totals = {TOTAL_KEYS[field]: round(sum(b[1 + i] for b in self.bins), 2) for i, field in enumerate(BIN_FIELDS)}
        return {"started_wall_s": self.started_wall_s, "interval_s": self.interval_s, **totals,
                "bins": [[round(end_s, 2), *(round(x, 3) for x in rest)] for end_s, *rest in self.bins],
                "heaviest_foreign": [{"command": c, "cpu_s": round(s, 2)} for c, s in heaviest]}


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
