"""The job's output: the trained model as a file the user loads with one call, and its held-out score.

After the last step, the coordinator runs this in a fresh process (TensorFlow, no cluster):

    python -m hetcluster.training.export --job export.json --result result.json

It builds the job's model, restores the final checkpoint's weights, re-estimates every BatchNorm
layer's moving statistics for those weights, saves ``model.keras`` (``tf_keras.models.load_model``
loads it) and ``model.weights.h5`` atomically, and evaluates the model on the held-out data.

Why re-estimate: BatchNorm keeps an exponential average (momentum 0.99: about the last hundred
steps) of batch statistics computed under weights that kept moving, so at the end of a job the
stored statistics describe older weights ([decisions](../../docs/decisions.md#batchnorm-statistics)).
The fix is the population statistics of the final weights: a pass over training batches with the
weights fixed, each layer's statistics the plain mean over the batches ("precise BN").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetcluster.errors import HetclusterError, TrainingError
from hetcluster.fileio import write_atomic, write_json_atomic
from hetcluster.models.datasets import DataSource
from hetcluster.tfenv import prepare_tf_env
from hetcluster.training.spec import TrainSpec

log = logging.getLogger(__name__)

STATISTICS_BATCHES = 100   # batches of training data for BatchNorm's population statistics


@dataclass
class HeldOut:
    """The exported model on held-out data."""

    loss: float
    accuracy: float
    examples: int
    source: str


@dataclass
class ExportResult:
    model_path: str
    weights_path: str
    batchnorm_layers: int = 0
    statistics_examples: int = 0
    held_out: HeldOut | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ExportResult":
        held = data.get("held_out")
        return cls(**{**data, "held_out": HeldOut(**held) if held else None})


def reestimate_batchnorm(model: Any, batches: Any, max_batches: int = STATISTICS_BATCHES) -> tuple[int, int]:
    """Set every BatchNorm layer's moving statistics to the mean of its batch statistics over up to
    ``max_batches`` of ``batches`` (images, labels), the weights fixed; returns (layers, examples)."""
    import tf_keras as keras

    layers = [layer for layer in _all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]
    if not layers:
        return 0, 0
    momenta = [layer.momentum for layer in layers]
    examples = 0
    try:
        for k, (images, _labels) in enumerate(batches):
            if k >= max_batches:
                break
            for layer in layers:  # a cumulative mean: after batch k the average of batches 0..k
                layer.momentum = k / (k + 1.0)
            model(images, training=True)
            examples += int(images.shape[0])
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
    return len(layers), examples


def _all_layers(model: Any) -> list[Any]:
    found = []
    for layer in model.layers:
        found.append(layer)
        if hasattr(layer, "layers"):  # a nested model
            found += _all_layers(layer)
    return found


def evaluate(model: Any, dataset: Any) -> tuple[float, float, int]:
    """(mean loss, accuracy, examples) of ``model`` on a finite dataset of (images, labels)."""
    import tensorflow as tf

    total_loss, correct, count = 0.0, 0, 0
    for images, labels in dataset:
        logits = model(images, training=False)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32), logits=logits)
        total_loss += float(tf.reduce_sum(losses))
        correct += int(tf.reduce_sum(tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == tf.cast(labels, tf.int32),
                                             tf.int32)))
        count += int(labels.shape[0])
    if count == 0:
        raise TrainingError(
            "The held-out data holds no example.", hint="give --eval-data with examples, or a larger --eval-split."
        )
    return total_loss / count, correct / count, count


def weights_path_for(model_path: Path) -> Path:
    """``model.keras`` -> ``model.weights.h5``."""
    name = model_path.name[:-len(".keras")] if model_path.name.endswith(".keras") else model_path.name
    return model_path.with_name(f"{name}.weights.h5")


def export_model(spec: TrainSpec, checkpoint_path: str, model_path: Path,
                 eval_source: DataSource | None) -> ExportResult:
    """Restore ``checkpoint_path`` into the job's model, re-estimate its BatchNorm statistics on the
    job's training data, save it and its weights, and evaluate it on ``eval_source``."""
    import tensorflow as tf

    from hetcluster.models.datasets import evaluation_dataset, load_dataset
    from hetcluster.models.registry import build_from_spec

    model = build_from_spec(spec.model)
    status = tf.train.Checkpoint(model=model).restore(checkpoint_path)
    try:
        status.assert_existing_objects_matched()
    except AssertionError as error:
        raise TrainingError(f"Checkpoint {checkpoint_path} does not hold this job's model: {error}",
                            hint="export from the job's own checkpoint.") from error
    status.expect_partial()   # the optimizer's slots stay in the checkpoint
    layers, examples = reestimate_batchnorm(model, load_dataset(spec.data, spec.model))
    weights_path = weights_path_for(model_path)
    write_atomic(model_path, lambda tmp: model.save(str(tmp), overwrite=True), suffix=".keras")
    write_atomic(weights_path, lambda tmp: model.save_weights(str(tmp), overwrite=True), suffix=".weights.h5")
    result = ExportResult(str(model_path), str(weights_path), layers, examples)
    if eval_source is not None:
        loss, accuracy, count = evaluate(model, evaluation_dataset(eval_source, spec.model))
        result.held_out = HeldOut(loss, accuracy, count, eval_source.describe())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a trained hetcluster job's model.")
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("HETCLUSTER_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    prepare_tf_env()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")   # the model is small next to a job: keep GPUs for it
    try:
        job = json.loads(args.job.read_text(encoding="utf-8"))
        eval_source = DataSource.from_dict(job["eval_data"]) if job.get("eval_data") else None
        result = export_model(TrainSpec.from_dict(job["train"]), job["checkpoint_path"], Path(job["model_path"]),
                              eval_source)
        payload, code = result.to_dict(), 0
    except HetclusterError as error:
        payload, code = {"error": str(error)}, 2
    except Exception as error:  # noqa: BLE001 - reported to the parent in one line
        log.exception("export failed")
        payload, code = {"error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}, 2
    write_json_atomic(args.result, payload)
    sys.stdout.flush()
    os._exit(code)


def export_in_subprocess(spec: TrainSpec, checkpoint_path: str, model_path: Path, eval_source: DataSource | None,
                         timeout_s: float = 1800.0) -> ExportResult:
    """:func:`export_model` in a fresh process (TensorFlow stays out of the caller's)."""
    import subprocess

    from hetcluster.tfenv import tf_env
    from hetcluster.training.servers import log_file_tail

    with tempfile.TemporaryDirectory(prefix="hetcluster-export-") as tmp:
        job, result, log_path = Path(tmp) / "job.json", Path(tmp) / "result.json", Path(tmp) / "export.log"
        job.write_text(json.dumps({"train": spec.to_dict(), "checkpoint_path": checkpoint_path,
                                   "model_path": str(model_path),
                                   "eval_data": eval_source.to_dict() if eval_source else None}), encoding="utf-8")
        with open(log_path, "wb") as log_file:
            done = subprocess.run([sys.executable, "-m", "hetcluster.training.export", "--job", str(job),
                                   "--result", str(result)], stdout=log_file, stderr=subprocess.STDOUT,
                                  env=tf_env(TMPDIR=tmp), timeout=timeout_s)
        if not result.exists():
            raise TrainingError(f"Exporting the model failed (exit {done.returncode}): {log_file_tail(log_path, 600)}",
                                hint="the checkpoint is kept; see the job's workdir.")
        payload = json.loads(result.read_text(encoding="utf-8"))
    if "error" in payload:
        raise TrainingError(f"Exporting the model failed: {payload['error']}", hint="the checkpoint is kept.")
    return ExportResult.from_dict(payload)


if __name__ == "__main__":  # pragma: no cover
    main()
