"""agent.toml parsing: the shared format, relative paths, and clear errors for bad input."""

from pathlib import Path

import pytest

from hetcluster.agent.config import AgentConfig, load_config, split_host_port, write_config
from hetcluster.errors import ConfigError

FULL = """
[agent]
name = "jetson-nano-1"
listen = "0.0.0.0:0"
port_file = "run/port"
device_kind = "unified"
memory_budget_bytes = 4294967296
state_dir = "state"
[auth]
token_file = "token"
cert_file = "server.crt"
key_file = "server.key"
client_ca_file = "/etc/hetcluster/ca.crt"
[power]
source = "model"
idle_w = 3.0
busy_w = 10.0
[emulation]
compute_share = 0.25
cgroup_dir = "/sys/fs/cgroup/hetcluster/dev"
task_cgroup_procs = ["/sys/fs/cgroup/hetcluster/dev/cgroup.procs", "procs"]
"""


def test_full_file_parses_and_resolves_relative_paths(tmp_path: Path):
    path = tmp_path / "agent.toml"
    path.write_text(FULL)
    config = load_config(path)
    assert config.name == "jetson-nano-1"
    assert config.listen_port == 0
    assert config.port_file == tmp_path / "run/port"
    assert config.state_dir == tmp_path / "state"
    assert config.auth.token_file == tmp_path / "token"
    assert config.auth.client_ca_file == Path("/etc/hetcluster/ca.crt")
    assert config.auth.mtls and config.auth.tls
    assert config.memory_budget_bytes == 4 * 2**30
    assert config.power == {"source": "model", "idle_w": 3.0, "busy_w": 10.0}
    assert config.emulation is not None and config.emulation.compute_share == 0.25
    assert config.emulation.task_cgroup_procs == (
        Path("/sys/fs/cgroup/hetcluster/dev/cgroup.procs"),
        tmp_path / "procs",
    )
    assert config.emulated


def test_minimal_token_only_config(tmp_path: Path):
    config = AgentConfig.from_mapping(
        {"agent": {"name": "a", "listen": "127.0.0.1:5"}, "auth": {"token_file": "t"}}, tmp_path
    )
    assert config.device_kind == "auto" and not config.emulated and not config.auth.tls
    assert config.task_host() == "127.0.0.1"


@pytest.mark.parametrize(
    "document, needle",
    [
        ({"agent": {"name": "a", "colour": 1}, "auth": {"token_file": "t"}}, "colour"),
        ({"agent": {"name": "a"}, "auth": {"token_file": "t"}, "extra": {}}, "extra"),
        ({"agent": {"name": ""}, "auth": {"token_file": "t"}}, "agent.name"),
        ({"agent": {"name": "a", "listen": "nohost"}, "auth": {"token_file": "t"}}, "host:port"),
        ({"agent": {"name": "a", "listen": "h:99999"}, "auth": {"token_file": "t"}}, "out of range"),
        ({"agent": {"name": "a", "device_kind": "tpu"}, "auth": {"token_file": "t"}}, "device_kind"),
        ({"agent": {"name": "a", "memory_budget_bytes": -1}, "auth": {"token_file": "t"}}, "memory_budget_bytes"),
        ({"agent": {"name": "a"}, "auth": {}}, "no credentials"),
        ({"agent": {"name": "a"}, "auth": {"cert_file": "c"}}, "together"),
        ({"agent": {"name": "a"}, "auth": {"token_file": "t", "client_ca_file": "ca"}}, "mTLS"),
        ({"agent": {"name": "a"}, "auth": {"token_file": "t"}, "emulation": {"compute_share": 0}}, "compute_share"),
        (
            {"agent": {"name": "a"}, "auth": {"token_file": "t"}, "emulation": {"task_cgroup_procs": "p"}},
            "task_cgroup_procs",
        ),
        (
            {"agent": {"name": "a"}, "auth": {"token_file": "t"}, "emulation": {"task_cgroup_procs": [""]}},
            "task_cgroup_procs",
        ),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, document, needle):
    with pytest.raises(ConfigError, match=needle):
        AgentConfig.from_mapping(document, tmp_path)


def test_invalid_toml_and_missing_file(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")


def test_write_config_round_trips(tmp_path: Path):
    document = {
        "agent": {"name": "emu-1", "listen": "127.0.0.1:0"},
        "auth": {"token_file": "token"},
        "power": {"source": "emulated", "idle_w": 2.0, "busy_w": 6.0},
        "emulation": {"compute_share": 0.5},
    }
    path = write_config(document, tmp_path / "sub" / "agent.toml")
    assert load_config(path).emulation.compute_share == 0.5


def test_split_host_port_ipv6():
    assert split_host_port("[::1]:50051") == ("::1", 50051)


def test_power_table_is_validated_and_emulation_fills_the_model(tmp_path: Path):
    base = {"agent": {"name": "a"}, "auth": {"token_file": "t"}}
    with pytest.raises(ConfigError, match="power"):
        AgentConfig.from_mapping({**base, "power": {"sauce": "x"}}, tmp_path)
    with pytest.raises(ConfigError, match="idle_w"):
        AgentConfig.from_mapping({**base, "power": {"source": "auto"}, "emulation": {"compute_share": 0.5}}, tmp_path)
    config = AgentConfig.from_mapping(
        {**base, "power": {"idle_w": 1.0, "busy_w": 4.0}, "emulation": {"compute_share": 0.5}}, tmp_path
    )
    power = config.power_config(root_pid=1234)
    assert (power.source, power.compute_share, power.root_pid) == ("emulated", 0.5, 1234)
