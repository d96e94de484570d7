"""run_in_subprocess: with ready=..., the training process starts first and imports TensorFlow while the
launch waits for the servers; when the wait fails, that process ends without training and the
launch's error is what the caller sees; a training process that ends without a result is
reported in one line with its log's tail, and one that crashes in one line with its error's last line."""

from __future__ import annotations

import sys

import psutil
import pytest

from hetcluster.errors import TrainingError
from hetcluster.models.spec import ModelSpec
from hetcluster.training.launch import DeviceLaunchError
from hetcluster.training.run_job import run_in_subprocess
from hetcluster.training.servers import free_addresses
from hetcluster.training.spec import ClusterAddresses, TrainSpec


@pytest.mark.tensorflow  # the child imports TensorFlow before it reads the go line
def test_a_failed_wait_for_the_servers_ends_the_waiting_training_process(tmp_path):
    spec = TrainSpec(model=ModelSpec("small_cnn", (16, 16, 3), 4, 8), total_steps=10)
    worker, ps, chief = free_addresses(3)
    cluster = ClusterAddresses(workers={"a": worker}, ps=[ps], chief=chief)
    children = []

    def ready() -> None:
        children.extend((c, c.cmdline()) for c in psutil.Process().children()
                        if "hetcluster.training.run_job" in c.cmdline())
        raise DeviceLaunchError("a", "The worker on a exited (failed): port in use")

    with pytest.raises(DeviceLaunchError, match="worker on a exited"):
        run_in_subprocess(spec, cluster, ready=ready, log_path=tmp_path / "run.log")
    # the process was already running when the wait began, and it is gone (reaped) now
    [(child, cmdline)] = children
    assert "--wait-for-go" in cmdline
    assert not child.is_running()


def test_a_training_process_that_ends_without_a_result_is_a_one_line_error_with_its_log_tail(tmp_path, monkeypatch):
    """No TensorFlow: the training process is replaced by a script that dies with a traceback."""
    script = tmp_path / "dies.sh"
    script.write_text("#!/bin/sh\necho 'Traceback (most recent call last):'\necho '  File \"x.py\", line 1'\n"
                      "echo 'RuntimeError: the model did not build'\nexit 3\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    spec = TrainSpec(model=ModelSpec("small_cnn", (16, 16, 3), 4, 8), total_steps=10)
    worker, ps, chief = free_addresses(3)
    cluster = ClusterAddresses(workers={"a": worker}, ps=[ps], chief=chief)
    with pytest.raises(TrainingError) as raised:
        run_in_subprocess(spec, cluster, log_path=tmp_path / "run.log", timeout_s=60)
    message = str(raised.value)
    assert "\n" not in message
    assert "exited with code 3" in message
    assert message.rstrip().endswith("To fix: check TensorFlow and the servers.")
    assert "File \"x.py\", line 1 RuntimeError: the model did not build" in message


def test_a_crashed_run_reports_its_error_in_one_line():
    from hetcluster.training.run_job import crash_summary

    traced = ValueError(
        'in user code:\n\n    File "engine.py", line 103, in gradient_fn  *\n        per_example = ...\n\n'
        "    ValueError: 'user net/' is not a valid root scope name.\n"
    )
    assert crash_summary(traced) == ("ValueError: 'user net/' is not a valid root scope name. "
                                     "(the run's log holds the traceback)")
    assert crash_summary(RuntimeError("out of threads")) == "RuntimeError: out of threads"
