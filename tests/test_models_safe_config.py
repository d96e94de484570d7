"""Keras configs from outside load only when they hold nothing but built-in layers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetcluster.errors import ConfigError

pytestmark = pytest.mark.tensorflow


def test_builtin_model_round_trips():
    from hetcluster.models.registry import build_model
    from hetcluster.models.safe_config import model_from_config_safe

    original = build_model("small_cnn", (16, 16, 3), 4)
    clone = model_from_config_safe(original.to_json())
    assert [type(layer).__name__ for layer in clone.layers] == [type(layer).__name__ for layer in original.layers]
    assert clone.count_params() == original.count_params()
    assert clone(np.zeros((1, 16, 16, 3), np.float32)).shape == (1, 4)


def test_lambda_layer_is_refused():
    import tf_keras as keras

    from hetcluster.models.safe_config import model_from_config_safe

    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Lambda(lambda x: x * 2)])
    with pytest.raises(ConfigError, match="Lambda"):
        model_from_config_safe(model.to_json())


def test_custom_class_is_refused():
    import tf_keras as keras

    from hetcluster.models.safe_config import model_from_config_safe

    config = json.loads(keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(2)]).to_json())
    config["config"]["layers"][1]["class_name"] = "EvilDense"
    with pytest.raises(ConfigError, match="EvilDense"):
        model_from_config_safe(config)
    config["config"]["layers"][1]["class_name"] = "Dense"
    config["config"]["layers"][1]["module"] = "os"
    with pytest.raises(ConfigError, match="custom object"):
        model_from_config_safe(config)
    config["config"]["layers"][1]["module"] = "keras.layers"
    config["config"]["layers"][1]["registered_name"] = "mypkg>Dense"
    with pytest.raises(ConfigError, match="custom object"):
        model_from_config_safe(config)


@pytest.mark.parametrize("payload", ["not json", "[1, 2]", '{"class_name": "Dense", "config": {}}'])
def test_non_model_payloads_are_refused(payload):
    from hetcluster.models.safe_config import model_from_config_safe

    with pytest.raises(ConfigError):
        model_from_config_safe(payload)
