"""Atomic file writes: what a user keeps (profiles, reports, inventories) is never half-written.

Write to a temporary file in the destination folder, flush and fsync it, then `os.replace` it over
the target, so a reader sees either the old file or the new one — also after a crash or Ctrl-C.
A folder that cannot hold the file is a ConfigError (one line at the CLI), not an OSError; figures
are written the same way, in the format their suffix names (write_figure_atomic).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from hetcluster.errors import ConfigError


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], None], *, mode: int = 0o644,
                 suffix: str = ".tmp") -> Path:
    """Call ``write(tmp_path)`` to produce the content, then move it over ``path`` atomically.

    The temporary file is created 0600 (mkstemp), so a secret is never readable by others in
    between; ``mode`` is applied just before the rename. ``suffix``: the temporary file's, for
    writers that choose a format by it (Keras: ".keras")."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    except OSError as error:
        raise _unwritable(target, error) from None
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


def check_writable(path: str | os.PathLike[str]) -> Path:
    """``path`` as write_atomic would write it: its folder, or the nearest one that exists above it,
    must be a folder this process can write in (a ConfigError saying which one is not). For a
    command to check its outputs before long work."""
    target = Path(path)
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"Cannot write {target}: {folder} is not a folder.", hint="choose a path inside a folder.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"Cannot write {target}: {folder} is not writable.", hint="choose a folder you can write to.")
    return target


def _unwritable(target: Path, error: OSError) -> ConfigError:
    return ConfigError(f"Cannot write {target}: {error.strerror or error}.", hint="choose a folder you can write to.")


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_bytes(data), mode=mode)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, mode: int = 0o644) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_json_atomic(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=indent, default=_json_default) + "\n")


def figure_format(path: str | os.PathLike[str]) -> str:
    """The image format matplotlib writes for ``path``'s suffix (png when it has none); a
    ConfigError naming the formats matplotlib knows when it cannot write that one. Cheap, so a
    command checks its --plot before the long work rather than failing after it."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(path).suffix.lstrip(".").lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise ConfigError(f"Cannot write a plot as .{suffix} ({path}).",
                          hint=f"end the file name in one of .{', .'.join(sorted(formats))}.")
    return suffix


def write_figure_atomic(path: str | os.PathLike[str], fig: Any, *, dpi: int = 110, **savefig: Any) -> Path:
    """Save a matplotlib figure atomically, in the format of the path's suffix (figure_format)."""
    fmt = figure_format(path)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=fmt, **savefig))


def _json_default(value: Any) -> Any:
    """Serialise numpy scalars/arrays, paths and tuples-in-sets that json cannot."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
