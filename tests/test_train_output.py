"""A job hands back a good model: `hetcluster train` on an emulated fleet learns scikit-learn's
digits, exports model.keras, and the held-out score it reports is what a fresh process gets.

The fresh process loads the file with tf_keras alone and measures it on the held-out fifth; then
it re-estimates every BatchNorm layer's statistics its own way (each layer's input over the whole
training part at once, not the exporter's running means over batches) and measures again: the
exported statistics must be as good (within a point). The checkpoint's own statistics, the
exponential averages training leaves, are printed beside them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from train_fleet import emulated_fleet, write_profile

pytestmark = [pytest.mark.slow, pytest.mark.tensorflow]

STEPS = 1500

FRESH = textwrap.dedent("""
    import json, os, sys
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np, tensorflow as tf, tf_keras as keras
    from hetcluster.models.datasets import held_out_mask
    model_path, data_path, checkpoint = sys.argv[1:4]
    data = np.load(data_path)
    x, y = data["x"].astype("float32") / 255.0, data["y"]
    held = held_out_mask(len(x), 0.2)

    def accuracy(model):
        return float((model.predict(x[held], batch_size=256, verbose=0).argmax(-1) == y[held]).mean())

    model = keras.models.load_model(model_path)
    exported = accuracy(model)
    norms = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    inputs = keras.Model(model.inputs, [l.input for l in norms]).predict(x[~held], batch_size=256, verbose=0)
    for layer, values in zip(norms, inputs if len(norms) > 1 else [inputs]):
        axes = tuple(range(values.ndim - 1))
        layer.moving_mean.assign(values.mean(axis=axes))
        layer.moving_variance.assign(values.var(axis=axes))
    fresh = accuracy(model)
    tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial()   # training's own statistics
    scores = {"exported": exported, "fresh": fresh, "checkpoint": accuracy(model), "held_out": int(held.sum())}
    print(json.dumps(scores))
""")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with emulated_fleet(tmp_path_factory.mktemp("fleet"), "t9o") as root:
        yield root


def test_a_job_on_digits_exports_a_model_that_scores_what_it_reports(fleet, tmp_path):
    from hetcluster.models import ModelSpec
    from hetcluster.models.digits import write_digits_npz
    from hetcluster.training.checkpoints import latest_checkpoint

    data = write_digits_npz(tmp_path / "digits.npz")
    model = ModelSpec("small_cnn", (32, 32, 1), 10, 32)
    profile = write_profile(fleet / "profile-digits.json", with_ghost=False, model=model)
    workdir = tmp_path / "job"
    command = [sys.executable, "-m", "hetcluster.cli.app", "train", "--inventory", str(fleet / "cluster.toml"),
               "--workdir", str(workdir), "--profile", str(profile), "--model", "small_cnn", "--input-shape", "32x32x1",
               "--classes", "10", "--batch-size", "32", "--total-steps", str(STEPS), "--data", str(data),
               "--eval-split", "0.2", "--require", "fast", "--allow-missing", "--report", str(workdir / "report.json"),
               "--export", str(tmp_path / "out" / "digits.keras"), "--plot-loss", str(tmp_path / "loss.png")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "grey images" not in done.stdout and "held-out accuracy" in done.stdout
    report = json.loads((workdir / "report.json").read_text())
    assert report["steps_total"] == STEPS
    assert report["model_path"] == str(tmp_path / "out" / "digits.keras")
    assert Path(report["weights_path"]).name == "digits.weights.h5" and Path(report["weights_path"]).exists()
    assert report["loss_curve"] and report["loss_curve"][-1]["last_step"] == STEPS
    assert report["loss_curve"][-1]["loss"] < report["loss_curve"][0]["loss"]
    assert (tmp_path / "loss.png").stat().st_size > 10_000
    checkpoint = latest_checkpoint(str(workdir / "checkpoints"))
    fresh = subprocess.run([sys.executable, "-c", FRESH, report["model_path"], str(data), checkpoint],
                           capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    scores = json.loads(fresh.stdout.strip().splitlines()[-1])
    print(f"held-out accuracy: reported {report['held_out']['accuracy']:.3f}, exported file {scores['exported']:.3f}, "
          f"statistics re-estimated {scores['fresh']:.3f}, training's own statistics {scores['checkpoint']:.3f} "
          f"(of {scores['held_out']})")
    assert scores["held_out"] == report["held_out"]["examples"]
    assert scores["exported"] == pytest.approx(report["held_out"]["accuracy"], abs=1e-6)
    assert scores["exported"] >= 0.95
    assert abs(scores["exported"] - scores["fresh"]) <= 0.01
