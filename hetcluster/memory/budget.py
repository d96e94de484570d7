"""Parse memory sizes written by people: 1GiB, 512MiB, 2GB, 1.5G, 1048576."""

from __future__ import annotations

import re

from hetcluster.errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Bytes in `text`; KB/MB/GB are powers of 1000, KiB/MiB/GiB (and bare K/M/G) of 1024."""
    match = _PATTERN.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise ConfigError(f"Cannot read {text!r} as a memory size.",
                          hint="write e.g. 1GiB, 512MiB, 2GB or a number of bytes.")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"Memory size {text!r} is not positive.", hint="give a size above zero.")
    return value


def format_bytes(value: float) -> str:
    """Human-readable binary size: 1.50 GiB."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{int(value)} B"
