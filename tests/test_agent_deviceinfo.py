"""Device facts from fake /proc and /etc trees: x86, Raspberry Pi, Jetson."""

from importlib import metadata
from pathlib import Path

from hetcluster.agent.config import AgentConfig
from hetcluster.agent.deviceinfo import collect_device_info, cpu_model, is_tegra, resolve_device_kind
from hetcluster.agent.messages import AcceleratorInfo, DeviceInfo


def installed_tensorflow() -> str:
    """The version pip installed here ("2.20.0" in CI; "" on a host that runs only the agent, such
    as the GPU machine the NVML benchmark ran on)."""
    try:
        return metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        return ""


def write(root: Path, relative: str, content) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def test_cpu_model_x86_pi_and_device_tree(tmp_path):
    x86, pi, jetson = tmp_path / "x86", tmp_path / "pi", tmp_path / "jetson"
    write(x86, "proc/cpuinfo", "processor\t: 0\nmodel name\t: AMD EPYC 7B13\n")
    write(
        pi,
        "proc/cpuinfo",
        "processor\t: 0\nBogoMIPS\t: 108.00\n\nHardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n",
    )
    write(jetson, "proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 38.40\n")
    write(jetson, "proc/device-tree/model", b"NVIDIA Jetson Nano Developer Kit\x00")
    write(jetson, "proc/device-tree/compatible", b"nvidia,p3450-0000\x00nvidia,tegra210\x00")
    assert cpu_model(x86) == "AMD EPYC 7B13"
    assert cpu_model(pi) == "Raspberry Pi 4 Model B Rev 1.4"
    assert cpu_model(jetson) == "NVIDIA Jetson Nano Developer Kit"
    assert is_tegra(jetson) and not is_tegra(pi)


def test_device_kind_resolution(tmp_path):
    gpu = [AcceleratorInfo("nvidia", "H100", 0, "GPU-1", 80 * 2**30)]
    write(tmp_path / "tegra", "etc/nv_tegra_release", "# R32 (release)\n")
    assert resolve_device_kind("auto", [], tmp_path) == "cpu"
    assert resolve_device_kind("auto", gpu, tmp_path) == "discrete-gpu"
    assert resolve_device_kind("auto", [], tmp_path / "tegra") == "unified"
    assert resolve_device_kind("cpu", gpu, tmp_path) == "cpu"


def test_collect_and_round_trip_through_proto(tmp_path):
    write(tmp_path, "proc/cpuinfo", "model name\t: Test CPU\n")
    config = AgentConfig.from_mapping(
        {"agent": {"name": "emu", "memory_budget_bytes": 2**30}, "auth": {"token_file": "t"},
         "power": {"idle_w": 1.0, "busy_w": 2.0}, "emulation": {"compute_share": 0.5}},
        tmp_path,
    )
    info = collect_device_info(config, "model", root=tmp_path, probe_hardware=False)
    assert info.cpu_model == "Test CPU" and info.emulated and info.compute_share == 0.5
    assert info.memory_budget_bytes == 2**30 and info.device_kind == "cpu"
    assert info.tensorflow_version == installed_tensorflow()
    assert DeviceInfo.from_proto(info.to_proto()) == info


def test_probe_results_become_dataclasses_and_failures_yield_nothing(tmp_path, monkeypatch):
    import hetcluster.power as power
    from hetcluster.errors import PowerSourceError

    gpu = {"vendor": "nvidia", "name": "NVIDIA H100", "index": 0, "uuid": "GPU-x", "memory_bytes": 80 * 2**30}
    monkeypatch.setattr(power, "list_nvidia_accelerators", lambda: [gpu])
    config = AgentConfig.from_mapping({"agent": {"name": "g"}, "auth": {"token_file": "t"}}, tmp_path)
    info = collect_device_info(config, "nvml", root=tmp_path)
    assert info.accelerators == (AcceleratorInfo(**gpu),) and info.device_kind == "discrete-gpu"
    assert any(s.name == "model" for s in info.power_sources)

    def broken():
        raise PowerSourceError("NVML exploded.")

    monkeypatch.setattr(power, "list_nvidia_accelerators", broken)
    assert collect_device_info(config, "model", root=tmp_path).accelerators == ()
