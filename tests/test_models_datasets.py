"""Dataset loaders on small files the tests write: synthetic, .npz, image folders, TFRecord."""

from __future__ import annotations

import numpy as np
import pytest

from hetcluster.errors import ConfigError
from hetcluster.models import ModelSpec
from hetcluster.models.datasets import DataSource

pytestmark = pytest.mark.tensorflow

SPEC = ModelSpec("small_cnn", (8, 8, 3), classes=3, batch_size=4)


def _batches(ds, n):
    return [(x.numpy(), y.numpy()) for x, y in ds.take(n)]


def _check_batch(x, y, spec=SPEC):
    assert x.shape == (spec.batch_size, *spec.input_shape) and x.dtype == np.float32
    assert y.shape == (spec.batch_size,) and y.dtype == np.int32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert 0 <= y.min() and y.max() < spec.classes


def _images(n, shape=(8, 8, 3), seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8), (np.arange(n) % 3).astype(np.int64)


def test_synthetic_is_deterministic_infinite_and_batched():
    from hetcluster.models.datasets import load_dataset

    a = _batches(load_dataset(DataSource(seed=7), SPEC), 3)
    b = _batches(load_dataset(DataSource(seed=7), SPEC), 3)
    c = _batches(load_dataset(DataSource(seed=8), SPEC), 1)
    for (xa, ya), (xb, yb) in zip(a, b):
        _check_batch(xa, ya)
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a[0][0], c[0][0])
    # far more batches than the random pool holds: the stream never ends
    assert len(_batches(load_dataset(DataSource(), SPEC), 200)) == 200


def test_npz_loader(tmp_path):
    from hetcluster.models.datasets import load_dataset

    x, y = _images(10)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    batches = _batches(load_dataset(DataSource("npz", str(tmp_path / "d.npz")), SPEC), 6)
    for xb, yb in batches:
        _check_batch(xb, yb)
    # every stored image comes back scaled to [0, 1]
    seen = {tuple(np.round(img.ravel()[:5] * 255).astype(int)) for xb, _ in batches for img in xb}
    assert seen <= {tuple(img.ravel()[:5].astype(int)) for img in x}


def test_npz_rejects_labels_beyond_classes(tmp_path):
    from hetcluster.models.datasets import load_dataset

    x, _ = _images(4)
    np.savez(tmp_path / "d.npz", x=x, y=np.array([0, 1, 2, 5]))
    with pytest.raises(ConfigError, match="--classes 6"):
        load_dataset(DataSource("npz", str(tmp_path / "d.npz")), SPEC)


def test_image_folder_loader_resizes_and_labels_by_folder(tmp_path):
    import tensorflow as tf

    from hetcluster.models.datasets import load_dataset

    for label, name in enumerate(["cat", "dog"]):
        (tmp_path / name).mkdir()
        for i in range(3):
            # constant images whose value encodes the class, at another size than the job's
            image = np.full((12, 10, 3), 40 + 150 * label, np.uint8)
            tf.io.write_file(str(tmp_path / name / f"{i}.png"), tf.io.encode_png(image))
    for xb, yb in _batches(load_dataset(DataSource("folder", str(tmp_path)), SPEC), 4):
        _check_batch(xb, yb)
        for img, label in zip(xb, yb):
            assert abs(img.mean() - (40 + 150 * label) / 255) < 0.02


@pytest.mark.parametrize("encoded", [True, False])
def test_tfrecord_loader(tmp_path, encoded):
    import tensorflow as tf

    from hetcluster.models.datasets import load_dataset

    x, y = _images(6)
    path = tmp_path / "d.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for img, label in zip(x, y):
            if encoded:
                image = tf.train.Feature(bytes_list=tf.train.BytesList(value=[tf.io.encode_png(img).numpy()]))
            else:
                image = tf.train.Feature(float_list=tf.train.FloatList(value=(img / 255.0).ravel().tolist()))
            label_f = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))
            example = tf.train.Example(features=tf.train.Features(feature={"image": image, "label": label_f}))
            writer.write(example.SerializeToString())
    batches = _batches(load_dataset(DataSource("tfrecord", str(path)), SPEC), 3)
    for xb, yb in batches:
        _check_batch(xb, yb)
        for img, label in zip(xb, yb):
            # each decoded image is one of the stored images with that label
            assert min(np.abs(img - xi / 255).max() for xi, yi in zip(x, y) if yi == label) < 1e-5


def test_dataset_fn_gives_pipelines_different_data():
    import tensorflow as tf

    from hetcluster.models.datasets import make_dataset_fn

    fn = make_dataset_fn(DataSource(seed=1), SPEC)
    first = [next(iter(fn(tf.distribute.InputContext(2, i, 1))))[0].numpy() for i in range(2)]
    assert not np.array_equal(first[0], first[1])
    assert next(iter(fn(None)))[0].shape == (4, 8, 8, 3)


def test_data_source_validation(tmp_path):
    with pytest.raises(ConfigError, match="kind"):
        DataSource("csv", str(tmp_path))
    with pytest.raises(ConfigError, match="needs a path"):
        DataSource("npz")
    with pytest.raises(ConfigError, match="does not exist"):
        DataSource("npz", str(tmp_path / "missing.npz"))
    assert DataSource.from_dict(DataSource("npz", str(tmp_path), 3).to_dict()) == DataSource("npz", str(tmp_path), 3)
    assert DataSource("image_folder", str(tmp_path)).kind == "folder"


def test_the_held_out_split_is_the_same_in_numpy_and_in_every_pipeline(tmp_path):
    """The examples a job keeps out of training are held_out_mask's, whether the pipeline is an
    .npz (split in NumPy), a folder (sorted files) or TFRecords (indices hashed in TF)."""
    import numpy as np
    import tensorflow as tf

    from hetcluster.models.datasets import DataSource, _select_part, evaluation_dataset, held_out_mask

    x = (np.arange(60) * 4).astype("uint8").reshape(60, 1, 1, 1).repeat(8, 1).repeat(8, 2)
    np.savez(tmp_path / "x.npz", x=x, y=np.arange(60) % 3)
    source = DataSource("npz", str(tmp_path / "x.npz"), holdout=0.2)
    mask = held_out_mask(500, 0.2)
    ds = tf.data.Dataset.range(500).map(lambda i: (i, i))
    assert [int(a) for a, _ in _select_part(ds, source.held_out())] == list(np.nonzero(mask)[0])
    assert [int(a) for a, _ in _select_part(ds, source)] == list(np.nonzero(~mask)[0])
    spec = ModelSpec("small_cnn", (8, 8, 1), 3, 4)
    held = np.concatenate([images[:, 0, 0, 0].numpy() for images, _ in evaluation_dataset(source.held_out(), spec)])
    assert np.allclose(held * 255, x[held_out_mask(60, 0.2), 0, 0, 0], atol=0.5)
