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
    """(interface, IPv4 address, prefix length) of every address of the host."""
    ip = shutil.which("ip")
    if ip is None:
        return []
    try:
        out = subprocess.run([ip, "-j", "-4", "addr", "show"], capture_output=True, text=True,
                             timeout=10).stdout
        rows = json.loads(out or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    return [(r["ifname"], a["local"], int(a.get("prefixlen", 32)))
            for r in rows for a in r.get("addr_info", []) if a.get("family") == "inet"]


def netdev_for(ip: str | None, interfaces: list[tuple[str, str, int]] | None = None) -> str | None:
    """The network interface that carries a device at ``ip`` (None: a free loopback
    address): the one with that address, else the one whose subnet holds it; ``lo`` for
    loopback."""
    if ip is None or ipaddress.IPv4Address(ip).is_loopback:
        return "lo"
    rows = _interfaces() if interfaces is None else interfaces
    for name, local, _ in rows:
        if local == ip:
            return name
    addr = ipaddress.IPv4Address(ip)
    best, best_len = None, -1
    for name, local, plen in rows:
        if addr in ipaddress.IPv4Network(f"{local}/{plen}", strict=False) and plen > best_len:
            best, best_len = name, plen
    return best


# The entries a tree holds besides each device's net/ (part of its name, so a tree written
# by an earlier layout is not taken for this one): ports/1/pkeys/0 (rdma-core 64's tests
# read the P_Key there).
_LAYOUT = 2


def tree(cfg: _config.RuntimeConfig | None = None, base: Path | None = None) -> Path:
    """The directory standing for ``/sys/class/infiniband`` for the devices of ``cfg``."""
    cfg = _config.load() if cfg is None else cfg
    rows = _interfaces() if any(d.ip and not ipaddress.IPv4Address(d.ip).is_loopback
                                for d in cfg.devices) else []
    layout = {d.name: netdev_for(d.ip, rows) for d in cfg.devices}
    if base is None:
        from softnic.driver.hostfiles import stats_dir
        base = stats_dir()
    key = hashlib.sha256(json.dumps([_LAYOUT, layout], sort_keys=True).encode()).hexdigest()[:12]
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
        pkeys = tmp / name / "ports" / "1" / "pkeys"      # one P_Key: the default
        pkeys.mkdir(parents=True)
        (pkeys / "0").write_text("0xffff\n")
    try:
        os.rename(tmp, dest)
    except OSError:                         # another process made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ``rdma link`` (iproute2) asks the kernel over RDMA netlink, which knows nothing of
# softnic's devices; rdma-core 64's tests find a device's netdev with ``rdma link show -j``.
# ``softnic exec`` puts this ``rdma`` first on PATH: ``rdma link [show] [DEV[/PORT]]`` lists
# the host's links (if it has any) and softnic's devices from the tree that SOFTNIC_SYSFS
# names (port 1, ACTIVE, LINK_UP, on the netdev of its device/net/), in iproute2's text or
# JSON (-j, -p); every other command is the host's rdma.
RDMA_TOOL = r"""#!/usr/bin/env python3
import json, os, shutil, socket, subprocess, sys


def host_rdma():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and os.path.abspath(p) != here)
    return shutil.which("rdma", path=path)


def softnic_links():
    top = os.environ.get("SOFTNIC_SYSFS", "")
    links = []
    for name in sorted(os.listdir(top)) if os.path.isdir(top) else []:
        net = os.path.join(top, name, "device", "net")
        netdevs = sorted(os.listdir(net)) if os.path.isdir(net) else []
        link = {"ifname": name, "port": 1, "state": "ACTIVE", "physical_state": "LINK_UP"}
        if netdevs:
            link["netdev"] = netdevs[0]
            try:
                link["netdev_index"] = socket.if_nametoindex(netdevs[0])
            except OSError:
                pass
        links.append(link)
    return links


def main(argv):
    opts = [a for a in argv if a.startswith("-")]
    words = [a for a in argv if not a.startswith("-")]
    real = host_rdma()
    if not words or not "link".startswith(words[0]) or len(words) > 3 or \
            (len(words) > 1 and words[1] not in ("show", "list")):
        if real is None:
            print("rdma: the host has no rdma tool (iproute2)", file=sys.stderr)
            return 127
        os.execv(real, [real] + argv)
    links = []
    if real is not None:
        r = subprocess.run([real, "-j", "link", "show"], capture_output=True, text=True)
        if r.returncode == 0:
            links = json.loads(r.stdout or "[]")
    first = max((link.get("ifindex", 0) for link in links), default=0) + 1
    links += [dict(ifindex=first + i, **link) for i, link in enumerate(softnic_links())]
    if len(words) == 3:
        dev, _, port = words[2].partition("/")
        links = [link for link in links
                 if link["ifname"] == dev and (not port or str(link["port"]) == port)]
        if not links:
            print("Wrong device name", file=sys.stderr)
            return 1
    if any(o in ("-j", "-json", "--json") for o in opts):
        pretty = any(o in ("-p", "-pretty", "--pretty") for o in opts)
        print(json.dumps(links, indent=4 if pretty else None))
    else:
        for link in links:
            line = (f"link {link['ifname']}/{link['port']} state {link['state']} "
                    f"physical_state {link['physical_state']}")
            print(line + (f" netdev {link['netdev']}" if link.get("netdev") else ""))
    return 0


sys.exit(main(sys.argv[1:]))
"""


def tools(base: Path | None = None) -> Path:
    """The directory holding ``rdma`` (RDMA_TOOL), for the front of PATH."""
    if base is None:
        from softnic.driver.hostfiles import stats_dir
        base = stats_dir()
    key = hashlib.sha256(RDMA_TOOL.encode()).hexdigest()[:12]
    dest = base / f"bin-{key}"
    if dest.is_dir():
        return dest
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bin-", dir=base))
    (tmp / "rdma").write_text(RDMA_TOOL)
    (tmp / "rdma").chmod(0o755)
    try:
        os.rename(tmp, dest)
    except OSError:                         # another process made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
