"""The environment of every TensorFlow process hetcluster runs — the coordinator, the parameter
servers, the workers the agents start — in one place, applied before TensorFlow is imported.

- ``GRPC_FAIL_FAST=use_caller``: a lost worker's RPC fails to the caller at once, so
  ClusterCoordinator's failure handling (and ours) sees it instead of waiting.
- ``TF_USE_LEGACY_KERAS=1``: the models are tf_keras (Keras 2) models, which
  ParameterServerStrategy trains.
- ``TF_ENABLE_ONEDNN_OPTS=1``: TensorFlow turns oneDNN on by default only on some CPUs; off, the
  others train several times slower, and TF's CPU allocator keeps no statistics for the memory
  measurements (docs/decisions.md#onednn-on).
- ``TF_CPP_MIN_LOG_LEVEL=2``: TF's C++ runtime logs warnings (no GPU, no cuInit) on every start.

A setting the user already made wins (``TF_ENABLE_ONEDNN_OPTS=0`` turns oneDNN off again).
"""

from __future__ import annotations

import os
from typing import Mapping

TF_ENV = {
    "GRPC_FAIL_FAST": "use_caller",
    "TF_USE_LEGACY_KERAS": "1",
    "TF_ENABLE_ONEDNN_OPTS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def tf_env(base: Mapping[str, str] | None = None, **forced: str) -> dict[str, str]:
    """A child process's environment: ``base`` (default ``os.environ``) with every TF_ENV setting it
    lacks, and ``forced`` over everything."""
    return {**TF_ENV, **(os.environ if base is None else base), **forced}


def prepare_tf_env() -> None:
    """Give this process every TF_ENV setting it lacks (call before TensorFlow is imported)."""
    for key, value in TF_ENV.items():
        os.environ.setdefault(key, value)
