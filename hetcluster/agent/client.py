"""Talking to an agent: `AgentClient` for the RPCs, `PowerRecorder` for power during a run.

gRPC errors become AgentError naming the device address and what to check, and protos become
the dataclasses of `messages`, so callers (profiling, training, the CLI) never see grpc types.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hetcluster.agent.auth import auth_metadata, channel_credentials
from hetcluster.agent.credentials import read_token
from hetcluster.agent.messages import DeviceInfo, TaskInfo, sample_from_proto
from hetcluster.errors import AgentError
from hetcluster.power.base import PowerSample
from hetcluster.proto.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

_HINTS = {
    grpc.StatusCode.UNAVAILABLE: "is the agent running at {address}? With mTLS, also check the client certificate is "
                                 "signed by the agent's client CA.",
    grpc.StatusCode.UNAUTHENTICATED: "check the credentials files (token, CA, client certificate) for {address}.",
    grpc.StatusCode.DEADLINE_EXCEEDED: "the agent at {address} did not answer in time; check the network or raise the "
                                       "timeout.",
    grpc.StatusCode.INVALID_ARGUMENT: "fix the request as the message says.",
    grpc.StatusCode.NOT_FOUND: "list tasks with task_status() and use one of their ids.",
}


class AgentClient:
    """A connection to one agent. TLS when ``ca_file`` (or a client certificate) is given,
    plaintext otherwise; the token, when given, is sent as ``authorization: Bearer``."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        token_file: Path | str | None = None,
        ca_file: Path | str | None = None,
        cert_file: Path | str | None = None,
        key_file: Path | str | None = None,
        server_name: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        if token is None and token_file is not None:
            token = read_token(token_file)
        self._metadata = auth_metadata(token)
        options: list[tuple[str, Any]] = [("grpc.enable_retries", 0)]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        self._tls = ca_file is not None or cert_file is not None
        if self._tls:
            self._channel = grpc.secure_channel(
                address, channel_credentials(ca_file, cert_file, key_file), options=options
            )
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = agent_pb2_grpc.AgentStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # -- plumbing -------------------------------------------------------------------------
    def _error(self, error: grpc.RpcError, what: str) -> AgentError:
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        hint: str | None = _HINTS.get(code, "see the agent's log.").format(address=self.address)
        if code == grpc.StatusCode.UNAVAILABLE and not self._tls:
            hint = f"{hint} If the agent uses TLS, pass the CA that signed its certificate (ca_file / --ca-file)."
        details = str(details or "").rstrip(".")
        if "To fix:" in details:  # the agent's own error already says how
            hint = None
        result = AgentError(
            f"{what} on agent {self.address} failed: {code.name if code else 'error'}: {details}.", hint=hint
        )
        result.status_code = code  # type: ignore[attr-defined]
        return result

    def _unary(self, method: Callable[..., Any], request: Any, what: str, timeout_s: float | None = None) -> Any:
        try:
            return method(request, timeout=timeout_s or self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as error:
            raise self._error(error, what) from None

    # -- RPCs ---------------------------------------------------------------------------
    def health(self) -> bool:
        """True when the agent answers its health check with SERVING (no credentials needed)."""
        try:
            reply = self._health.Check(health_pb2.HealthCheckRequest(), timeout=self.timeout_s)
        except grpc.RpcError as error:
            log.debug("health check of %s failed: %s", self.address, error)
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def device_info(self) -> DeviceInfo:
        return DeviceInfo.from_proto(
            self._unary(self._stub.GetDeviceInfo, agent_pb2.GetDeviceInfoRequest(), "GetDeviceInfo")
        )

    def stream_power(self, rate_hz: float = 10.0, duration_s: float = 0.0, max_samples: int = 0) -> "PowerStream":
        """Samples as they arrive; ``cancel()`` (or ``close()``) ends the stream early."""
        call = self._stub.StreamPower(
            agent_pb2.StreamPowerRequest(rate_hz=rate_hz, duration_s=duration_s, max_samples=max_samples),
            metadata=self._metadata,
        )
        return PowerStream(call, self)

    def reserve_port(self, ttl_s: float = 0.0) -> str:
        return self._unary(self._stub.ReservePort, agent_pb2.ReservePortRequest(ttl_s=ttl_s), "ReservePort").address

    def start_task(self, job_name: str, task_index: int, cluster_spec: dict[str, list[str]], task_id: str = "",
                   *, lease_s: float = 0.0, open_plane: bool = False) -> TaskInfo:
        """Start a TF server task; ``cluster_spec`` holds each task's training-plane address.
        Renew its lease (``lease_s``, 0 = the agent's default) with renew_task_leases."""
        request = agent_pb2.StartTaskRequest(
            task_id=task_id,
            job_name=job_name,
            task_index=task_index,
            cluster_spec={job: agent_pb2.JobAddresses(addresses=list(addrs)) for job, addrs in cluster_spec.items()},
            lease_s=lease_s,
            open_plane=open_plane,
        )
        return TaskInfo.from_proto(
            self._unary(self._stub.StartTask, request, f"StartTask {job_name}:{task_index}").task
        )

    def renew_task_leases(self, task_ids: list[str], lease_s: float = 0.0) -> list[str]:
        """Extend the leases of ``task_ids``; returns those the agent no longer runs."""
        request = agent_pb2.RenewTaskLeasesRequest(task_ids=task_ids, lease_s=lease_s)
        return list(self._unary(self._stub.RenewTaskLeases, request, "RenewTaskLeases").gone_task_ids)

    def stop_task(self, task_id: str, grace_s: float = 5.0) -> TaskInfo:
        request = agent_pb2.StopTaskRequest(task_id=task_id, grace_s=grace_s)
        reply = self._unary(
            self._stub.StopTask, request, f"StopTask {task_id}", timeout_s=self.timeout_s + grace_s + 10.0
        )
        return TaskInfo.from_proto(reply.task)

    def task_status(self, task_id: str = "") -> list[TaskInfo]:
        reply = self._unary(self._stub.GetTaskStatus, agent_pb2.GetTaskStatusRequest(task_id=task_id), "GetTaskStatus")
        return [TaskInfo.from_proto(t) for t in reply.tasks]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "AgentClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PowerStream:
    """An iterator of PowerSample over one StreamPower call, cancellable from another thread."""

    def __init__(self, call: Any, client: AgentClient) -> None:
        self._call = call
        self._client = client
        self._cancelled = False

    def __iter__(self) -> "PowerStream":
        return self

    def __next__(self) -> PowerSample:
        try:
            return sample_from_proto(next(self._call))
        except grpc.RpcError as error:
            if self._cancelled or error.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise self._client._error(error, "StreamPower") from None

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    close = cancel

    def __enter__(self) -> "PowerStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class PowerRecorder:
    """Streams an agent's power into a list from a background thread, for the span of a run.

    ``energy_j(t0, t1)`` over wall-clock times uses the source's energy counter when it has one
    (counter difference), else the trapezoid rule over power_w; both clip to samples in [t0, t1].
    """

    def __init__(self, client: AgentClient, rate_hz: float = 10.0) -> None:
        self._client = client
        self._rate_hz = rate_hz
        self._samples: list[PowerSample] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stream: PowerStream | None = None
        self._stop = threading.Event()
        self.error: AgentError | None = None

    def start(self) -> "PowerRecorder":
        if self._thread is not None:
            raise AgentError("this PowerRecorder is already recording.", hint="stop() it first or make another.")
        self._stop.clear()
        self._stream = self._client.stream_power(rate_hz=self._rate_hz)
        self._thread = threading.Thread(target=self._run, name=f"power-{self._client.address}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self._stream is not None
        try:
            for sample in self._stream:
                with self._lock:
                    self._samples.append(sample)
                if self._stop.is_set():
                    break
        except AgentError as error:
            if not self._stop.is_set():
                log.warning("power recording from %s ended: %s", self._client.address, error)
                self.error = error

    def stop(self) -> list[PowerSample]:
        """End the stream and return every sample recorded (also kept in ``samples``)."""
        self._stop.set()
        if self._stream is not None:
            self._stream.cancel()  # wakes the thread blocked on the next message
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._thread, self._stream = None, None
        return self.samples

    @property
    def samples(self) -> list[PowerSample]:
        with self._lock:
            return list(self._samples)

    def window(self, t0_wall_s: float, t1_wall_s: float) -> list[PowerSample]:
        return [s for s in self.samples if t0_wall_s <= s.wall_time_s <= t1_wall_s]

    def energy_j(self, t0_wall_s: float, t1_wall_s: float) -> float:
        return energy_between(self.samples, t0_wall_s, t1_wall_s)

    def mean_power_w(self, t0_wall_s: float, t1_wall_s: float) -> float:
        return mean_power_between(self.samples, t0_wall_s, t1_wall_s)

    def __enter__(self) -> "PowerRecorder":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _at(samples: list[PowerSample], t_s: float, value: Callable[[PowerSample], float]) -> float | None:
    """``value`` linearly interpolated at wall time ``t_s``; None outside the samples' span."""
    for a, b in zip(samples, samples[1:]):
        if a.wall_time_s <= t_s <= b.wall_time_s:
            span_s = b.wall_time_s - a.wall_time_s
            f = (t_s - a.wall_time_s) / span_s if span_s > 0 else 0.0
            return value(a) + f * (value(b) - value(a))
    return None


def _covered(samples: list[PowerSample], t0_wall_s: float, t1_wall_s: float) -> tuple[float, float] | None:
    """[t0, t1] clipped to the span the samples cover (None when they cover none of it)."""
    if len(samples) < 2:
        return None
    lo, hi = max(t0_wall_s, samples[0].wall_time_s), min(t1_wall_s, samples[-1].wall_time_s)
    return (lo, hi) if hi > lo else None


def energy_between(samples: list[PowerSample], t0_wall_s: float, t1_wall_s: float) -> float:
    """Joules between two wall times (clipped to the span the samples cover): the difference of
    the energy counter where every sample has one, else the trapezoid rule over ``power_w``,
    with both ends linearly interpolated between the samples around them."""
    ordered = sorted(samples, key=lambda s: s.wall_time_s)
    span = _covered(ordered, t0_wall_s, t1_wall_s)
    if span is None:
        return 0.0
    lo, hi = span
    if all(s.energy_j is not None for s in ordered):
        e0 = _at(ordered, lo, lambda s: s.energy_j)  # type: ignore[arg-type,return-value]
        e1 = _at(ordered, hi, lambda s: s.energy_j)  # type: ignore[arg-type,return-value]
        return float(e1 - e0)  # type: ignore[operator]
    points = [(lo, _at(ordered, lo, lambda s: s.power_w))]
    points += [(s.wall_time_s, s.power_w) for s in ordered if lo < s.wall_time_s < hi]
    points.append((hi, _at(ordered, hi, lambda s: s.power_w)))
    return float(sum(0.5 * (pa + pb) * (tb - ta) for (ta, pa), (tb, pb) in zip(points, points[1:])))  # type: ignore[operator]


def mean_power_between(samples: list[PowerSample], t0_wall_s: float, t1_wall_s: float) -> float:
    """Average watts over [t0, t1] (clipped to the samples' span); 0.0 without samples there."""
    ordered = sorted(samples, key=lambda s: s.wall_time_s)
    span = _covered(ordered, t0_wall_s, t1_wall_s)
    if span is None:
        inside = [s.power_w for s in ordered if t0_wall_s <= s.wall_time_s <= t1_wall_s]
        return sum(inside) / len(inside) if inside else 0.0
    return energy_between(ordered, *span) / (span[1] - span[0])
