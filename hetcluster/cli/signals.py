"""SIGTERM takes Ctrl-C's path in the commands that start servers on the agents.

`kill PID`, a systemd stop or a CI timeout send SIGTERM, whose default ends Python at once: no
`finally` runs, so the TF servers a run started keep running on the devices and its temporary
folders stay. Raised as KeyboardInterrupt instead, a training run stops at its next round boundary
and stops its servers (training/coordinator.py), and pre-training stops its shared servers.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises KeyboardInterrupt (main thread only, as signal handlers are)."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
