"""Plain dataclasses for what the agent reports, converted to and from proto at the edge.

The servicer builds responses from these, the client returns them, so nothing else in hetcluster
handles generated proto classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetcluster.power.base import PowerSample
from hetcluster.proto.v1 import agent_pb2

TASK_STATES = {
    agent_pb2.TASK_STATE_UNSPECIFIED: "unspecified",
    agent_pb2.TASK_STATE_STARTING: "starting",
    agent_pb2.TASK_STATE_RUNNING: "running",
    agent_pb2.TASK_STATE_EXITED: "exited",
    agent_pb2.TASK_STATE_STOPPED: "stopped",
    agent_pb2.TASK_STATE_FAILED: "failed",
}
_STATE_CODES = {name: code for code, name in TASK_STATES.items()}


@dataclass(frozen=True)
class AcceleratorInfo:
    vendor: str
    name: str
    index: int = 0
    uuid: str = ""
    memory_bytes: int = 0


@dataclass(frozen=True)
class PowerSourceStatus:
    name: str
    measured: bool
    available: bool
    detail: str = ""


@dataclass(frozen=True)
class DeviceInfo:
    device_name: str
    hostname: str
    platform: str
    architecture: str
    cpu_model: str
    cpu_count: int
    memory_bytes: int
    accelerators: tuple[AcceleratorInfo, ...] = ()
    power_sources: tuple[PowerSourceStatus, ...] = ()
    active_power_source: str = ""
    agent_version: str = ""
    tensorflow_version: str = ""
    device_kind: str = "cpu"
    memory_budget_bytes: int = 0
    compute_share: float = 0.0
    emulated: bool = False

    def to_proto(self) -> agent_pb2.GetDeviceInfoResponse:
        return agent_pb2.GetDeviceInfoResponse(
            device_name=self.device_name,
            hostname=self.hostname,
            platform=self.platform,
            architecture=self.architecture,
            cpu_model=self.cpu_model,
            cpu_count=self.cpu_count,
            memory_bytes=self.memory_bytes,
            accelerators=[
                agent_pb2.Accelerator(
                    vendor=a.vendor, name=a.name, index=a.index, uuid=a.uuid, memory_bytes=a.memory_bytes
                )
                for a in self.accelerators
            ],
            power_sources=[
                agent_pb2.PowerSourceInfo(name=s.name, measured=s.measured, available=s.available, detail=s.detail)
                for s in self.power_sources
            ],
            active_power_source=self.active_power_source,
            agent_version=self.agent_version,
            tensorflow_version=self.tensorflow_version,
            device_kind=self.device_kind,
            memory_budget_bytes=self.memory_budget_bytes,
            compute_share=self.compute_share,
            emulated=self.emulated,
        )

    @classmethod
    def from_proto(cls, msg: agent_pb2.GetDeviceInfoResponse) -> "DeviceInfo":
        return cls(
            device_name=msg.device_name,
            hostname=msg.hostname,
            platform=msg.platform,
            architecture=msg.architecture,
            cpu_model=msg.cpu_model,
            cpu_count=msg.cpu_count,
            memory_bytes=msg.memory_bytes,
            accelerators=tuple(
                AcceleratorInfo(a.vendor, a.name, a.index, a.uuid, a.memory_bytes) for a in msg.accelerators
            ),
            power_sources=tuple(
                PowerSourceStatus(s.name, s.measured, s.available, s.detail) for s in msg.power_sources
            ),
            active_power_source=msg.active_power_source,
            agent_version=msg.agent_version,
            tensorflow_version=msg.tensorflow_version,
            device_kind=msg.device_kind,
            memory_budget_bytes=msg.memory_budget_bytes,
            compute_share=msg.compute_share,
            emulated=msg.emulated,
        )


@dataclass(frozen=True)
class TaskInfo:
    """One TensorFlow server task as the agent sees it; ``state`` is a lower-case name."""

    task_id: str
    job_name: str
    task_index: int
    address: str
    pid: int
    state: str
    exit_code: int | None = None
    started_wall_s: float = 0.0
    uptime_s: float = 0.0
    cpu_time_s: float = 0.0
    rss_bytes: int = 0
    message: str = ""
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def alive(self) -> bool:
        return self.state in ("starting", "running")

    def to_proto(self) -> agent_pb2.TaskStatus:
        msg = agent_pb2.TaskStatus(
            task_id=self.task_id,
            job_name=self.job_name,
            task_index=self.task_index,
            address=self.address,
            pid=self.pid,
            state=_STATE_CODES[self.state],
            started_wall_s=self.started_wall_s,
            uptime_s=self.uptime_s,
            cpu_time_s=self.cpu_time_s,
            rss_bytes=self.rss_bytes,
            message=self.message,
        )
        if self.exit_code is not None:
            msg.exit_code = self.exit_code
        return msg

    @classmethod
    def from_proto(cls, msg: agent_pb2.TaskStatus) -> "TaskInfo":
        return cls(
            task_id=msg.task_id,
            job_name=msg.job_name,
            task_index=msg.task_index,
            address=msg.address,
            pid=msg.pid,
            state=TASK_STATES.get(msg.state, "unspecified"),
            exit_code=msg.exit_code if msg.HasField("exit_code") else None,
            started_wall_s=msg.started_wall_s,
            uptime_s=msg.uptime_s,
            cpu_time_s=msg.cpu_time_s,
            rss_bytes=msg.rss_bytes,
            message=msg.message,
        )


def sample_to_proto(sample: PowerSample) -> agent_pb2.StreamPowerResponse:
    msg = agent_pb2.StreamPowerResponse(
        monotonic_s=sample.monotonic_s,
        wall_time_s=sample.wall_time_s,
        power_w=sample.power_w,
        source=sample.source,
        measured=sample.measured,
        utilization=sample.utilization,
    )
    if sample.energy_j is not None:
        msg.energy_j = sample.energy_j
    return msg


def sample_from_proto(msg: agent_pb2.StreamPowerResponse) -> PowerSample:
    return PowerSample(
        monotonic_s=msg.monotonic_s,
        wall_time_s=msg.wall_time_s,
        power_w=msg.power_w,
        source=msg.source,
        measured=msg.measured,
        energy_j=msg.energy_j if msg.HasField("energy_j") else None,
        utilization=msg.utilization,
    )
