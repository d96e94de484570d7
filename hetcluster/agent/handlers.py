"""The RPCs as plain functions of (request, state): validation, then work on the state.

No gRPC here: bad requests raise InvalidRequest, unknown tasks TaskNotFound, and the servicer
maps those to status codes. That keeps each rule testable without a server.
"""

from __future__ import annotations

import logging
import math
import re
import socket
import threading
import time
from typing import Iterator

from hetcluster.agent.config import split_host_port
from hetcluster.agent.messages import DeviceInfo, TaskInfo
from hetcluster.agent.state import AgentState
from hetcluster.errors import AgentError, ConfigError, TaskError
from hetcluster.power.base import PowerSample
from hetcluster.proto.v1 import agent_pb2

log = logging.getLogger(__name__)

DEFAULT_RATE_HZ = 10.0
MIN_RATE_HZ = 0.1   # a stream holds a slot; one that sends nothing for minutes is not a power stream
MAX_RATE_HZ = 100.0
DEFAULT_GRACE_S = 5.0
MAX_GRACE_S = 300.0
JOB_NAMES = ("worker", "ps")
JOB_NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")
PROTOCOLS = ("grpc",)
STOP_CHECK_S = 0.25


class InvalidRequest(AgentError):
    """A request field is out of range or malformed (INVALID_ARGUMENT)."""


class TooManyStreams(AgentError):
    """Every power-stream slot (or this caller's share) is taken (RESOURCE_EXHAUSTED)."""


def get_device_info(request: agent_pb2.GetDeviceInfoRequest, state: AgentState) -> DeviceInfo:
    return state.device_info


def stream_power(request: agent_pb2.StreamPowerRequest, state: AgentState, ended: threading.Event,
                 caller: str = "") -> Iterator[PowerSample]:
    """Samples on a fixed monotonic schedule (t0 + k/rate), so the rate does not drift with the
    time each read takes. When reads fall more than a period behind, the schedule restarts from
    now instead of bursting to catch up. ``ended`` is set when the call ends (the client cancelled
    or went away): the wait for the next sample wakes on it, so an abandoned stream frees its
    slot at once whatever its rate."""
    rate_hz = request.rate_hz or DEFAULT_RATE_HZ
    if not (math.isfinite(rate_hz) and MIN_RATE_HZ <= rate_hz <= MAX_RATE_HZ):
        raise InvalidRequest(f"rate_hz {request.rate_hz!r} is outside [{MIN_RATE_HZ:g}, {MAX_RATE_HZ:g}].",
                             hint="ask for 1 to 100 Hz (0 = 10 Hz).")
    if not (math.isfinite(request.duration_s) and request.duration_s >= 0):
        raise InvalidRequest(
            f"duration_s {request.duration_s!r} must be >= 0.", hint="use 0 to stream until cancelled."
        )
    if not state.streams.acquire(caller):
        raise TooManyStreams(f"this agent already serves {state.streams.total} power streams "
                             f"(at most {state.streams.per_caller} per caller).",
                             hint="end a stream first; one stream per device is enough.")
    try:
        yield from _samples(request, state, ended, 1.0 / rate_hz)
    finally:
        state.streams.release(caller)


def _samples(request: agent_pb2.StreamPowerRequest, state: AgentState, ended: threading.Event,
             period_s: float) -> Iterator[PowerSample]:
    base_s = time.monotonic()
    end_s = base_s + request.duration_s - 1e-9 if request.duration_s > 0 else math.inf
    ticks = 0  # next sample is due at base_s + ticks * period_s (no accumulated rounding)
    last_s = float("-inf")
    sent = 0
    while not ended.is_set() and not state.stopping.is_set():
        due_s = base_s + ticks * period_s
        if due_s >= end_s:
            return
        now_s = time.monotonic()
        if due_s > now_s:
            if _wait(ended, state.stopping, due_s - now_s):
                return
        elif now_s - due_s > period_s:
            base_s, ticks = now_s, 0
        sample = state.read_power(max_age_s=period_s / 2, newer_than_s=last_s)
        last_s = sample.monotonic_s
        yield sample
        sent += 1
        if request.max_samples and sent >= request.max_samples:
            return
        ticks += 1


def _wait(ended: threading.Event, stopping: threading.Event, timeout_s: float) -> bool:
    """Wait ``timeout_s`` or until either event is set (True then)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if ended.wait(min(left, STOP_CHECK_S)) or stopping.is_set():
            return True
    return ended.is_set() or stopping.is_set()


def reserve_port(request: agent_pb2.ReservePortRequest, state: AgentState, caller: str = "") -> str:
    if not (math.isfinite(request.ttl_s) and request.ttl_s >= 0):
        raise InvalidRequest(f"ttl_s {request.ttl_s!r} must be >= 0.", hint="use 0 for the default of 60 s.")
    return state.ports.reserve(request.ttl_s, caller=caller)


def validate_cluster_spec(job_name: str, task_index: int, spec: dict[str, list[str]]) -> None:
    """The checks StartTask makes before anything is started."""
    if job_name not in JOB_NAMES:
        raise InvalidRequest(
            f"job_name {job_name!r} is not one of {', '.join(JOB_NAMES)}.",
            hint="agents run workers and parameter servers only.",
        )
    if not spec:
        raise InvalidRequest(
            "cluster_spec is empty.", hint='send job -> addresses, e.g. {"worker": ["10.0.0.5:2222"]}.'
        )
    for job, addresses in spec.items():
        if not JOB_NAME_RE.match(job):
            raise InvalidRequest(f"cluster_spec job name {job[:70]!r} is not 1-64 of [a-z0-9_-].",
                                 hint='use TensorFlow job names such as "worker", "ps", "chief".')
        if not addresses:
            raise InvalidRequest(
                f"cluster_spec job {job!r} has no addresses.", hint="give every job at least one host:port."
            )
        for address in addresses:
            try:
                split_host_port(
                    address, what=f"cluster_spec[{job}] address", port_zero_hint="use ReservePort to get a real port."
                )
            except ConfigError as error:
                raise InvalidRequest(error.message, hint=error.hint) from None
    if job_name not in spec:
        raise InvalidRequest(
            f"cluster_spec has no job {job_name!r}.", hint=f"add the {job_name} addresses to the spec."
        )
    if task_index >= len(spec[job_name]):
        raise InvalidRequest(
            f"task_index {task_index} is out of range for job {job_name!r} with {len(spec[job_name])} task(s).",
            hint="indices start at 0.",
        )


def start_task(request: agent_pb2.StartTaskRequest, state: AgentState) -> TaskInfo:
    spec = {job: list(addresses.addresses) for job, addresses in request.cluster_spec.items()}
    validate_cluster_spec(request.job_name, request.task_index, spec)
    protocol = request.protocol or "grpc"
    if protocol not in PROTOCOLS:
        raise InvalidRequest(f"protocol {protocol!r} is not supported.", hint='use "grpc".')
    if len(request.task_id) > 128:
        raise InvalidRequest("task_id is longer than 128 characters.", hint="use a shorter id.")
    if not (math.isfinite(request.lease_s) and request.lease_s >= 0):
        raise InvalidRequest(f"lease_s {request.lease_s!r} must be >= 0.", hint="use 0 for the agent's default.")
    _, port = split_host_port(spec[request.job_name][request.task_index])
    if request.open_plane:
        if not state.config.tf_plane.allow_open:
            raise TaskError("an open TF plane (no namespace, no TLS) was asked for, and this agent does not allow it.",
                            hint="leave the plane closed; [tf_plane] allow_open is a developer switch for tests.")
        if state.ports.release(port):
            log.debug("released reserved port %d for %s:%d", port, request.job_name, request.task_index)
        log.warning("starting %s:%d on an OPEN plane (developer switch): its port takes any client",
                    request.job_name, request.task_index)
        return state.tasks.start(request.job_name, request.task_index, spec, task_id=request.task_id,
                                 protocol=protocol, lease_s=request.lease_s)
    plane = state.plane.host()
    public = state.ports.take(port) or _bind_now(port)
    try:
        return state.tasks.start(request.job_name, request.task_index, spec, task_id=request.task_id,
                                 protocol=protocol, lease_s=request.lease_s, plane=plane, public_socket=public)
    except BaseException:
        public.close()
        raise


def _bind_now(port: int) -> socket.socket:
    """A socket on ``port`` that was not reserved (the caller picked it): free now, or refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
    except OSError as error:
        sock.close()
        raise InvalidRequest(f"the task's port {port} was not reserved here and cannot be bound: {error.strerror}.",
                             hint="reserve it with ReservePort first.") from None
    return sock


def renew_task_leases(request: agent_pb2.RenewTaskLeasesRequest, state: AgentState) -> list[str]:
    if not (math.isfinite(request.lease_s) and request.lease_s >= 0):
        raise InvalidRequest(f"lease_s {request.lease_s!r} must be >= 0.", hint="use 0 for the agent's default.")
    return state.tasks.renew(list(request.task_ids), request.lease_s)


def stop_task(request: agent_pb2.StopTaskRequest, state: AgentState) -> TaskInfo:
    if not request.task_id:
        raise InvalidRequest("task_id is empty.", hint="pass the id StartTask returned.")
    grace_s = request.grace_s or DEFAULT_GRACE_S
    if not (math.isfinite(grace_s) and 0 < grace_s <= MAX_GRACE_S):
        raise InvalidRequest(
            f"grace_s {request.grace_s!r} is outside (0, {MAX_GRACE_S:g}].", hint="use 0 for the default of 5 s."
        )
    return state.tasks.stop(request.task_id, grace_s)


def get_task_status(request: agent_pb2.GetTaskStatusRequest, state: AgentState) -> list[TaskInfo]:
    return state.tasks.status(request.task_id)
