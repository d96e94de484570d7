"""Model registry, model specs and datasets of a training job.

Only the light parts are imported here (no TensorFlow at import time): the CLI imports this
package at start-up. TensorFlow is imported inside the functions that need it.
"""

from hetcluster.models.spec import MODEL_NAMES, ModelSpec, parse_input_shape

__all__ = ["MODEL_NAMES", "ModelSpec", "parse_input_shape"]
