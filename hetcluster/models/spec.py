"""What a training job trains: model name, input shape, classes and batch size.

A model is a registry name, or a user's own tf_keras JSON config (keras_config.py): its spec then
carries the config, and its name, input shape and classes are the config's. Kept free of TensorFlow
so the CLI and the planner can parse and carry a job description without paying TensorFlow's import
time.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from hetcluster.errors import ConfigError
from hetcluster.models.keras_config import (
    KerasConfigModel,
    describe_keras_config,
    register_keras_config,
    registered_keras_config,
)

# Keras applications (random weights) and our small CNN; min input side per model (pixels), as
# enforced by tf_keras.applications' own input-shape check (``obtain_input_shape``).
MIN_INPUT_SIDE_PX: dict[str, int] = {
    "resnet50": 32,
    "mobilenet_v2": 32,
    "vgg16": 32,
    "inception_v3": 75,
    "densenet121": 32,
    "small_cnn": 8,
}
MODEL_NAMES: tuple[str, ...] = tuple(MIN_INPUT_SIDE_PX)

_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX×,]\s*(\d+)\s*[xX×,]\s*(\d+)\s*$")


def parse_input_shape(text: str) -> tuple[int, int, int]:
    """Parse ``"HxWxC"`` (e.g. ``"32x32x3"``) into ``(H, W, C)`` with positive sides."""
    match = _SHAPE_RE.match(text or "")
    if not match:
        raise ConfigError(
            f"Input shape {text!r} is not of the form HxWxC.", hint="write e.g. --input-shape 32x32x3."
        )
    shape = tuple(int(g) for g in match.groups())
    if min(shape) <= 0:
        raise ConfigError(f"Input shape {text!r} has a zero side.", hint="use positive sizes, e.g. 32x32x3.")
    return shape  # type: ignore[return-value]


def format_input_shape(shape: tuple[int, int, int]) -> str:
    """The inverse of :func:`parse_input_shape`."""
    return "x".join(str(int(s)) for s in shape)


def check_model_input(name: str, input_shape: tuple[int, int, int]) -> None:
    """Raise ConfigError if ``name`` is unknown or ``input_shape`` is below its minimum (for a user
    model registered in this process: unless it is the config's own input shape)."""
    user_model = registered_keras_config(name)
    if user_model is not None:
        if tuple(int(s) for s in input_shape) != user_model.input_shape:
            raise ConfigError(f"Model {name} takes inputs of {format_input_shape(user_model.input_shape)}, "
                              f"not {format_input_shape(input_shape)}.",
                              hint="leave --input-shape out with --model-config: the config's input is used.")
        return
    if name not in MIN_INPUT_SIDE_PX:
        raise ConfigError(f"Unknown model {name!r}.", hint=f"choose one of {', '.join(MODEL_NAMES)}.")
    if len(input_shape) != 3:
        raise ConfigError(f"Input shape {input_shape!r} must have 3 dimensions (H, W, C).", hint="write HxWxC.")
    minimum = MIN_INPUT_SIDE_PX[name]
    height, width, channels = (int(s) for s in input_shape)
    if height < minimum or width < minimum:
        raise ConfigError(
            f"Model {name} needs inputs of at least {minimum}x{minimum} pixels, got {height}x{width}.",
            hint=f"use --input-shape {minimum}x{minimum}x{channels} or larger.",
        )
    if channels <= 0:
        raise ConfigError(f"Input shape {input_shape!r} has no channels.", hint="use C = 1 or 3.")


@dataclass(frozen=True)
class ModelSpec:
    """The job's model: registry name, input shape (H, W, C), number of classes, batch size; for a
    user's model also its tf_keras JSON config (``keras_config``, canonical form: from_keras_config),
    whose own name, input shape and classes the first three must be. Building a spec with a config
    registers it in the process, so ``registry.build_model`` can build the name."""

    name: str
    input_shape: tuple[int, int, int] = (32, 32, 3)
    classes: int = 10
    batch_size: int = 32
    keras_config: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(int(s) for s in self.input_shape))
        if self.keras_config is not None:
            described = describe_keras_config(self.keras_config)
            if (self.name, self.input_shape, self.classes) != (
                described.name,
                described.input_shape,
                described.classes,
            ):
                raise ConfigError(
                    f"Model spec {self.name} ({format_input_shape(self.input_shape)}, {self.classes} classes) "
                    f"does not match its config: {described.name} ({format_input_shape(described.input_shape)}, "
                    f"{described.classes} classes).",
                    hint="build the spec with ModelSpec.from_keras_config.",
                )
            object.__setattr__(self, "keras_config", described.config_json)
            register_keras_config(described)
        check_model_input(self.name, self.input_shape)
        if self.classes < 2:
            raise ConfigError(f"classes={self.classes} is too few.", hint="use --classes 2 or more.")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be positive.", hint="use --batch-size 1 or more.")

    @classmethod
    def from_keras_config(cls, config: str | dict | KerasConfigModel, batch_size: int = 32) -> "ModelSpec":
        """The spec of a user's model from its tf_keras JSON config (``model.to_json()``), or from the
        description of it that keras_config already made (not described again)."""
        described = config if isinstance(config, KerasConfigModel) else describe_keras_config(config)
        return cls(described.name, described.input_shape, described.classes, batch_size, described.config_json)

    def to_dict(self) -> dict:
        """JSON-friendly form (input shape as a list; ``keras_config`` only for a user's model)."""
        data = asdict(self)
        data["input_shape"] = list(self.input_shape)
        if self.keras_config is None:
            del data["keras_config"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "ModelSpec":
        """Inverse of :meth:`to_dict`; also accepts ``"HxWxC"`` for the input shape."""
        shape = data.get("input_shape", (32, 32, 3))
        if isinstance(shape, str):
            shape = parse_input_shape(shape)
        return cls(
            name=str(data["name"]),
            input_shape=tuple(shape),
            classes=int(data.get("classes", 10)),
            batch_size=int(data.get("batch_size", 32)),
            keras_config=data.get("keras_config"),
        )
