"""A user's own model: a tf_keras JSON config (``model.to_json()``), described without TensorFlow.

The registry's six models travel as names; any other model travels as its Keras config, which
hetcluster loads only in safe mode (safe_config.py: built-in layers, no Lambda, no custom code) and
only on the machine that runs the job's coordinator: the devices' agents and TF servers never see it.

What the job needs of the model is read from the JSON alone, so a command that plans from a
profile imports no TensorFlow for it: one image input of shape (H, W, C) and one output, a ``Dense``
layer with a linear activation (the logits of ``units`` classes: the engine's losses take logits).
The model's name in every table, profile and ledger is the config's own name (every run of
characters other than letters, digits, "_", "." and "-" made one "_", in the config too: TensorFlow's
name scopes need it) and the first 8 hex digits of a SHA-256 of the canonical JSON (sorted keys),
so two different configs never share a name (nor a memory graph, nor a profile) and a re-serialised
copy of the same config keeps it.

A process that builds a spec from a config registers it here (ModelSpec does), and
``hetcluster.models.registry.build_model`` then builds that name from it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetcluster.errors import ConfigError

_FUNCTIONAL = ("Functional", "Model")
_HINT = "save it with tf_keras: Path('model.json').write_text(model.to_json())."


@dataclass(frozen=True)
class KerasConfigModel:
    """What a job needs of a user's model, read from its config."""

    name: str                          # <config name>-<8 hex digits of its canonical JSON>
    input_shape: tuple[int, int, int]
    classes: int
    config_json: str                   # the canonical JSON text (sorted keys, no spaces)


_REGISTERED: dict[str, KerasConfigModel] = {}


def describe_keras_config(text: str | bytes | dict) -> KerasConfigModel:
    """The model's name, input shape and classes from its config; ConfigError for a config the
    job cannot train or that carries code (checked again, with TensorFlow, when it is built)."""
    from hetcluster.models.safe_config import check_config_structure

    try:
        config = json.loads(text) if isinstance(text, (str, bytes)) else text
    except json.JSONDecodeError as exc:
        raise ConfigError(f"Model config is not valid JSON: {exc}.", hint=_HINT) from exc
    if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
        raise ConfigError("Model config is not a Keras model config.", hint=_HINT)
    if str(config.get("keras_version", "")).startswith("3") or "module" in config or _holds_dtype_policy(config):
        raise ConfigError("Model config was saved with Keras 3 (tf.keras in TensorFlow 2.16 and later); hetcluster "
                          "trains tf_keras (Keras 2) models.",
                          hint="build the model with `import tf_keras as keras` and save model.to_json() again.")
    kind = config.get("class_name")
    if kind == "Sequential":
        raise ConfigError("Model config is a Sequential model; hetcluster trains functional models.",
                          hint="wrap it: keras.Model(model.inputs, model.outputs), then save that model's to_json().")
    if kind not in _FUNCTIONAL:
        raise ConfigError(f"Model config is a {kind!r}, not a Keras model config.", hint=_HINT)
    check_config_structure(config)
    body = config["config"]
    listed = body.get("layers")
    layers = {layer.get("name") or _config_of(layer).get("name"): layer
              for layer in (listed if isinstance(listed, list) else []) if isinstance(layer, dict)}
    input_shape = _input_shape(body, layers)
    classes = _classes(body, layers)
    # the model's own name opens every TensorFlow name scope of a step: Keras builds "user net" but
    # a tf.function cannot call it (not a valid root scope name), so it trains as "user_net"
    own_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(body.get("name") or "model")).strip("._-") or "model"
    config = {**config, "config": {**body, "name": own_name}}
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:8]
    return KerasConfigModel(f"{own_name}-{digest}", input_shape, classes, canonical)


def _holds_dtype_policy(node: Any) -> bool:
    """Keras 3 writes every layer's dtype as a DTypePolicy object (and the model's own "module");
    tf_keras writes a dtype name."""
    if isinstance(node, dict):
        return node.get("class_name") == "DTypePolicy" or any(_holds_dtype_policy(v) for v in node.values())
    if isinstance(node, list):
        return any(_holds_dtype_policy(value) for value in node)
    return False


def _config_of(layer: Any) -> dict:
    """A layer entry's own config (an empty one where the JSON holds something else)."""
    config = layer.get("config") if isinstance(layer, dict) else None
    return config if isinstance(config, dict) else {}


def _endpoints(body: dict, key: str, what: str) -> list[str]:
    endpoints = body.get(key)
    if not isinstance(endpoints, list) or not endpoints:
        raise ConfigError(f"Model config lists no {what}.", hint=_HINT)
    if isinstance(endpoints[0], str):  # a single endpoint written flat: [name, node, tensor]
        endpoints = [endpoints]
    return [str(e[0]) for e in endpoints if isinstance(e, list) and e]


def _input_shape(body: dict, layers: dict[str, Any]) -> tuple[int, int, int]:
    inputs = _endpoints(body, "input_layers", "input")
    if len(inputs) != 1:
        raise ConfigError(f"Model config has {len(inputs)} inputs; a job trains on one image input.", hint=_HINT)
    layer_config = _config_of(layers.get(inputs[0]))
    shape = layer_config.get("batch_input_shape") or layer_config.get("batch_shape")
    if (not isinstance(shape, list) or len(shape) != 4
            or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape[1:])):
        raise ConfigError(
            f"Model config's input {inputs[0]!r} has shape {shape}; a job needs images, (batch, H, W, C).",
            hint="build the model on keras.Input(shape=(H, W, C)).",
        )
    return tuple(int(s) for s in shape[1:])  # type: ignore[return-value]


def _classes(body: dict, layers: dict[str, Any]) -> int:
    outputs = _endpoints(body, "output_layers", "output")
    if len(outputs) != 1:
        raise ConfigError(f"Model config has {len(outputs)} outputs; a job trains one classifier output.", hint=_HINT)
    layer = layers.get(outputs[0], {})
    layer_config = _config_of(layer)
    if layer.get("class_name") != "Dense" or layer_config.get("activation", "linear") not in ("linear", None):
        raise ConfigError(f"Model config's output {outputs[0]!r} is a {layer.get('class_name')} layer "
                          f"with activation {layer_config.get('activation')!r}; the job's loss takes logits.",
                          hint="end the model with keras.layers.Dense(classes) (no softmax).")
    units = layer_config.get("units")
    if not isinstance(units, int) or units < 2:
        raise ConfigError(f"Model config's output {outputs[0]!r} has {units} units; a classifier needs 2 or more.",
                          hint="end the model with keras.layers.Dense(classes), classes >= 2.")
    return units


def read_keras_config(path: Path) -> KerasConfigModel:
    """describe_keras_config of a file, with a one-line error when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--model-config {path} cannot be read: {exc}.", hint=_HINT) from exc
    return describe_keras_config(text)


def register_keras_config(model: KerasConfigModel) -> None:
    """Make ``model.name`` buildable in this process (registry.build_model)."""
    _REGISTERED[model.name] = model


def registered_keras_config(name: str) -> KerasConfigModel | None:
    """The user model registered under ``name`` in this process, if any."""
    return _REGISTERED.get(name)
