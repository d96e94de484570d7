"""Small tf_keras models with forks, joins, BN and dropout for the memory tests (imports TF)."""

from __future__ import annotations

from typing import Any


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
