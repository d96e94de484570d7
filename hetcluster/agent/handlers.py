"""The RPCs as plain functions of (request, state): validation, then work on the state.

No gRPC here: bad requests raise InvalidRequest, unknown tasks TaskNotFound, and the servicer
maps those to status codes. That keeps each rule testable without a server.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, Iterator

from hetcluster.agent.config import split_host_port
from hetcluster.agent.messages import DeviceInfo, TaskInfo
from hetcluster.agent.state import AgentState
from hetcluster.errors import AgentError, ConfigError
from hetcluster.power.base import PowerSample
from hetcluster.proto.v1 import agent_pb2

log = logging.getLogger(__name__)

DEFAULT_RATE_HZ = 10.0
MAX_RATE_HZ = 100.0
DEFAULT_GRACE_S = 5.0
MAX_GRACE_S = 300.0
JOB_NAMES = ("worker", "ps")
PROTOCOLS = ("grpc",)


class InvalidRequest(AgentError):
    """A request field is out of range or malformed (INVALID_ARGUMENT)."""


def get_device_info(request: agent_pb2.GetDeviceInfoRequest, state: AgentState) -> DeviceInfo:
    return state.device_info


def stream_power(request: agent_pb2.StreamPowerRequest, state: AgentState, is_active: Callable[[], bool]) -> Iterator[PowerSample]:
    """Samples on a fixed monotonic schedule (t0 + k/rate), so the rate does not drift with the
    time each read takes. When reads fall more than a period behind, the schedule restarts from
    now instead of bursting to catch up."""
    rate_hz = request.rate_hz or DEFAULT_RATE_HZ
    if not (math.isfinite(rate_hz) and 0 < rate_hz <= MAX_RATE_HZ):
        raise InvalidRequest(f"rate_hz {request.rate_hz!r} is outside (0, {MAX_RATE_HZ:g}].", hint="ask for 1 to 100 Hz (0 = 10 Hz).")
    if not (math.isfinite(request.duration_s) and request.duration_s >= 0):
        raise InvalidRequest(f"duration_s {request.duration_s!r} must be >= 0.", hint="use 0 to stream until cancelled.")
    period_s = 1.0 / rate_hz
    base_s = time.monotonic()
    end_s = base_s + request.duration_s - 1e-9 if request.duration_s > 0 else math.inf
    ticks = 0  # next sample is due at base_s + ticks * period_s (no accumulated rounding)
    last_s = float("-inf")
    sent = 0
    while is_active() and not state.stopping.is_set():
        due_s = base_s + ticks * period_s
        if due_s >= end_s:
            return
        now_s = time.monotonic()
        if due_s > now_s:
            if state.stopping.wait(due_s - now_s):
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


def reserve_port(request: agent_pb2.ReservePortRequest, state: AgentState) -> str:
    if not (math.isfinite(request.ttl_s) and request.ttl_s >= 0):
        raise InvalidRequest(f"ttl_s {request.ttl_s!r} must be >= 0.", hint="use 0 for the default of 60 s.")
    return state.ports.reserve(request.ttl_s)


def validate_cluster_spec(job_name: str, task_index: int, spec: dict[str, list[str]]) -> None:
    """The checks StartTask makes before anything is started."""
    if job_name not in JOB_NAMES:
        raise InvalidRequest(f"job_name {job_name!r} is not one of {', '.join(JOB_NAMES)}.", hint="agents run workers and parameter servers only.")
    if not spec:
        raise InvalidRequest("cluster_spec is empty.", hint='send job -> addresses, e.g. {"worker": ["10.0.0.5:2222"]}.')
    for job, addresses in spec.items():
        if not job or not addresses:
            raise InvalidRequest(f"cluster_spec job {job!r} has no addresses.", hint="give every job at least one host:port.")
        for address in addresses:
            try:
                split_host_port(address, what=f"cluster_spec[{job}] address", port_zero_hint="use ReservePort to get a real port.")
            except ConfigError as error:
                raise InvalidRequest(error.message, hint=error.hint) from None
    if job_name not in spec:
        raise InvalidRequest(f"cluster_spec has no job {job_name!r}.", hint=f"add the {job_name} addresses to the spec.")
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
    _, port = split_host_port(spec[request.job_name][request.task_index])
    if state.ports.release(port):
        log.debug("released reserved port %d for %s:%d", port, request.job_name, request.task_index)
    return state.tasks.start(request.job_name, request.task_index, spec, task_id=request.task_id, protocol=protocol)


def stop_task(request: agent_pb2.StopTaskRequest, state: AgentState) -> TaskInfo:
    if not request.task_id:
        raise InvalidRequest("task_id is empty.", hint="pass the id StartTask returned.")
    grace_s = request.grace_s or DEFAULT_GRACE_S
    if not (math.isfinite(grace_s) and 0 < grace_s <= MAX_GRACE_S):
        raise InvalidRequest(f"grace_s {request.grace_s!r} is outside (0, {MAX_GRACE_S:g}].", hint="use 0 for the default of 5 s.")
    return state.tasks.stop(request.task_id, grace_s)


def get_task_status(request: agent_pb2.GetTaskStatusRequest, state: AgentState) -> list[TaskInfo]:
    return state.tasks.status(request.task_id)
