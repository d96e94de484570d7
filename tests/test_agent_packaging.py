"""agents/: the unit verifies, the example config parses, install.sh --dry-run changes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hetcluster.agent.config import load_config

AGENTS = Path(__file__).resolve().parent.parent / "agents"


def unit_directives() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (AGENTS / "hetcluster-agent.service").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_unit_has_notify_watchdog_and_hardening():
    unit = unit_directives()
    assert unit["Type"] == ["notify"] and unit["WatchdogSec"] == ["30"] and unit["Restart"] == ["on-failure"]
    assert unit["User"] == ["hetcluster"] and unit["Group"] == ["hetcluster"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert unit[key] == ["yes"], key
    assert unit["ProtectSystem"] == ["strict"] and unit["ReadWritePaths"] == ["/var/lib/hetcluster"]
    assert "PrivateDevices" not in unit  # it would hide the GPUs
    assert any(v.startswith("char-nvidia") for v in unit["DeviceAllow"])
    assert any("nvhost" in v for v in unit["DeviceAllow"])
    assert "agent serve --config /etc/hetcluster/agent.toml" in unit["ExecStart"][0]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    unit = (AGENTS / "hetcluster-agent.service").read_text().replace("/opt/hetcluster/venv/bin/hetcluster", "/bin/true")
    path = tmp_path / "hetcluster-agent.service"
    path.write_text(unit)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60
    )
    assert "Unknown" not in result.stderr and "Invalid" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr


def test_example_config_parses():
    config = load_config(AGENTS / "agent.toml")
    assert config.name and config.auth.mtls and config.auth.token_file == AGENTS / "token"


def test_rapl_rules_name_the_group_and_counter():
    rules = (AGENTS / "60-hetcluster-rapl.rules").read_text()
    assert 'SUBSYSTEM=="powercap"' in rules and "chgrp hetcluster" in rules and "energy_uj" in rules
    tmpfiles = (AGENTS / "hetcluster-rapl.tmpfiles.conf").read_text()
    assert "z /sys/class/powercap/intel-rapl:*/energy_uj 0440 root hetcluster" in tmpfiles


def test_install_dry_run_prints_steps_and_changes_nothing(tmp_path):
    prefix = tmp_path / "opt"
    result = subprocess.run(
        ["bash", str(AGENTS / "install.sh"), "--dry-run", "--prefix", str(prefix)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"+ {prefix}/venv/bin/python -m pip install --upgrade" in out
    assert "+ install -m 0644" in out and "/etc/systemd/system/hetcluster-agent.service" in out
    assert "/etc/udev/rules.d/60-hetcluster-rapl.rules" in out and "systemctl daemon-reload" in out
    assert not prefix.exists()
    bad = subprocess.run(["bash", str(AGENTS / "install.sh"), "--bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown option" in bad.stderr
