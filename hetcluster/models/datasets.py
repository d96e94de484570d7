"""Training data for a job: synthetic by default, or small real data sets from files.

Every loader returns an *infinite*, batched ``tf.data.Dataset`` of ``(images float32 [B,H,W,C],
labels int32 [B])`` with images scaled to [0, 1] and resized to the job's input shape, so the
training engine can schedule any number of steps; ``evaluation_dataset`` gives the same examples
once each, in order, for held-out evaluation. ``make_dataset_fn`` wraps a source in the
``dataset_fn(input_context)`` form that ``strategy.distribute_datasets_from_function`` and
``ClusterCoordinator.create_per_worker_dataset`` expect.

A source may hold a share of its file out of training (``holdout``, the job's ``--eval-split``):
example ``i`` (in file order; sorted file order for folders) is held out when
``held_out_mask`` says so, a multiplicative hash of ``i + 1`` that spreads the held-out examples
evenly through the file, the same in NumPy (checks, counts) and in the TF pipelines.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from hetcluster.errors import ConfigError
from hetcluster.models.spec import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

log = logging.getLogger(__name__)

DATA_KINDS = ("synthetic", "folder", "npz", "tfrecord")
PARTS = ("train", "held_out")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
_HASH_MULTIPLIER = 2654435761  # Knuth's multiplicative hash: consecutive indices spread over [0, 2**32)
_KIND_ALIASES = {"image_folder": "folder", "images": "folder", "tfrecords": "tfrecord"}
_SYNTHETIC_POOL_BATCHES = 64  # at most this many distinct random batches before the stream repeats
_SYNTHETIC_POOL_BYTES = 32 * 2**20  # ... and at most this much image memory per worker


@dataclass(frozen=True)
class DataSource:
    """Where a job's data comes from: ``kind`` in DATA_KINDS, ``path`` for files (made absolute:
    the training processes run elsewhere); ``holdout`` the share of the file kept out of training,
    ``part`` which side of that split this source reads."""

    kind: str = "synthetic"
    path: str | None = None
    seed: int = 0
    holdout: float = 0.0
    part: str = "train"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _KIND_ALIASES.get(self.kind, self.kind))
        if self.kind not in DATA_KINDS:
            raise ConfigError(f"Unknown data kind {self.kind!r}.", hint=f"use one of {', '.join(DATA_KINDS)}.")
        if self.part not in PARTS:
            raise ConfigError(f"Unknown data part {self.part!r}.", hint=f"use one of {', '.join(PARTS)}.")
        if not 0.0 <= self.holdout < 1.0:
            raise ConfigError(f"Held-out share {self.holdout} is outside [0, 1).", hint="give --eval-split 0.2, say.")
        if self.kind != "synthetic":
            if not self.path:
                raise ConfigError(f"Data kind {self.kind} needs a path.", hint="pass --data PATH.")
            path = Path(self.path).expanduser().absolute()
            if not path.exists():
                raise ConfigError(f"Data path {path} does not exist.", hint="check --data.")
            object.__setattr__(self, "path", str(path))

    def held_out(self) -> "DataSource":
        """The examples this source keeps out of training."""
        return replace(self, part="held_out")

    def to_dict(self) -> dict:
        data: dict[str, Any] = {"kind": self.kind, "path": self.path, "seed": self.seed}
        if self.holdout:
            data.update(holdout=self.holdout, part=self.part)
        return data

    @classmethod
    def from_dict(cls, data: dict | None) -> "DataSource":
        data = data or {}
        return cls(kind=data.get("kind", "synthetic"), path=data.get("path"), seed=int(data.get("seed", 0)),
                   holdout=float(data.get("holdout", 0.0)), part=str(data.get("part", "train")))

    def describe(self) -> str:
        """How a table names it: "synthetic", or the file and the split's side."""
        if self.kind == "synthetic":
            return "synthetic"
        side = f" ({'held-out' if self.part == 'held_out' else 'training'} part, {self.holdout:.0%} held out)" \
            if self.holdout else ""
        return f"{self.path}{side}"


def held_out_mask(count: int, holdout: float) -> Any:
    """A boolean array: which of ``count`` examples (in file order) are held out."""
    import numpy as np

    hashed = ((np.arange(count, dtype=np.uint64) + np.uint64(1)) * np.uint64(_HASH_MULTIPLIER)) % np.uint64(2**32)
    return hashed < np.uint64(int(holdout * 2**32))


def _select_part(ds: "tf.data.Dataset", source: DataSource) -> "tf.data.Dataset":
    """The examples of ``source.part`` from a dataset in file order (held_out_mask, in TF)."""
    import tensorflow as tf

    if not source.holdout:
        return ds
    threshold = tf.constant(int(source.holdout * 2**32), tf.int64)
    keep_held_out = source.part == "held_out"

    def wanted(index: Any, _example: Any) -> Any:
        held = ((index + 1) * _HASH_MULTIPLIER) % (2**32) < threshold
        return held if keep_held_out else tf.logical_not(held)

    return ds.enumerate().filter(wanted).map(lambda _index, example: example)

def _finish(ds: "tf.data.Dataset", spec: ModelSpec, shuffle_seed: int, training: bool = True) -> "tf.data.Dataset":
    """Resize and scale; for training shuffle, repeat forever and batch (dropping the remainder),
    for evaluation batch every example once, in order."""
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
    if not training:
        return ds.batch(spec.batch_size).prefetch(tf.data.AUTOTUNE)
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


def read_npz(path: str | Path) -> tuple[Any, Any]:
    """Arrays ``x`` [N,H,W,C] (or [N,H,W]) and ``y`` [N] of a ``.npz`` file; ConfigError naming the
    file otherwise (data_check says what is wrong in more detail, before any server starts)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as archive:
            x, y = archive["x"], archive["y"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"Cannot read x and y from {path}: {exc}.",
                          hint="save with numpy.savez(path, x=images, y=labels).") from exc
    return (x[..., None] if x.ndim == 3 else x), y


def npz_dataset(source: DataSource, spec: ModelSpec, training: bool = True) -> "tf.data.Dataset":
    """Arrays ``x`` and ``y`` from a NumPy ``.npz`` file (the source's part of them)."""
    import tensorflow as tf

    x, y = read_npz(source.path)
    check_labels(y, spec.classes, source.path)
    if source.holdout:
        held = held_out_mask(len(x), source.holdout)
        chosen = held if source.part == "held_out" else ~held
        x, y = x[chosen], y[chosen]
    ds = tf.data.Dataset.from_tensor_slices((x, y.astype("int32")))
    return _finish(ds, spec, source.seed, training)


def check_labels(labels: Any, classes: int, where: str | None) -> None:
    """ConfigError unless every label is an integer in [0, classes)."""
    import numpy as np

    labels = np.asarray(labels)
    if labels.size == 0:
        return
    if not np.issubdtype(labels.dtype, np.integer):
        if not np.issubdtype(labels.dtype, np.floating) or not np.all(labels == np.round(labels)):
            raise ConfigError(f"{where}: labels are {labels.dtype}, not whole class numbers.",
                              hint="save y as integers 0..classes-1.")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        raise ConfigError(f"{where}: labels span {low}..{high}, outside 0..{classes - 1} for --classes {classes}.",
                          hint=f"use --classes {high + 1}." if low >= 0 else "labels are class numbers from 0.")


def folder_files(path: str | Path) -> tuple[list[str], list[int], list[str]]:
    """(image files, their class indices, class names) of a class-per-subfolder folder, sorted:
    the class index is the sorted sub-folder order, as tf_keras' directory loader numbers them."""
    root = Path(path)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files, labels = [], []
    for index, name in enumerate(classes):
        for file in sorted((root / name).rglob("*")):
            if file.suffix.lower() in IMAGE_SUFFIXES and file.is_file():
                files.append(str(file))
                labels.append(index)
    return files, labels, classes


def folder_dataset(source: DataSource, spec: ModelSpec, training: bool = True) -> "tf.data.Dataset":
    """Images in class-per-subfolder layout (the source's part of them)."""
    import numpy as np
    import tensorflow as tf

    files, labels, _classes = folder_files(source.path)
    if source.holdout:
        held = held_out_mask(len(files), source.holdout)
        chosen = held if source.part == "held_out" else ~held
        files, labels = list(np.asarray(files)[chosen]), list(np.asarray(labels)[chosen])
    channels = spec.input_shape[2]

    def decode(file: Any, label: Any) -> tuple[Any, Any]:
        image = tf.io.decode_image(tf.io.read_file(file), channels=channels if channels in (1, 3, 4) else 0,
                                   expand_animations=False)
        return image, label

    ds = tf.data.Dataset.from_tensor_slices((files, np.asarray(labels, dtype="int32"))).map(
        decode, num_parallel_calls=tf.data.AUTOTUNE)
    return _finish(ds, spec, source.seed, training)


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


def tfrecord_dataset(source: DataSource, spec: ModelSpec, training: bool = True,
                     encoded: bool | None = None) -> "tf.data.Dataset":
    """``tf.train.Example`` records (features ``image`` and ``label``); the source's path is a file
    or folder. ``encoded`` says whether ``image`` holds PNG/JPEG bytes; None sniffs the first
    record, which needs eager mode (pass it explicitly when building inside a ``tf.function``)."""
    import tensorflow as tf

    path = source.path
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

    ds = _select_part(tf.data.TFRecordDataset(files), source).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    return _finish(ds, spec, source.seed, training)


_LOADERS: dict[str, Callable[..., Any]] = {"npz": npz_dataset, "folder": folder_dataset, "tfrecord": tfrecord_dataset}


def load_dataset(source: DataSource, spec: ModelSpec) -> "tf.data.Dataset":
    """The infinite batched dataset of ``source`` for ``spec``."""
    if source.kind == "synthetic":
        return synthetic_dataset(spec, source.seed)
    return _LOADERS[source.kind](source, spec)


def evaluation_dataset(source: DataSource, spec: ModelSpec) -> "tf.data.Dataset":
    """Every example of ``source`` (of its part) once, in file order, batched: held-out evaluation."""
    if source.kind == "synthetic":
        raise ConfigError("Synthetic data has no held-out examples.", hint="evaluate on --eval-data or --eval-split.")
    return _LOADERS[source.kind](source, spec, training=False)


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
            ds = tfrecord_dataset(source, spec, encoded=encoded)
        else:
            ds = load_dataset(source, spec)
        return ds.shard(pipelines, pipeline_id) if pipelines > 1 else ds

    return dataset_fn
