"""Everything an agent knows and holds: its config, device facts, power source, tasks, ports.

Handlers receive this object; the servicer and the server own its lifetime. Reads of the power
source are serialized here because counter-based sources (RAPL, emulated CPU time) keep the
previous read and two interleaved streams would each see half the interval.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import threading
import time
from pathlib import Path

from hetcluster.agent.config import AgentConfig
from hetcluster.agent.messages import DeviceInfo
from hetcluster.agent.plane import AgentPlane
from hetcluster.agent.ports import PortReservations
from hetcluster.agent.tasks import TaskSupervisor
from hetcluster.power.base import PowerSample, PowerSource

log = logging.getLogger(__name__)


class AgentState:
    def __init__(
        self, config: AgentConfig, power_source: PowerSource, device_info: DeviceInfo, state_dir: Path | None = None
    ) -> None:
        self.config = config
        self.power_source = power_source
        self.device_info = device_info
        # without a configured state dir the agent works in a temporary one, removed on close
        self._temporary_state_dir = not (state_dir or config.state_dir)
        self.state_dir = (
            state_dir or config.state_dir or Path(tempfile.mkdtemp(prefix=f"hetcluster-agent-{_slug(config.name)}-"))
        )
        # An emulated device's TF server gets as many TF threads as cores it is granted: a 0.15-core
        # device running two busy threads inside its quota would thrash more than a real slow device.
        threads = math.ceil(config.emulation.compute_share) if config.emulation is not None else 0
        cgroup_procs = config.emulation.task_cgroup_procs if config.emulation is not None else ()
        self.tasks = TaskSupervisor(self.state_dir, tf_threads=threads, cgroup_procs=cgroup_procs)
        self.ports = PortReservations(advertised_host=config.task_host())
        self.plane = AgentPlane(config)
        self.streams = StreamSlots()
        self.stopping = threading.Event()
        self._power_lock = threading.Lock()
        self._last_sample: PowerSample | None = None

    def read_power(self, max_age_s: float = 0.0, newer_than_s: float = float("-inf")) -> PowerSample:
        """A fresh sample, or the last one when it is younger than ``max_age_s`` and taken after
        ``newer_than_s`` (the caller's previous sample): concurrent streams then share reads
        instead of each forcing its own (counter sources enforce a minimum interval between
        reads, which would otherwise halve every stream's rate), and no stream sees a sample twice."""
        with self._power_lock:
            last = self._last_sample
            if last is not None and last.monotonic_s > newer_than_s and time.monotonic() - last.monotonic_s < max_age_s:
                return last
            self._last_sample = self.power_source.read()
            return self._last_sample

    def close(self, grace_s: float = 5.0) -> None:
        """Stop every task, drop port reservations, release the power source."""
        self.stopping.set()
        self.tasks.stop_all(grace_s)
        self.ports.close()
        self.plane.close()
        if self._temporary_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        try:
            self.power_source.close()
        except Exception:  # closing must not keep the agent from exiting
            log.exception("closing power source %s", self.power_source.name)


class StreamSlots:
    """Power streams are long calls: at most ``total`` at once, ``per_caller`` from one peer host,
    so streams never take the threads that health checks and task control need."""

    def __init__(self, total: int = 16, per_caller: int = 8) -> None:
        self.total, self.per_caller = total, per_caller
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, caller: str) -> bool:
        with self._lock:
            if sum(self._held.values()) >= self.total or self._held.get(caller, 0) >= self.per_caller:
                return False
            self._held[caller] = self._held.get(caller, 0) + 1
            return True

    def release(self, caller: str) -> None:
        with self._lock:
            left = self._held.get(caller, 0) - 1
            if left > 0:
                self._held[caller] = left
            else:
                self._held.pop(caller, None)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:40]
