"""Power sources: one module per way of knowing a device's power draw, a probe each, a factory.

Use ``open_source(PowerConfig.from_mapping(table))`` for the configured source and
``available_sources()`` to list what this host offers. See docs/power.md for what each reads.
"""

from hetcluster.power.android import AndroidBatteryPowerSource
from hetcluster.power.base import Availability, PowerSample, PowerSource
from hetcluster.power.combined import CombinedSource
from hetcluster.power.detect import SOURCE_NAMES, PowerConfig, available_sources, open_source
from hetcluster.power.emulated import EmulatedPowerSource
from hetcluster.power.jetson import JetsonPowerSource
from hetcluster.power.model import UtilizationModelSource, cpu_model_name
from hetcluster.power.nvml import NvmlPowerSource, list_nvidia_accelerators
from hetcluster.power.pi5 import Pi5PowerSource
from hetcluster.power.rapl import RaplPowerSource

__all__ = [
    "AndroidBatteryPowerSource",
    "Availability",
    "CombinedSource",
    "EmulatedPowerSource",
    "JetsonPowerSource",
    "NvmlPowerSource",
    "Pi5PowerSource",
    "PowerConfig",
    "PowerSample",
    "PowerSource",
    "RaplPowerSource",
    "SOURCE_NAMES",
    "UtilizationModelSource",
    "available_sources",
    "cpu_model_name",
    "list_nvidia_accelerators",
    "open_source",
]
