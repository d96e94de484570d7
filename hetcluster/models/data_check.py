"""A job's data checked up front, in the CLI's process, before any server starts.

Whatever is wrong with a data file shows as one line naming the file, within seconds, instead of
as a device failure minutes into pre-training: the file is readable and of its kind, the labels
are class numbers within ``--classes``, the images are NHWC (channels-first is named, with the
fix), their channels can become the model's (grey and colour convert; anything else is an
error). What the pipelines will convert (size, channels) comes back as one line each, so nothing
happens silently. NumPy and Pillow for .npz files and image folders; TensorFlow (imported here)
only for .tfrecord files, whose records need its parser.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from hetcluster.errors import ConfigError
from hetcluster.models.datasets import (
    DataSource,
    check_labels,
    folder_files,
    held_out_mask,
    read_npz,
    tfrecord_image_is_encoded,
)
from hetcluster.models.spec import ModelSpec

CHANNEL_COUNTS = (1, 3, 4)
_CONVERTIBLE = {(1, 3), (1, 4), (3, 1), (4, 1), (4, 3)}
_FOLDER_SAMPLE = 64   # images whose header is read: a folder's images may be many
_RECORD_SAMPLE = 10000


@dataclass(frozen=True)
class DataSummary:
    """What a data source holds, as the job will read it."""

    examples: int
    held_out: int
    shape: tuple[int, ...]          # (H, W, C) of the images (of the first ones read, for a folder)
    notes: list[str] = field(default_factory=list)   # conversions the pipeline makes, one line each

    @property
    def training(self) -> int:
        return self.examples - self.held_out


def check_data(source: DataSource, spec: ModelSpec, what: str = "--data") -> DataSummary | None:
    """Check ``source`` against the job's model; None for synthetic data. Raises ConfigError."""
    if source.kind == "synthetic":
        return None
    checker = {"npz": _check_npz, "folder": _check_folder, "tfrecord": _check_tfrecord}[source.kind]
    summary = checker(Path(source.path), spec, what)
    held_out = int(held_out_mask(summary.examples, source.holdout).sum()) if source.holdout else 0
    summary = DataSummary(summary.examples, held_out, summary.shape, summary.notes)
    if summary.training < 1 and source.part == "train":
        raise ConfigError(f"{what} {source.path}: no example is left to train on.", hint="lower --eval-split.")
    if source.holdout and held_out < 1:
        raise ConfigError(f"{what} {source.path}: {summary.examples} examples leave none held out at "
                          f"--eval-split {source.holdout}.", hint="raise --eval-split, or give --eval-data.")
    return summary


def _conversions(path: Path, what: str, shape: tuple[int, ...], spec: ModelSpec) -> list[str]:
    """One line for each conversion from images of ``shape`` (H, W, C) to the model's input; a
    ConfigError for channels that do not convert."""
    height, width, channels = shape
    want_h, want_w, want_c = spec.input_shape
    notes = []
    if channels != want_c:
        if (channels, want_c) not in _CONVERTIBLE:
            raise ConfigError(f"{what} {path}: images have {channels} channels, the model takes {want_c}.",
                              hint=f"give images of {want_c} channels, or --input-shape {want_h}x{want_w}x{channels}.")
        if want_c == 1:
            notes.append(f"{what}: images of {channels} channels are made grey for the model")
        elif channels == 1:
            notes.append(f"{what}: grey images are replicated to {want_c} channels for the model")
        else:
            notes.append(f"{what}: images of {channels} channels are cut to {want_c} for the model")
    if (height, width) != (want_h, want_w):
        notes.append(f"{what}: images of {height}x{width} are resized to {want_h}x{want_w} for the model")
    return notes


def _check_npz(path: Path, spec: ModelSpec, what: str) -> DataSummary:
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{what} {path} is not a NumPy .npz archive (not a zip file: corrupt or another format).",
                          hint="save it with numpy.savez(path, x=images, y=labels).")
    try:
        x, y = read_npz(path)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - a damaged member: any error numpy raises
        raise ConfigError(f"{what} {path} cannot be read as a .npz archive: {type(error).__name__}.",
                          hint="save it again with numpy.savez(path, x=images, y=labels).") from None
    if x.dtype == object or y.dtype == object:
        raise ConfigError(f"{what} {path}: x or y holds Python objects, not numbers.",
                          hint="save numeric arrays: numpy.savez(path, x=np.asarray(images), y=np.asarray(labels)).")
    if x.ndim != 4:
        raise ConfigError(f"{what} {path}: x has shape {x.shape}; a job needs images [N, H, W, C].",
                          hint="save x as [N, H, W, C] (or [N, H, W] for grey).")
    if y.ndim != 1 or len(y) != len(x) or len(x) == 0:
        raise ConfigError(f"{what} {path}: x has {len(x)} images and y the shape {y.shape}; need one label each.",
                          hint="save y as [N] class numbers.")
    if x.shape[1] in CHANNEL_COUNTS and x.shape[3] not in CHANNEL_COUNTS:
        raise ConfigError(f"{what} {path}: x is channels-first, {tuple(x.shape)} (N, C, H, W); a job reads "
                          f"[N, H, W, C].", hint="save x.transpose(0, 2, 3, 1).")
    if x.shape[3] not in CHANNEL_COUNTS:
        raise ConfigError(f"{what} {path}: images have {x.shape[3]} channels; a job reads 1 (grey), 3 (RGB) or 4.",
                          hint="save x as [N, H, W, C] with C 1 or 3.")
    check_labels(y, spec.classes, f"{what} {path}")
    shape = tuple(int(s) for s in x.shape[1:])
    notes = _conversions(path, what, shape, spec)
    if x.dtype.kind == "f" and x.size and (float(x.min()) < 0.0 or float(x.max()) > 1.0):
        raise ConfigError(f"{what} {path}: float images span {float(x.min()):g}..{float(x.max()):g}; a job reads "
                          "floats in [0, 1] (or uint8 0..255).", hint="save x / 255 or x as uint8.")
    return DataSummary(len(x), 0, shape, notes)


def _check_folder(path: Path, spec: ModelSpec, what: str) -> DataSummary:
    from PIL import Image, UnidentifiedImageError

    files, labels, classes = folder_files(path)
    if not classes:
        raise ConfigError(f"{what} {path} has no sub-folders; an image folder holds one sub-folder per class.",
                          hint="put each class's images in a sub-folder named after it.")
    if not files:
        raise ConfigError(f"{what} {path}: its sub-folders hold no .png, .jpg, .bmp or .gif image.",
                          hint="put the images in one sub-folder per class.")
    if len(classes) > spec.classes:
        raise ConfigError(f"{what} {path} has {len(classes)} classes (sub-folders) but --classes is {spec.classes}.",
                          hint=f"use --classes {len(classes)}.")
    shapes = set()
    step = max(1, len(files) // _FOLDER_SAMPLE)
    for file in files[::step]:
        try:
            with Image.open(file) as image:
                bands = len(image.getbands())
                shapes.add((image.height, image.width, 1 if bands in (1, 2) and image.mode in ("L", "LA", "I", "F")
                            else min(bands, 4)))
        except (OSError, UnidentifiedImageError) as error:
            raise ConfigError(
                f"{what}: {file} is not a readable image ({error}).", hint="remove or replace it."
            ) from None
    first = sorted(shapes)[0]
    notes = []
    for shape in sorted(shapes):
        notes += [n for n in _conversions(path, what, shape, spec) if n not in notes]
    return DataSummary(len(files), 0, first, notes)


def _check_tfrecord(path: Path, spec: ModelSpec, what: str) -> DataSummary:
    import numpy as np
    import tensorflow as tf

    from hetcluster.models.datasets import _tfrecord_files

    files = _tfrecord_files(path)
    encoded = tfrecord_image_is_encoded(path)
    labels, count, shape = [], 0, None
    try:
        for record in tf.data.TFRecordDataset(files):
            example = tf.train.Example.FromString(record.numpy())
            feature = example.features.feature
            if "label" not in feature or "image" not in feature:
                raise ConfigError(f"{what} {path}: a record lacks 'image' or 'label'.",
                                  hint="see docs/training.md for the TFRecord layout.")
            if count < _RECORD_SAMPLE:
                labels.append(int(feature["label"].int64_list.value[0]) if feature["label"].int64_list.value else -1)
            if shape is None and encoded:
                shape = tuple(int(s) for s in tf.io.decode_image(feature["image"].bytes_list.value[0],
                                                                 expand_animations=False).shape)
            count += 1
    except tf.errors.DataLossError as error:
        raise ConfigError(f"{what} {path} is not a readable TFRecord file ({error.message.splitlines()[0]}).",
                          hint="write it again with tf.io.TFRecordWriter.") from None
    if count == 0:
        raise ConfigError(f"{what} {path} holds no records.", hint="write at least one tf.train.Example.")
    check_labels(np.asarray(labels), spec.classes, f"{what} {path}")
    shape = shape or tuple(spec.input_shape)
    return DataSummary(count, 0, shape, _conversions(path, what, shape, spec) if encoded else [])


def check_job_data(source: DataSource, eval_source: DataSource | None, spec: ModelSpec) -> list[str]:
    """Check the training data and the held-out data of a job; the lines to show the user."""
    lines = []
    summary = check_data(source, spec)
    if summary is not None:
        lines += summary.notes
        if source.holdout:
            lines.append(f"--data: {summary.training} examples to train on, {summary.held_out} held out")
    if eval_source is not None and eval_source.path != source.path:
        held = check_data(eval_source, spec, "--eval-data")
        if held is not None:
            lines += [n for n in held.notes if n.split(": ", 1)[1] not in {m.split(": ", 1)[1] for m in lines}]
    return lines
