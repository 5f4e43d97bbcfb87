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

from softnic.core.qp import gid_of as _gid_of
from softnic.driver import config as _config
from verbs_api.addr import GID_POPULATED

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


# The entries a tree holds besides each device's net/ (part of its name, so a tree written
# by an earlier layout is not taken for this one): ports/1/pkeys/0 (rdma-core 64's tests
# read the P_Key there); for the populated GID entries, gid_attrs/types/N ("RoCE v2": UCX
# reads a GID's RoCE version there), gid_attrs/ndevs/N and, when the device's address is
# set (not picked when the device opens), ports/1/gids/N.
_LAYOUT = 3


def _sysfs_gid(ip: str) -> str:
    """The kernel's text of a GID in sysfs: eight groups of four hex digits."""
    raw = ipaddress.IPv6Address(_gid_of(ip)).packed
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


def tree(cfg: _config.RuntimeConfig | None = None, base: Path | None = None) -> Path:
    """The directory standing for ``/sys/class/infiniband`` for the devices of ``cfg``."""
    cfg = _config.load() if cfg is None else cfg
    rows = _interfaces() if any(d.ip and not ipaddress.ip_address(d.ip).is_loopback
                                for d in cfg.devices) else []
    layout = {d.name: (netdev_for(d.ip, rows), _sysfs_gid(d.ip) if d.ip else None)
              for d in cfg.devices}
    if base is None:
        from softnic.driver.hostfiles import stats_dir
        base = stats_dir()
    key = hashlib.sha256(json.dumps([_LAYOUT, layout], sort_keys=True).encode()).hexdigest()[:12]
    dest = base / f"sysfs-{key}"
    if dest.is_dir():
        try:
            os.utime(dest)          # in use again: hostfiles.prune leaves it TREE_GRACE
            return dest
        except OSError:
            pass                    # (removed meanwhile: made again below)
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".sysfs-", dir=base))
    for name, (netdev, gid) in layout.items():
        dev = tmp / name / "device"
        (dev / "net").mkdir(parents=True)
        if netdev:
            (dev / "net" / netdev).mkdir()
        (tmp / name / "node_type").write_text("1: CA\n")
        port = tmp / name / "ports" / "1"
        (port / "pkeys").mkdir(parents=True)              # one P_Key: the default
        (port / "pkeys" / "0").write_text("0xffff\n")
        for d in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / d).mkdir(parents=True)
        for i in range(GID_POPULATED):                  # what ibv_query_gid answers
            if gid:             # (a device whose address is picked when it opens: unknown)
                (port / "gids" / str(i)).write_text(gid + "\n")
            (port / "gid_attrs" / "types" / str(i)).write_text("RoCE v2\n")
            if netdev:
                (port / "gid_attrs" / "ndevs" / str(i)).write_text(netdev + "\n")
    try:
        os.rename(tmp, dest)
    except OSError:                         # another process made it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ``rdma link`` (iproute2) asks the kernel over RDMA netlink, which knows nothing of
# softnic's devices; rdma-core 64's tests find a device's netdev with ``rdma link show -j``.
# ``softnic exec`` puts this ``rdma`` first on PATH: ``rdma link [show] [DEV[/PORT]]`` lists
# the host's links (if it has any), then softnic's devices from the tree that SOFTNIC_SYSFS
# names (port 1, ACTIVE, LINK_UP, on the netdev of its device/net/), as iproute2's text or
# compact JSON (-j); a DEV that is none of softnic's, and every other command, go to the
# host's rdma.  A shell script: a test's setUp runs it once per GID.
RDMA_TOOL = r"""#!/bin/sh
here=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
real=
oldifs=$IFS; IFS=:
for d in $PATH; do
    if [ -n "$d" ] && [ "$d" != "$here" ] && [ -x "$d/rdma" ]; then real=$d/rdma; break; fi
done
IFS=$oldifs
json=0; n=0; w1=; w2=; w3=
for a in "$@"; do
    case $a in
        -j|-json|--json) json=1 ;;
        -*) ;;
        *) n=$((n + 1)); [ "$n" -le 3 ] && eval "w$n=\$a" ;;
    esac
done
case $w1 in l|li|lin|link) ;; *) w1= ;; esac
case $w2 in ''|show|list) ;; *) w1= ;; esac
top=${SOFTNIC_SYSFS:-}
dev=${w3%%/*}; port=
case $w3 in */*) port=${w3#*/} ;; esac
if [ -n "$w1" ] && [ "$n" -le 3 ] && [ -n "$dev" ] && [ ! -d "$top/$dev" ]; then w1=; fi
if [ -z "$w1" ] || [ "$n" -gt 3 ]; then
    [ -n "$real" ] && exec "$real" "$@"
    echo "rdma: the host has no rdma tool (iproute2)" >&2
    exit 127
fi
if [ -n "$port" ] && [ "$port" != 1 ]; then
    echo "Wrong device name" >&2
    exit 1
fi
hostj=; hostn=0
if [ -z "$dev" ] && [ -n "$real" ]; then
    hostj=$("$real" -j link show 2>/dev/null) || hostj=
    hostn=$(printf '%s' "$hostj" | grep -o '"ifindex"' | wc -l)
    [ "$json" = 0 ] && [ "$hostn" -gt 0 ] && "$real" link show 2>/dev/null
fi
items=; i=$hostn
for d in "$top"/*; do
    [ -d "$d" ] || continue
    name=${d##*/}
    i=$((i + 1))
    [ -n "$dev" ] && [ "$name" != "$dev" ] && continue
    net=
    for x in "$d"/device/net/*; do [ -e "$x" ] && { net=${x##*/}; break; }; done
    if [ "$json" = 1 ]; then
        item="{\"ifindex\":$i,\"ifname\":\"$name\",\"port\":1,\"state\":\"ACTIVE\",\"physical_state\":\"LINK_UP\""
        if [ -n "$net" ]; then
            item="$item,\"netdev\":\"$net\""
            idx=$(cat "/sys/class/net/$net/ifindex" 2>/dev/null) && item="$item,\"netdev_index\":$idx"
        fi
        items="$items${items:+,}$item}"
    else
        echo "link $name/1 state ACTIVE physical_state LINK_UP${net:+ netdev $net}"
    fi
done
if [ "$json" = 1 ]; then
    if [ "$hostn" -gt 0 ]; then
        printf '%s%s]\n' "${hostj%]*}" "${items:+,$items}"
    else
        printf '[%s]\n' "$items"
    fi
fi
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
