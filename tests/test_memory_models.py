"""Small tf_keras models with forks, joins, BN and dropout for the memory tests (imports TF)."""

from __future__ import annotations

from typing import Any


def forced_plan(model: Any, batch_size: int, strategy: str, mode: str | None = None) -> Any:
    """A plan recomputing every segment of ``strategy`` (optionally forcing the mode)."""
    from hetcluster.memory import plan_for_budget
    from hetcluster.memory.checkpoints import segments
    from hetcluster.memory.keras_graph import extract_graph
    from hetcluster.memory.plan import MemoryPlan, PlannedSegment

    g = extract_graph(model, batch_size)
    base = plan_for_budget(g, 10**12)
    segs = tuple(PlannedSegment(tuple(g.nodes[i].name for i in range(s.start, s.stop)), mode or s.mode)
                 for s in segments(g, strategy))
    assert segs
    return MemoryPlan(**{**base.__dict__, "segments": segs, "technique": f"recompute_{strategy}"})


def resnet_like(keras: Any, input_shape=(16, 16, 3), classes: int = 5, blocks: int = 2, dropout: float = 0.0,
                width: int = 8, name: str = "resnet_like") -> Any:
    """Conv stem, `blocks` residual blocks (fork + add join), optional dropout, dense head."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name="stem_conv")(inputs)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    for b in range(blocks):
        y = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"b{b}_conv1")(x)
        y = keras.layers.BatchNormalization(name=f"b{b}_bn1")(y)
        y = keras.layers.ReLU(name=f"b{b}_relu1")(y)
        if dropout:
            y = keras.layers.Dropout(dropout, name=f"b{b}_drop")(y)
        y = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name=f"b{b}_conv2")(y)
        y = keras.layers.BatchNormalization(name=f"b{b}_bn2")(y)
        x = keras.layers.Add(name=f"b{b}_add")([x, y])
        x = keras.layers.ReLU(name=f"b{b}_out")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    if dropout:
        x = keras.layers.Dropout(dropout, name="head_drop")(x)
    outputs = keras.layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def densenet_like(keras: Any, input_shape=(16, 16, 3), classes: int = 5, layers: int = 3) -> Any:
    """A dense block: every layer's output concatenated onto the running features."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", name="stem")(inputs)
    for i in range(layers):
        y = keras.layers.BatchNormalization(name=f"d{i}_bn")(x)
        y = keras.layers.ReLU(name=f"d{i}_relu")(y)
        y = keras.layers.Conv2D(4, 3, padding="same", name=f"d{i}_conv")(y)
        x = keras.layers.Concatenate(name=f"d{i}_cat")([x, y])
    x = keras.layers.BatchNormalization(name="final_bn")(x)
    x = keras.layers.AveragePooling2D(2, name="pool")(x)
    x = keras.layers.Flatten(name="flat")(x)
    outputs = keras.layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="densenet_like")


def inception_like(keras: Any, input_shape=(16, 16, 3), classes: int = 5) -> Any:
    """One inception module: a fork into 1x1, 3x3, pooled branches joined by concat."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="stem")(inputs)
    a = keras.layers.Conv2D(4, 1, name="br1_conv")(x)
    b = keras.layers.Conv2D(4, 1, activation="relu", name="br3_reduce")(x)
    b = keras.layers.Conv2D(4, 3, padding="same", name="br3_conv")(b)
    c = keras.layers.MaxPooling2D(3, strides=1, padding="same", name="brp_pool")(x)
    c = keras.layers.Conv2D(4, 1, name="brp_conv")(c)
    x = keras.layers.Concatenate(name="mix")([a, b, c])
    x = keras.layers.BatchNormalization(name="mix_bn")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="inception_like")


# ---- graph extraction tests (TensorFlow) ---------------------------------------------------

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def keras_mod():
    pytest.importorskip("tensorflow")
    import tf_keras

    return tf_keras


@pytest.mark.tensorflow
def test_resnet_like_graph_has_forks_joins_and_exact_sizes(keras_mod) -> None:
    from hetcluster.memory.keras_graph import extract_graph

    model = resnet_like(keras_mod, blocks=2, width=8)
    g = extract_graph(model, batch_size=4)
    assert len(g) == len(model.layers)
    idx = g.index
    assert g.nodes[0].kind == "input" and g.nodes[0].output_bytes == 4 * 16 * 16 * 3 * 4
    assert g.is_fork(idx["stem_relu"]) and g.is_fork(idx["b0_out"]) and not g.is_fork(idx["b0_bn1"])
    assert g.is_join(idx["b0_add"]) and set(g.nodes[idx["b0_add"]].inputs) == {"stem_relu", "b0_bn2"}
    assert g.nodes[idx["b0_conv1"]].kind == "conv" and g.nodes[idx["b0_bn1"]].kind == "bn"
    assert g.nodes[idx["b0_conv1"]].output_bytes == 4 * 16 * 16 * 8 * 4
    assert g.nodes[idx["b0_conv1"]].flops == 2 * 4 * 16 * 16 * 3 * 3 * 8 * 8
    assert g.nodes[idx["logits"]].flops == 2 * 4 * 8 * 5
    assert g.param_bytes == model.count_params() * 4
    assert g.trainable_param_bytes == sum(v.shape.num_elements() for v in model.trainable_variables) * 4
    assert g.output_ids == (idx["logits"],)
    # activations scale with the batch, parameters do not
    g8 = extract_graph(model, batch_size=8)
    assert g8.activation_bytes == 2 * g.activation_bytes and g8.param_bytes == g.param_bytes
    assert g.scaled(8) == g8


@pytest.mark.tensorflow
def test_densenet_and_inception_like_graphs(keras_mod) -> None:
    from hetcluster.memory.keras_graph import extract_graph

    d = extract_graph(densenet_like(keras_mod, layers=3), 2)
    cat = d.nodes[d.index["d2_cat"]]
    assert cat.kind == "concat" and cat.inputs == ("d1_cat", "d2_conv")
    assert cat.output_bytes == 2 * 16 * 16 * (8 + 3 * 4) * 4
    assert d.is_fork(d.index["d1_cat"])  # read by the next BN and the next concat
    i = extract_graph(inception_like(keras_mod), 2)
    assert len(i.consumers[i.index["stem"]]) == 3
    assert i.nodes[i.index["mix"]].inputs == ("br1_conv", "br3_conv", "brp_conv")
    assert i.nodes[i.index["brp_pool"]].kind == "maxpool"


@pytest.mark.tensorflow
def test_nested_functional_models_are_flattened(keras_mod) -> None:
    from hetcluster.memory.keras_graph import extract_graph, flatten_model

    inner = resnet_like(keras_mod, blocks=1, name="backbone")
    inputs = keras_mod.Input(shape=(16, 16, 3), name="outer_in")
    x = keras_mod.layers.Rescaling(1 / 255.0, name="scale")(inputs)
    x = inner(x)
    outputs = keras_mod.layers.Dense(3, name="head")(x)
    model = keras_mod.Model(inputs, outputs)
    g = extract_graph(model, 2)
    names = [n.name for n in g.nodes]
    assert "backbone/b0_add" in names and "head" in names and "backbone" not in names
    assert g.nodes[g.index["backbone/stem_conv"]].inputs == ("scale",)
    assert g.nodes[g.index["head"]].inputs == ("backbone/logits",)
    assert g.param_bytes == model.count_params() * 4
    assert len(flatten_model(model).ops) == len(g)
