"""Load Keras model configs that come from outside, refusing anything that carries code.

A Keras JSON config can name a ``Lambda`` layer (marshalled Python bytecode) or a custom class
that resolves to arbitrary code. Configs from users or the network are walked first: only layer,
initializer, regularizer and constraint classes that tf_keras ships are accepted; then the model
is deserialised inside tf_keras' own ``SafeModeScope(True)`` as a second line of defence.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from hetcluster.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import tf_keras

log = logging.getLogger(__name__)

_FORBIDDEN_CLASSES = frozenset({"Lambda", "TFOpLambda", "SlicingOpLambda"})
_MODEL_CLASSES = frozenset({"Model", "Functional", "Sequential"})
# Keys whose values, when strings, name a function that Keras would import.
_FUNCTION_TYPE_KEYS = frozenset({"function_type", "output_shape_type"})


def _allowed_class_names() -> frozenset[str]:
    """Class names tf_keras itself exports for layers, initializers, regularizers, constraints."""
    import tf_keras as keras

    names: set[str] = set(_MODEL_CLASSES)
    for module in (keras.layers, keras.initializers, keras.regularizers, keras.constraints,
                   keras.activations, keras.optimizers):
        names.update(n for n in dir(module) if not n.startswith("_"))
    names.update({"InputLayer", "Functional", "__tuple__"})
    return frozenset(names - _FORBIDDEN_CLASSES)


def _walk(node: Any, allowed: frozenset[str] | None, path: str) -> None:
    """Raise ConfigError at the first object that is not a plain tf_keras built-in (allowed None:
    only what can be told without TensorFlow: code-carrying layers, foreign modules, functions)."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            _walk(item, allowed, f"{path}[{i}]")
        return
    if not isinstance(node, dict):
        return
    class_name = node.get("class_name")
    if isinstance(class_name, str):
        if class_name in _FORBIDDEN_CLASSES:
            raise ConfigError(
                f"Model config has a {class_name} layer at {path}; it carries Python code.",
                hint="replace the Lambda with built-in layers before sending the model.",
            )
        registered = node.get("registered_name")
        module = node.get("module")
        custom_registration = isinstance(registered, str) and registered not in ("", class_name)
        foreign_module = isinstance(module, str) and not module.startswith(("keras", "tf_keras"))
        if (allowed is not None and class_name not in allowed) or custom_registration or foreign_module:
            raise ConfigError(
                f"Model config names a custom object {class_name!r} at {path}.",
                hint="use only built-in tf_keras layers; custom code is not loaded.",
            )
    for key, value in node.items():
        if key in _FUNCTION_TYPE_KEYS and value not in (None, "raw"):
            raise ConfigError(f"Model config carries a function at {path}.{key}.",
                              hint="use only built-in tf_keras layers.")
        _walk(value, allowed, f"{path}.{key}")


def check_config_structure(config: dict) -> None:
    """The checks of a config that need no TensorFlow (Lambda layers, custom registrations,
    foreign modules, functions); model_from_config_safe adds tf_keras' own list of classes."""
    _walk(config, None, "$")


def model_from_config_safe(config_json: str | dict) -> "tf_keras.Model":
    """Build an (untrained) model from a Keras JSON config, refusing Lambda and custom objects."""
    try:
        config = json.loads(config_json) if isinstance(config_json, (str, bytes)) else config_json
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Model config is not valid JSON: {exc}.", hint="send model.to_json().") from exc
    if not isinstance(config, dict) or config.get("class_name") not in _MODEL_CLASSES:
        raise ConfigError("Model config is not a Keras model config.", hint="send model.to_json().")
    _walk(config, _allowed_class_names(), "$")
    import tf_keras as keras
    from tf_keras.src.saving.serialization_lib import SafeModeScope

    with SafeModeScope(True):
        try:
            return keras.models.model_from_json(json.dumps(config), custom_objects=None)
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(f"Keras refused the model config: {exc}",
                              hint="check the config was written by tf_keras model.to_json().") from exc
