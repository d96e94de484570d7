"""Supervision of the TensorFlow server processes an agent starts.

Each task is ``python -m hetcluster.agent.tf_server`` in its own process group, so a stop
signal reaches the server and anything it spawned, and a Ctrl-C at the agent's terminal does not.
On an emulated device each server first joins the device's cgroups (``cgroup_procs``, through
:func:`hetcluster.emulation.slowdown.wrapper_command`: a shell that writes its PID there and execs
the server, so the PID stays the server's).
On the training plane (the default) the server runs in a network namespace of its own, with a
cluster spec of local endpoints, and the agent's PlaneHost forwards its traffic over mutual TLS
(hetcluster.plane). Every task holds a lease: a task whose lease lapses (its coordinator stopped
renewing it, e.g. because it was killed) is stopped by the lease thread, which also releases the
plane's listeners of tasks that ended. State is derived from the process on every query (poll).
Resource use (CPU time, RSS) is summed over the process and its children with psutil.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
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
from hetcluster.plane.host import PlaneChild, PlaneHost
from hetcluster.plane.isolation import listening_ports
from hetcluster.plane.localspec import local_ports, local_spec
from hetcluster.tfenv import tf_env

log = logging.getLogger(__name__)

STDERR_TAIL_LINES = 20
DEFAULT_LEASE_S = 15.0
MAX_LEASE_S = 600.0
LEASE_CHECK_S = 0.5


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
    listen_port: int = -1               # where the server listens (inside its namespace on the plane)
    lease_s: float = DEFAULT_LEASE_S
    lease_deadline_s: float = float("inf")
    plane_child: PlaneChild | None = None
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
        self._closing = threading.Event()
        self._plane: PlaneHost | None = None
        self._lease_thread = threading.Thread(target=self._watch_leases, name="task-leases", daemon=True)
        self._lease_thread.start()

    def start(self, job_name: str, task_index: int, cluster_spec: dict[str, list[str]], task_id: str = "",
              protocol: str = "grpc", *, lease_s: float = DEFAULT_LEASE_S, plane: PlaneHost | None = None,
              public_socket: socket.socket | None = None) -> TaskInfo:
        """Start a TF server child for (job_name, task_index) of an already validated spec.

        With ``plane`` the server runs in its own namespace and ``public_socket`` (bound to its
        address in the spec) becomes its mTLS forwarding port; without, it listens on its address
        itself (the developer-only open plane)."""
        task_id = task_id or f"{job_name}-{task_index}-{uuid.uuid4().hex[:8]}"
        with self._lock:
            existing = self._tasks.get(task_id)
            if existing is not None and existing.process.poll() is None:
                raise TaskError(
                    f"task {task_id!r} is already running (pid {existing.process.pid}).",
                    hint="stop it first or use another task_id.",
                )
            self._state_dir.mkdir(parents=True, exist_ok=True)
            log_path = self._state_dir / f"{_safe_name(task_id)}.log"
            address = cluster_spec[job_name][task_index]
            ports = local_ports(cluster_spec)
            server_spec = local_spec(cluster_spec, ports) if plane is not None else cluster_spec
            command = [
                self._python, "-m", "hetcluster.agent.tf_server",
                "--cluster-spec", json.dumps(server_spec, sort_keys=True),
                "--job", job_name, "--index", str(task_index), "--protocol", protocol,
                "--parent-pid", str(os.getpid()), "--threads", str(self._tf_threads),
            ]
            if self._cgroup_procs:
                command = wrapper_command(command, self._cgroup_procs)
            env = tf_env(TF_CPP_MIN_LOG_LEVEL="2")   # the server's warnings and errors go to its log
            child = None
            try:
                with open(log_path, "wb") as log_file:
                    popen = dict(stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True, close_fds=True)
                    if plane is None:
                        process = subprocess.Popen(command, **popen)  # type: ignore[call-overload]
                    else:
                        own = plane.add_task(address, f"{job_name}:{task_index}", ports[address], public_socket)
                        child = plane.spawn(
                            task_id, command, plane.routes(cluster_spec, address, ports), task=own, **popen
                        )
                        process = child.process
            except OSError as error:
                if plane is not None:
                    plane.remove_task(address)
                raise TaskError(
                    f"cannot start the TF server for {job_name}:{task_index}: {error}.",
                    hint=f"check that {self._python} runs.",
                ) from None
            lease_s = min(lease_s if lease_s > 0 else DEFAULT_LEASE_S, MAX_LEASE_S)
            task = _Task(task_id, job_name, task_index, address, process, log_path, time.time(), time.monotonic(),
                         listen_port=ports[address] if plane is not None else _port_of(address), lease_s=lease_s,
                         lease_deadline_s=time.monotonic() + lease_s, plane_child=child)
            self._tasks[task_id] = task
            if plane is not None:
                self._plane = plane
        log.info(
            "started task %s (%s:%d at %s%s) pid %d, lease %.0f s, log %s",
            task_id,
            job_name,
            task_index,
            task.address,
            ", its own namespace" if plane is not None else ", open plane",
            process.pid,
            lease_s,
            log_path,
        )
        return self._info(task)

    def renew(self, task_ids: Sequence[str], lease_s: float = 0.0) -> list[str]:
        """Extend the leases of ``task_ids``; return those that are not running (unknown or ended)."""
        now = time.monotonic()
        gone = []
        for task_id in task_ids:
            with self._lock:
                task = self._tasks.get(task_id)
            if task is None or task.process.poll() is not None:
                gone.append(task_id)
                continue
            task.lease_s = min(lease_s if lease_s > 0 else task.lease_s, MAX_LEASE_S)
            task.lease_deadline_s = now + task.lease_s
        return gone

    def _watch_leases(self) -> None:
        """Stop tasks whose lease lapsed; release the plane's listeners of tasks that ended."""
        while not self._closing.wait(LEASE_CHECK_S):
            with self._lock:
                tasks = list(self._tasks.values())
            now = time.monotonic()
            for task in tasks:
                if task.process.poll() is None and now > task.lease_deadline_s:
                    log.warning(
                        "task %s: its lease lapsed (no renewal for %.0f s); stopping it", task.task_id, task.lease_s
                    )
                    try:
                        self.stop(task.task_id, grace_s=2.0)
                    except TaskError as error:
                        log.warning("stopping %s: %s", task.task_id, error)
                elif task.process.poll() is not None:
                    self._release_plane(task)

    def _release_plane(self, task: _Task) -> None:
        child, task.plane_child = task.plane_child, None
        if child is not None and self._plane is not None:
            own = self._plane.tasks.get(task.address)
            self._plane.release(child, own)
            self._plane.remove_task(task.address)

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
            self._release_plane(task)
        return self._info(task)

    def status(self, task_id: str = "") -> list[TaskInfo]:
        if task_id:
            return [self._info(self._get(task_id))]
        with self._lock:
            tasks = list(self._tasks.values())
        return [self._info(t) for t in tasks]

    def stop_all(self, grace_s: float = 5.0) -> None:
        self._closing.set()
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
            raise TaskNotFound(
                f"no task {task_id!r} on this agent.", hint="list tasks with GetTaskStatus and use one of their ids."
            )
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
    """CPU time and RSS of the task and its children (kept for after it ends), and whether its
    server listens yet (in the task's own namespace, on the plane)."""
    try:
        root = psutil.Process(task.process.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    cpu_s, rss = 0.0, 0
    for proc in procs:
        try:
            times = proc.cpu_times()
            cpu_s += times.user + times.system
            rss += proc.memory_info().rss
        except psutil.Error:
            continue
    if not task.listening:
        task.listening = task.listen_port in listening_ports(task.process.pid)
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
