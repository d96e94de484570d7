"""`hetcluster cluster up|add|remove|status|down`: the emulated fleet on this machine.

Thin: parses options, calls hetcluster.emulation, prints. Errors are HetclusterErrors, which
app.main() prints as one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

cluster_app = typer.Typer(
    help="Start, inspect and stop an emulated fleet of real agents on this machine.", no_args_is_help=True
)


def _gib(value: int) -> str:
    return f"{value / 2**30:.1f} GiB" if value else "-"


@cluster_app.command("up")
def up(
    devices: str = typer.Option(
        ",".join(("server", "jetson-xavier", "jetson-nano", "rpi4", "phone")),
        "--devices",
        help="Comma-separated catalog profiles, one agent each; rpi4*3 (or rpi4 three "
        "times) is three identical devices rpi4-1..3.",
    ),
    out: Path = typer.Option(Path("cluster.toml"), "--out", help="Inventory file to write."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="TOML file adding or overriding device profiles."),
    network: str = typer.Option("loopback", "--network", help="loopback, or shaped (root: netns + veth + tc)."),
    state_dir: Optional[Path] = typer.Option(
        None, "--state-dir", help="Where the cluster's state lives [$HETCLUSTER_STATE_DIR or ./.hetcluster]."
    ),
    name: str = typer.Option("emulated", "--name", help="Cluster name (cgroup and namespace names)."),
    slowdown: str = typer.Option(
        "auto", "--slowdown", help="auto (cgroup if writable, else duty cycle), cgroup or dutycycle."
    ),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="How long to wait for every agent to be healthy."),
    dev_allow_open_plane: bool = typer.Option(
        False,
        "--dev-allow-open-plane",
        hidden=True,
        help="Developer switch: agents accept a request for an open TF plane "
        "(tests and benchmarks compare against it).",
    ),
) -> None:
    """Start one agent per device, slowed to its compute share, and write the inventory."""
    from hetcluster.emulation.catalog import load_catalog
    from hetcluster.emulation.cluster import cluster_up

    names = [n.strip() for n in devices.split(",") if n.strip()]
    profiles = load_catalog(catalog).select(names)
    inventory = cluster_up(profiles, out, name=name, network=network, state_dir=state_dir, slowdown=slowdown,
                           health_timeout_s=timeout_s, allow_open_plane=dev_allow_open_plane)
    typer.echo(
        f"cluster {inventory.name!r} up: {len(inventory.devices)} devices ({inventory.network}); inventory {out}"
    )
    for device in inventory.devices:
        typer.echo(f"  {device.name:<16} {device.address}")


@cluster_app.command("status")
def status(
    inventory_path: Optional[Path] = typer.Option(None, "--inventory", help="Inventory [the running cluster's]."),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="State directory of the running cluster."),
    output_format: str = typer.Option("table", "--format", help="table or json."),
    timeout_s: float = typer.Option(5.0, "--timeout-s", help="Per-device timeout."),
) -> None:
    """Each device's address, health, live power (and its source), share and memory budget."""
    from hetcluster.emulation.state import default_state_dir, load_state
    from hetcluster.emulation.status import fleet_status
    from hetcluster.errors import ConfigError, EmulationError
    from hetcluster.inventory import load_inventory

    if output_format not in ("table", "json"):
        raise ConfigError(
            f"--format {output_format!r} is not table or json.", hint="pass --format table or --format json."
        )
    if inventory_path is None:
        state = load_state(Path(state_dir or default_state_dir()))
        if state is None:
            raise EmulationError("no emulated cluster is up here and no --inventory given.",
                                 hint="pass --inventory FILE, or start one with `hetcluster cluster up`.")
        inventory_path = Path(state.inventory_path)
    inventory = load_inventory(inventory_path)
    rows = fleet_status(inventory, timeout_s)
    if output_format == "json":
        typer.echo(json.dumps({"cluster": inventory.name, "network": inventory.network,
                               "devices": [row.to_dict() for row in rows]}, indent=2))
    else:
        from rich import box
        from rich.table import Table

        from hetcluster.cli.console import make_console

        table = Table(title=f"cluster {inventory.name} ({inventory.network})", box=box.SIMPLE_HEAD)
        for column in ("device", "address", "health", "power", "source", "share", "memory"):
            table.add_column(column, no_wrap=column != "health", min_width=6 if column == "health" else None)
        for row in rows:
            table.add_row(
                row.name,
                row.address,
                "ok" if row.healthy else f"DOWN {row.error}"[:60],
                f"{row.power_w:.2f} W" if row.power_w is not None else "-",
                row.power_source or "-",
                f"{row.compute_share:g}" if row.compute_share else "-",
                _gib(row.memory_budget_bytes),
            )
        make_console().print(table)
    if not all(row.healthy for row in rows):
        raise typer.Exit(1)


@cluster_app.command("add")
def add(
    devices: str = typer.Option(..., "--devices", help="Comma-separated catalog profiles to start, one agent each."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="TOML file adding or overriding device profiles."),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="State directory of the running cluster."),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="How long to wait for the new agents to be healthy."),
) -> None:
    """Start more devices in the running fleet and add them to its inventory (a job training with
    --elastic sees them join)."""
    from hetcluster.emulation.catalog import load_catalog
    from hetcluster.emulation.cluster import cluster_add

    names = [n.strip() for n in devices.split(",") if n.strip()]
    profiles = load_catalog(catalog).select(names)
    inventory = cluster_add(profiles, state_dir, health_timeout_s=timeout_s)
    added = inventory.devices[len(inventory.devices) - len(profiles):]
    typer.echo(f"cluster {inventory.name!r}: added {len(added)} devices; inventory {inventory.path}")
    for device in added:
        typer.echo(f"  {device.name:<16} {device.address}")


@cluster_app.command("remove")
def remove(
    device: List[str] = typer.Option(..., "--device", help="A device to stop and take out (repeatable)."),
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="State directory of the running cluster."),
    grace_s: float = typer.Option(10.0, "--grace-s", help="Seconds between SIGTERM and SIGKILL."),
) -> None:
    """Stop devices of the running fleet and take them out of its inventory (a job training with
    --elastic sees them leave)."""
    from hetcluster.emulation.cluster import cluster_remove

    report = cluster_remove(list(device), state_dir, grace_s)
    typer.echo(f"removed {', '.join(device)}: stopped {len(report.stopped_pids)} processes")
    if report.leftovers:
        typer.echo("could not remove: " + "; ".join(report.leftovers), err=True)
        raise typer.Exit(1)


@cluster_app.command("down")
def down(
    state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="State directory of the running cluster."),
    grace_s: float = typer.Option(10.0, "--grace-s", help="Seconds between SIGTERM and SIGKILL."),
) -> None:
    """Stop exactly the recorded processes; remove the cluster's cgroups, namespaces and state."""
    from hetcluster.emulation.cluster import cluster_down

    report = cluster_down(state_dir, grace_s)
    typer.echo(f"stopped {len(report.stopped_pids)} processes, removed {report.removed_cgroups} cgroup directories")
    if report.leftovers:
        typer.echo("could not remove: " + "; ".join(report.leftovers), err=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(cluster_app, name="cluster")
