"""Run one training run in a fresh Python process and hand back its RunResult as JSON.

TensorFlow reliably hosts one ParameterServerStrategy cluster per process (see engine.py), and a
run on another device set needs another cluster, so every run gets its own process:

    python -m hetcluster.training.run_job --job job.json --result result.json [--progress p.jsonl]

``job.json`` is ``{"train": TrainSpec.to_dict(), "cluster": ClusterAddresses.to_dict()}``. The
result file (written atomically) holds ``RunResult.to_dict()``, or ``{"error": ..., "error_type":
...}`` with exit code 2. SIGINT/SIGTERM stop the run at the next round boundary and still write a
checkpoint and the result. The progress file gets a JSON line ``{"done", "to_do", "elapsed_s"}``
about four times a second (``done`` = applied steps so far, read from ``optimizer.iterations``),
for live displays in the parent. With ``--wait-for-go`` the process imports TensorFlow and then
waits for the line ``go`` on standard input before it connects: the parent starts it while the
servers start (run_in_subprocess(ready=...)), so its own import no longer adds to each run's start.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from hetcluster.errors import HetclusterError, TrainingError
from hetcluster.fileio import write_json_atomic
from hetcluster.tfenv import prepare_tf_env, tf_env
from hetcluster.training.servers import log_file_tail
from hetcluster.training.spec import ClusterAddresses, RunResult, TrainSpec

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.training.plane import CoordinatorPlane

log = logging.getLogger(__name__)


def _exit_with_parent(parent_pid: int) -> None:
    """A coordinator killed outright (SIGKILL) must not leave its run training on: an orphan
    would keep applying steps and writing checkpoints behind a resumed coordinator's back."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one hetcluster training run.")
    parser.add_argument("--job", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    parser.add_argument("--progress", type=Path)
    parser.add_argument("--round-steps", type=int, default=0)
    parser.add_argument("--wait-for-go", action="store_true",
                        help="import TensorFlow, then wait for a line 'go' on standard input before connecting "
                             "(the parent starts this process while the servers start); anything else exits 4")
    parser.add_argument("--plane-fd", type=int, default=-1, help="control socket of the training plane")
    parser.add_argument("--isolation", default="netns", help="netns, or none (the operator's explicit opt-out)")
    args = parser.parse_args(argv)
    routed = None
    if args.plane_fd >= 0:  # first: a namespace holds only for threads started after it
        from hetcluster.plane.isolation import enter_plane

        routed = enter_plane(args.plane_fd, args.isolation)
    logging.basicConfig(level=os.environ.get("HETCLUSTER_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    prepare_tf_env()
    # the parent sends SIGUSR1 before killing a run that overran: every thread's stack goes to the log
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    progress_file = open(args.progress, "a", encoding="utf-8") if args.progress else None

    def on_progress(done: int, to_do: int, elapsed_s: float) -> None:
        if progress_file is not None:
            progress_file.write(json.dumps({"done": done, "to_do": to_do, "elapsed_s": elapsed_s}) + "\n")
            progress_file.flush()

    if args.wait_for_go:
        import tensorflow  # noqa: F401  (the seconds this takes overlap the servers' own start)

        from hetcluster.training import engine  # noqa: F401
        if sys.stdin.readline().strip() != "go":
            os._exit(4)  # the parent gave up on the launch: no run, no result
    if routed is not None:
        routed.wait()
    code = 0
    try:
        job = json.loads(args.job.read_text(encoding="utf-8"))
        from hetcluster.training.engine import run_training

        result = run_training(TrainSpec.from_dict(job["train"]), ClusterAddresses.from_dict(job["cluster"]),
                              on_progress=on_progress, stop_event=stop, round_steps=args.round_steps or None)
        payload = result.to_dict()
    except HetclusterError as exc:
        payload, code = {"error": str(exc), "error_type": type(exc).__name__}, 2
    except Exception as exc:  # noqa: BLE001 - report anything to the parent rather than die silently
        log.exception("training run crashed")
        payload, code = {"error": crash_summary(exc), "error_type": "TrainingError"}, 2
    write_json_atomic(args.result, payload)
    if progress_file is not None:
        progress_file.close()
    sys.stderr.flush()
    # Skip interpreter teardown: TF's coordinator threads may still wait on lost workers.
    os._exit(code)


def crash_summary(exc: BaseException) -> str:
    """One line for an unexpected exception of a training run: its type and its message's last line.
    TensorFlow's errors from a tf.function carry the traced code's whole traceback in the message
    ("in user code: ..."); that goes to the run's log (log.exception), not into every report."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    text = last if last.startswith(f"{type(exc).__name__}:") else f"{type(exc).__name__}: {last}"
    return text + (" (the run's log holds the traceback)" if len(lines) > 1 else "")


def run_in_subprocess(spec: TrainSpec | Callable[[], TrainSpec], cluster: ClusterAddresses, *,
                      timeout_s: float | None = None,
                      on_progress: Callable[[int, int, float], None] | None = None,
                      round_steps: int = 0, log_path: Path | None = None,
                      stop_event: threading.Event | None = None, stop_grace_s: float = 120.0,
                      ready: Callable[[], None] | None = None, plane: "CoordinatorPlane | None" = None) -> RunResult:
    """Run :func:`engine.run_training` in a child process and return its RunResult.

    ``cluster`` holds the run's public addresses; with ``plane`` (the launched cluster's) the
    child is the chief in a namespace of its own and trains on the plane's local view of them.

    ``ready`` (a launched cluster's ``wait_ready``) is called after the child has started: the
    child imports TensorFlow meanwhile and connects only once ``ready`` has returned. If ``ready``
    raises, the child exits without training and the error propagates. ``spec`` may be a function,
    called once ``ready`` has returned: a run started before its steps are known (pre-training
    starts its next run while the current one trains).

    Setting ``stop_event`` asks the child (SIGINT) to stop after its current round; it writes a
    checkpoint and the result comes back with ``stopped=True``. On KeyboardInterrupt the child is
    asked the same, given ``stop_grace_s`` to checkpoint, and the interrupt is re-raised.
    Raises TrainingError with the child's error (or log tail) if the run fails or times out.
    """
    with tempfile.TemporaryDirectory(prefix="hetcluster-run-") as tmp:
        tmpdir = Path(tmp)
        job_path, result_path, progress_path = tmpdir / "job.json", tmpdir / "result.json", tmpdir / "progress.jsonl"
        seen = plane.local_view(cluster) if plane is not None else cluster

        def write_job() -> None:
            train = spec() if callable(spec) else spec
            job_path.write_text(json.dumps({"train": train.to_dict(), "cluster": seen.to_dict()}), encoding="utf-8")

        if not callable(spec) or ready is None:
            write_job()
        progress_path.touch()
        log_path = log_path or tmpdir / "run.log"
        cmd = [sys.executable, "-m", "hetcluster.training.run_job", "--job", str(job_path), "--result",
               str(result_path), "--progress", str(progress_path), "--round-steps", str(round_steps)]
        # the child ends with os._exit, past the atexit hooks that delete what TensorFlow's autograph
        # writes to the temporary directory (a few __autograph_generated_file*.py per run): its own
        # temporary directory lies in this run's, which goes with the run
        child_tmp = tmpdir / "tmp"
        child_tmp.mkdir()
        env = tf_env(TMPDIR=str(child_tmp))
        with (
            open(log_path, "wb") as log_file,
            open(progress_path, encoding="utf-8") as progress,
            chief_process(
                plane,
                cluster,
                cmd + (["--wait-for-go"] if ready else []),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.PIPE if ready else subprocess.DEVNULL,
            ) as child,
        ):
            if ready is not None:
                def ready_then_job() -> None:
                    ready()
                    if not job_path.exists():
                        write_job()

                _release_when_ready(child, ready_then_job)
            deadline = time.monotonic() + timeout_s if timeout_s else None
            stop_sent = False
            try:
                while child.poll() is None:
                    _pump_progress(progress, on_progress)
                    if stop_event is not None and stop_event.is_set() and not stop_sent:
                        child.send_signal(signal.SIGINT)
                        stop_sent = True
                    if deadline and time.monotonic() > deadline:
                        child.send_signal(signal.SIGUSR1)  # stacks into the log (faulthandler)
                        time.sleep(1.0)
                        child.kill()
                        child.wait()
                        tail = Path(log_path).read_text(errors="replace")[-3000:]
                        log.error("training run overran %.0f s; its log ends with:\n%s", timeout_s, tail)
                        raise TrainingError(f"Training run exceeded {timeout_s:.0f} s and was killed "
                                            f"(its thread stacks are in the log).",
                                            hint="raise the timeout or train fewer steps.")
                    time.sleep(0.2)
            except KeyboardInterrupt:
                if child.poll() is None:
                    child.send_signal(signal.SIGINT)
                try:
                    child.wait(timeout=stop_grace_s)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                raise
            _pump_progress(progress, on_progress)
        if not result_path.exists():
            raise TrainingError(f"Training process exited with code {child.returncode} and no result; "
                                f"its log ends: {log_file_tail(log_path, 600)}",
                                hint="check TensorFlow and the servers.")
        payload = json.loads(result_path.read_text(encoding="utf-8"))
    if "error" in payload:
        raise TrainingError(payload["error"])
    return RunResult.from_dict(payload)


@contextlib.contextmanager
def chief_process(plane: "CoordinatorPlane | None", cluster: ClusterAddresses, cmd: list[str],
                  **popen: Any) -> Iterator[subprocess.Popen]:
    """A training process ``cmd`` (one that enters the plane with the arguments the plane appends)
    as the chief of ``cluster``: on the plane, in a namespace of its own, routed to the run's tasks
    (watched: a lost worker's port refuses connections, as the engine expects); killed if still
    running when the block ends."""
    if plane is None:
        yield subprocess.Popen(cmd, **popen)
        return
    process, child = plane.spawn(cluster.chief, cmd, cluster.cluster_spec_dict(), watch=True, **popen)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        plane.release(child, cluster.chief)


def _release_when_ready(child: subprocess.Popen, ready: Callable[[], None]) -> None:
    """Call ``ready``, then tell the waiting child to connect; if ``ready`` raises (or is
    interrupted), the child, which has not connected to anything yet, is killed and reaped
    before the error propagates."""
    assert child.stdin is not None
    try:
        ready()
    except BaseException:
        child.kill()
        child.wait()
        raise
    with contextlib.suppress(OSError):  # a child that already died leaves no result: the caller reports its log
        child.stdin.write(b"go\n")
        child.stdin.close()


def _pump_progress(progress: "object", on_progress: Callable[[int, int, float], None] | None) -> None:
    """Hand complete progress lines to ``on_progress``; leave a partial last line for later."""
    while True:
        position = progress.tell()  # type: ignore[attr-defined]
        line = progress.readline()  # type: ignore[attr-defined]
        if not line.endswith("\n"):
            progress.seek(position)  # type: ignore[attr-defined]
            return
        if on_progress is not None:
            event = json.loads(line)
            on_progress(int(event["done"]), int(event["to_do"]), float(event["elapsed_s"]))


if __name__ == "__main__":  # pragma: no cover
    main()
