"""`hetcluster agent serve|credentials|info`: run a device agent, make credentials, ask an agent.

Thin: parses options, calls hetcluster.agent, prints. grpc and the agent modules load inside the
commands so `hetcluster --help` stays fast.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional

import typer

agent_app = typer.Typer(help="Run a device agent, make its credentials, or ask one what it is.", no_args_is_help=True)


@agent_app.command("serve")
def serve(
    config: Path = typer.Option(..., "--config", "-c", help="agent.toml of this device."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    """Run the agent until SIGTERM/SIGINT (systemd Type=notify aware); stops its tasks on exit."""
    from hetcluster.agent.config import load_config
    from hetcluster.agent.server import serve as run_agent
    from hetcluster.errors import ConfigError

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise ConfigError(f"--log-level {log_level!r} is not a level.", hint="use debug, info, warning or error.")
    root = logging.getLogger()
    root.setLevel(min(level, root.level) if root.handlers else level)
    if not root.handlers:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in root.handlers:
        handler.setLevel(level)
    logging.getLogger("hetcluster").setLevel(level)
    run_agent(load_config(config))


@agent_app.command("credentials")
def credentials(
    out: Path = typer.Option(..., "--out", help="Folder to write ca.crt, server.crt/key, client.crt/key, token."),
    host: Optional[List[str]] = typer.Option(
        None, "--host", help="Name or IP the agent is reached at (repeat); default 127.0.0.1 and localhost."
    ),
    days: int = typer.Option(365, "--days", help="Certificate lifetime in days."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Make throwaway credentials: a CA, a server and a client certificate, and a bearer token."""
    from hetcluster.agent.credentials import DEFAULT_HOSTS, generate_credentials

    paths = generate_credentials(out, list(host) if host else list(DEFAULT_HOSTS), days, overwrite=force)
    typer.echo(f"wrote credentials to {out} (files are 0600):")
    for label, path in asdict(paths).items():
        typer.echo(f"  {label:<12} {path}")


@agent_app.command("info")
def info(
    address: str = typer.Option(..., "--address", "-a", help="host:port of the agent."),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="Bearer token file."),
    ca_file: Optional[Path] = typer.Option(
        None, "--ca-file", help="CA that signed the agent's certificate (enables TLS)."
    ),
    cert_file: Optional[Path] = typer.Option(None, "--cert-file", help="Client certificate (mTLS)."),
    key_file: Optional[Path] = typer.Option(None, "--key-file", help="Client key (mTLS)."),
    server_name: Optional[str] = typer.Option(
        None, "--server-name", help="Name to check the agent's certificate against."
    ),
    output_format: str = typer.Option("table", "--format", help="table or json."),
    timeout_s: float = typer.Option(10.0, "--timeout-s", help="Per-call timeout."),
) -> None:
    """Health, device facts and one live power sample of an agent."""
    from hetcluster.agent.client import AgentClient
    from hetcluster.errors import ConfigError

    if output_format not in ("table", "json"):
        raise ConfigError(
            f"--format {output_format!r} is not table or json.", hint="pass --format table or --format json."
        )
    with AgentClient(address, token_file=token_file, ca_file=ca_file, cert_file=cert_file, key_file=key_file,
                     server_name=server_name, timeout_s=timeout_s) as client:
        healthy = client.health()
        device = client.device_info()
        sample = next(iter(client.stream_power(max_samples=1)), None)
        tasks = client.task_status()
    if output_format == "json":
        typer.echo(json.dumps({
            "address": address, "healthy": healthy, "device": asdict(device),
            "power_sample": asdict(sample) if sample else None,
            "tasks": [{k: v for k, v in asdict(t).items() if k != "extra"} for t in tasks],
        }, indent=2))
        return
    _print_table(address, healthy, device, sample, tasks)


def _print_table(address: str, healthy: bool, device, sample, tasks) -> None:  # type: ignore[no-untyped-def]
    from rich.table import Table

    from hetcluster.cli.console import make_console

    table = Table(title=f"agent {device.device_name} at {address}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("health", "SERVING" if healthy else "NOT SERVING"),
        ("hostname", device.hostname),
        ("platform", f"{device.platform} ({device.architecture})"),
        ("cpu", f"{device.cpu_model} x{device.cpu_count}"),
        ("memory", f"{device.memory_bytes / 2**30:.1f} GiB"),
        ("device kind", device.device_kind),
        (
            "memory budget",
            f"{device.memory_budget_bytes / 2**30:.2f} GiB" if device.memory_budget_bytes else "no limit",
        ),
        (
            "accelerators",
            ", ".join(f"{a.name} ({a.memory_bytes / 2**30:.0f} GiB)" for a in device.accelerators) or "none",
        ),
        ("emulated", f"yes, {device.compute_share:g} core(s)" if device.emulated else "no"),
        ("versions", f"agent {device.agent_version}, TensorFlow {device.tensorflow_version or 'not installed'}"),
        (
            "power sources",
            ", ".join(f"{s.name}{'' if s.available else ' (unavailable)'}" for s in device.power_sources) or "-",
        ),
        ("active source", device.active_power_source),
    ]
    if sample is not None:
        kind = "measured" if sample.measured else f"modeled, utilization {sample.utilization:.2f}"
        rows.append(("power now", f"{sample.power_w:.2f} W ({sample.source}, {kind})"))
    rows.append(("tasks", ", ".join(f"{t.task_id}={t.state}" for t in tasks) or "none"))
    for key, value in rows:
        table.add_row(key, value)
    make_console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(agent_app, name="agent")
