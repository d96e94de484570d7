"""Write the user models of the experiments: tf_keras configs that no part of hetcluster was developed
on, for `choice_accuracy.py --model-config` (and `hetcluster ... --model-config`).

    .venv/bin/python -m experiments.user_models      # writes experiments/models/<name>.json

dense_head_cnn: two conv/pool blocks and a 4096x256 dense head, 1.07 M parameters (4.3 MB of float32
variables that every step pulls from and pushes to the parameter server), where the registry's
small_cnn has 25 k: a job whose step is mostly the parameter server's traffic, not the workers'
compute.

residual_l2_cnn: a stem and three residual blocks (conv/BN/ReLU twice, a 1x1 projection where the width
changes), global pooling and a Dense(10), every conv and the head under an L2 weight regularizer
(which the training step adds to the loss); 0.1 M parameters: a compute-bound job with skip connections.
"""

from __future__ import annotations

from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent / "models"


def dense_head_cnn(keras):  # type: ignore[no-untyped-def]
    inputs = keras.Input(shape=(32, 32, 3), name="image")
    x = inputs
    for i, filters in enumerate((32, 64)):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"conv{i + 1}")(x)
        x = keras.layers.MaxPooling2D(2, name=f"pool{i + 1}")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(256, activation="relu", name="dense")(x)
    x = keras.layers.Dropout(0.2, name="dropout")(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="dense_head_cnn")


def residual_l2_cnn(keras):  # type: ignore[no-untyped-def]
    l2 = keras.regularizers.L2(1e-4)

    def conv(x, filters, name, kernel=3):  # type: ignore[no-untyped-def]
        return keras.layers.Conv2D(filters, kernel, padding="same", use_bias=False, kernel_regularizer=l2, name=name)(x)

    inputs = keras.Input(shape=(32, 32, 3), name="image")
    x = keras.layers.ReLU(name="stem_relu")(keras.layers.BatchNormalization(name="stem_bn")(conv(inputs, 16, "stem")))
    for i, (filters, stride) in enumerate(((16, 1), (32, 2), (64, 2))):
        shortcut = x
        if stride > 1:
            x = keras.layers.MaxPooling2D(stride, name=f"b{i}_pool")(x)
            shortcut = x
        y = keras.layers.ReLU(name=f"b{i}_relu1")(
            keras.layers.BatchNormalization(name=f"b{i}_bn1")(conv(x, filters, f"b{i}_conv1"))
        )
        y = keras.layers.BatchNormalization(name=f"b{i}_bn2")(conv(y, filters, f"b{i}_conv2"))
        if shortcut.shape[-1] != filters:
            shortcut = conv(shortcut, filters, f"b{i}_proj", kernel=1)
        x = keras.layers.ReLU(name=f"b{i}_out")(keras.layers.Add(name=f"b{i}_add")([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(10, kernel_regularizer=l2, name="logits")(x)
    return keras.Model(inputs, outputs, name="residual_l2_cnn")


def main() -> int:
    import tf_keras as keras

    MODELS_DIR.mkdir(exist_ok=True)
    for build in (dense_head_cnn, residual_l2_cnn):
        model = build(keras)
        path = MODELS_DIR / f"{model.name}.json"
        path.write_text(model.to_json(indent=1) + "\n")
        print(f"{path}: {model.count_params():,} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
