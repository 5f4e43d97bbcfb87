"""UD multicast: the host's group membership and the sender's fan-out.

A RoCE device sends a UD datagram to a multicast GID (``ff0e::/16``, or an IPv4-mapped
``::ffff:224.0.0.0/100``) with DQPN 0xFFFFFF; the network delivers a copy to every port
with a QP attached to the group, and each port hands it to every attached QP whose Q_Key
matches (as rxe's ``rxe_rcv_mcast_pkt``).  softnic's devices are per process and talk
over unicast UDP, so the network's part is played here: ``attach`` records
``(device IP, device UDP port, QPN)`` under the group in a per-user, per-network-namespace
table (files, as ``rdmacm_host``'s listeners, so every process of the host sees it), and
the sending device's driver turns a datagram to a group address into one unicast copy per
member, its BTH DestQP set to the member's QPN and its ICRC computed for that copy
(``fan_out``).  The engine sees ordinary UD datagrams for its own QPs and checks their
Q_Key as for any.  The sending QP itself gets no copy (as a QP created with
IBV_QP_CREATE_BLOCK_SELF_MCAST_LB; softnic does not loop a group's traffic back to its
sender).  A copy in flight when its QP detaches still reaches that QP.

Limits are rxe's: 8192 groups, 56 QPs per group, 0x70000 attachments in all.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import os
from pathlib import Path

from softnic.driver.hostfiles import namespace_table, own_start, process_alive
from softnic.core.errors import VerbsError
from softnic.wire.icrc import append_icrc
from softnic.wire.roce import BTH_LEN, BTH_STRUCT, DETH_LEN, DETH_STRUCT, ICRC_LEN, QPN_MASK

MAX_MCAST_GRP = 8192
MAX_MCAST_QP_ATTACH = 56
MAX_TOTAL_MCAST_QP_ATTACH = 0x70000
MULTICAST_QPN = 0xFFFFFF                  # IBA: the DestQP of a multicast datagram


def _table() -> Path:
    return namespace_table("mcast")


@functools.lru_cache(maxsize=1024)
def group_ip(gid) -> str | None:
    """The IPv4 group address of a multicast GID (bytes or text), None if the GID is no
    multicast address (rdma_is_multicast_addr)."""
    try:
        a = ipaddress.IPv6Address(bytes(gid) if not isinstance(gid, str) else gid)
    except ValueError:
        try:
            a = ipaddress.IPv4Address(gid)
        except ValueError:
            return None
        return str(a) if a.is_multicast else None
    if a.ipv4_mapped is not None:
        return str(a.ipv4_mapped) if a.ipv4_mapped.is_multicast else None
    if a.is_multicast:
        return str(a)           # an IPv6 group: a name in the table (no IPv6 devices yet)
    return None


@functools.lru_cache(maxsize=1024)
def is_group(ip: str) -> bool:
    """True if a datagram's destination ``ip`` is a multicast group (asked of every
    datagram a flush sends, of a handful of addresses: remembered)."""
    try:
        return ipaddress.ip_address(ip).is_multicast
    except ValueError:
        return False


def _member(nic, qpn: int) -> str:
    """The file naming ``qpn`` of ``nic`` a member of a group's: the device's address,
    the QP, and its process as its pid and start (``own_start``: a later process
    given the pid is not that member; without /proc, the pid alone)."""
    start = own_start()
    return f"{nic.ip}-{nic.port}-{qpn}-{os.getpid()}" + ("" if start is None else f"-{start}")


def _entries(group: str) -> list[tuple[str, int, int, int, int | None, Path]]:
    """A group's members' files: ``(ip, port, qpn, pid, start or None, path)``."""
    d = _table() / group.replace(":", "_")
    try:
        names = os.listdir(d)
    except OSError:
        return []
    out = []
    for n in names:
        try:
            ip, port, qpn, pid, *start = n.split("-")
            if len(start) > 1:
                continue
            out.append((ip, int(port), int(qpn), int(pid), int(start[0]) if start else None,
                        d / n))
        except ValueError:
            continue
    return out


def members(group: str) -> list[tuple[str, int, int]]:
    """Every live ``(device IP, UDP port, QPN)`` attached to ``group``."""
    res = []
    for ip, port, qpn, pid, start, path in _entries(group):
        if process_alive(pid, start):
            res.append((ip, port, qpn))
        else:
            try:
                path.unlink()                    # its process is gone
            except OSError:
                pass
    return res


def attach(nic, qpn: int, qp_is_ud: bool, gid) -> None:
    """ibv_attach_mcast: errnos as the kernel's ib_attach_mcast and rxe give them."""
    group = group_ip(gid)
    if group is None or not qp_is_ud:
        raise VerbsError(errno.EINVAL, "attach needs a UD QP and a multicast GID")
    mine = getattr(nic, "_mcast", None)
    if mine is None:
        mine = nic._mcast = {}
    qps = mine.setdefault(group, set())
    if qpn in qps:
        return                                   # attached already: rxe returns 0
    if len(mine) > MAX_MCAST_GRP or len(qps) >= MAX_MCAST_QP_ATTACH \
            or sum(len(s) for s in mine.values()) >= MAX_TOTAL_MCAST_QP_ATTACH:
        if not qps:
            del mine[group]
        raise VerbsError(errno.ENOMEM, "too many multicast attachments")
    d = _table() / group.replace(":", "_")
    d.mkdir(parents=True, exist_ok=True)
    (d / _member(nic, qpn)).touch()
    qps.add(qpn)


def detach(nic, qpn: int, gid) -> None:
    """ibv_detach_mcast: EINVAL if the QP is not attached to the group (rxe)."""
    group = group_ip(gid)
    mine = getattr(nic, "_mcast", None) or {}
    if group is None or qpn not in mine.get(group, ()):
        raise VerbsError(errno.EINVAL, "the QP is not attached to this group")
    mine[group].discard(qpn)
    if not mine[group]:
        del mine[group]
    try:
        (_table() / group.replace(":", "_") / _member(nic, qpn)).unlink()
    except FileNotFoundError:
        pass


def detach_qp(nic, qpn: int) -> None:
    """A destroyed QP leaves every group."""
    for group in [g for g, s in (getattr(nic, "_mcast", None) or {}).items() if qpn in s]:
        detach(nic, qpn, ipaddress.IPv4Address(group).packed if "." in group else group)


def fan_out(data, group: str, src: tuple[str, int]) -> list[tuple[bytearray, tuple[str, int]]]:
    """The unicast copies of one datagram ``data`` (with its ICRC) sent to ``group``:
    one per member, DestQP the member's QPN, the sending QP itself left out."""
    mv = memoryview(data)
    if len(mv) < BTH_LEN + DETH_LEN + ICRC_LEN:
        return []
    opcode, flags, pkey, w1, w2 = BTH_STRUCT.unpack_from(mv, 0)
    if w1 & QPN_MASK != MULTICAST_QPN:
        return []                                 # only a UD datagram to DQPN 0xFFFFFF
    src_qpn = DETH_STRUCT.unpack_from(mv, BTH_LEN)[1] & QPN_MASK
    body = bytes(mv[:-ICRC_LEN])
    out = []
    for ip, port, qpn in members(group):
        if (ip, port, qpn) == (src[0], src[1], src_qpn):
            continue
        pkt = bytearray(body)
        BTH_STRUCT.pack_into(pkt, 0, opcode, flags, pkey, (w1 & ~QPN_MASK) | qpn, w2)
        out.append((append_icrc(pkt, src[0], ip, src[1], port), (ip, port)))
    return out
