"""Raspberry Pi 5 PMIC: the parser on recorded ``vcgencmd pmic_read_adc`` output."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetcluster.errors import PowerSourceError
from hetcluster.power import pi5
from hetcluster.power.pi5 import Pi5PowerSource, parse_pmic_adc, total_power_w

RECORDED = Path(__file__).parent / "data/power/pi5_pmic_read_adc.txt"


def recorded_text() -> str:
    return RECORDED.read_text()


def test_parser_pairs_currents_with_voltages_by_rail() -> None:
    rails = parse_pmic_adc(recorded_text())
    assert len(rails) == 12
    assert rails["VDD_CORE"] == (pytest.approx(0.885), pytest.approx(2.529))
    assert rails["HDMI"] == (pytest.approx(5.157516), pytest.approx(0.0235653))
    assert "EXT5V" not in rails and "BATT" not in rails  # voltage only: nothing to multiply


def test_total_power_is_sum_of_v_times_i() -> None:
    rails = parse_pmic_adc(recorded_text())
    expected = sum(v * a for v, a in rails.values())
    assert total_power_w(rails) == pytest.approx(expected)
    # The core rail alone is 0.885 V × 2.529 A; summed by hand over the 12 rails: 3.7886 W.
    assert 0.885 * 2.529 < total_power_w(rails) == pytest.approx(3.7886, abs=1e-3)


def test_parser_ignores_noise_and_unpaired_lines() -> None:
    text = ("error=0\n  VDD_CORE_A current(7)=1.00000000A\nrandom line\n  VDD_CORE_V volt(15)=0.80000000V\n"
            "  X_A current(1)=3A\n")
    assert parse_pmic_adc(text) == {"VDD_CORE": (0.8, 1.0)}


def test_source_runs_the_command_each_read() -> None:
    calls: list[list[str]] = []
    outputs = [recorded_text(), recorded_text(), "  VDD_CORE_A current(7)=2.0A\n  VDD_CORE_V volt(15)=1.0V\n"]

    def runner(argv: list[str]) -> str:
        calls.append(argv)
        return outputs[len(calls) - 1]

    source = Pi5PowerSource(runner)
    assert source.read().power_w == pytest.approx(3.7886, abs=1e-3)
    sample = source.read()
    assert sample.power_w == pytest.approx(2.0)
    assert sample.source == "pi5_pmic" and sample.measured
    assert calls == [["vcgencmd", "pmic_read_adc"]] * 3


def test_missing_vcgencmd_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(PowerSourceError, match="vcgencmd is not installed") as caught:
        Pi5PowerSource()
    assert "libraspberrypi-bin" in str(caught.value)


def test_output_without_rails_is_refused() -> None:
    with pytest.raises(PowerSourceError, match="no current/voltage pairs"):
        Pi5PowerSource(lambda argv: "Command not registered\n")


def test_probe_needs_a_pi5_device_tree(tmp_path: Path) -> None:
    assert not pi5.probe(tmp_path, lambda argv: recorded_text()).available
    model = tmp_path / "proc/device-tree/model"
    model.parent.mkdir(parents=True)
    model.write_text("Raspberry Pi 5 Model B Rev 1.0\x00")
    availability = pi5.probe(tmp_path, lambda argv: recorded_text())
    assert availability.available and "12 rails" in availability.detail

    def failing(argv: list[str]) -> str:
        raise PowerSourceError("vcgencmd is not installed or not on PATH.")

    missing = pi5.probe(tmp_path, failing)
    assert not missing.available and "vcgencmd" in missing.detail
