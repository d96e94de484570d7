"""Model registry, model specs and datasets of a training job.

Only the light parts are imported here (no TensorFlow at import time): the CLI imports this
package at start-up. TensorFlow is imported inside the functions that need it.
"""

from typing import Any

from hetcluster.models.spec import MODEL_NAMES, ModelSpec, parse_input_shape


def build_model(name: str, input_shape: tuple[int, int, int] = (32, 32, 3), classes: int = 10) -> Any:
    """A registry model as a tf_keras Model (random weights); imports TensorFlow."""
    from hetcluster.models.registry import build_model as build

    return build(name, input_shape, classes)


__all__ = ["MODEL_NAMES", "ModelSpec", "build_model", "parse_input_shape"]
