r"""Each worker's step stamps over long runs, and how its step time moves after the start.

A diagnostic for what pre-training's short windows see: it trains the given configurations one
after another on a fresh emulated fleet (every run continues one checkpoint, as pre-training's
runs do), keeps every step's worker-side ``(start, end)`` stamps, and prints for each worker its
mean step duration in consecutive bins from the moment the run trains freely (the end of the start
barrier's rounds, else the run's start), beside its rate over the whole run. Power recorders can
stream from every agent while it runs (``--power-hz``), as pre-training's and training's do.

    .venv/bin/python -m experiments.investigations.step_stamps --devices server,jetson-tx2,phone \
        --runs server+jetson-tx2+phone,server+jetson-tx2 --steps 900 [--no-barrier] [--power-hz 2]

With ``--pretrain-total-steps N`` it runs a job's pre-training instead (as `hetcluster profile
--total-steps N --pretrain-steps 10 --warmup-steps 3` does, its settings from the job's size) and
keeps the stamps of each of its runs, then trains ``--runs`` on the same fleet right after, so a
calibration set's short window can be set beside the same configuration trained long.

With ``--shared-servers`` the TF servers of every device the runs name are launched once and each
run is a new client naming its devices' servers, as pre-training runs them (``--solo-steps`` gives
runs of one device their own length): a worker's first run beside its later ones.

Results: one JSON per run (the RunResult's stamps and rounds; a configuration listed twice in --runs
keeps both, the second as <label>-2.json) and ``machine.json`` under --out-dir
(default experiments/results/step_stamps/<name>, not kept in the repository; one recorded run is test
data, tests/data/step_stamps/). Library calls, not the CLI: no command keeps stamps. It trains: run it
with nothing else on the host.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from experiments.common import RESULTS, emulated_fleet, machine_info, read_json, write_json


def free_start_s(result: Any, barrier: bool) -> float:
    """When the run trains freely: the start of the first round after the barrier's rounds."""
    from hetcluster.training.spec import barrier_rounds

    rounds = result.round_starts_wall_s
    skip = barrier_rounds(result.warmup_steps) if barrier else 0
    return rounds[skip] if len(rounds) > skip else result.start_wall_s


def duration_bins(result: Any, worker: str, start_s: float, bin_s: float) -> list[float | None]:
    """The worker's mean step duration (s) per bin of ``bin_s`` from ``start_s``, by step end."""
    bins: dict[int, list[float]] = {}
    for begin, end, name in result.step_times:
        if name == worker and end > start_s:
            bins.setdefault(int((end - start_s) // bin_s), []).append(end - begin)
    last = max(bins, default=-1)
    return [statistics.fmean(bins[i]) if i in bins else None for i in range(last + 1)]


def run_file_names(labels: list[str]) -> list[str]:
    """A file name per run of ``--runs``: the label, and ``-2``, ``-3``… where a label repeats, so a
    configuration trained twice keeps both runs (one file held only the last)."""
    seen: dict[str, int] = {}
    names = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        names.append(f"{label}.json" if seen[label] == 1 else f"{label}-{seen[label]}.json")
    return names


def workers_used_before(runs: list[list[str]], shared_servers: bool) -> list[list[str]]:
    """For each run, its devices whose worker process trained in an earlier run (only with
    ``--shared-servers``: otherwise every run launches fresh servers)."""
    trained: set[str] = set()
    used = []
    for names in runs:
        used.append([n for n in names if n in trained] if shared_servers else [])
        trained.update(names)
    return used


def write_run(path: Path, result: Any, **labels: Any) -> None:
    """One run's file: its RunResult (stamps, rounds) beside ``labels`` (devices, barrier)."""
    write_json(path, {**labels, **result.to_dict()})


LABELS = ("devices", "barrier", "shared_servers", "workers_used_before")


def read_run(path: Path) -> Any:
    """The RunResult of a file :func:`write_run` wrote, its labels left out."""
    from hetcluster.training.spec import RunResult

    data = read_json(path)
    return RunResult.from_dict({key: value for key, value in data.items() if key not in LABELS})


def run_pretraining_phase(inventory_path: Path, args: argparse.Namespace, out_dir: Path) -> None:
    """A job's pre-training with the CLI's settings; each run's stamps to pretrain-<k>-<devices>.json
    (the opening run's, not measured, to pretrain-0-<devices>-opening.json)."""
    from hetcluster.inventory import load_inventory
    from hetcluster.profiling.pretrain import PretrainSettings, run_pretraining, solo_run_count

    inventory = load_inventory(inventory_path)
    settings = PretrainSettings.for_job(10, args.warmup_steps, args.pretrain_total_steps,
                                        solo_run_count(inventory, inventory.names))
    runs: list[tuple[list[str], Any, str]] = []

    def on_event(kind: str, details: dict[str, Any]) -> None:
        if kind == "run_done":
            runs.append((sorted(details["devices"]), details["result"], details.get("what", "")))

    with tempfile.TemporaryDirectory(prefix="step-stamps-pretrain-") as checkpoint_dir:
        profile = run_pretraining(inventory, _model(args), checkpoint_dir, settings=settings, on_event=on_event)
    write_json(out_dir / "pretrain-profile.json", profile.to_dict())
    for index, (names, result, what) in enumerate(runs):
        label = "+".join(names) + (f"-{what}" if what else "")
        write_run(out_dir / f"pretrain-{index}-{label}.json", result, devices=names)
    for run in profile.runs:
        rates = {n: steps / run.time_s for n, steps in run.per_device_steps.items()}
        print(f"pre-training set {'+'.join(run.devices)}: window {run.time_s:.2f} s, "
              + ", ".join(f"{n} {rate:.2f} steps/s" for n, rate in rates.items()))


def _model(args: argparse.Namespace) -> Any:
    from hetcluster.models.spec import ModelSpec, parse_input_shape

    return ModelSpec(args.model, parse_input_shape(args.input_shape), 10, args.batch_size)


def run_configurations(inventory_path: Path, args: argparse.Namespace, out_dir: Path) -> None:
    from hetcluster.agent.client import PowerRecorder
    from hetcluster.inventory import load_inventory
    from hetcluster.models.datasets import DataSource
    from hetcluster.training.launch import launch_cluster
    from hetcluster.training.run_job import run_in_subprocess
    from hetcluster.training.spec import TrainSpec

    inventory = load_inventory(inventory_path)
    model = _model(args)
    clients = [inventory.device(n).client() for n in inventory.names] if args.power_hz > 0 else []
    recorders = [PowerRecorder(client, rate_hz=args.power_hz).start() for client in clients]
    steps_total = 0
    labels = args.runs.split(",")
    runs = [label.split("+") for label in labels]
    fleet = list(dict.fromkeys(n for names in runs for n in names))   # every device the runs name, in order
    try:
        with tempfile.TemporaryDirectory(prefix="step-stamps-") as checkpoint_dir, \
                (launch_cluster([inventory.device(n) for n in fleet], inventory.parameter_server_host)
                 if args.shared_servers else nullcontext()) as shared:
            for label, names, file_name, used in zip(labels, runs, run_file_names(labels),
                                                     workers_used_before(runs, args.shared_servers)):
                barrier = len(names) > 1 and not args.no_barrier
                steps = args.solo_steps if len(names) == 1 and args.solo_steps else args.steps
                spec = TrainSpec(model=model, total_steps=steps_total + steps, data=DataSource(),
                                 checkpoint_dir=checkpoint_dir, warmup_steps=args.warmup_steps,
                                 start_barrier=barrier)
                if shared is not None:
                    result = run_in_subprocess(spec, shared.addresses.subset(names), timeout_s=1800, plane=shared.plane)
                else:
                    with launch_cluster([inventory.device(n) for n in names], inventory.parameter_server_host,
                                        wait=False) as launched:
                        result = run_in_subprocess(spec, launched.addresses, timeout_s=1800, ready=launched.wait_ready,
                                                   plane=launched.plane)
                steps_total = result.steps_total
                write_run(out_dir / file_name, result, devices=names, barrier=barrier,
                          shared_servers=args.shared_servers, workers_used_before=used)
                report(label + (f" (workers that trained before: {'+'.join(used)})" if used else ""),
                       result, barrier, args.bin_s)
    finally:
        for recorder in recorders:
            recorder.stop()
        for client in clients:
            client.close()


def report(label: str, result: Any, barrier: bool, bin_s: float) -> None:
    start_s = free_start_s(result, barrier)
    rates = result.worker_steps_per_s()
    print(f"{label} ({'barrier' if barrier else 'no barrier'}): {result.steps_applied} steps in {result.time_s:.1f} s, "
          f"free from {start_s - result.start_wall_s:.1f} s; mean step duration per {bin_s:g} s bin (ms):")
    for worker in sorted(rates, key=lambda w: -rates[w]):
        cells = " ".join(
            "  -" if d is None else f"{1000 * d:3.0f}" for d in duration_bins(result, worker, start_s, bin_s)
        )
        print(f"  {worker:<14} {rates[worker]:6.2f} steps/s | {cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="server,jetson-tx2,phone", help="the emulated fleet (catalog names)")
    parser.add_argument("--runs", required=True, help="configurations to train in turn, e.g. server,server+phone")
    parser.add_argument("--steps", type=int, default=600, help="steps per run")
    parser.add_argument("--solo-steps", type=int, default=0, help="steps of a run of one device (0: --steps)")
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--input-shape", default="32x32x3")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--warmup-steps", type=int, default=3, help="a set's barrier rounds (one step per member each)")
    parser.add_argument("--no-barrier", action="store_true", help="start sets as trainings do, without the barrier")
    parser.add_argument(
        "--power-hz", type=float, default=0.0, help="stream power from every agent at this rate (0: none)"
    )
    parser.add_argument("--shared-servers", action="store_true",
                        help="launch the TF servers of every device the runs name once; each run is a new "
                             "client naming its devices' servers (as pre-training runs), not a fresh launch")
    parser.add_argument("--bin-s", type=float, default=3.0)
    parser.add_argument("--pretrain-total-steps", type=int, default=0,
                        help="first run the pre-training of a job of this many steps (10 steps per run)")
    parser.add_argument("--out-dir", type=Path)
    args = parser.parse_args(argv)
    devices = args.devices.split(",")
    unknown = [n for label in args.runs.split(",") for n in label.split("+") if n not in devices]
    if unknown or args.steps < 1 or args.solo_steps < 0:
        parser.error(f"devices {unknown} are not in --devices" if unknown
                     else "--steps must be positive, --solo-steps not negative")
    name = (f"{args.model}-{f'pretrain{args.pretrain_total_steps}-' if args.pretrain_total_steps else ''}"
            f"{args.runs.replace(',', '_')}{'-nobarrier' if args.no_barrier else ''}"
            f"{'-sharedservers' if args.shared_servers else ''}")
    out_dir = args.out_dir or RESULTS / "step_stamps" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "machine.json", {"before": machine_info(), "command": sys.argv})
    with emulated_fleet(Path(tempfile.gettempdir()) / "hetcluster-step-stamps", devices,
                        name="stepstamps") as inventory:
        if args.pretrain_total_steps > 0:
            run_pretraining_phase(inventory, args, out_dir)
        run_configurations(inventory, args, out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
