"""The sysfs entries of softnic's devices, as the kernel shows an RDMA device's.

Programs find a RoCE device's network interface under
``/sys/class/infiniband/<device>/device/net/<netdev>/`` (rdma-core's test suite does,
``tests/base.py``: it lists that directory, then asks ``ip addr show <netdev>`` for the
address its rdma_cm tests use).  For rxe that is the netdev it was added to; for a
softnic device it is the interface that carries the device's address: ``lo`` for a
loopback address (the default devices), else the interface whose address or subnet holds
it.

``softnic exec`` writes these entries into a directory of their own (``tree``) and names
it in ``SOFTNIC_SYSFS``; the preload (``preload.c``) answers a path under
``/sys/class/infiniband/`` that does not exist from there, so a host with real RDMA
devices keeps its own.  The directory is named by its content, so runs with the same
devices share one and nothing piles up.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from softnic.driver import config as _config

ENV = "SOFTNIC_SYSFS"


def _interfaces() -> list[tuple[str, str, int]]:
    """(interface, IP address, prefix length) of every IPv4 and IPv6 address of the host."""
    ip = shutil.which("ip")
    if ip is None:
        return []
    try:
        out = subprocess.run([ip, "-j", "addr", "show"], capture_output=True, text=True,
                             timeout=10).stdout
        rows = json.loads(out or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    return [(r["ifname"], a["local"], int(a.get("prefixlen", 32)))
            for r in rows for a in r.get("addr_info", []) if a.get("family") in ("inet", "inet6")]


def netdev_for(ip: str | None, interfaces: list[tuple[str, str, int]] | None = None) -> str | None:
    """The network interface that carries a device at ``ip`` (None: a free loopback
    address): the one with that address, else the one whose subnet holds it; ``lo`` for
    loopback."""
    if ip is None or ipaddress.ip_address(ip).is_loopback:
        return "lo"
    rows = _interfaces() if interfaces is None else interfaces
    addr = ipaddress.ip_address(ip)
    for name, local, _ in rows:
        if ipaddress.ip_address(local) == addr:
            return name
    best, best_len = None, -1
    for name, local, plen in rows:
        if addr in ipaddress.ip_network(f"{local}/{plen}", strict=False) and plen > best_len:
            best, best_len = name, plen
    return best


def tree(cfg: _config.RuntimeConfig | None = None, base: Path | None = None) -> Path:
    """The directory standing for ``/sys/class/infiniband`` for the devices of ``cfg``."""
    cfg = _config.load() if cfg is None else cfg
    rows = _interfaces() if any(d.ip and not ipaddress.ip_address(d.ip).is_loopback
                                for d in cfg.devices) else []
    layout = {d.name: netdev_for(d.ip, rows) for d in cfg.devices}
    if base is None:
        from softnic.driver.hostfiles import stats_dir
        base = stats_dir()
    key = hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()[:12]
    dest = base / f"sysfs-{key}"
    if dest.is_dir():
        return dest
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".sysfs-", dir=base))
    for name, netdev in layout.items():
        dev = tmp / name / "device"
        (dev / "net").mkdir(parents=True)
        if netdev:
            (dev / "net" / netdev).mkdir()
        (tmp / name / "node_type").write_text("1: CA\n")
    try:
        os.rename(tmp, dest)
    except OSError:                         # another process made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
