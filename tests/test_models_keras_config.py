"""A user's own model as a tf_keras JSON config: described without TensorFlow, named by its content,
carried by ModelSpec across processes, built in safe mode, and refused in one line when a job
cannot train it. tests/data/models/user_net.json was written by tf_keras 2.20 ``model.to_json()``
(Input 16x16x3, Conv2D, BatchNormalization, ReLU, global pooling, Dense(4) logits; named "user net")."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetcluster.errors import ConfigError
from hetcluster.models import keras_config
from hetcluster.models.keras_config import describe_keras_config, read_keras_config
from hetcluster.models.spec import ModelSpec

USER_NET = Path(__file__).parent / "data" / "models" / "user_net.json"


@pytest.fixture
def config() -> dict:
    return json.loads(USER_NET.read_text())


def _layer(config: dict, name: str) -> dict:
    return next(layer for layer in config["config"]["layers"] if layer["name"] == name)


def test_a_config_gives_the_job_its_name_input_and_classes_without_tensorflow(config):
    described = read_keras_config(USER_NET)
    assert described.name.startswith("user_net-") and len(described.name) == len("user_net-") + 8
    assert (described.input_shape, described.classes) == ((16, 16, 3), 4)
    # the name is the content's: the same config written another way keeps it, another config does not
    assert describe_keras_config(json.dumps(config)).name == described.name
    wider = copy.deepcopy(config)
    _layer(wider, "c1")["config"]["filters"] = 16
    assert describe_keras_config(wider).name != described.name
    # and no TensorFlow for it (planning from a profile imports none): checked in a fresh interpreter
    probe = ("import sys; from hetcluster.models.spec import ModelSpec; from hetcluster.models.keras_config import "
             f"read_keras_config; ModelSpec.from_keras_config(read_keras_config({str(USER_NET)!r}).config_json); "
             "print(sorted(m for m in ('tensorflow', 'tf_keras', 'keras') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_model_spec_carries_the_config_and_registers_it_where_it_is_read(config, monkeypatch):
    spec = ModelSpec.from_keras_config(json.dumps(config), batch_size=8)
    assert (spec.input_shape, spec.classes, spec.batch_size) == ((16, 16, 3), 4, 8)
    assert "keras_config" not in repr(spec)  # a resnet50 config is 120 kB: not in logs
    data = json.loads(json.dumps(spec.to_dict()))  # as a job file or a profile carries it
    assert "keras_config" not in ModelSpec("small_cnn").to_dict()  # registry models' dicts are as before
    monkeypatch.setattr(keras_config, "_REGISTERED", {})  # a fresh process (the training's, run_job)
    assert keras_config.registered_keras_config(spec.name) is None
    assert ModelSpec.from_dict(data) == spec
    assert keras_config.registered_keras_config(spec.name).input_shape == (16, 16, 3)
    with pytest.raises(ConfigError, match="takes inputs of 16x16x3"):
        ModelSpec(spec.name, (32, 32, 3), 4, 8)
    with pytest.raises(ConfigError, match="does not match its config"):
        ModelSpec.from_dict({**data, "classes": 5})


def _without_dense_output(config: dict) -> dict:
    _layer(config, "logits")["config"]["activation"] = "softmax"
    return config


def _two_inputs(config: dict) -> dict:
    config["config"]["input_layers"] = [["image", 0, 0], ["image", 0, 0]]
    return config


def _flat_input(config: dict) -> dict:
    _layer(config, "image")["config"]["batch_input_shape"] = [None, 48]
    return config


def _lambda(config: dict) -> dict:
    _layer(config, "r")["class_name"] = "Lambda"
    return config


def _malformed(config: dict) -> dict:
    config["config"]["layers"] = 5
    return config


def _sequential(config: dict) -> dict:
    config["class_name"] = "Sequential"
    return config


@pytest.mark.parametrize("break_it, needle", [
    (_without_dense_output, "takes logits"),
    (_two_inputs, "2 inputs"),
    (_flat_input, "needs images"),
    (_lambda, "Lambda"),
    (_sequential, "Sequential"),
    (_malformed, "has shape None"),
])
def test_a_config_the_job_cannot_train_is_refused_in_one_line(config, break_it, needle):
    with pytest.raises(ConfigError, match=needle) as caught:
        describe_keras_config(break_it(config))
    assert "\n" not in str(caught.value) and "To fix:" in str(caught.value)


def test_unreadable_and_non_json_files_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        read_keras_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_keras_config(tmp_path / "bad.json")


@pytest.mark.tensorflow
def test_the_registry_builds_a_registered_config_in_safe_mode(config):
    import numpy as np
    import tensorflow as tf

    from hetcluster.models.registry import build_from_spec

    spec = ModelSpec.from_keras_config(config, batch_size=2)
    first, second = build_from_spec(spec), build_from_spec(spec)
    assert first.output_shape == (None, 4) and first(np.zeros((2, 16, 16, 3), np.float32)).shape == (2, 4)
    # a training step calls the model inside a tf.function, whose name scope "user net" (the config's
    # name) would refuse: it trains as user_net
    assert first.name == "user_net"
    assert tf.function(lambda x: first(x, training=True))(tf.zeros((2, 16, 16, 3))).shape == (2, 4)
    # fresh random weights each time, as for the registry's own models
    assert not np.allclose(first.get_layer("c1").get_weights()[0], second.get_layer("c1").get_weights()[0])
    # a class tf_keras does not ship passes the TensorFlow-free description and is refused at the build
    _layer(config, "r")["class_name"] = "EvilReLU"
    evil = ModelSpec.from_keras_config(config, batch_size=2)
    with pytest.raises(ConfigError, match="EvilReLU"):
        build_from_spec(evil)
