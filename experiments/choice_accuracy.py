"""Reproduce the reference evaluation: how often does the planner choose the measured best configuration?

Three emulated platforms (server, jetson-nano, phone: a server-class device, an edge board, a phone)
× five models × four objectives (time, power, energy, EDP); `--devices` names another fleet from the
catalog (the default five: server,jetson-xavier,jetson-nano,rpi4,phone — 31 configurations), and
`--catalog FILE` adds device profiles of its own (`hetcluster cluster up --catalog`: e.g.
experiments/catalog_untuned.toml, devices the planner was never developed on); `--network shaped`
(root) rate-shapes each device's link to its catalog bandwidth, so a slow link slows its device. For each
model, `hetcluster evaluate` pre-trains once, predicts all 2^n − 1 configurations, trains every one
of them for real from the same pre-training checkpoint, and scores each objective's choice. This script brings the
fleet up in its
own state dir, runs evaluate per model, always tears the fleet down, and writes under
experiments/results/choice_accuracy/<full|reduced>/:

  choices.csv         model × objective: chosen, measured best, exact, regret, within 5%
  models.csv          per model: setting, MAPE of time/energy/power, pre-training time and overhead
  configurations.csv  every configuration's predicted and measured time/power/energy/EDP
  summary.csv         exact and within-5% accuracy per objective and overall, beside the reference's 76.67%
  accuracy.png, errors.png, predicted_vs_measured.png
  machine.json        per run into the folder: CPU model, cores, load before/after, date, git commit, command,
                      the fleet's device profiles (share, memory, watts, link: what each device was)
                      and foreign_cpu: CPU seconds other processes took on the host, per 2-s bin, with
                      the kernel's threads', the host's interrupt and stolen seconds and the signed
                      rest no process holds beside them (experiments/host_watch.py);
                      raw/<model>.setting.json: foreign_cpu_s during its pre-training and its trainings
                      (kernel_cpu_s, interrupt_cpu_s, steal_s and unattributed_cpu_s beside it)
  raw/<model>.json    evaluate's own result; raw/evaluate.log its console output

Usage:  .venv/bin/python -m experiments.choice_accuracy [--reduced] [--models a,b] [--devices a,b,c] [--catalog FILE]
                                                        [--network loopback|shaped]
                                                        [--job-scale K] [--repeats R] [--out-dir DIR]
        .venv/bin/python -m experiments.choice_accuracy --model-config FILE [--config-batch-size B]
                                                        [--config-total-steps N] ...   (a user's own model)
        .venv/bin/python -m experiments.choice_accuracy --render-only [--reduced]   (tables/figures from raw/)
Models already in raw/ are skipped unless --fresh, so an interrupted full run continues where it stopped.
A finished recording goes into the dataset the headline reads (`python -m experiments.recordings add DIR`).
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from experiments.accuracy import plot_accuracy, plot_errors, plot_predicted_vs_measured, tables
from experiments.common import (
    PLATFORMS,
    REFERENCE_EXACT_RATE,
    RESULTS,
    emulated_fleet,
    machine_info,
    read_json,
    run_cli,
    write_json,
)
from experiments.host_watch import BIN_FIELDS, TOTAL_KEYS, ForeignCpu, host_cpu_between
from hetcluster.emulation.cluster import NETWORK_MODES

log = logging.getLogger("choice_accuracy")


@dataclass(frozen=True)
class Setting:
    """One model's job. Small inputs and batches so that the phone (0.2 core) trains in seconds."""

    model: str
    input_shape: str
    batch_size: int
    total_steps: int
    pretrain_steps: int = 20
    warmup_steps: int = 4
    model_config: str | None = None  # a user's model (hetcluster --model-config): model is then its file's stem

    def model_args(self) -> list[Any]:
        """How the evaluate command names the model: a registry name and input shape, or the config file."""
        if self.model_config is not None:
            return ["--model-config", self.model_config]
        return ["--model", self.model, "--input-shape", self.input_shape]


def config_setting(path: Path, batch_size: int, total_steps: int) -> Setting:
    """The Setting of a user's model from its tf_keras config (one-line exit for a config the job
    cannot train); pre-training as the full configuration's: 10 steps per run, 3 of them warm-up."""
    from hetcluster.errors import HetclusterError
    from hetcluster.models.keras_config import read_keras_config
    from hetcluster.models.spec import format_input_shape

    try:
        described = read_keras_config(path)
    except HetclusterError as error:
        raise SystemExit(f"error: {error}") from None
    return Setting(path.stem, format_input_shape(described.input_shape), batch_size, total_steps,
                   pretrain_steps=10, warmup_steps=3, model_config=str(path.resolve()))


# The full configuration: the five models at 32x32 (the smallest input every one of them accepts),
# batches that the phone (0.2 core) steps through in about a second at most. Pre-training is 10 steps
# per run (3 of them warm-up) over 6 runs (each device alone, three calibration sets); total steps
# give the slowest configuration (the phone alone) about a minute of training after pre-training.
FULL = (
    Setting("small_cnn", "32x32x3", 32, 500, pretrain_steps=10, warmup_steps=3),
    Setting("mobilenet_v2", "32x32x3", 16, 200, pretrain_steps=10, warmup_steps=3),
    Setting("resnet50", "32x32x3", 8, 140, pretrain_steps=10, warmup_steps=3),
    Setting("vgg16", "32x32x3", 8, 160, pretrain_steps=10, warmup_steps=3),
    Setting("densenet121", "32x32x3", 8, 120, pretrain_steps=10, warmup_steps=3),
)
# Models run only when --models names them: Inception-v3 takes 75x75 inputs at the least, where a
# step of batch 4 took 0.16 s on the emulated server, 0.46 s on the jetson-xavier and 0.72 s on the
# jetson-nano (the recording full-x2-r2-inception-sxn), too slow for the default set.
EXTRA = (
    Setting("inception_v3", "75x75x3", 4, 150, pretrain_steps=10, warmup_steps=3),
)
# The reduced configuration (CI and a quick look): two light models, fewer steps.
REDUCED = (
    Setting("small_cnn", "16x16x3", 16, 120, pretrain_steps=12, warmup_steps=3),
    Setting("mobilenet_v2", "32x32x3", 8, 80, pretrain_steps=8, warmup_steps=2),
)


def scaled(settings: tuple[Setting, ...], job_scale: int) -> tuple[Setting, ...]:
    """The settings with K times the total steps: pre-training (capped at a third of the job) gets
    longer windows and becomes a smaller share of the job, so near-ties are decided by the planner
    rather than by the host's run-to-run noise; every configuration then trains K times longer."""
    if job_scale < 1:
        raise SystemExit(f"--job-scale must be a whole number >= 1, got {job_scale}")
    return tuple(replace(s, total_steps=s.total_steps * job_scale) for s in settings)


def evaluate_model(setting: Setting, inventory: Path, raw_dir: Path, work_dir: Path, repeats: int = 1,
                   watch: ForeignCpu | None = None) -> dict[str, Any]:
    """`hetcluster evaluate` for one model; returns its JSON with the wall time added to the setting,
    and with ``watch``, the CPU seconds other work took on the host during its pre-training and after."""
    out = raw_dir / f"{setting.model}.json"
    shutil.rmtree(work_dir / setting.model, ignore_errors=True)  # pre-training would resume an old checkpoint
    started = time.monotonic()
    run_cli(["evaluate", "--inventory", inventory, *setting.model_args(), "--batch-size", setting.batch_size,
             "--total-steps", setting.total_steps, "--pretrain-steps", setting.pretrain_steps,
             "--warmup-steps", setting.warmup_steps, "--objectives", "time,power,energy,edp",
             "--workdir", work_dir / setting.model, "--out", out, "--repeats", repeats],
            raw_dir / "evaluate.log")
    evaluation = read_json(out)
    record = {"setting": {**asdict(setting), "repeats": repeats, "wall_s": time.monotonic() - started,
                          "machine_after": machine_info()},
              "evaluation": evaluation}
    if watch is not None:
        record["setting"].update(host_cpu_of_phases(watch.record(), evaluation["profile"]))
    write_json(raw_dir / f"{setting.model}.setting.json", record["setting"])
    return record


def host_cpu_of_phases(
    watched: dict[str, Any], profile: dict[str, Any], warn_above_s: float = 5.0
) -> dict[str, dict[str, float]]:
    """The CPU seconds of other work (``foreign_cpu_s``), of the kernel's threads (``kernel_cpu_s``),
    of interrupts (``interrupt_cpu_s``, mostly the fleet's own loopback traffic), stolen by the
    hypervisor (``steal_s``) and the host's rest no process holds (``unattributed_cpu_s``; host_watch.py),
    each during the evaluation's pre-training (its profile's last pretrain_time_s before
    created_wall_s) and after it (the trainings, up to now); a warning when the pre-training had
    more than ``warn_above_s`` of other work: its short windows read every rate low."""
    start_s, end_s, now_s = (
        profile["created_wall_s"] - profile["pretrain_time_s"],
        profile["created_wall_s"],
        time.time(),
    )
    phases = {TOTAL_KEYS[field]: {"pretraining": host_cpu_between(watched, start_s, end_s, field),
                                  "trainings": host_cpu_between(watched, end_s, now_s, field)} for field in BIN_FIELDS}
    if phases["foreign_cpu_s"]["pretraining"] > warn_above_s:
        heaviest = ", ".join(f"{h['command']} ({h['cpu_s']:.0f} s)" for h in watched["heaviest_foreign"][:3])
        log.warning(
            "other work took %.1f CPU s on this host during pre-training (heaviest over the run: %s): "
            "its rates read low; run nothing else beside a recording",
            phases["foreign_cpu_s"]["pretraining"],
            heaviest,
        )
    return {key: {phase: round(cpu_s, 1) for phase, cpu_s in by_phase.items()} for key, by_phase in phases.items()}


def collect(raw_dir: Path, settings: tuple[Setting, ...]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(model, setting, evaluation) for every model whose evaluation and setting are in raw/."""
    runs = []
    for setting in settings:
        result, meta = raw_dir / f"{setting.model}.json", raw_dir / f"{setting.model}.setting.json"
        if result.exists() and meta.exists():
            runs.append((setting.model, read_json(meta), read_json(result)))
    return runs


def render(out_dir: Path, settings: tuple[Setting, ...]) -> dict[str, Any]:
    """CSV tables and PNG figures from raw/ (nothing is trained here)."""
    runs = collect(out_dir / "raw", settings)
    if not runs:
        raise SystemExit(f"no evaluation results in {out_dir / 'raw'}: run without --render-only first")
    frames = tables(runs, REFERENCE_EXACT_RATE)
    for name, frame in frames.items():
        frame.to_csv(out_dir / f"{name}.csv", index=False)
    plot_accuracy(frames["summary"], REFERENCE_EXACT_RATE, out_dir / "accuracy.png")
    plot_errors(frames["models"], out_dir / "errors.png")
    plot_predicted_vs_measured(frames["configurations"], out_dir / "predicted_vs_measured.png")
    return frames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reduced", action="store_true", help="two light models, few steps (CI, a quick look)")
    parser.add_argument("--models", help="only these models of the configuration, comma-separated; "
                                          f"{', '.join(s.model for s in EXTRA)} run only when named here")
    parser.add_argument(
        "--model-config",
        type=Path,
        help="instead of the configuration's models, a user's own "
        "(a tf_keras model.to_json() file; hetcluster --model-config)",
    )
    parser.add_argument("--config-batch-size", type=int, default=16, help="--model-config's batch size (default 16)")
    parser.add_argument("--config-total-steps", type=int, default=200,
                        help="--model-config's total steps before --job-scale (default 200)")
    parser.add_argument("--job-scale", type=int, default=1,
                        help="K times each model's total steps (default 1); results default to <full|reduced>-xK")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="train every configuration R times, truth = their mean (default 1); results default to ...-rR",
    )
    parser.add_argument("--devices", help=f"the emulated fleet, catalog names comma-separated, NAME*K for K identical "
                                          f"devices (default {','.join(PLATFORMS)}); results default to ...-<n>dev")
    parser.add_argument("--catalog", type=Path, help="a TOML file of device profiles added to the built-in catalog "
                                                      "(hetcluster cluster up --catalog); --devices may name them")
    parser.add_argument("--network", choices=NETWORK_MODES, default="loopback",
                        help="hetcluster cluster up --network: shaped (root) rate-shapes each device's link to its "
                             "catalog bandwidth (default loopback); results default to ...-shaped")
    parser.add_argument(
        "--out-dir", type=Path, help="default: experiments/results/choice_accuracy/<full|reduced>[-xK][-rR]"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="the fleet's state dir and checkpoints (default: $TMPDIR/hetcluster-choice-accuracy-<name>)",
    )
    parser.add_argument("--fresh", action="store_true", help="re-run models whose results are already in raw/")
    parser.add_argument("--render-only", action="store_true", help="only rebuild tables and figures from raw/")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    name = "reduced" if args.reduced else "full"
    settings = REDUCED if args.reduced else FULL
    if args.model_config is not None:
        if args.models or args.reduced:
            parser.error("--model-config names the one model to run: give it without --models and --reduced")
        settings = (config_setting(args.model_config, args.config_batch_size, args.config_total_steps),)
    if args.job_scale != 1:
        settings, name = scaled(settings, args.job_scale), f"{name}-x{args.job_scale}"
    if args.repeats < 1:
        parser.error(f"--repeats must be 1 or more, got {args.repeats}")
    if args.repeats > 1:
        name = f"{name}-r{args.repeats}"
    devices = PLATFORMS
    if args.devices:
        devices = tuple(d.strip() for d in args.devices.split(",") if d.strip())
        if len(devices) < 2 or len(set(devices)) != len(devices):
            parser.error(
                f"--devices: give two or more distinct entries (NAME*K for K identical devices), got {args.devices!r}"
            )
        if devices != PLATFORMS:
            name = f"{name}-{len(devices)}dev"
    if args.network != "loopback":
        name = f"{name}-{args.network}"
    profiles = None if args.render_only else fleet_profiles(devices, args.catalog)
    if args.models:
        wanted = [m.strip() for m in args.models.split(",") if m.strip()]
        if not args.reduced:
            settings += tuple(s for s in scaled(EXTRA, args.job_scale) if s.model in wanted)
        unknown = sorted(set(wanted) - {s.model for s in settings})
        if unknown:
            parser.error(f"--models: {', '.join(unknown)} not in the {name} configuration "
                         f"({', '.join(s.model for s in settings)})")
        settings = tuple(s for s in settings if s.model in wanted)
    out_dir = (args.out_dir or RESULTS / "choice_accuracy" / name).resolve()
    raw_dir = out_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    if not args.render_only:
        try:
            run_all(
                settings,
                out_dir,
                args.state_dir or Path(tempfile.gettempdir()) / f"hetcluster-choice-accuracy-{name}",
                args.fresh,
                sys.argv,
                args.repeats,
                devices,
                args.catalog,
                profiles,
                args.network,
            )
        except RuntimeError as error:  # a hetcluster command failed: its own message, not a traceback
            raise SystemExit(f"error: {error}") from None
    frames = render(out_dir, settings)
    log.info("summary:\n%s", frames["summary"].to_string(index=False))
    log.info("results in %s", out_dir)
    return 0


def fleet_name(out_dir: Path) -> str:
    """The emulated cluster's name for a results folder: `hetcluster cluster up` takes 1-24 lower-case
    letters, digits or '-' (it names cgroups and credentials), which `accuracy-full-x10-r2` fits."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", f"accuracy-{out_dir.name}".lower())
    return cleaned[:24].strip("-") or "accuracy"


def fleet_profiles(devices: tuple[str, ...], catalog: Path | None) -> dict[str, dict[str, Any]]:
    """What each device of the fleet is (the catalog profile `cluster up` will emulate, by device
    name), checked before anything starts: an unknown name or a bad catalog ends the run with its
    one-line error."""
    from hetcluster.emulation.catalog import load_catalog
    from hetcluster.errors import HetclusterError

    try:
        chosen = load_catalog(catalog).select(devices)
    except HetclusterError as error:
        raise SystemExit(f"error: {error}") from None
    return {p.name: {k: v for k, v in asdict(p).items() if k not in ("name", "rationale")} for p in chosen}


def run_all(settings: tuple[Setting, ...], out_dir: Path, state_dir: Path, fresh: bool, command: list[str],
            repeats: int = 1, devices: tuple[str, ...] = PLATFORMS, catalog: Path | None = None,
            profiles: dict[str, dict[str, Any]] | None = None, network: str = "loopback") -> None:
    """Bring the fleet up (``catalog``: device profiles added to the built-in ones; ``network``: its
    `cluster up --network`), evaluate every model not yet in raw/, record the machine (``profiles``:
    what each device was; the network), tear down."""
    raw_dir = out_dir / "raw"
    todo = [s for s in settings if fresh or not (raw_dir / f"{s.model}.setting.json").exists()]
    machine = {"before": machine_info(), "command": " ".join(command), "platforms": list(devices), "network": network,
               **({"device_profiles": profiles} if profiles else {}),
               "settings": [asdict(s) for s in settings], "models_run_now": [s.model for s in todo]}
    work_dir = state_dir / "work"
    finished = []
    watch = ForeignCpu(marker=str(state_dir.resolve()))
    try:
        if todo:
            with watch, emulated_fleet(state_dir, devices, name=fleet_name(out_dir), log_path=raw_dir / "evaluate.log",
                                       catalog=catalog, network=network) as inventory:
                for setting in todo:
                    log.info("evaluating %s (%s, batch %d, %d steps)", setting.model, setting.input_shape,
                             setting.batch_size, setting.total_steps)
                    evaluate_model(setting, inventory, raw_dir, work_dir, repeats, watch)
                    finished.append(setting.model)
    finally:  # an interrupted run still records what it finished; rerunning the command resumes
        shutil.rmtree(work_dir, ignore_errors=True)  # checkpoints: large, and not results
        machine.update(after=machine_info(), models_finished=finished)
        if todo:
            machine["foreign_cpu"] = watch.record()
        write_json(out_dir / "machine.json", {"runs": previous_runs(out_dir / "machine.json") + [machine]})


def previous_runs(path: Path) -> list[dict[str, Any]]:
    """The machine records of earlier runs into the same folder (a resumed run keeps them)."""
    if not path.exists():
        return []
    old = read_json(path)
    return old["runs"] if "runs" in old else [old]


if __name__ == "__main__":
    sys.exit(main())
