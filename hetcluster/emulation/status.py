"""One look at every device of an inventory: health, live power and what it says it is.

Works for any inventory (emulated or real): it only talks to the agents. Devices are asked in
parallel with a short timeout, so one dead device costs seconds, not a minute per device.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from hetcluster.errors import HetclusterError
from hetcluster.inventory import DeviceEntry, Inventory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceStatus:
    name: str
    address: str
    healthy: bool
    power_w: float | None = None
    power_source: str = ""
    power_measured: bool = False
    compute_share: float = 0.0
    memory_budget_bytes: int = 0
    emulated: bool = False
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def device_status(entry: DeviceEntry, timeout_s: float = 5.0) -> DeviceStatus:
    """Health, then device info and one power sample; errors end up in ``error``, not raised."""
    try:
        client = entry.client(timeout_s=timeout_s)
    except HetclusterError as error:
        return DeviceStatus(entry.name, entry.address, False, error=str(error))
    try:
        if not client.health():
            return DeviceStatus(entry.name, entry.address, False, error="no answer to the health check")
        info = client.device_info()
        stream = client.stream_power(rate_hz=10.0, max_samples=1, duration_s=timeout_s)
        try:
            sample = next(iter(stream), None)
        finally:
            stream.cancel()
        budget = entry.memory_budget_bytes if entry.memory_budget_bytes is not None else info.memory_budget_bytes
        return DeviceStatus(
            name=entry.name,
            address=entry.address,
            healthy=True,
            power_w=sample.power_w if sample else None,
            power_source=sample.source if sample else "",
            power_measured=bool(sample.measured) if sample else False,
            compute_share=info.compute_share,
            memory_budget_bytes=budget,
            emulated=info.emulated,
        )
    except HetclusterError as error:
        return DeviceStatus(entry.name, entry.address, False, error=str(error))
    finally:
        client.close()


def fleet_status(inventory: Inventory, timeout_s: float = 5.0) -> list[DeviceStatus]:
    """device_status for every device, in inventory order."""
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(inventory.devices)))) as pool:
        return list(pool.map(lambda entry: device_status(entry, timeout_s), inventory.devices))


__all__ = ["DeviceStatus", "device_status", "fleet_status"]
