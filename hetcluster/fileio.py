"""Atomic file writes: what a user keeps (profiles, reports, inventories) is never half-written.

Write to a temporary file in the destination folder, flush and fsync it, then `os.replace` it over
the target, so a reader sees either the old file or the new one — also after a crash or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], None], *, mode: int = 0o644) -> Path:
    """Call ``write(tmp_path)`` to produce the content, then move it over ``path`` atomically.

    The temporary file is created 0600 (mkstemp), so a secret is never readable by others in
    between; ``mode`` is applied just before the rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_bytes(data), mode=mode)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, mode: int = 0o644) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=indent, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    """Serialise numpy scalars/arrays, paths and tuples-in-sets that json cannot."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
