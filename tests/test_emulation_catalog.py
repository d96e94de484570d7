"""The device catalog: built-in profiles are documented, user catalogs merge strictly, fleets must fit."""

import pytest

from hetcluster.emulation.catalog import DEFAULT_FLEET, check_fleet_fits, load_catalog
from hetcluster.errors import ConfigError, EmulationError

NUMBERS = ("compute_share", "memory_budget_bytes", "idle_w", "busy_w", "link_bandwidth_mbit_per_s", "link_latency_ms")


def test_builtin_catalog_has_the_five_kinds_each_number_with_a_rationale():
    catalog = load_catalog()
    assert set(DEFAULT_FLEET) <= set(catalog)
    assert len(catalog) >= 5
    for profile in catalog.values():
        assert set(profile.rationale) == set(NUMBERS), profile.name
        assert all(len(line) > 10 for line in profile.rationale.values())
        assert 0 < profile.compute_share <= 1.0
        assert profile.idle_w < profile.busy_w
    # The server is the fastest, the Pi the slowest, as on real hardware.
    shares = {name: catalog[name].compute_share for name in DEFAULT_FLEET}
    assert max(shares, key=shares.get) == "server" and min(shares, key=shares.get) == "rpi4"


def test_default_fleet_fits_two_cores_and_units_convert():
    catalog = load_catalog()
    assert check_fleet_fits(catalog.select(DEFAULT_FLEET), cores=2.0) == pytest.approx(2.0)
    rpi = catalog["rpi4"]
    assert rpi.link_bandwidth_bytes_per_s == pytest.approx(100e6 / 8)
    assert rpi.link_latency_s == pytest.approx(0.003)


def test_oversubscribed_fleet_is_refused_saying_by_how_much():
    catalog = load_catalog()
    with pytest.raises(EmulationError) as caught:
        check_fleet_fits(catalog.select(["server", "jetson-xavier", "jetson-tx2"]), cores=1.5)
    assert "oversubscribed by 0.2 cores" in str(caught.value)


def test_user_catalog_adds_and_overrides(tmp_path):
    extra = tmp_path / "my.toml"
    extra.write_text(
        "[profiles.rpi4]\ncompute_share = 0.1\n\n"
        "[profiles.rpi5]\ndescription = 'Pi 5'\ncompute_share = 0.3\nmemory_budget_bytes = 6442450944\n"
        "idle_w = 3.0\nbusy_w = 9.0\nlink_bandwidth_mbit_per_s = 1000\nlink_latency_ms = 0.3\n"
    )
    catalog = load_catalog(extra)
    assert catalog["rpi4"].compute_share == 0.1
    assert catalog["rpi4"].idle_w == 2.7  # untouched fields keep the built-in values
    assert catalog["rpi5"].memory_budget_bytes == 6 * 2**30
    assert [p.name for p in catalog.select(["rpi5", "server"])] == ["rpi5", "server"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[profiles.rpi4]\ncompute_shares = 0.1\n", "unknown key compute_shares"),
        ("[profiles.new]\ncompute_share = 0.1\n", "missing memory_budget_bytes"),
        ("[profiles.rpi4]\ncompute_share = 'fast'\n", "must be a non-negative number"),
        ("[profiles.rpi4]\nidle_w = 10.0\n", "busy_w 6.4 is below idle_w 10"),
        ("[devices.rpi4]\ncompute_share = 0.1\n", "unknown top-level key devices"),
        ("[profiles.rpi4]\n[profiles.rpi4.rationale]\nspeed = 'x'\n", "rationale for unknown field speed"),
    ],
)
def test_bad_user_catalog_is_a_clear_error(tmp_path, text, message):
    extra = tmp_path / "my.toml"
    extra.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_catalog(extra)
    assert message in str(caught.value)
    assert str(extra) in str(caught.value)


def test_unknown_device_name_lists_the_known_ones():
    with pytest.raises(ConfigError, match="no device profile 'toaster'.*server"):
        load_catalog().select(["toaster"])


@pytest.mark.parametrize(
    "names", [["server", "rpi4", "rpi4", "rpi4"], ["server", "rpi4*3"], ["rpi4*2", "server", "rpi4"]]
)
def test_a_profile_named_more_than_once_is_that_many_numbered_identical_devices(names):
    chosen = load_catalog().select(names)
    rpi4 = load_catalog()["rpi4"]
    copies = [p for p in chosen if p.name != "server"]
    assert [p.name for p in copies] == ["rpi4-1", "rpi4-2", "rpi4-3"]
    assert all(p.catalog_name == "rpi4" and p.compute_share == rpi4.compute_share for p in copies)
    assert [p.catalog_name for p in chosen if p.name == "server"] == ["server"]


@pytest.mark.parametrize(
    "names, message",
    [
        (["rpi4*0"], "needs a count of 1 or more"),
        (["rpi4*x"], "needs a count of 1 or more"),
        (["toaster*2"], "no device profile 'toaster'"),
    ],
)
def test_bad_device_counts_are_clear_errors(names, message):
    with pytest.raises(ConfigError, match=message):
        load_catalog().select(names)


def test_a_numbered_copy_may_not_take_the_name_of_another_profile(tmp_path):
    extra = tmp_path / "my.toml"
    extra.write_text("[profiles.rpi4-1]\ncompute_share = 0.1\nmemory_budget_bytes = 1\nidle_w = 1\nbusy_w = 2\n"
                     "link_bandwidth_mbit_per_s = 100\nlink_latency_ms = 1\n")
    with pytest.raises(ConfigError, match="'rpi4-1' would stand for two devices"):
        load_catalog(extra).select(["rpi4-1", "rpi4", "rpi4"])
