"""Supervision of the TensorFlow server processes an agent starts.

Each task is ``python -m hetcluster.agent.tf_server`` in its own process group, so a stop
signal reaches the server and anything it spawned, and a Ctrl-C at the agent's terminal does not.
On an emulated device each server first joins the device's cgroups (``cgroup_procs``, through
:func:`hetcluster.emulation.slowdown.wrapper_command`: a shell that writes its PID there and execs
the server, so the PID stays the server's).
State is derived from the process on every query (poll), so there is no reaper thread to race
with. Resource use (CPU time, RSS) is summed over the process and its children with psutil.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import psutil

from hetcluster.agent.messages import TaskInfo
from hetcluster.emulation.slowdown import wrapper_command
from hetcluster.errors import TaskError
from hetcluster.tfenv import tf_env

log = logging.getLogger(__name__)

STDERR_TAIL_LINES = 20


class TaskNotFound(TaskError):
    """No task with that id was started by this agent."""


@dataclass
class _Task:
    task_id: str
    job_name: str
    task_index: int
    address: str
    process: subprocess.Popen
    log_path: Path
    started_wall_s: float
    started_mono_s: float
    stop_requested: bool = False
    ended_mono_s: float | None = None
    last_cpu_time_s: float = 0.0
    last_rss_bytes: int = 0
    listening: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class TaskSupervisor:
    def __init__(self, state_dir: Path, python: str = sys.executable, tf_threads: int = 0,
                 cgroup_procs: Sequence[Path] = ()) -> None:
        self._state_dir = state_dir
        self._python = python
        self._tf_threads = tf_threads  # 0 = TensorFlow's default (one per core)
        self._cgroup_procs = tuple(cgroup_procs)  # an emulated device's cgroups, joined by each server
        self._tasks: dict[str, _Task] = {}
        self._lock = threading.Lock()

    def start(self, job_name: str, task_index: int, cluster_spec: dict[str, list[str]], task_id: str = "", protocol: str = "grpc") -> TaskInfo:
        """Start a TF server child for (job_name, task_index) of an already validated spec."""
        task_id = task_id or f"{job_name}-{task_index}-{uuid.uuid4().hex[:8]}"
        with self._lock:
            existing = self._tasks.get(task_id)
            if existing is not None and existing.process.poll() is None:
                raise TaskError(f"task {task_id!r} is already running (pid {existing.process.pid}).", hint="stop it first or use another task_id.")
            self._state_dir.mkdir(parents=True, exist_ok=True)
            log_path = self._state_dir / f"{_safe_name(task_id)}.log"
            command = [
                self._python, "-m", "hetcluster.agent.tf_server",
                "--cluster-spec", json.dumps(cluster_spec, sort_keys=True),
                "--job", job_name, "--index", str(task_index), "--protocol", protocol,
                "--parent-pid", str(os.getpid()), "--threads", str(self._tf_threads),
            ]
            if self._cgroup_procs:
                command = wrapper_command(command, self._cgroup_procs)
            env = tf_env(TF_CPP_MIN_LOG_LEVEL="2")   # the server's warnings and errors go to its log
            try:
                with open(log_path, "wb") as log_file:
                    process = subprocess.Popen(
                        command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                        env=env, start_new_session=True, close_fds=True,
                    )
            except OSError as error:
                raise TaskError(f"cannot start the TF server for {job_name}:{task_index}: {error}.", hint=f"check that {self._python} runs.") from None
            task = _Task(task_id, job_name, task_index, cluster_spec[job_name][task_index], process, log_path, time.time(), time.monotonic())
            self._tasks[task_id] = task
        log.info("started task %s (%s:%d at %s) pid %d, log %s", task_id, job_name, task_index, task.address, process.pid, log_path)
        return self._info(task)

    def stop(self, task_id: str, grace_s: float = 5.0) -> TaskInfo:
        """SIGTERM the task's process group; SIGKILL it when still alive after ``grace_s``."""
        task = self._get(task_id)
        with task.lock:
            if task.process.poll() is None:
                task.stop_requested = True
                _signal_group(task.process.pid, signal.SIGTERM)
                # a duty-cycled (SIGSTOPped) task would hold the SIGTERM until its next SIGCONT
                _signal_group(task.process.pid, signal.SIGCONT)
                try:
                    task.process.wait(timeout=max(grace_s, 0.0))
                except subprocess.TimeoutExpired:
                    log.warning("task %s ignored SIGTERM for %.1f s; sending SIGKILL", task_id, grace_s)
                    _signal_group(task.process.pid, signal.SIGKILL)
                    task.process.wait(timeout=10.0)
            # whatever the leader did, leave no stragglers in its group
            _signal_group(task.process.pid, signal.SIGKILL)
        return self._info(task)

    def status(self, task_id: str = "") -> list[TaskInfo]:
        if task_id:
            return [self._info(self._get(task_id))]
        with self._lock:
            tasks = list(self._tasks.values())
        return [self._info(t) for t in tasks]

    def stop_all(self, grace_s: float = 5.0) -> None:
        with self._lock:
            ids = [t.task_id for t in self._tasks.values() if t.process.poll() is None]
        for task_id in ids:
            try:
                self.stop(task_id, grace_s)
            except TaskError as error:
                log.warning("stopping %s: %s", task_id, error)

    def _get(self, task_id: str) -> _Task:
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None:
            raise TaskNotFound(f"no task {task_id!r} on this agent.", hint="list tasks with GetTaskStatus and use one of their ids.")
        return task

    def _info(self, task: _Task) -> TaskInfo:
        code = task.process.poll()
        if code is None:
            _measure(task)
            state = "running" if task.listening else "starting"
            uptime_s = time.monotonic() - task.started_mono_s
            message = ""
        else:
            if task.ended_mono_s is None:
                task.ended_mono_s = time.monotonic()
            uptime_s = task.ended_mono_s - task.started_mono_s
            if task.stop_requested:
                state, message = "stopped", ""
            elif code == 0:
                state, message = "exited", ""
            else:
                state, message = "failed", _tail(task.log_path)
        return TaskInfo(
            task_id=task.task_id, job_name=task.job_name, task_index=task.task_index, address=task.address,
            pid=task.process.pid, state=state, exit_code=code, started_wall_s=task.started_wall_s,
            uptime_s=uptime_s, cpu_time_s=task.last_cpu_time_s, rss_bytes=task.last_rss_bytes, message=message,
        )


def _measure(task: _Task) -> None:
    """CPU time and RSS of the task and its children (kept for after it ends)."""
    try:
        root = psutil.Process(task.process.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    port = _port_of(task.address)
    cpu_s, rss = 0.0, 0
    for proc in procs:
        try:
            times = proc.cpu_times()
            cpu_s += times.user + times.system
            rss += proc.memory_info().rss
            if not task.listening:
                task.listening = any(
                    c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in proc.net_connections("tcp")
                )
        except psutil.Error:
            continue
    task.last_cpu_time_s, task.last_rss_bytes = cpu_s, rss


def _port_of(address: str) -> int:
    try:
        return int(address.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _safe_name(task_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)[:100] or "task"
