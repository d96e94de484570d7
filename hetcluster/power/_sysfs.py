"""Reading small sysfs/procfs attribute files, with errors that say how to fix them.

Every power source reads one-line files under an injectable root; the failure modes are the
same everywhere (missing, permission denied, not a file, garbage), so they are translated to
PowerSourceError here, once.
"""

from __future__ import annotations

from pathlib import Path

from hetcluster.errors import PowerSourceError

PERMISSION_HINT = (
    "run the agent as root, or install the udev/tmpfiles rule from agents/ and add the agent's "
    "user to the group it names."
)


def read_text(path: Path) -> str:
    """The stripped content of an attribute file, or PowerSourceError saying why not."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except PermissionError as exc:
        raise PowerSourceError(f"Permission denied reading {path}.", hint=PERMISSION_HINT) from exc
    except FileNotFoundError as exc:
        raise PowerSourceError(
            f"{path} does not exist (the sensor disappeared or the driver is not loaded).",
            hint="check that the driver is loaded and the device still present.",
        ) from exc
    except OSError as exc:
        raise PowerSourceError(
            f"Cannot read {path}: {exc.strerror or exc}.",
            hint="check the sensor driver; the file must be a readable attribute.",
        ) from exc


def read_int(path: Path) -> int:
    """An integer attribute (energy_uj, current_now, ...)."""
    text = read_text(path)
    try:
        return int(text.split()[0])
    except (ValueError, IndexError) as exc:
        raise PowerSourceError(
            f"{path} holds {text!r}, not an integer.", hint="check the sensor driver."
        ) from exc


def read_optional(path: Path) -> str | None:
    """The content of an optional attribute (labels, names), or None when absent or unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
