"""Build the registry's models with random weights (never a download), and users' own models.

Five Keras applications from ``tf_keras.applications`` (``weights=None``) plus ``small_cnn``, a few
conv/BN/pool layers that train fast on a CPU. Every model is a functional ``tf_keras.Model`` that
outputs logits (no softmax): the training engine uses ``from_logits=True`` losses, which is the
numerically stable form, and the memory scheduler can walk the functional layer graph. A user's
model registered in the process (a ModelSpec built from its config, keras_config.py) is built from
that config in safe mode (safe_config.py), with fresh random weights as well.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from hetcluster.errors import ConfigError
from hetcluster.models.keras_config import registered_keras_config
from hetcluster.models.spec import MODEL_NAMES, ModelSpec, check_model_input

if TYPE_CHECKING:  # pragma: no cover
    import tf_keras

log = logging.getLogger(__name__)

# name -> attribute of tf_keras.applications
_APPLICATIONS: dict[str, str] = {
    "resnet50": "ResNet50",
    "mobilenet_v2": "MobileNetV2",
    "vgg16": "VGG16",
    "inception_v3": "InceptionV3",
    "densenet121": "DenseNet121",
}


def _build_small_cnn(keras: Any, input_shape: tuple[int, int, int], classes: int) -> "tf_keras.Model":
    """Two conv/BN/ReLU/pool blocks, global pooling and a dense classifier (~25k parameters)."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    for i, filters in enumerate((16, 32)):
        x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv{i + 1}")(x)
        x = keras.layers.BatchNormalization(name=f"bn{i + 1}")(x)
        x = keras.layers.ReLU(name=f"relu{i + 1}")(x)
        x = keras.layers.MaxPooling2D(2, name=f"pool{i + 1}")(x)
    x = keras.layers.Conv2D(64, 3, padding="same", activation="relu", name="conv3")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def build_model(name: str, input_shape: tuple[int, int, int] = (32, 32, 3), classes: int = 10) -> "tf_keras.Model":
    """Return a freshly initialised (random weights) ``tf_keras.Model`` of the registry.

    Raises ConfigError for an unknown name or an input below the model's minimum side.
    """
    input_shape = tuple(int(s) for s in input_shape)  # type: ignore[assignment]
    check_model_input(name, input_shape)
    if classes < 2:
        raise ConfigError(f"classes={classes} is too few.", hint="use --classes 2 or more.")
    user_model = registered_keras_config(name)
    if user_model is not None:
        return _build_user_model(user_model, classes)
    import tf_keras as keras

    if name == "small_cnn":
        return _build_small_cnn(keras, input_shape, classes)
    constructor: Callable[..., Any] = getattr(keras.applications, _APPLICATIONS[name])
    try:
        return constructor(
            weights=None,
            include_top=True,
            input_shape=input_shape,
            classes=classes,
            classifier_activation=None,
        )
    except ValueError as exc:  # Keras' own input check, worded as ours
        raise ConfigError(f"Keras could not build {name} for input {input_shape}: {exc}",
                          hint="use a larger --input-shape.") from exc


def _build_user_model(user_model: Any, classes: int) -> "tf_keras.Model":
    """A user's model from its config (safe mode), checked to take and give what its spec says."""
    from hetcluster.models.safe_config import model_from_config_safe

    if classes != user_model.classes:
        raise ConfigError(f"Model {user_model.name} has {user_model.classes} classes, not {classes}.",
                          hint="leave --classes out with --model-config: the config's output is used.")
    model = model_from_config_safe(user_model.config_json)
    given = (tuple(model.input_shape[1:]), model.output_shape[-1])
    if given != (user_model.input_shape, user_model.classes):
        raise ConfigError(f"Model {user_model.name} built with input {given[0]} and {given[1]} outputs, where its "
                          f"config says {user_model.input_shape} and {user_model.classes}.",
                          hint="save the config again with tf_keras model.to_json().")
    return model


def build_from_spec(spec: ModelSpec) -> "tf_keras.Model":
    """``build_model`` for a :class:`ModelSpec`."""
    return build_model(spec.name, spec.input_shape, spec.classes)


__all__ = ["MODEL_NAMES", "build_model", "build_from_spec"]
