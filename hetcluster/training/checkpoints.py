"""Read where a job's checkpoint stands without importing TensorFlow.

The engine names checkpoints ``ckpt-<applied steps>`` through ``tf.train.CheckpointManager``,
whose index file ``<dir>/checkpoint`` is a small text proto naming the latest one. Planning and
resuming only need that number, so it is parsed here directly.
"""

from __future__ import annotations

import re
from pathlib import Path

_LATEST_RE = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.MULTILINE)
_STEPS_RE = re.compile(r"-(\d+)$")


def latest_checkpoint(checkpoint_dir: str | Path | None) -> str | None:
    """Path prefix of the latest checkpoint in ``checkpoint_dir`` (None when there is none)."""
    if not checkpoint_dir:
        return None
    index = Path(checkpoint_dir) / "checkpoint"
    try:
        match = _LATEST_RE.search(index.read_text(encoding="utf-8"))
    except OSError:
        return None
    if not match:
        return None
    path = Path(match.group(1))
    return str(path if path.is_absolute() else Path(checkpoint_dir) / path)


def checkpoint_steps(checkpoint_dir: str | Path | None) -> int:
    """Applied steps recorded in the latest checkpoint's name (0 when there is no checkpoint)."""
    latest = latest_checkpoint(checkpoint_dir)
    match = _STEPS_RE.search(latest or "")
    return int(match.group(1)) if match else 0
