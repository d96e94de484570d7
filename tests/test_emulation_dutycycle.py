"""SIGSTOP/SIGCONT duty cycling of a real busy process tree, children started later included."""

import subprocess
import sys
import time

import psutil
import pytest
from busy import BUSY_UNTIL_ORPHANED

from hetcluster.emulation.dutycycle import DutyCycler, duty_for_share, run_duty_cycle
from hetcluster.errors import EmulationError

# The parent idles; after 0.5 s it starts a busy child (like an agent starting a TF server), and
# both end when the test's process is gone.
LATE_CHILD = (
    "import os, subprocess, sys, time\n"
    "parent = os.getppid()\n"
    "time.sleep(0.5)\n"
    f"child = subprocess.Popen([sys.executable, '-c', {BUSY_UNTIL_ORPHANED!r}])\n"
    "while os.getppid() == parent and child.poll() is None:\n"
    "    time.sleep(0.2)\n"
    "child.kill()\n"
)


# SIGTERM lands while the supervisor's loop sits in its stop flag's wait holding the flag's lock (if
# it has one: threading.Event does, and a handler calling its set() then waits forever on a lock its
# own thread holds — seen once, a supervisor asleep on that futex after SIGTERM).
SIGNAL_INSIDE_WAIT = (
    "import contextlib, os, signal\n"
    "from hetcluster.emulation.dutycycle import stop_on_signals\n"
    "stop = stop_on_signals()\n"
    "with getattr(stop, '_cond', contextlib.nullcontext()):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    for _ in range(1000):\n"
    "        pass\n"
    "print(stop.is_set())\n"
)


def _tree_cpu_s(root: psutil.Process) -> float:
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def test_duty_for_share():
    assert duty_for_share(0.25) == 0.25
    assert duty_for_share(1.5) == 1.0
    with pytest.raises(EmulationError):
        run_duty_cycle(1, 0.0)


@pytest.mark.serial  # a CPU share or a sample rate, measured: another test beside it would bend it
def test_duty_cycle_holds_a_late_busy_child_near_its_share():
    parent = subprocess.Popen([sys.executable, "-c", LATE_CHILD])
    supervisor = DutyCycler(period_s=0.1).start(parent.pid, 0.25)
    assert supervisor is not None
    root = psutil.Process(parent.pid)
    try:
        time.sleep(1.5)  # the child exists by now and has been caught
        assert len(root.children()) == 1
        before_s, t0 = _tree_cpu_s(root), time.monotonic()
        time.sleep(3.0)
        fraction = (_tree_cpu_s(root) - before_s) / (time.monotonic() - t0)
        assert 0.15 < fraction < 0.35, fraction
    finally:
        supervisor.terminate()
        assert supervisor.wait(timeout=5) == 0
        children = root.children(recursive=True)
        # The supervisor resumes the tree when it stops: nothing is left in state T.
        assert all(p.status() != psutil.STATUS_STOPPED for p in [root, *children])
        for process in [*children, root]:
            process.kill()
        parent.wait()


def test_supervisor_exits_when_its_process_is_gone():
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    supervisor = DutyCycler().start(target.pid, 0.5)
    target.wait()
    assert supervisor.wait(timeout=5) == 0


def test_full_share_needs_no_supervisor():
    assert DutyCycler().start(1, 1.0) is None


def test_supervisor_signal_handler_needs_no_lock_its_loop_may_hold():
    done = subprocess.run([sys.executable, "-c", SIGNAL_INSIDE_WAIT], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
