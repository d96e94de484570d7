"""The model registry builds every model with random weights and refuses inputs that are too small."""

from __future__ import annotations

import numpy as np
import pytest

from hetcluster.errors import ConfigError
from hetcluster.models import MODEL_NAMES, ModelSpec, parse_input_shape
from hetcluster.models.spec import MIN_INPUT_SIDE_PX, format_input_shape

pytestmark = pytest.mark.tensorflow


def _forward(name: str, shape: tuple[int, int, int], classes: int = 5) -> np.ndarray:
    from hetcluster.models.registry import build_model

    model = build_model(name, shape, classes)
    x = np.random.default_rng(0).random((2, *shape), dtype=np.float32)
    return model(x, training=False).numpy()


def test_registry_names_the_six_models():
    assert set(MODEL_NAMES) == {"resnet50", "mobilenet_v2", "vgg16", "inception_v3", "densenet121", "small_cnn"}


@pytest.mark.parametrize("name,shape", [("small_cnn", (32, 32, 3)), ("mobilenet_v2", (32, 32, 3)),
                                        ("small_cnn", (8, 8, 1))])
def test_small_models_forward_to_logits(name, shape):
    out = _forward(name, shape)
    assert out.shape == (2, 5)
    # logits, not probabilities: rows do not sum to one
    assert not np.allclose(out.sum(axis=1), 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "vgg16", "inception_v3", "densenet121"])
def test_large_models_build_at_their_minimum_input(name):
    side = MIN_INPUT_SIDE_PX[name]
    assert _forward(name, (side, side, 3), classes=3).shape == (2, 3)


def test_random_weights_differ_between_builds():
    from hetcluster.models.registry import build_model

    a = build_model("small_cnn", (16, 16, 3), 4).get_weights()[0]
    b = build_model("small_cnn", (16, 16, 3), 4).get_weights()[0]
    assert a.shape == b.shape and not np.array_equal(a, b)


@pytest.mark.parametrize("name,side", [("inception_v3", 74), ("resnet50", 31), ("mobilenet_v2", 16)])
def test_too_small_input_names_the_minimum(name, side):
    from hetcluster.models.registry import build_model

    with pytest.raises(ConfigError, match=rf"at least {MIN_INPUT_SIDE_PX[name]}x{MIN_INPUT_SIDE_PX[name]}"):
        build_model(name, (side, side, 3), 10)


def test_unknown_model_lists_the_choices():
    from hetcluster.models.registry import build_model

    with pytest.raises(ConfigError, match="small_cnn"):
        build_model("alexnet", (32, 32, 3), 10)


@pytest.mark.parametrize("text,shape", [("32x32x3", (32, 32, 3)), ("224X224X3", (224, 224, 3)),
                                        (" 75 x 75 x 1 ", (75, 75, 1))])
def test_parse_input_shape(text, shape):
    assert parse_input_shape(text) == shape
    assert parse_input_shape(format_input_shape(shape)) == shape


@pytest.mark.parametrize("text", ["32x32", "32x32x0", "axbxc", "", "32x32x3x1"])
def test_parse_input_shape_rejects(text):
    with pytest.raises(ConfigError):
        parse_input_shape(text)


def test_model_spec_round_trip_and_validation():
    spec = ModelSpec("mobilenet_v2", (32, 32, 3), 10, 16)
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    assert ModelSpec.from_dict({"name": "small_cnn", "input_shape": "16x16x1"}).input_shape == (16, 16, 1)
    with pytest.raises(ConfigError):
        ModelSpec("vgg16", (16, 16, 3))
    with pytest.raises(ConfigError):
        ModelSpec("small_cnn", batch_size=0)
    with pytest.raises(ConfigError):
        ModelSpec("small_cnn", classes=1)
