"""A source that adds up sources measuring disjoint parts of one host (RAPL CPU + NVML GPUs)."""

from __future__ import annotations

import logging
from typing import Sequence

from hetcluster.errors import PowerSourceError
from hetcluster.power.base import PowerSample, PowerSource

log = logging.getLogger(__name__)


class CombinedSource(PowerSource):
    """Σ power of its parts; energy summed only when every part has a counter."""

    def __init__(self, parts: Sequence[PowerSource]) -> None:
        if not parts:
            raise PowerSourceError("A combined power source needs at least one part.", hint="report this as a bug.")
        self.parts = list(parts)
        self.name = "+".join(p.name for p in self.parts)
        self.measured = all(p.measured for p in self.parts)

    def describe(self) -> str:
        return " + ".join(p.describe() for p in self.parts)

    def read(self) -> PowerSample:
        samples = [p.read() for p in self.parts]
        energies = [s.energy_j for s in samples]
        energy_j = None if any(e is None for e in energies) else sum(e for e in energies if e is not None)
        return self._sample(sum(s.power_w for s in samples), energy_j=energy_j)

    def close(self) -> None:
        for part in self.parts:
            try:
                part.close()
            except Exception as exc:  # closing one part must not leak the others
                log.warning("Closing power source %s failed: %s", part.name, exc)
