"""Training data for a job: synthetic by default, or small real data sets from files.

Every loader returns an *infinite*, batched ``tf.data.Dataset`` of ``(images float32 [B,H,W,C],
labels int32 [B])`` with images scaled to [0, 1] and resized to the job's input shape, so the
training engine can schedule any number of steps. ``make_dataset_fn`` wraps a source in the
``dataset_fn(input_context)`` form that ``strategy.distribute_datasets_from_function`` and
``ClusterCoordinator.create_per_worker_dataset`` expect.

File formats (``DataSource.kind``):

* ``synthetic`` - random images and labels from a fixed seed (deterministic).
* ``folder``    - one sub-folder per class with PNG/JPEG/BMP/GIF files (class index = sorted
  sub-folder order, as ``tf_keras.utils.image_dataset_from_directory`` does).
* ``npz``       - a NumPy archive with arrays ``x`` [N,H,W,C] (uint8 0..255 or float 0..1) and
  ``y`` [N] integer labels.
* ``tfrecord``  - ``tf.train.Example`` records with feature ``label`` (int64) and ``image``,
  either a ``bytes`` feature holding encoded PNG/JPEG, or a ``float`` list of H*W*C raw values in
  [0, 1] in the job's input shape.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from hetcluster.errors import ConfigError
from hetcluster.models.spec import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger(__name__)

DATA_KINDS = ("synthetic", "folder", "npz", "tfrecord")
_KIND_ALIASES = {"image_folder": "folder", "images": "folder", "tfrecords": "tfrecord"}
_SYNTHETIC_POOL_BATCHES = 64  # at most this many distinct random batches before the stream repeats
_SYNTHETIC_POOL_BYTES = 32 * 2**20  # ... and at most this much image memory per worker


@dataclass(frozen=True)
class DataSource:
    """Where a job's training data comes from: ``kind`` in DATA_KINDS, ``path`` for files."""

    kind: str = "synthetic"
    path: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _KIND_ALIASES.get(self.kind, self.kind))
        if self.kind not in DATA_KINDS:
            raise ConfigError(f"Unknown data kind {self.kind!r}.", hint=f"use one of {', '.join(DATA_KINDS)}.")
        if self.kind != "synthetic":
            if not self.path:
                raise ConfigError(f"Data kind {self.kind} needs a path.", hint="pass --data PATH.")
            if not Path(self.path).exists():
                raise ConfigError(f"Data path {self.path} does not exist.", hint="check --data.")

    def to_dict(self) -> dict:
        return {"kind": self.kind, "path": self.path, "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict | None) -> "DataSource":
        data = data or {}
        return cls(kind=data.get("kind", "synthetic"), path=data.get("path"), seed=int(data.get("seed", 0)))


def _finish(ds: "tf.data.Dataset", spec: ModelSpec, shuffle_seed: int, shuffle: bool = True) -> "tf.data.Dataset":
    """Resize, scale, shuffle, repeat forever and batch (dropping the remainder)."""
    import tensorflow as tf

    height, width, channels = spec.input_shape

    def prepare(image: Any, label: Any) -> tuple[Any, Any]:
        image = tf.convert_to_tensor(image)
        if image.dtype == tf.uint8:
            image = tf.cast(image, tf.float32) / 255.0
        image = tf.cast(image, tf.float32)
        image = _match_channels(image, channels)
        image = tf.image.resize(image, (height, width))
        image.set_shape((height, width, channels))
        return image, tf.cast(label, tf.int32)

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    if shuffle:
        ds = ds.shuffle(1024, seed=shuffle_seed, reshuffle_each_iteration=True)
    return ds.repeat().batch(spec.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _match_channels(image: Any, channels: int) -> Any:
    """Turn grey into RGB or RGB into grey when the files disagree with the job's channels."""
    import tensorflow as tf

    have = image.shape[-1]
    if have == channels or have is None:
        return image
    if have == 1:
        return tf.repeat(image, channels, axis=-1)
    if channels == 1 and have in (3, 4):
        return tf.image.rgb_to_grayscale(image[..., :3])
    if have == 4 and channels == 3:
        return image[..., :3]
    raise ConfigError(f"Images have {have} channels, the job expects {channels}.", hint="fix --input-shape.")


def synthetic_dataset(spec: ModelSpec, seed: int = 0) -> "tf.data.Dataset":
    """Random images in [0, 1] and labels, deterministic in ``seed``; infinite and batched."""
    import tensorflow as tf

    batch = spec.batch_size
    batch_bytes = 4 * batch * spec.input_shape[0] * spec.input_shape[1] * spec.input_shape[2]
    pool = max(1, min(_SYNTHETIC_POOL_BATCHES, _SYNTHETIC_POOL_BYTES // batch_bytes)) * batch
    images = tf.random.stateless_uniform((pool, *spec.input_shape), seed=(seed, 1))
    labels = tf.random.stateless_uniform((pool,), seed=(seed, 2), maxval=spec.classes, dtype=tf.int32)
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def npz_dataset(path: str | Path, spec: ModelSpec, seed: int = 0) -> "tf.data.Dataset":
    """Arrays ``x`` and ``y`` from a NumPy ``.npz`` file."""
    import numpy as np
    import tensorflow as tf

    try:
        with np.load(path, allow_pickle=False) as archive:
            x, y = archive["x"], archive["y"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"Cannot read x and y from {path}: {exc}.",
                          hint="save with numpy.savez(path, x=images, y=labels).") from exc
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or len(x) != len(y) or len(x) == 0:
        raise ConfigError(f"{path}: x has shape {x.shape}, y {y.shape}; need x [N,H,W,C] and y [N].",
                          hint="save matching arrays x and y.")
    _check_labels(y, spec, str(path))
    ds = tf.data.Dataset.from_tensor_slices((x, y.astype("int32")))
    return _finish(ds, spec, seed)


def _check_labels(labels: Any, spec: ModelSpec, where: str) -> None:
    import numpy as np

    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= spec.classes):
        raise ConfigError(f"{where}: labels span {labels.min()}..{labels.max()} but classes={spec.classes}.",
                          hint=f"use --classes {int(labels.max()) + 1}.")


def folder_dataset(path: str | Path, spec: ModelSpec, seed: int = 0) -> "tf.data.Dataset":
    """Images in class-per-subfolder layout, read with tf_keras' own directory loader."""
    import tf_keras as keras

    height, width, channels = spec.input_shape
    color_mode = {1: "grayscale", 3: "rgb", 4: "rgba"}.get(channels)
    if color_mode is None:
        raise ConfigError(f"Image folders need 1, 3 or 4 channels, not {channels}.", hint="fix --input-shape.")
    try:
        ds = keras.utils.image_dataset_from_directory(
            str(path), labels="inferred", label_mode="int", color_mode=color_mode, batch_size=None,
            image_size=(height, width), shuffle=True, seed=seed)
    except ValueError as exc:
        raise ConfigError(f"Cannot read images from {path}: {exc}",
                          hint="put images in one sub-folder per class.") from exc
    if len(ds.class_names) > spec.classes:
        raise ConfigError(f"{path} has {len(ds.class_names)} classes but classes={spec.classes}.",
                          hint=f"use --classes {len(ds.class_names)}.")
    ds = ds.map(lambda image, label: (image / 255.0, label))
    return _finish(ds, spec, seed)


def _tfrecord_files(path: str | Path) -> list[str]:
    source = Path(path)
    files = sorted(str(p) for p in source.glob("*.tfrecord*")) if source.is_dir() else [str(source)]
    if not files:
        raise ConfigError(f"No *.tfrecord files in {path}.", hint="point --data at a .tfrecord file.")
    return files


def tfrecord_image_is_encoded(path: str | Path) -> bool:
    """Whether the records' ``image`` feature holds encoded bytes (else raw floats); reads eagerly."""
    import tensorflow as tf

    files = _tfrecord_files(path)
    first = next(iter(tf.data.TFRecordDataset(files[:1]).take(1)), None)
    if first is None:
        raise ConfigError(f"{files[0]} holds no records.", hint="write at least one tf.train.Example.")
    example = tf.train.Example.FromString(first.numpy())
    if "image" not in example.features.feature or "label" not in example.features.feature:
        raise ConfigError(f"{files[0]}: records need features 'image' and 'label'.",
                          hint="see docs/training.md for the TFRecord layout.")
    return example.features.feature["image"].WhichOneof("kind") == "bytes_list"


def tfrecord_dataset(path: str | Path, spec: ModelSpec, seed: int = 0,
                     encoded: bool | None = None) -> "tf.data.Dataset":
    """``tf.train.Example`` records (features ``image`` and ``label``); ``path`` is a file or folder.

    ``encoded`` says whether ``image`` holds PNG/JPEG bytes; None sniffs the first record, which
    needs eager mode (pass it explicitly when building inside a ``tf.function``).
    """
    import tensorflow as tf

    files = _tfrecord_files(path)
    height, width, channels = spec.input_shape
    raw_len = height * width * channels
    features = {"image": tf.io.VarLenFeature(tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    raw_features = {"image": tf.io.VarLenFeature(tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)}
    if encoded is None:
        encoded = tfrecord_image_is_encoded(path)

    def parse(record: Any) -> tuple[Any, Any]:
        if encoded:
            parsed = tf.io.parse_single_example(record, features)
            image = tf.io.decode_image(parsed["image"].values[0], channels=channels, expand_animations=False)
        else:
            parsed = tf.io.parse_single_example(record, raw_features)
            image = tf.reshape(tf.sparse.to_dense(parsed["image"])[:raw_len], (height, width, channels))
        return image, parsed["label"]

    ds = tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return _finish(ds, spec, seed)


def load_dataset(source: DataSource, spec: ModelSpec) -> "tf.data.Dataset":
    """The infinite batched dataset of ``source`` for ``spec``."""
    if source.kind == "synthetic":
        return synthetic_dataset(spec, source.seed)
    loader: Callable[..., Any] = {"npz": npz_dataset, "folder": folder_dataset, "tfrecord": tfrecord_dataset}[
        source.kind]
    return loader(source.path, spec, source.seed)


def make_dataset_fn(source: DataSource, spec: ModelSpec) -> Callable[[Any], "tf.data.Dataset"]:
    """A ``dataset_fn(input_context)`` for ``distribute_datasets_from_function``.

    The per-replica batch size is ``spec.batch_size`` (one replica per worker under
    ParameterServerStrategy). When the context has several input pipelines, file data is sharded
    per pipeline; synthetic data instead gets a different seed per pipeline.
    """

    encoded = tfrecord_image_is_encoded(source.path) if source.kind == "tfrecord" else None

    def dataset_fn(input_context: Any = None) -> "tf.data.Dataset":
        pipelines = getattr(input_context, "num_input_pipelines", 1) or 1
        pipeline_id = getattr(input_context, "input_pipeline_id", 0) or 0
        if source.kind == "synthetic":
            return synthetic_dataset(spec, source.seed + pipeline_id)
        if source.kind == "tfrecord":
            ds = tfrecord_dataset(source.path, spec, source.seed, encoded=encoded)
        else:
            ds = load_dataset(source, spec)
        return ds.shard(pipelines, pipeline_id) if pipelines > 1 else ds

    return dataset_fn
