"""Write the user models of the experiments: tf_keras configs that no part of hetcluster was developed
on, for `choice_accuracy.py --model-config` (and `hetcluster ... --model-config`).

    .venv/bin/python experiments/user_models.py      # writes experiments/models/<name>.json

dense_head_cnn: two conv/pool blocks and a 4096x256 dense head, 1.07 M parameters (4.3 MB of float32
variables that every step pulls from and pushes to the parameter server), where the registry's
small_cnn has 25 k: a job whose step is mostly the parameter server's traffic, not the workers'
compute.
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


def main() -> int:
    import tf_keras as keras

    MODELS_DIR.mkdir(exist_ok=True)
    for build in (dense_head_cnn,):
        model = build(keras)
        path = MODELS_DIR / f"{model.name}.json"
        path.write_text(model.to_json(indent=1) + "\n")
        print(f"{path}: {model.count_params():,} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
