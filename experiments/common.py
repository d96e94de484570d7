"""What every experiment needs: an emulated fleet that is always torn down, the `hetcluster` CLI
run as a subprocess (the same path a user takes), and a record of the machine the figures came from.

Experiments drive the CLI rather than library functions on purpose: the numbers in
experiments/results/ are then exactly what `hetcluster evaluate` / `hetcluster plan` print for a
user, and a crash in one run (a model that does not fit, a lost worker) stays in that run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
PLATFORMS = ("server", "jetson-nano", "phone")  # a server-class device, an edge board and a phone
REFERENCE_EXACT_RATE = 0.7667  # the reference paper's share of best-configuration choices

log = logging.getLogger(__name__)


def hetcluster_executable() -> list[str]:
    """The CLI of the interpreter running this (the venv's), so a notebook kernel finds the same one."""
    exe = Path(sys.executable).with_name("hetcluster")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "hetcluster.cli.app"]


def cli_env() -> dict[str, str]:
    return {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "",
            "COLUMNS": "160"}


def run_cli(args: Sequence[str], log_path: Path | None = None, timeout_s: float | None = None) -> str:
    """Run `hetcluster ARGS`; stdout is returned, both streams are appended to ``log_path``.

    Raises RuntimeError with the output's tail when the command fails, so a notebook cell shows why.
    """
    cmd = [*hetcluster_executable(), *map(str, args)]
    log.info("running %s", " ".join(cmd))
    started = time.monotonic()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
                          cwd=ROOT) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except BaseException:  # Ctrl-C, a SIGTERM emulated_fleet turned into one, the timeout
            _stop(proc)
            raise
    elapsed_s = time.monotonic() - started
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("a") as fh:
            fh.write(
                f"$ {' '.join(cmd)}\n{_clip(stdout)}{_clip(stderr)}\n[exit {proc.returncode}, {elapsed_s:.1f} s]\n"
            )
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit {proc.returncode}:\n{(stdout + stderr)[-3000:]}")
    return stdout


def _stop(proc: subprocess.Popen, grace_s: float = 120.0) -> None:
    """SIGTERM, which the commands take as Ctrl-C (the run in progress stops the servers it started
    on the agents: hetcluster/cli/signals.py), then SIGKILL if it has not ended within ``grace_s``.
    subprocess.run would SIGKILL at once and leave those servers running."""
    proc.terminate()
    try:
        proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()


def _clip(text: str, keep_chars: int = 3000) -> str:
    """Head and tail of a long output (a plan's JSON, progress bars): the log stays small enough to commit."""
    if len(text) <= 2 * keep_chars:
        return text
    return f"{text[:keep_chars]}\n[... {len(text) - 2 * keep_chars} characters left out ...]\n{text[-keep_chars:]}"


@contextlib.contextmanager
def emulated_fleet(state_dir: Path, devices: Sequence[str] = PLATFORMS, name: str = "experiments",
                   log_path: Path | None = None, catalog: Path | None = None,
                   network: str = "loopback") -> Iterator[Path]:
    """`hetcluster cluster up` into our own state dir (``catalog``: a TOML file of device profiles
    added to the built-in ones, `cluster up --catalog`; ``network``: `cluster up --network`, loopback
    or shaped, each device's link rate-shaped in its own namespace, root only); yields the inventory;
    `cluster down` after, whatever happened — once the fleet is up: an `up` that fails (say, another
    run's fleet is up in that state dir) has taken down what it started itself, and a `down` then
    would stop the other run's fleet.

    SIGTERM is turned into an exception while the fleet is up, so `kill PID` of a long experiment
    also tears the agents down instead of leaving them running on a shared machine.
    """
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    inventory = state_dir / "cluster.toml"
    previous = signal.getsignal(signal.SIGTERM)

    def _terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    in_main_thread = _is_main_thread()
    if in_main_thread:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        run_cli(["cluster", "up", "--devices", ",".join(devices), "--state-dir", state_dir, "--name", name,
                 "--out", inventory, "--network", network,
                 *(["--catalog", Path(catalog).resolve()] if catalog else [])], log_path)
        try:
            yield inventory
        finally:
            try:
                run_cli(["cluster", "down", "--state-dir", state_dir], log_path)
            except RuntimeError as error:
                log.warning("cluster down: %s", error)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """CPU model, cores, load average and date: the figures depend on them (a shared 2-core host)."""
    import psutil

    load_1m, load_5m, load_15m = os.getloadavg()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu_model": cpu_model(),
            "cpu_cores": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
            "load_avg_1m": load_1m, "load_avg_5m": load_5m, "load_avg_15m": load_15m,
            "python": platform.python_version(), "platform": platform.platform(), "git_commit": commit}


def write_json(path: Path, data: Any) -> Path:
    """Atomically (temp file + os.replace): results are what users keep."""
    from hetcluster.fileio import write_json_atomic

    return write_json_atomic(path, data)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def case_scopes(cases: Any, columns: Sequence[str] = ("objective", "devices")) -> list[tuple[str, Any]]:
    """(scope, rows) of a DataFrame of scored cases: "all", then one per value of each column
    ("objective=time", "devices=3", ...): the scopes of a re-planning experiment's summary."""
    return [("all", cases)] + [(f"{column}={value}", group) for column in columns
                               for value, group in cases.groupby(column)]


def run_case_experiment(argv: Sequence[str] | None, description: str, out_name: str,
                        rows_of: Any, summary: Any) -> int:
    """main() of a re-planning experiment over the recorded choice-accuracy truths: --recordings (the
    dataset, experiments.recordings, or a folder of results folders with raw/) and --out (default
    results/choice_accuracy/<out_name>); writes out/cases.csv (``rows_of(recordings)``, one row per
    case), out/summary.csv (``summary(cases)``) and prints the summary."""
    import argparse

    import pandas as pd

    from experiments.recordings import DATASET, load

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--recordings",
        type=Path,
        default=DATASET,
        help="the dataset, or a folder of results folders (<folder>/raw/<model>.json); default %(default)s",
    )
    parser.add_argument(
        "--out", type=Path, help=f"where summary.csv and cases.csv go (default: {DATASET.parent / out_name})"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    recordings = load(args.recordings)
    planner_log = logging.getLogger("hetcluster.planner")
    level = planner_log.level
    planner_log.setLevel(logging.ERROR)   # e.g. a class's members differing, once per fit; restored below
    try:
        cases = pd.DataFrame(rows_of(recordings))
    finally:
        planner_log.setLevel(level)
    table = summary(cases)
    out = args.out or DATASET.parent / out_name
    out.mkdir(parents=True, exist_ok=True)
    cases.to_csv(out / "cases.csv", index=False)
    table.to_csv(out / "summary.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False))
    return 0
