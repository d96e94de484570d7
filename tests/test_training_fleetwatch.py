"""FleetWatcher on a real inventory file, its health checks replaced by a table the test sets:
devices leave (agent down, or taken out of the file) and join (added, or answering again)."""

from __future__ import annotations

import os

from hetcluster.inventory import load_inventory
from hetcluster.training.fleetwatch import FleetWatcher


def _write(path, names):
    (path.parent / "token").write_text("t" * 32)
    lines = ['[cluster]', 'name = "w"', 'network = "loopback"', ""]
    for port, name in enumerate(names, start=50001):
        lines += ["[[devices]]", f'name = "{name}"', f'address = "127.0.0.1:{port}"', 'token_file = "token"', ""]
    path.write_text("\n".join(lines))
    stat = path.stat()   # a rewrite within the file system's timestamp granularity still reads as new
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000 * (len(names) + 1)))


def test_leaving_and_joining_devices_are_reported_once_each(tmp_path):
    path = tmp_path / "cluster.toml"
    _write(path, ["a", "b", "c"])
    down = {"c": "its agent at 127.0.0.1:50003 does not answer"}
    asked = []

    def check(inventory, names, timeout_s):
        asked.append(tuple(names))
        return {n: r for n, r in down.items() if n in names}

    watcher = FleetWatcher(load_inventory(path, check_credentials=False), ["a", "b"], check=check)
    assert watcher.poll() == []
    down["b"] = "its agent at 127.0.0.1:50002 does not answer"
    assert watcher.poll() == []                 # one missed check is no departure
    [left] = watcher.poll()
    assert (left.kind, left.device, left.reason) == ("left", "b", down["b"])
    assert watcher.poll() == []                 # reported once, not on every poll
    del down["c"]
    [joined] = watcher.poll()
    assert (joined.kind, joined.device, joined.reason) == ("joined", "c", "its agent answers again")
    _write(path, ["a", "c", "d"])             # b taken out, d added
    changes = watcher.poll()
    assert [(c.kind, c.device, c.reason) for c in changes] == [("joined", "d", "added to the inventory")]
    assert asked[-1] == ("a", "c", "d") and watcher.up == ["a", "c", "d"]
    _write(path, ["c", "d"])
    assert [(c.kind, c.device, c.reason) for c in watcher.poll()] == [("left", "a", "taken out of the inventory")]


def test_an_unreadable_inventory_keeps_the_fleet_it_listed(tmp_path):
    path = tmp_path / "cluster.toml"
    _write(path, ["a", "b"])
    watcher = FleetWatcher(load_inventory(path, check_credentials=False), ["a", "b"], check=lambda *_: {})
    path.write_text("[[devices]\nbroken")
    assert watcher.poll() == [] and watcher.fleet.names == ("a", "b")
