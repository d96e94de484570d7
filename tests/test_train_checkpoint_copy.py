"""copy_checkpoint copies one named checkpoint (not its folder's latest) and indexes it."""

import pytest

from hetcluster.errors import TrainingError
from hetcluster.training.checkpoints import checkpoint_steps
from hetcluster.training.coordinator import copy_checkpoint


def _fake_checkpoint(folder, steps):
    for suffix in (".index", ".data-00000-of-00001"):
        (folder / f"ckpt-{steps}{suffix}").write_bytes(b"x" * steps)


def test_copies_the_named_checkpoint_even_when_a_later_one_exists(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    _fake_checkpoint(source, 20)
    _fake_checkpoint(source, 400)  # training went on in the same folder
    (source / "checkpoint").write_text('model_checkpoint_path: "ckpt-400"\n')
    target = copy_checkpoint(str(source / "ckpt-20"), tmp_path / "copy")
    assert sorted(p.name for p in target.iterdir()) == ["checkpoint", "ckpt-20.data-00000-of-00001", "ckpt-20.index"]
    assert checkpoint_steps(target) == 20


def test_missing_checkpoint_is_an_error_and_none_gives_an_empty_folder(tmp_path):
    with pytest.raises(TrainingError, match="gone"):
        copy_checkpoint(str(tmp_path / "ckpt-5"), tmp_path / "a")
    empty = copy_checkpoint(None, tmp_path / "b")
    assert list(empty.iterdir()) == [] and checkpoint_steps(empty) == 0
