"""Other work on the host while an experiment measures: CPU seconds not spent by the experiment.

The emulated devices share this host's cores, so anything else that runs during a recording —
above all during its short pre-training windows — reads every rate low (docs/experiments.md).
`ForeignCpu` samples, every ``interval_s``, the host's busy CPU time (psutil.cpu_times: all but
idle and iowait) and the CPU time of the experiment's own processes: this process and its
descendants, and every process whose command line holds ``marker`` (the fleet's state dir: the
agents, started by `cluster up` and re-parented to init) with theirs. A process's CPU counts its
reaped children too (user + system + children_user + children_system), so a short-lived child of
ours is not taken for another's. What the host spent beyond ours in a bin is "foreign": other
users' work, a test run, an analysis script (and the kernel's own threads, a fraction of a
per cent). The record keeps every bin, the total and the heaviest foreign commands, each by its
own CPU time (init reaps every orphan, the fleet's agents too, and a shell its commands: counting
reaped children there would count those twice).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil


def _busy_s() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


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
        self.bins: list[tuple[float, float]] = []           # (end wall time, foreign CPU seconds)
        self._own_pid = os.getpid()
        self._ours: dict[tuple[int, float], bool] = {}     # (pid, create_time) → ours?
        self._last: dict[tuple[int, float], tuple[float, float]] = {}   # its _cpu_s at the last sample
        self._foreign_by_command: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="foreign-cpu", daemon=True)
        self._last_busy_s = 0.0

    def __enter__(self) -> "ForeignCpu":
        self.started_wall_s = time.time()
        self._last_busy_s = _busy_s()
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
        self.bins.append((time.time(), self._sample()))

    def _is_ours(self, process: psutil.Process, key: tuple[int, float], parents: dict[int, tuple[int, float]]) -> bool:
        if key not in self._ours:
            parent = parents.get(process.ppid())
            try:
                marked = self.marker in " ".join(process.cmdline())
            except psutil.Error:
                marked = False
            self._ours[key] = key[0] == self._own_pid or marked or bool(parent and self._ours.get(parent))
        return self._ours[key]

    def _sample(self, first: bool = False) -> float:
        """Foreign CPU seconds since the previous sample (0 for the first, which sets the baselines)."""
        busy_s = _busy_s()
        processes = []
        for process in psutil.process_iter():
            try:
                processes.append((process, (process.pid, process.create_time())))
            except psutil.Error:
                continue
        parents = {key[0]: key for _, key in processes}
        ours_s = 0.0
        seen = {}
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
            elif cpu_s[0] > last_own_s:   # its own: init reaps every orphan, ours too, and a shell its commands
                self._add_foreign(process, cpu_s[0] - last_own_s)
        self._last = seen
        self._ours = {key: value for key, value in self._ours.items() if key in seen}
        spent_s, self._last_busy_s = busy_s - self._last_busy_s, busy_s
        return 0.0 if first else max(spent_s - ours_s, 0.0)

    def _add_foreign(self, process: psutil.Process, cpu_s: float) -> None:
        """Credit ``cpu_s`` to the process's command (read only for the few foreign processes that ran)."""
        try:
            command = " ".join(process.cmdline()[:3])[:120] or process.name()
        except psutil.Error:
            return
        self._foreign_by_command[command] = self._foreign_by_command.get(command, 0.0) + cpu_s

    def record(self) -> dict[str, Any]:
        heaviest = sorted(self._foreign_by_command.items(), key=lambda item: -item[1])[: self.top]
        return {"started_wall_s": self.started_wall_s, "interval_s": self.interval_s,
                "foreign_cpu_s": round(sum(cpu_s for _, cpu_s in self.bins), 2),
                "bins": [[round(end_s, 2), round(cpu_s, 3)] for end_s, cpu_s in self.bins],
                "heaviest_foreign": [{"command": c, "cpu_s": round(s, 2)} for c, s in heaviest]}


def foreign_cpu_between(record: dict[str, Any], start_wall_s: float, end_wall_s: float) -> float:
    """Foreign CPU seconds of a ForeignCpu record within [start, end] (bins cut in proportion)."""
    total, bin_start = 0.0, record["started_wall_s"]
    for bin_end, cpu_s in record["bins"]:
        overlap = min(bin_end, end_wall_s) - max(bin_start, start_wall_s)
        if overlap > 0 and bin_end > bin_start:
            total += cpu_s * overlap / (bin_end - bin_start)
        bin_start = bin_end
    return total
