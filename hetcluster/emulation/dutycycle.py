"""SIGSTOP/SIGCONT duty cycling: the slowdown of last resort, when no cgroup is writable.

Every period (~100 ms) the supervisor lets the device's whole process tree run for about
``duty × period`` and stops it for the rest; the window is corrected by the CPU time the tree
actually used, so the whole tree averages ``duty`` cores, like a CFS quota of ``duty`` cores.
The tree is re-read every period, so children the agent starts later (TF servers) are caught
within one period. A quota is smoother (the kernel enforces it per 100 ms with no
process of ours in the loop), which is why cgroups are preferred; this fallback works for any
user who owns the processes.

Run as ``python -m hetcluster.emulation.dutycycle --pid PID --duty 0.25``: one supervisor per
device. It exits, after resuming the tree, when the root process is gone or on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import psutil

from hetcluster.errors import EmulationError

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 0.1


def duty_for_share(share: float) -> float:
    """Cores the tree may average (at most 1: a share ≥ 1 needs no supervisor, its threads run freely)."""
    return max(0.01, min(1.0, share))


def process_tree(root_pid: int) -> list[psutil.Process]:
    """The root and all its descendants that still exist."""
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _signal_all(processes: list[psutil.Process], signum: int) -> None:
    for process in processes:
        try:
            process.send_signal(signum)
        except psutil.Error:
            continue


def _tree_cpu_s(tree: list[psutil.Process]) -> float:
    total = 0.0
    for process in tree:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


class SignalStop:
    """A stop flag that a signal handler may set: ``set`` takes no lock.

    ``threading.Event.set`` takes the event's lock, and Python runs a signal handler in the main
    thread between two bytecodes — possibly while that thread's own ``Event.wait`` holds the lock,
    so the handler would wait forever on it (a supervisor once slept on that futex after SIGTERM
    until it was killed). ``wait`` sleeps the whole timeout (a signal does not shorten it), so a
    stop takes effect within one duty-cycle window.
    """

    def __init__(self) -> None:
        self._stopped = False

    def set(self, *_signal_args: object) -> None:
        self._stopped = True

    def is_set(self) -> bool:
        return self._stopped

    def wait(self, timeout_s: float) -> bool:
        if not self._stopped and timeout_s > 0:
            time.sleep(timeout_s)
        return self._stopped


def stop_on_signals() -> SignalStop:
    """A SignalStop set by SIGTERM and SIGINT (the handlers are installed here)."""
    stop = SignalStop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop.set)
    return stop


def run_duty_cycle(root_pid: int, duty: float, period_s: float = DEFAULT_PERIOD_S,
                   stop: threading.Event | SignalStop | None = None) -> None:
    """Alternate SIGCONT and SIGSTOP on the tree of root_pid until it exits or ``stop`` is set.

    The run window is stretched by the CPU time the tree fell short of ``duty`` in the previous
    periods (capped at one period), so on a busy host, where the tree does not get a core for its
    whole window, it still averages ``duty`` cores per thread, as a CFS quota would give it.
    """
    if not 0 < duty <= 1:
        raise EmulationError(f"duty {duty!r} is outside (0, 1].", hint="pass the device's share, at most 1.")
    stop = stop or threading.Event()
    tree: list[psutil.Process] = []
    credit_s = 0.0  # CPU time owed to the tree (positive) from earlier periods
    try:
        while not stop.is_set():
            start = time.monotonic()
            tree = process_tree(root_pid)
            if not tree or tree[0].status() == psutil.STATUS_ZOMBIE:
                log.info("duty cycle: process %d is gone; exiting", root_pid)
                return
            if duty >= 1.0:
                _signal_all(tree, signal.SIGCONT)
                stop.wait(period_s)
                continue
            cpu_before_s = _tree_cpu_s(tree)
            run_s = min(period_s, max(0.0, duty * period_s + credit_s))
            _signal_all(tree, signal.SIGCONT)
            if run_s > 0 and stop.wait(max(0.0, start + run_s - time.monotonic())):
                break
            tree = process_tree(root_pid)
            _signal_all(tree, signal.SIGSTOP)
            used_s = _tree_cpu_s(tree) - cpu_before_s
            # Only a tree that wanted the CPU is owed time: an idle agent earns no credit.
            wanted = used_s > 0.2 * run_s
            credit_s = min(period_s, max(-period_s, credit_s + duty * period_s - used_s)) if wanted else 0.0
            stop.wait(max(0.0, start + period_s - time.monotonic()))
    except psutil.Error:
        return
    finally:
        _signal_all(process_tree(root_pid) or tree, signal.SIGCONT)


@dataclass(frozen=True)
class DutyCycler:
    """Starts one supervisor process per device; its PID is recorded so `down` can stop it."""

    period_s: float = DEFAULT_PERIOD_S

    def describe(self) -> str:
        return f"SIGSTOP/SIGCONT duty cycling (period {self.period_s * 1000:g} ms)"

    def start(self, root_pid: int, share: float, log_path: str | None = None) -> subprocess.Popen | None:
        """Spawn the supervisor for the tree of root_pid; None when the share needs no slowing."""
        duty = duty_for_share(share)
        if duty >= 1.0:
            return None
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "hetcluster.emulation.dutycycle", "--pid", str(root_pid),
                 "--duty", f"{duty:.6f}", "--period-s", f"{self.period_s:g}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            )
        except OSError as error:
            raise EmulationError(f"cannot start the duty-cycle supervisor ({sys.executable}): {error.strerror}.",
                                 hint="check that this user may run the Python interpreter of the install.") from None
        finally:
            if log_path:
                out.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Duty-cycle a process tree with SIGSTOP/SIGCONT.")
    parser.add_argument("--pid", type=int, required=True, help="root of the process tree")
    parser.add_argument("--duty", type=float, required=True, help="fraction of each period the tree runs, (0, 1]")
    parser.add_argument("--period-s", type=float, default=DEFAULT_PERIOD_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s dutycycle[%(process)d]: %(message)s")
    stop = stop_on_signals()
    try:
        os.nice(-5)  # a late SIGSTOP lets the tree run over its share; ask to be scheduled promptly
    except OSError:
        pass
    try:
        run_duty_cycle(args.pid, args.duty, args.period_s, stop)
    except EmulationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
