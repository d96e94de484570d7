"""Inventory parsing: valid files round-trip; every kind of mistake is one clear ConfigError."""

from pathlib import Path

import pytest

from hetcluster.errors import ConfigError
from hetcluster.inventory import DeviceEntry, Inventory, load_inventory, write_inventory

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "real-fleet.toml"


def _creds(tmp_path: Path) -> Path:
    creds = tmp_path / "creds"
    creds.mkdir()
    for name in ("token", "ca.crt", "client.crt", "client.key"):
        (creds / name).write_text("x")
    return creds


def _write(tmp_path: Path, devices: str, cluster: str = 'name = "lab"\nnetwork = "real"\n') -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(f"[cluster]\n{cluster}\n{devices}")
    return path


GOOD = """
[[devices]]
name = "a"
address = "10.0.0.5:50051"
token_file = "creds/token"
ca_file = "creds/ca.crt"
cert_file = "creds/client.crt"
key_file = "creds/client.key"
server_name = "agent-a"
memory_budget_bytes = 4294967296
idle_power_counts = true
device_class = "jetson-nano"

[[devices]]
name = "b"
address = "[::1]:50052"
token_file = "creds/token"
"""


def test_valid_inventory_resolves_paths_relative_to_the_file(tmp_path):
    creds = _creds(tmp_path)
    inventory = load_inventory(_write(tmp_path, GOOD))
    assert inventory.names == ("a", "b")
    a = inventory.device("a")
    assert a.token_file == creds / "token" and a.key_file == creds / "client.key"
    assert a.server_name == "agent-a" and a.memory_budget_bytes == 4 * 2**30
    assert inventory.idle_counts(a) is True
    assert inventory.idle_counts(inventory.device("b")) is False  # cluster default
    assert inventory.device("b").host == "::1"
    assert inventory.parameter_server_host == "127.0.0.1"


def test_write_then_load_round_trips_with_relative_paths(tmp_path):
    _creds(tmp_path)
    original = load_inventory(_write(tmp_path, GOOD))
    out = tmp_path / "sub" / "copy.toml"
    write_inventory(original, out)
    assert "../creds/token" in out.read_text()
    again = load_inventory(out)
    assert again.devices == original.devices
    assert again.device("a").device_class == "jetson-nano" and again.device("b").device_class is None
    assert (again.name, again.network) == (original.name, original.network)


@pytest.mark.parametrize(
    "devices, cluster, message",
    [
        (
            '[[devices]]\nname = "a"\naddress = "h:1"\ntoken_file = "creds/token"\ncolour = "red"\n',
            None,
            "unknown key in device 'a': colour",
        ),
        ('[[devices]]\nname = "a"\ntoken_file = "creds/token"\n', None, "device 'a' has no address"),
        ('[[devices]]\nname = "a"\naddress = "nohostport"\ntoken_file = "creds/token"\n', None, "is not host:port"),
        ('[[devices]]\nname = "a"\naddress = "h:99999"\ntoken_file = "creds/token"\n', None, "out of range"),
        (
            '[[devices]]\nname = "a"\naddress = "h:1"\ntoken_file = "creds/token"\n'
            '[[devices]]\nname = "a"\naddress = "h:2"\ntoken_file = "creds/token"\n',
            None,
            "'a' appears twice",
        ),
        ('[[devices]]\nname = "a"\naddress = "h:1"\ntoken_file = "creds/missing"\n', None, "unreadable"),
        ('[[devices]]\nname = "a"\naddress = "h:1"\n', None, "has no credentials"),
        (
            '[[devices]]\nname = "a"\naddress = "h:1"\ncert_file = "creds/client.crt"\n',
            None,
            "only one of cert_file/key_file",
        ),
        (
            '[[devices]]\nname = "a"\naddress = "h:1"\ntoken_file = "creds/token"\n',
            'network = "wifi"',
            "cluster.network 'wifi'",
        ),
        (
            '[[devices]]\nname = "a"\naddress = "h:1"\ntoken_file = "creds/token"\n',
            "speed = 3",
            "unknown key in [cluster]: speed",
        ),
        (
            '[[devices]]\nname = "a"\naddress = "h:1"\ntoken_file = "creds/token"\ndevice_class = 3\n',
            None,
            "device 'a': device_class must be a string",
        ),
        ("", None, "lists no devices"),
    ],
)
def test_invalid_inventory_is_one_clear_error(tmp_path, devices, cluster, message):
    _creds(tmp_path)
    path = _write(tmp_path, devices, cluster or 'name = "lab"')
    with pytest.raises(ConfigError) as caught:
        load_inventory(path)
    text = str(caught.value)
    assert message in text
    assert str(path) in text  # names the file
    assert "\n" not in text


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read inventory"):
        load_inventory(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_inventory(bad)


def test_client_is_built_from_the_entry(tmp_path):
    creds = _creds(tmp_path)
    entry = DeviceEntry(name="a", address="127.0.0.1:1", token_file=creds / "token")
    client = entry.client(timeout_s=0.5)
    try:
        assert client.address == "127.0.0.1:1"
        assert client.health() is False  # nothing listens there
    finally:
        client.close()


def test_example_real_fleet_parses_once_its_credentials_exist(tmp_path):
    text = EXAMPLE.read_text()
    target = tmp_path / "real-fleet.toml"
    target.write_text(text)
    creds = tmp_path / "creds"
    creds.mkdir()
    import tomllib

    for device in tomllib.loads(text)["devices"]:
        for key in ("token_file", "ca_file", "cert_file", "key_file"):
            if key in device:
                (tmp_path / device[key]).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / device[key]).write_text("x")
    inventory = load_inventory(target)
    assert isinstance(inventory, Inventory)
    assert len(inventory.devices) == 5
    assert inventory.network == "real"
