"""Shaped networking: each emulated device in its own network namespace behind a shaped veth.

Layout of one cluster (root only; traffic never leaves this machine)::

    host namespace                         namespace hc-<cluster>-<device>
    bridge hc<tag>br 10.213.N.1/24 ── veth hc<tag><i>h ═══ hc<tag><i>d 10.213.N.<i+2>/24

The host ends of all veths hang on one bridge, so the coordinator (host namespace) reaches every
agent and TF server at its namespace address and devices reach each other at layer 2 — no IP
forwarding sysctl is touched. One private /24 per cluster (not per device) follows from the
bridge. Each direction is shaped where it leaves a veth: the device end's egress is the device's
upload, the host end's egress its download, so device-to-device traffic crosses both links like
a switch would. A tbf qdisc caps the rate; a netem qdisc above it adds half the round-trip
latency per direction where the kernel has sch_netem (without it the link is rate-shaped only,
and ``DeviceLink.latency_applied`` says so).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import shutil
import subprocess
from dataclasses import asdict, dataclass, field, replace

from hetcluster.errors import EmulationError

log = logging.getLogger(__name__)

SUBNET_PREFIX = "10.213"


@dataclass(frozen=True)
class DeviceLink:
    """The namespace, veth pair and address of one device, and how its link is shaped."""

    device: str
    netns: str
    veth_host: str
    veth_device: str
    address: str
    bandwidth_mbit_per_s: float
    latency_ms: float
    latency_applied: bool = False  # False where the kernel lacks sch_netem


@dataclass
class ShapedNetwork:
    """What `create_network` made; recorded in the cluster state so `down` removes exactly it."""

    cluster: str
    bridge: str
    host_address: str
    prefix_len: int = 24
    links: list[DeviceLink] = field(default_factory=list)

    def link(self, device: str) -> DeviceLink:
        for link in self.links:
            if link.device == device:
                return link
        raise EmulationError(f"no shaped link for device {device!r}.", hint="recreate the cluster.")

    def to_state(self) -> dict:
        return {"cluster": self.cluster, "bridge": self.bridge, "host_address": self.host_address,
                "prefix_len": self.prefix_len, "links": [asdict(link) for link in self.links]}

    @classmethod
    def from_state(cls, data: dict) -> "ShapedNetwork":
        return cls(data["cluster"], data["bridge"], data["host_address"], int(data.get("prefix_len", 24)),
                   [DeviceLink(**link) for link in data.get("links", [])])


def require_tools() -> None:
    """Raise a clear error unless we are root with `ip` and `tc` available."""
    import os

    if os.geteuid() != 0:
        raise EmulationError("--network shaped needs root (network namespaces, veth, tc).",
                             hint="run as root, or use --network loopback.")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise EmulationError(f"--network shaped needs {' and '.join(missing)} (iproute2).",
                             hint="install iproute2, or use --network loopback.")


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ip/tc command; failures become EmulationError with the command's own message."""
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise EmulationError(
            f"`{' '.join(args)}` failed: {result.stderr.strip() or result.returncode}.",
            hint="check that iproute2 works here (root, kernel modules veth, bridge, sch_netem, sch_tbf).",
        )
    return result


def names_for(cluster: str, state_key: str) -> tuple[str, str]:
    """A 4-hex tag (interface names are limited to 15 characters) and the bridge name."""
    tag = hashlib.sha1(f"{cluster}:{state_key}".encode()).hexdigest()[:4]
    return tag, f"hc{tag}br"


def netns_name(cluster: str, device: str) -> str:
    return f"hc-{cluster}-{device}"


def _free_subnet(tag: str) -> ipaddress.IPv4Network:
    """A 10.213.N.0/24 no interface of the host namespace uses yet (starting from the tag's hash)."""
    used = run("ip", "-4", "-o", "addr", "show").stdout
    start = int(tag, 16) % 250
    for offset in range(250):
        subnet = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{(start + offset) % 250 + 1}.0/24")
        if f" {str(subnet.network_address)[:-1]}" not in used:  # " 10.213.N." appears in no address
            return subnet
    raise EmulationError(f"no free /24 left in {SUBNET_PREFIX}.0.0/16.", hint="take down other emulated clusters.")


def create_network(cluster: str, state_key: str, devices: list[tuple[str, float, float]]) -> ShapedNetwork:
    """Make the bridge, one namespace + shaped veth per (device, mbit/s, rtt ms); undo all on failure."""
    require_tools()
    tag, bridge = names_for(cluster, state_key)
    subnet = _free_subnet(tag)
    hosts = list(subnet.hosts())
    network = ShapedNetwork(cluster, bridge, str(hosts[0]), subnet.prefixlen)
    try:
        run("ip", "link", "add", bridge, "type", "bridge")
        run("ip", "addr", "add", f"{hosts[0]}/{subnet.prefixlen}", "dev", bridge)
        run("ip", "link", "set", bridge, "up")
        for index, (device, mbit, rtt_ms) in enumerate(devices):
            link = DeviceLink(device, netns_name(cluster, device), f"hc{tag}{index}h", f"hc{tag}{index}d",
                              str(hosts[index + 1]), mbit, rtt_ms)
            run("ip", "netns", "add", link.netns)
            network.links.append(link)
            run(
                "ip",
                "link",
                "add",
                link.veth_host,
                "type",
                "veth",
                "peer",
                "name",
                link.veth_device,
                "netns",
                link.netns,
            )
            run("ip", "link", "set", link.veth_host, "master", bridge)
            run("ip", "link", "set", link.veth_host, "up")
            run("ip", "-n", link.netns, "link", "set", "lo", "up")
            run("ip", "-n", link.netns, "addr", "add", f"{link.address}/{subnet.prefixlen}", "dev", link.veth_device)
            run("ip", "-n", link.netns, "link", "set", link.veth_device, "up")
            delayed = shape(link.veth_host, mbit, rtt_ms / 2.0)
            delayed = shape(link.veth_device, mbit, rtt_ms / 2.0, netns=link.netns) and delayed
            network.links[-1] = link = replace(link, latency_applied=delayed)
            log.info("device %s: netns %s at %s, %g Mbit/s, %g ms rtt", device, link.netns, link.address, mbit, rtt_ms)
    except BaseException:
        remove_network(network)
        raise
    if any(not link.latency_applied and link.latency_ms > 0 for link in network.links):
        log.warning("this kernel has no tc netem (sch_netem): links are rate-shaped but their latency is not emulated")
    return network


def shape(dev: str, mbit_per_s: float, delay_ms: float, netns: str | None = None) -> bool:
    """Cap the egress rate of ``dev`` with tbf, under a netem delay where the kernel has netem.

    Returns whether the delay was applied: kernels built without sch_netem (some VM kernels) can
    only shape the rate, and the caller records that the latency is not emulated.
    """
    prefix = ["ip", "netns", "exec", netns] if netns else []
    rate_bytes_per_s = mbit_per_s * 1e6 / 8.0
    # The bucket must hold at least one GSO super-packet (64 KiB) and ~5 ms of traffic at the rate.
    burst_bytes = int(max(128 * 1024, rate_bytes_per_s * 0.005))
    tbf = ["tbf", "rate", f"{int(mbit_per_s * 1000)}kbit", "burst", str(burst_bytes), "latency", "100ms"]
    delayed = delay_ms > 0 and run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                                   "delay", f"{delay_ms:.3f}ms", "limit", "100000", check=False).returncode == 0
    if delayed:
        run(*prefix, "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
    else:
        if delay_ms > 0:
            log.debug("tc netem is unavailable: %s gets a rate cap but no added latency", dev)
        run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "10:", *tbf)
    return delayed


def remove_network(network: ShapedNetwork) -> list[str]:
    """Delete the namespaces (their veths go with them) and the bridge; return what is left."""
    left: list[str] = []
    for link in network.links:
        run("ip", "netns", "del", link.netns, check=False)
        run("ip", "link", "del", link.veth_host, check=False)  # normally gone with its peer
        if link.netns in list_netns():
            left.append(f"netns {link.netns}")
    run("ip", "link", "del", network.bridge, check=False)
    if run("ip", "link", "show", network.bridge, check=False).returncode == 0:
        left.append(f"bridge {network.bridge}")
    return left


def exec_prefix(netns: str) -> tuple[list[str], bool]:
    """The command prefix that runs a program inside ``netns`` with the same PID (both exec).

    Returns (prefix, host_sys_visible). `nsenter --net` only switches the network namespace;
    `ip netns exec` also remounts /sys for it, which hides /sys/fs/cgroup from the program (the
    agent then measures its CPU over its process tree instead of its cgroup).
    """
    if shutil.which("nsenter"):
        return ["nsenter", f"--net=/var/run/netns/{netns}"], True
    return ["ip", "netns", "exec", netns], False


def list_netns() -> set[str]:
    result = run("ip", "netns", "list", check=False)
    return {line.split()[0] for line in result.stdout.splitlines() if line.strip()}


__all__ = ["DeviceLink", "ShapedNetwork", "create_network", "exec_prefix", "list_netns", "names_for", "netns_name",
           "remove_network", "require_tools", "shape"]
