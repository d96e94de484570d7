"""Shared by the `plan` and `profile` CLI tests: a profile recorded from the emulated cluster
(server, jetson-nano, rpi4; small_cnn, batch 32) and an inventory naming those devices with no
agent behind them (`plan` is given the profile, and the memory budget is in the inventory)."""

from __future__ import annotations

from pathlib import Path

PROFILE = Path(__file__).parent / "data" / "profiles" / "emulated_small_cnn_3dev.json"
DEVICES = ("server", "jetson-nano", "rpi4")


def write_inventory(folder: Path) -> Path:
    """cluster.toml in ``folder`` for DEVICES (loopback addresses, a token file and the training
    plane's TLS files, 3 GiB memory each)."""
    from hetcluster.agent.credentials import generate_credentials

    (folder / "token").write_text("t" * 32)
    generate_credentials(folder / "creds")
    lines = ['[cluster]', 'name = "recorded"', 'network = "loopback"', ""]
    for port, name in enumerate(DEVICES, start=50001):
        lines += ["[[devices]]", f'name = "{name}"', f'address = "127.0.0.1:{port}"', 'token_file = "token"',
                  'ca_file = "creds/ca.crt"', 'cert_file = "creds/client.crt"', 'key_file = "creds/client.key"',
                  "memory_budget_bytes = 3221225472", ""]
    path = folder / "cluster.toml"
    path.write_text("\n".join(lines))
    return path
