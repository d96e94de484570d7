"""The gRPC servicer: calls a handler, converts the result to proto, maps our errors to codes.

Nothing else happens here (STYLE.md §10): validation and work live in handlers.py.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterator, NoReturn

import grpc

from hetcluster.agent import handlers
from hetcluster.agent.messages import sample_to_proto
from hetcluster.agent.plane import PlaneUnavailable
from hetcluster.agent.ports import TooManyReservations
from hetcluster.agent.state import AgentState
from hetcluster.agent.tasks import TaskNotFound
from hetcluster.errors import HetclusterError, PowerSourceError, TaskError
from hetcluster.proto.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

_CODES: tuple[tuple[type[HetclusterError], grpc.StatusCode], ...] = (
    (handlers.InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (handlers.TooManyStreams, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TooManyReservations, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TaskNotFound, grpc.StatusCode.NOT_FOUND),
    (PlaneUnavailable, grpc.StatusCode.FAILED_PRECONDITION),
    (TaskError, grpc.StatusCode.FAILED_PRECONDITION),
    (PowerSourceError, grpc.StatusCode.UNAVAILABLE),
)


def _abort(context: grpc.ServicerContext, error: Exception, method: str) -> NoReturn:
    if isinstance(error, HetclusterError):
        code = next((c for kind, c in _CODES if isinstance(error, kind)), grpc.StatusCode.FAILED_PRECONDITION)
        log.info("%s -> %s: %s", method, code.name, error)
        context.abort(code, str(error))
    log.exception("%s failed unexpectedly", method)
    context.abort(grpc.StatusCode.INTERNAL, f"agent error in {method}: {type(error).__name__}: {error}")
    raise AssertionError("unreachable")  # context.abort raises


class AgentServicer(agent_pb2_grpc.AgentServicer):
    def __init__(self, state: AgentState) -> None:
        self._state = state

    def _call(self, method: str, context: grpc.ServicerContext, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 — every error becomes a status code
            _abort(context, error, method)

    def GetDeviceInfo(
        self, request: agent_pb2.GetDeviceInfoRequest, context: grpc.ServicerContext
    ) -> agent_pb2.GetDeviceInfoResponse:
        return self._call("GetDeviceInfo", context, lambda: handlers.get_device_info(request, self._state).to_proto())

    def StreamPower(
        self, request: agent_pb2.StreamPowerRequest, context: grpc.ServicerContext
    ) -> Iterator[agent_pb2.StreamPowerResponse]:
        ended = threading.Event()
        context.add_callback(ended.set)   # cancelled, deadline passed, or the client went away
        samples = handlers.stream_power(request, self._state, ended, caller_host(context))
        while True:
            try:
                sample = next(samples)
            except StopIteration:
                return
            except Exception as error:  # noqa: BLE001
                _abort(context, error, "StreamPower")
            yield sample_to_proto(sample)

    def ReservePort(
        self, request: agent_pb2.ReservePortRequest, context: grpc.ServicerContext
    ) -> agent_pb2.ReservePortResponse:
        return self._call("ReservePort", context, lambda: agent_pb2.ReservePortResponse(
            address=handlers.reserve_port(request, self._state, caller_host(context))))

    def StartTask(
        self, request: agent_pb2.StartTaskRequest, context: grpc.ServicerContext
    ) -> agent_pb2.StartTaskResponse:
        return self._call(
            "StartTask",
            context,
            lambda: agent_pb2.StartTaskResponse(task=handlers.start_task(request, self._state).to_proto()),
        )

    def RenewTaskLeases(
        self, request: agent_pb2.RenewTaskLeasesRequest, context: grpc.ServicerContext
    ) -> agent_pb2.RenewTaskLeasesResponse:
        return self._call("RenewTaskLeases", context, lambda: agent_pb2.RenewTaskLeasesResponse(
            gone_task_ids=handlers.renew_task_leases(request, self._state)))

    def StopTask(self, request: agent_pb2.StopTaskRequest, context: grpc.ServicerContext) -> agent_pb2.StopTaskResponse:
        return self._call(
            "StopTask",
            context,
            lambda: agent_pb2.StopTaskResponse(task=handlers.stop_task(request, self._state).to_proto()),
        )

    def GetTaskStatus(
        self, request: agent_pb2.GetTaskStatusRequest, context: grpc.ServicerContext
    ) -> agent_pb2.GetTaskStatusResponse:
        return self._call(
            "GetTaskStatus",
            context,
            lambda: agent_pb2.GetTaskStatusResponse(
                tasks=[t.to_proto() for t in handlers.get_task_status(request, self._state)]
            ),
        )


def caller_host(context: grpc.ServicerContext) -> str:
    """The peer's host ("ipv4:10.0.0.5:41234" -> "10.0.0.5"): limits count per host, not per connection."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0].strip("[]") or rest
    return peer
