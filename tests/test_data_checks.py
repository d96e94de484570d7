"""A job's data is checked up front: every mistake is one line naming the file, exit 2, before any
agent is asked anything (the inventory's only device has no agent: reaching it would fail otherwise)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetcluster.agent.credentials import generate_credentials
from hetcluster.errors import ConfigError
from hetcluster.models.data_check import check_data
from hetcluster.models.datasets import DataSource, held_out_mask
from hetcluster.models.spec import ModelSpec
from hetcluster.training.servers import free_address
from hetcluster.training.spec import Training


@pytest.fixture(scope="module")
def ghost_inventory(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ghost")
    generate_credentials(folder / "creds")
    path = folder / "cluster.toml"
    path.write_text(f'[cluster]\nname = "g"\nnetwork = "loopback"\n\n[[devices]]\nname = "ghost"\n'
                    f'address = "{free_address("127.0.0.1")}"\ntoken_file = "creds/token"\nca_file = "creds/ca.crt"\n'
                    f'cert_file = "creds/client.crt"\nkey_file = "creds/client.key"\n')
    return path


def train(inventory: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "hetcluster.cli.app", "train", "--inventory", str(inventory), "--workdir",
               str(cwd / "job"), "--total-steps", "100", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "Unreachable" not in lines[0] and "ghost" not in lines[0]   # no agent was asked
    return lines[0]


def npz(path: Path, x: np.ndarray, y: np.ndarray) -> Path:
    np.savez(path, x=x, y=y)
    return path


def raw(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def images(n: int = 40, shape: tuple[int, ...] = (8, 8, 1)) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (n, *shape), dtype=np.uint8)


def labels(n: int = 40, classes: int = 10) -> np.ndarray:
    return np.arange(n) % classes


def test_a_relative_data_path_that_is_not_there_is_named_absolute(ghost_inventory, tmp_path):
    line = one_line_error(train(ghost_inventory, tmp_path, "--data", "data/missing.npz"))
    assert f"{tmp_path}/data/missing.npz does not exist" in line


def test_a_relative_path_travels_absolute(tmp_path, monkeypatch):
    from hetcluster.cli.job_options import data_source

    npz(tmp_path / "ok.npz", images(), labels())
    monkeypatch.chdir(tmp_path)
    assert data_source(Path("ok.npz")).path == str(tmp_path / "ok.npz")


@pytest.mark.parametrize(
    "write, args, says",
    [
        (
            lambda p: npz(p, images(), np.arange(40) % 13),
            (),
            "labels span 0..12, outside 0..9 for --classes 10. To fix: use --classes 13.",
        ),
        (lambda p: npz(p, images(shape=(1, 8, 8)), labels()), (), "x is channels-first, (40, 1, 8, 8) (N, C, H, W)"),
        (lambda p: raw(p, b"PK\x03\x04 not really a zip" * 10), (), "is not a NumPy .npz archive"),
        (lambda p: raw(p, np.random.default_rng(1).bytes(4096)), (), "is not a NumPy .npz archive"),
        (lambda p: npz(p, images(shape=(8, 8, 2)), labels()), (), "images have 2 channels"),
        (
            lambda p: npz(p, images(shape=(8, 8, 3)), labels()),
            ("--input-shape", "32x32x4"),
            "images have 3 channels, the model takes 4",
        ),
        (lambda p: npz(p, images(), labels()), ("--eval-split", "1.5"), "--eval-split 1.5 is not a share"),
        (
            lambda p: npz(p, images(), labels()),
            ("--eval-split", "0.2", "--eval-data", "{p}"),
            "both name held-out data",
        ),
    ],
)
def test_each_data_mistake_is_one_line_and_exit_2(ghost_inventory, tmp_path, write, args, says):
    path = write(tmp_path / "data.npz")
    line = one_line_error(train(ghost_inventory, tmp_path, "--data", str(path), *(a.format(p=path) for a in args)))
    assert says in line
    assert "allow_pickle" not in line


def test_a_keras3_model_config_gets_its_own_message(ghost_inventory, tmp_path):
    config = {"module": "keras.src.models.functional", "class_name": "Functional", "registered_name": "Functional",
              "config": {"name": "net", "layers": [{"class_name": "InputLayer", "config": {
                  "batch_shape": [None, 8, 8, 1], "dtype": {"module": "keras", "class_name": "DTypePolicy"}}}]}}
    (tmp_path / "net.json").write_text(json.dumps(config))
    line = one_line_error(train(ghost_inventory, tmp_path, "--model-config", str(tmp_path / "net.json")))
    assert "saved with Keras 3" in line and "tf_keras" in line


def test_a_profile_made_on_other_data_or_optimizer_is_refused(ghost_inventory, tmp_path):
    from train_fleet import write_profile

    digits = npz(tmp_path / "digits.npz", images(shape=(16, 16, 3)), labels(classes=4))
    profile_path = write_profile(tmp_path / "profile.json", with_ghost=False)
    profile = json.loads(profile_path.read_text())
    profile["training"] = Training(DataSource("npz", str(digits)), optimizer="sgd", learning_rate=0.01).recorded()
    profile_path.write_text(json.dumps(profile))
    job = ("--model", "small_cnn", "--input-shape", "16x16x3", "--classes", "4", "--batch-size", "8", "--profile",
           str(profile_path))
    line = one_line_error(train(ghost_inventory, tmp_path, *job))   # no --data: synthetic
    assert f"was made with data {digits}, not synthetic" in line
    line = one_line_error(train(ghost_inventory, tmp_path, *job, "--data", str(digits), "--optimizer", "adam"))
    assert "was made with --optimizer sgd, not adam" in line
    line = one_line_error(train(ghost_inventory, tmp_path, *job, "--data", str(digits), "--learning-rate", "0.1"))
    assert "was made with --learning-rate 0.01, not 0.1" in line


def test_conversions_are_stated_and_the_split_is_the_same_in_numpy_and_counts(tmp_path):
    path = npz(tmp_path / "d.npz", images(100, (8, 8, 1)), labels(100))
    summary = check_data(DataSource("npz", str(path), holdout=0.2), ModelSpec("small_cnn", (32, 32, 3), 10, 8))
    assert summary.examples == 100 and summary.held_out == int(held_out_mask(100, 0.2).sum())
    assert 15 <= summary.held_out <= 25
    assert any("grey images are replicated to 3 channels" in n for n in summary.notes)
    assert any("images of 8x8 are resized to 32x32" in n for n in summary.notes)
    mask = held_out_mask(1000, 0.2)
    assert abs(mask.mean() - 0.2) < 0.01 and not (held_out_mask(1000, 0.2) ^ mask).any()   # the same every time
    with pytest.raises(ConfigError, match="none held out"):
        check_data(DataSource("npz", str(npz(tmp_path / "tiny.npz", images(2), labels(2))), holdout=0.01),
                   ModelSpec("small_cnn", (32, 32, 1), 10, 8))
