"""Packet ladders: who sent what to whom, one line (or one arrow) per packet.

Input is a pcap (ours, or any RoCEv2 capture whose link type is raw IP,
Ethernet, Linux cooked or BSD loopback) or the ``trace`` of a
``transport.sim.Fabric`` run with ``trace=True``.  Either way the result is a
list of ``Event``\\ s, one per packet copy on the wire, which render as text
for a terminal or as an SVG picture with time going down.

What each source can tell:

* A fabric trace knows when a packet was sent and when it was delivered, and
  which packets the links dropped, duplicated or corrupted.
* A pcap knows one timestamp per packet (where it was captured) and only the
  packets that reached the capture point.  Corruption shows as a failed ICRC.

A packet is marked as a retransmission when its PSN was seen before on the
same direction and destination QP (requests, READ responses and ATOMIC ACKs;
plain ACKs repeat PSNs by design), or when it is a READ request that restarts
inside the PSN range of an earlier READ (go-back-N after lost responses).
"""

from __future__ import annotations

import ipaddress
import math
import random
import struct
from collections import deque
from dataclasses import dataclass, replace
from os import PathLike
from statistics import median
from typing import Iterable, Sequence
from html import escape as _html_escape

from ..core.enums import RNR_TIMER_SECONDS
from ..wire.icrc import check_icrc
from ..wire.roce import (
    BTH_LEN, ICRC_LEN, OPCODES, ROCEV2_PORT, AethCode, Kind, NakCode, Opcode, WireError,
    decode, psn_diff,
)


def escape(text: str) -> str:
    """``&``, ``<`` and ``>`` as XML entities (xml.sax.saxutils.escape's answer;
    html's, which does not import urllib, http and email as saxutils does)."""
    return _html_escape(text, quote=False)


__all__ = [
    "Event", "from_pcap", "from_fabric_trace", "render_text", "render_svg", "short_name",
    "simulate", "summary",
]

Address = tuple[str, int]


# -- names ------------------------------------------------------------------

def _short(op: Opcode) -> str:
    if op == Opcode.CNP:
        return "CNP"
    prefix, rest = op.name.split("_", 1)
    for old, new in (("RDMA_", ""), ("RESPONSE", "RESP"), ("REQUEST", "REQ"),
                     ("_WITH_IMMEDIATE", "_IMM"), ("_WITH_INVALIDATE", "_INV"),
                     ("ACKNOWLEDGE", "ACK"), ("COMPARE_SWAP", "CMP_SWAP")):
        rest = rest.replace(old, new)
    rest = rest.replace("_", " ")
    return rest if prefix == "RC" else f"{prefix} {rest}"


#: opcode -> short name ("WRITE FIRST", "READ RESP LAST", "UC SEND ONLY IMM", ...)
SHORT_NAMES: dict[int, str] = {op: _short(Opcode(op)) for op in OPCODES}

_NAK_SHORT = {
    NakCode.PSN_SEQUENCE_ERROR: "seq-err",
    NakCode.INVALID_REQUEST: "inv-req",
    NakCode.REMOTE_ACCESS_ERROR: "rem-access",
    NakCode.REMOTE_OPERATIONAL_ERROR: "rem-op",
    NakCode.INVALID_RD_REQUEST: "inv-rd-req",
}

_NAK_WORDS = {
    NakCode.PSN_SEQUENCE_ERROR: "PSN sequence error",
    NakCode.INVALID_REQUEST: "invalid request",
    NakCode.REMOTE_ACCESS_ERROR: "remote access error",
    NakCode.REMOTE_OPERATIONAL_ERROR: "remote operational error",
    NakCode.INVALID_RD_REQUEST: "invalid RD request",
}

def short_name(opcode: int, syndrome: int | None = None) -> str:
    """The ladder's name for a packet: the opcode, or for an ACK the AETH verdict
    ("ACK", "RNR NAK", "NAK seq-err", ...)."""
    if opcode == Opcode.RC_ACKNOWLEDGE and syndrome is not None:
        code = AethCode((syndrome >> 5) & 3)
        if code == AethCode.RNR_NAK:
            return "RNR NAK"
        if code == AethCode.NAK:
            value = syndrome & 0x1F
            return "NAK " + _NAK_SHORT.get(value, f"code-{value}")
        if code == AethCode.RESERVED:
            return "ACK reserved"
    return SHORT_NAMES.get(opcode, f"op {opcode:#04x}")


def _aeth_text(syndrome: int) -> str:
    code = AethCode((syndrome >> 5) & 3)
    value = syndrome & 0x1F
    if code == AethCode.ACK:
        return "credits " + ("none" if value == 31 else str(value))   # 31: no flow control
    if code == AethCode.RNR_NAK:
        return f"rnr timer {value} ({RNR_TIMER_SECONDS[value] * 1e3:g} ms)"
    if code == AethCode.NAK:
        return _NAK_WORDS.get(value, f"NAK code {value}")
    return f"reserved syndrome {syndrome:#04x}"


# -- events -----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Event:
    """One packet copy on the wire.

    ``time`` is the send time (fabric trace) or the capture time (pcap), in
    seconds.  ``arrive`` is the delivery time when the source knows it; it is
    None for a dropped packet, one still in flight, or one from a pcap.
    Header fields are None when the packet does not decode (``name`` then
    says why).  ``length`` is the payload without pad and ICRC.
    """
    time: float
    src: Address
    dst: Address
    name: str
    opcode: int | None = None
    psn: int | None = None
    dest_qp: int | None = None
    length: int = 0
    ackreq: bool = False
    msn: int | None = None
    syndrome: int | None = None
    aeth: str = ""                 # the syndrome in words: "credits 31", "psn sequence error"
    dma_len: int | None = None     # RETH DMA length (WRITE FIRST/ONLY, READ REQ)
    size: int = 0                  # UDP payload bytes (BTH through ICRC)
    arrive: float | None = None
    retransmit: bool = False
    dropped: bool = False
    duplicate: bool = False
    corrupt: bool = False          # bits flipped on the way (fabric) or the ICRC failed
    icrc_ok: bool | None = None    # None: not checked (non-canonical IP header, truncated)

    @property
    def delay(self) -> float | None:
        return None if self.arrive is None else self.arrive - self.time

    @property
    def is_nak(self) -> bool:
        return self.syndrome is not None and self.opcode == Opcode.RC_ACKNOWLEDGE \
            and (self.syndrome >> 5) & 3 in (AethCode.NAK, AethCode.RNR_NAK)

    @property
    def marks(self) -> tuple[str, ...]:
        """Short tags for what went wrong: RETX, DROP, DUP, CORRUPT, BAD-ICRC."""
        m = []
        if self.retransmit:
            m.append("RETX")
        if self.dropped:
            m.append("DROP")
        if self.duplicate:
            m.append("DUP")
        if self.corrupt:
            m.append("CORRUPT")
        if self.icrc_ok is False:
            m.append("BAD-ICRC")
        return tuple(m)


def _fields(roce: bytes | memoryview, roce_len: int | None = None) -> dict:
    """Header fields of one RoCE datagram (BTH .. ICRC).  ``roce_len`` is its
    length on the wire when ``roce`` was cut short by the capture's snaplen."""
    n = len(roce) if roce_len is None else roce_len
    out: dict = {"size": n}
    if len(roce) < BTH_LEN:
        out["name"] = "malformed (short)"
        return out
    info = OPCODES.get(roce[0])
    if info is None:
        out["name"] = f"op {roce[0]:#04x}"
        return out
    if len(roce) == n:
        body = roce[:n - ICRC_LEN]
    else:
        # Truncated: decode the headers with the pad count cleared, and take the
        # payload length from the length on the wire.
        if len(roce) < info.hdr_len:
            out["name"] = "truncated"
            return out
        head = bytearray(roce[:info.hdr_len])
        head[1] &= ~0x30
        body = bytes(head) + (b"\0" * 16 if info.kind == Kind.CNP else b"")
    try:
        pkt = decode(body)
    except WireError as e:
        out["name"] = f"malformed ({e})"
        return out
    bth = pkt.bth
    length = len(pkt.payload)
    if len(roce) != n and info.kind != Kind.CNP:
        length = max(0, n - ICRC_LEN - info.hdr_len - ((roce[1] >> 4) & 3))
    out.update(opcode=bth.opcode, psn=bth.psn, dest_qp=bth.dest_qp, ackreq=bth.ackreq,
               length=length)
    if pkt.aeth is not None:
        out.update(msn=pkt.aeth.msn, syndrome=pkt.aeth.syndrome,
                   aeth=_aeth_text(pkt.aeth.syndrome))
    if pkt.reth is not None:
        out["dma_len"] = pkt.reth.dma_len
    out["name"] = short_name(bth.opcode, out.get("syndrome"))
    out["_pkt"] = pkt
    return out


class _History:
    """Which PSNs each direction has carried, to spot retransmissions."""

    def __init__(self) -> None:
        self.psns: dict[tuple, set[int]] = {}
        self.top: dict[tuple, int] = {}
        self.reads: dict[tuple, deque] = {}
        self.mtu: dict[frozenset, int] = {}

    def observe(self, src: Address, dst: Address, f: dict) -> bool:
        """Record the packet described by ``f``; True if it is a retransmission."""
        pkt = f.get("_pkt")
        if pkt is None:
            return False
        info = pkt.info
        pair = frozenset((src, dst))
        if info.payload and not info.last and len(pkt.payload):   # FIRST/MIDDLE: exactly one MTU
            if len(pkt.payload) > self.mtu.get(pair, 0):
                self.mtu[pair] = len(pkt.payload)
        if info.kind in (Kind.ACK, Kind.CNP):
            return False
        key = (src, dst, pkt.bth.dest_qp, info.is_request)
        psn = pkt.bth.psn
        seen = self.psns.setdefault(key, set())
        top = self.top.get(key)
        # Seen before and not ahead of the highest PSN (which would be a 24-bit wrap).
        again = psn in seen and top is not None and psn_diff(psn, top) <= 0
        reads = self.reads.setdefault(key, deque(maxlen=256))
        if not again and info.kind == Kind.READ_REQUEST:
            mtu = self.mtu.get(pair, 4096)   # unknown: the largest MTU, the narrowest span
            for first, dma_len in reads:
                if 0 < psn_diff(psn, first) < max(1, math.ceil(dma_len / mtu)):
                    again = True
                    break
        seen.add(psn)
        if top is None or psn_diff(psn, top) > 0:
            self.top[key] = psn
        if info.kind == Kind.READ_REQUEST and not again:
            reads.append((psn, pkt.reth.dma_len))
        return again


def _icrc(data: bytes, src: Address, dst: Address) -> bool | None:
    try:
        return check_icrc(data, src[0], dst[0], src[1], dst[1])
    except (OSError, ValueError):      # not an address
        return None


def _event(time: float, src: Address, dst: Address, f: dict, **kw) -> Event:
    fields = {k: v for k, v in f.items() if not k.startswith("_")}
    return Event(time=time, src=src, dst=dst, **fields, **kw)


# -- fabric traces -----------------------------------------------------------

def from_fabric_trace(trace: Iterable) -> list[Event]:
    """Events from ``Fabric(..., trace=True).trace`` (TraceRecord objects, or
    any ``(time, kind, src, dst, data)`` tuples), in send order.

    A duplicated packet gives two events, the second marked ``duplicate``.
    Deliveries are matched to sends by the identity of the bytes object the
    fabric carries, or failing that (a trace that was copied or pickled) by
    equal bytes on the same direction, oldest first.
    """
    recs = list(trace)
    history = _History()
    m = _Sends()
    i, n = 0, len(recs)
    while i < n:
        time, kind, src, dst, data = recs[i][:5]
        src, dst = tuple(src), tuple(dst)
        i += 1
        if kind == "send":
            i, dropped, corrupted, dup = _send_fate(recs, i, time, src, dst, data)
            f = _fields(data)
            base = {k: v for k, v in f.items() if not k.startswith("_")}
            base.update(time=time, src=src, dst=dst, retransmit=history.observe(src, dst, f))
            m.add_send(base, data, dropped, corrupted, dup)
        elif kind == "deliver":
            idx = m.take(src, dst, data)
            if idx is not None:
                m.built[idx]["arrive"] = time
            else:   # sent before the trace began
                f = _fields(data)
                kw = {k: v for k, v in f.items() if not k.startswith("_")}
                kw.update(time=time, src=src, dst=dst, arrive=time,
                          retransmit=history.observe(src, dst, f))
                m.built.append(kw)
                m.copies.append(data)
        elif kind == "drop":   # lost on arrival (the destination was detached)
            idx = m.take(src, dst, data)
            if idx is not None:
                m.built[idx]["dropped"] = True
        # "corrupt"/"dup" without their "send" (tracing switched on mid-run): nothing to add
    events = []
    for kw, copy in zip(m.built, m.copies):
        if copy is not None:
            ok = _icrc(copy, kw["src"], kw["dst"])
            kw["icrc_ok"] = ok
            if ok is False:
                kw["corrupt"] = True
        events.append(Event(**kw))
    return events


def _send_fate(recs: list, i: int, time, src, dst, data):
    """The records the fabric writes right after a send belong to it: (the index past
    them, dropped, the corrupted copies' bytes, the duplicate's bytes or None)."""
    dropped, corrupted, dup = False, [], None
    while i < len(recs):
        t2, k2, s2, d2, data2 = recs[i][:5]
        if t2 != time or tuple(s2) != src or tuple(d2) != dst:
            break
        if k2 == "drop" and (data2 is data or data2 == data):
            dropped = True
        elif k2 == "corrupt":
            corrupted.append(data2)
        elif k2 == "dup":
            dup = data2
        else:
            break
        i += 1
    return i, dropped, corrupted, dup


class _Sends:
    """The events built so far, each with the bytes (copy) it waits to see delivered."""

    def __init__(self):
        self.built: list[dict] = []
        self.copies: list[bytes | None] = []
        self.by_id: dict[int, deque[int]] = {}     # id(copy) -> events waiting for it
        self.by_dir: dict[tuple, list[int]] = {}   # (src, dst) -> events waiting, in send order

    def add(self, kw: dict, copy: bytes | None) -> None:
        self.built.append(kw)
        self.copies.append(copy)
        if copy is not None:
            idx = len(self.built) - 1
            self.by_id.setdefault(id(copy), deque()).append(idx)
            self.by_dir.setdefault((kw["src"], kw["dst"]), []).append(idx)

    def add_send(self, base: dict, data: bytes, dropped: bool, corrupted: list, dup) -> None:
        """A send's events: one if dropped, else its copy and the duplicate's."""
        if dropped:
            self.add(dict(base, dropped=True), None)
            return
        # Copy 0 is ``data`` unless corrupted; a corrupt record whose bytes are
        # the dup record's is the second copy's.
        first, first_corrupt, dup_corrupt = data, False, False
        for c in corrupted:
            if dup is not None and c is dup:
                dup_corrupt = True
            else:
                first, first_corrupt = c, True
        self.add(dict(base, corrupt=first_corrupt), first)
        if dup is not None:
            self.add(dict(base, duplicate=True, corrupt=dup_corrupt), dup)

    def take(self, src: Address, dst: Address, data: bytes) -> int | None:
        """The event waiting for these delivered bytes (no longer waiting), or None."""
        waiting = self.by_id.get(id(data))
        idx = waiting[0] if waiting else None
        open_ = self.by_dir.get((src, dst), [])
        if idx is None:
            idx = next((i for i in open_ if self.copies[i] == data), None)
            if idx is None:
                return None
        self.by_id[id(self.copies[idx])].remove(idx)
        open_.remove(idx)
        return idx


# -- pcaps -------------------------------------------------------------------

_ETH_IPV4, _ETH_IPV6, _ETH_VLANS = 0x0800, 0x86DD, (0x8100, 0x88A8, 0x9100)


def _ip_offset(linktype: int, frame: bytes) -> int | None:
    """Where the IP header starts in a frame of this link type, or None."""
    if linktype in (101, 12, 14, 228, 229):            # raw IP (LINKTYPE_RAW, DLT_RAW, IPV4/6)
        return 0
    if linktype == 1:                                  # Ethernet, with any VLAN tags
        off = 12
        while len(frame) >= off + 2:
            ethertype = int.from_bytes(frame[off:off + 2], "big")
            if ethertype in _ETH_VLANS:
                off += 4
                continue
            return off + 2 if ethertype in (_ETH_IPV4, _ETH_IPV6) else None
        return None
    if linktype == 113:                                # Linux cooked (SLL)
        return 16 if frame[14:16] in (b"\x08\x00", b"\x86\xdd") else None
    if linktype == 276:                                # Linux cooked v2 (SLL2)
        return 20 if frame[0:2] in (b"\x08\x00", b"\x86\xdd") else None
    if linktype in (0, 108):                           # BSD loopback / OpenBSD loop
        return 4
    return None


def _udp(frame: bytes, off: int):
    """(src ip, dst ip, sport, dport, roce bytes, roce length on the wire, canonical: the
    ICRC's pseudo header is rebuilt from the addresses and ports alone)."""
    if len(frame) < off + 1:
        return None
    version = frame[off] >> 4
    if version == 4:
        if len(frame) < off + 20:
            return None
        ihl = (frame[off] & 0x0F) * 4
        if ihl < 20:
            return None
        ident, flags_frag, proto = struct.unpack_from("!HHxB", frame, off + 4)
        if proto != 17 or flags_frag & 0x3FFF:      # not UDP, or a fragment
            return None
        src = ".".join(map(str, frame[off + 12:off + 16]))
        dst = ".".join(map(str, frame[off + 16:off + 20]))
        # check_icrc rebuilds the IP header as softnic writes it (id 0, DF set).
        canonical = ihl == 20 and ident == 0 and flags_frag == 0x4000
        udp = off + ihl
    elif version == 6:
        if len(frame) < off + 40 or frame[off + 6] != 17:   # extension headers: not handled
            return None
        src = str(ipaddress.IPv6Address(bytes(frame[off + 8:off + 24])))
        dst = str(ipaddress.IPv6Address(bytes(frame[off + 24:off + 40])))
        # no extension headers: the fields the ICRC covers are the addresses and lengths
        canonical = True
        udp = off + 40
    else:
        return None
    if len(frame) < udp + 8:
        return None
    sport, dport, ulen = struct.unpack_from("!HHH", frame, udp)
    if ulen < 8:
        return None
    roce_len = ulen - 8
    roce = frame[udp + 8:udp + 8 + roce_len]
    return src, dst, sport, dport, roce, roce_len, canonical


def _pcap_frames(path: str):
    """(linktype, frame, seconds) for every record of a pcap or pcapng file."""
    from scapy.utils import RawPcapReader
    with RawPcapReader(path) as reader:
        for frame, meta in reader:
            if hasattr(meta, "tsresol"):                # pcapng
                t = ((meta.tshigh << 32) | meta.tslow) / meta.tsresol
                linktype = meta.linktype
            else:
                scale = 1e-9 if getattr(reader, "nano", False) else 1e-6
                t = meta.sec + meta.usec * scale
                linktype = reader.linktype
            yield linktype, frame, t


def from_pcap(path: str | PathLike[str], port: int | None = ROCEV2_PORT) -> list[Event]:
    """Events from the RoCEv2 packets of a capture (UDP destination ``port``;
    None takes every UDP datagram), in capture order.

    Times are capture timestamps; ``arrive`` stays None (one timestamp per
    packet).  The ICRC is checked where the IP header is the canonical one
    softnic writes (IPv4 with id 0 and DF; IPv6 without extension headers);
    elsewhere ``icrc_ok`` is None.
    """
    history = _History()
    events = []
    for linktype, frame, t in _pcap_frames(str(path)):
        off = _ip_offset(linktype, frame)
        if off is None:
            continue
        parsed = _udp(frame, off)
        if parsed is None:
            continue
        sip, dip, sport, dport, roce, roce_len, canonical = parsed
        if port is not None and dport != port:
            continue
        src, dst = (sip, sport), (dip, dport)
        f = _fields(roce, roce_len)
        icrc_ok = _icrc(roce, src, dst) if canonical and len(roce) == roce_len else None
        events.append(_event(t, src, dst, f, retransmit=history.observe(src, dst, f),
                             icrc_ok=icrc_ok, corrupt=icrc_ok is False))
    return events


# -- text ---------------------------------------------------------------------

_ANSI = {"red": "\x1b[31m", "yellow": "\x1b[33m", "magenta": "\x1b[35m", "cyan": "\x1b[36m",
         "reset": "\x1b[0m"}


def _endpoints(events: Sequence[Event]) -> list[Address]:
    seen: dict[Address, None] = {}
    for e in events:
        seen.setdefault(e.src, None)
        seen.setdefault(e.dst, None)
    return list(seen)


def _label(addr: Address, labels: dict | None, all_default_port: bool) -> str:
    if labels and addr in labels:
        return labels[addr]
    return addr[0] if all_default_port else f"{addr[0]}:{addr[1]}"


def _unit(events: Sequence[Event], unit: str) -> tuple[str, float]:
    if unit == "auto":
        t0 = min(e.time for e in events)
        t1 = max(max(e.time, e.arrive or e.time) for e in events)
        unit = "ms" if t1 - t0 >= 10e-3 else "us"
    if unit not in ("us", "ms", "s"):
        raise ValueError(f"unit must be 'us', 'ms', 's' or 'auto', not {unit!r}")
    return unit, {"us": 1e6, "ms": 1e3, "s": 1.0}[unit]


def _details(e: Event) -> str:
    if e.psn is None:
        parts = [f"{'':<12}{'':<13}len {e.size:>4}"]
    else:
        parts = [f"psn {e.psn:>8}  qp {e.dest_qp:#08x}  len {e.length:>4}"
                 + ("  ackreq" if e.ackreq else " " * 8)]
    if e.syndrome is not None:
        parts.append(f"msn {e.msn} syn {e.syndrome:#04x} {e.aeth}")
    if e.dma_len is not None:
        parts.append(f"dmalen {e.dma_len}")
    return "  ".join(parts)


def _color_of(e: Event) -> str | None:
    if e.dropped or e.corrupt or e.icrc_ok is False:
        return "red"
    if e.is_nak:
        return "magenta"
    if e.retransmit:
        return "yellow"
    if e.duplicate:
        return "cyan"
    return None


def _arrow(length: int, name: str, rightward: bool, dropped: bool) -> str:
    """The ``length`` characters between two bars: ``-- NAME --->`` or, when
    dropped, ``-- NAME --X   `` (mirrored for a leftward arrow), the name
    near the sender."""
    name = f" {name} "[:max(length - 4, 0)]
    cells = ["-"] * length
    if dropped:
        cut = min(max(len(name) + 4, length * 2 // 3), length - 2)
        cells[cut:] = ["X"] + [" "] * (length - cut - 1)
    else:
        cells[-1] = ">"
    at = 2
    if not rightward:
        cells = ["<" if c == ">" else c for c in reversed(cells)]
        at = length - 2 - len(name)
    cells[at:at + len(name)] = name
    return "".join(cells)


def render_text(events: Sequence[Event], *, max_lines: int | None = None, width: int = 36,
                unit: str = "auto", color: bool = False,
                labels: dict[Address, str] | None = None) -> str:
    """A fixed-width ladder: a header line with the endpoints, then one line
    per event (at most ``max_lines``, then one line saying how many were left
    out).  Each line is the time since the first event, the arrow between the
    endpoint columns with the packet's name, and the packet's fields and marks.

    Arrows: ``|-- NAME --->|`` delivered (or not known), ``|-- NAME ---X   |``
    dropped.  ``width`` is the number of characters between two columns.
    ``color`` adds ANSI colors (for a terminal).
    """
    if not events:
        return "(no packets)\n"
    width = max(width, 20)
    ends = _endpoints(events)
    col = {a: k for k, a in enumerate(ends)}
    default_port = all(a[1] == ROCEV2_PORT for a in ends)
    unit, scale = _unit(events, unit)
    t0 = min(e.time for e in events)
    time_w = 13
    bars = [k * (width + 1) for k in range(len(ends))]
    span = bars[-1] + 1

    # Endpoint names over their columns: the first starts at its bar, the last
    # ends at its bar, others are centred; a name never runs into the previous one.
    head, end = "", -2
    for k, a in enumerate(ends):
        text = _label(a, labels, default_port)
        start = bars[k] if k == 0 else (bars[k] - len(text) + 1 if k == len(ends) - 1
                                        else bars[k] - len(text) // 2)
        start = max(start, end + 2, 0)
        head = head.ljust(start) + text
        end = start + len(text)
    lines = [f"{'time':>{time_w}}  {head}"]

    shown = events if max_lines is None else events[:max(max_lines, 0)]
    paint = (lambda s, c: f"{_ANSI[c]}{s}{_ANSI['reset']}" if c else s) if color \
        else (lambda s, c: s)
    for e in shown:
        row = [" "] * span
        for b in bars:
            row[b] = "|"
        a, b = bars[col[e.src]], bars[col[e.dst]]
        if a == b:          # to itself
            row[a] = "@"
        else:
            lo = min(a, b)
            row[lo + 1:lo + 1 + abs(b - a) - 1] = _arrow(abs(b - a) - 1, e.name, b > a, e.dropped)
        stamp = f"{(e.time - t0) * scale:>{time_w - 2}.3f}{unit}"
        marks = " ".join(e.marks)
        arrow = "".join(row)
        line = f"{stamp}  {paint(arrow, _color_of(e))}  {_details(e)}"
        if marks:
            line += "  " + paint(marks, "red" if e.dropped or e.corrupt else "yellow")
        lines.append(line.rstrip())
    if len(shown) < len(events):
        lines.append(f"{'':>{time_w}}  ... {len(events) - len(shown)} more packets not shown")
    return "\n".join(lines) + "\n"


def summary(events: Sequence[Event]) -> str:
    """One line of totals: packets, drops, retransmissions, NAKs, ..."""
    counts = {
        "dropped": sum(e.dropped for e in events),
        "retransmitted": sum(e.retransmit for e in events),
        "NAKs": sum(e.is_nak for e in events),
        "duplicated": sum(e.duplicate for e in events),
        "corrupted": sum(e.corrupt for e in events),
    }
    rest = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    return f"{len(events)} packets" + (f": {rest}" if rest else "")


# -- SVG ----------------------------------------------------------------------

_ROW = 22.0          # pixels per packet row
_MAX_GAP = 3 * _ROW  # an idle stretch never takes more room than this


def _y_of_time(events: Sequence[Event]) -> tuple[dict[float, float], list[tuple[float, float]]]:
    """A monotone time -> y map: each time point leaves room for the rows of
    the packets sent at it, gaps between points scale with time (so delivery
    delay shows as slant) up to a cap (so a retransmission timeout does not
    push the rest off the page).  Also returns the shortened stretches as
    (y where they end, seconds)."""
    sends: dict[float, int] = {}
    for e in events:
        sends[e.time] = sends.get(e.time, 0) + 1
    points = sorted(set(sends) | {e.arrive for e in events if e.arrive is not None})
    delays = [e.delay for e in events if e.delay is not None and e.delay > 0]
    px_per_s = 2.5 * _ROW / median(delays) if delays else 0.0
    y, prev, ys, cut = 0.0, None, {}, []
    for t in points:
        if prev is not None:
            band = sends.get(prev, 0) * _ROW
            gap = (t - prev) * px_per_s
            if gap > _MAX_GAP and _MAX_GAP > band:
                cut.append((y + _MAX_GAP, t - prev))
            y += max(band, min(gap, _MAX_GAP), 4.0 if not band else 0.0)
        ys[t] = y
        prev = t
    return ys, cut


def render_svg(events: Sequence[Event], path: str | PathLike[str] | None = None, *,
               labels: dict[Address, str] | None = None, max_events: int | None = None,
               title: str | None = None, unit: str = "auto") -> str:
    """Draw the ladder as SVG (written to ``path`` if given; returned either way).

    Time goes down; each endpoint is a vertical line.  A packet is one arrow
    (``<line class="arrow ...">``) from its sender's line at its send time to
    its receiver's line at its delivery time, so the slant shows the delay;
    packets sent at one instant are stacked a row apart, and long idle
    stretches are shortened.  A dropped packet's arrow stops halfway and ends
    in an X.  Without delivery times (a pcap) arrows are level.
    """
    events = list(events if max_events is None else events[:max_events])
    ends = _endpoints(events)
    col = {a: k for k, a in enumerate(ends)}
    default_port = all(a[1] == ROCEV2_PORT for a in ends)
    left, gap_x, top = 120.0, 440.0, 70.0
    xs = [left + k * gap_x for k in range(len(ends))]
    ys, cut = _y_of_time(events)
    unit, scale = _unit(events, unit) if events else ("us", 1e6)
    t0 = min((e.time for e in events), default=0.0)
    delays = [e.delay for e in events if e.delay is not None and e.delay > 0]
    drop_dy = 0.5 * (2.5 * _ROW if delays else 0.0)
    slot: dict[float, int] = {}
    body: list[str] = []
    bottom = top
    last_label_y = -1e9
    for i, e in enumerate(events):
        k = slot.get(e.time, 0)
        slot[e.time] = k + 1
        y0 = top + ys[e.time] + k * _ROW
        x0, x1 = xs[col[e.src]], xs[col[e.dst]]
        if e.dropped:
            # Halfway; past an odd number of columns, off the lifeline in the middle.
            hops = round(abs(x1 - x0) / gap_x)
            y1 = y0 + drop_dy
            x1 = (x0 + x1) / 2 + (0 if hops % 2 else (x1 - x0) / hops / 4)
        elif e.arrive is not None:
            y1 = top + ys[e.arrive] + (0 if e.arrive != e.time else k * _ROW)
        else:
            y1 = y0
        body += _svg_packet(i, e, x0, y0, x1, y1)
        if y0 - last_label_y >= 12:
            body.append(f'<text class="t" x="{xs[0] - 12:.1f}" y="{y0 + 4:.1f}" '
                        f'text-anchor="end">{(e.time - t0) * scale:.3f} {_svg_unit(unit)}</text>')
            last_label_y = y0
        body.append("</g>")
        bottom = max(bottom, y0, y1)
    for y, seconds in cut:
        body.append(f'<text class="gap" x="{xs[0] + 8:.1f}" y="{top + y - _MAX_GAP / 2:.1f}">'
                    f'\u22ee {seconds * scale:.3f} {_svg_unit(unit)} later</text>')
    bottom += 2 * _ROW
    head = _svg_head(xs, top, bottom, title,
                     [_label(a, labels, default_port) for a in ends])
    svg = "\n".join(head + body + ["</svg>"]) + "\n"
    if path is not None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(svg)
    return svg


def _svg_packet(i: int, e: Event, x0: float, y0: float, x1: float, y1: float) -> list[str]:
    """A packet's group, open: its arrow (an X at the end if dropped) and its label
    just above the arrow, near its sender."""
    cls = ["arrow"]
    if e.dropped:
        cls.append("drop")
    if e.retransmit:
        cls.append("retx")
    if e.is_nak:
        cls.append("nak")
    if e.duplicate:
        cls.append("dup")
    if e.corrupt:
        cls.append("corrupt")
    resp = e.opcode is not None and OPCODES[e.opcode].is_response
    cls.append("resp" if resp else "req")
    color = _svg_color(cls)
    cls.append("c-" + color)
    marker = "" if e.dropped else f' marker-end="url(#head-{color})"'
    tip = f"{e.name} psn {e.psn} qp {e.dest_qp:#x} len {e.length}" if e.psn is not None \
        else e.name
    out = [f'<g class="pkt" data-index="{i}"><title>{escape(tip)}</title>'
           f'<line class="{" ".join(cls)}" x1="{x0:.1f}" y1="{y0:.1f}" '
           f'x2="{x1:.1f}" y2="{y1:.1f}"{marker}/>']
    if e.dropped:
        d = 6
        out.append(f'<path class="x" d="M{x1 - d:.1f},{y1 - d:.1f} L{x1 + d:.1f},{y1 + d:.1f} '
                   f'M{x1 - d:.1f},{y1 + d:.1f} L{x1 + d:.1f},{y1 - d:.1f}"/>')
    rightward = x1 >= x0
    lx = x0 + (14 if rightward else -14)
    anchor = "start" if rightward else "end"
    text = e.name if e.psn is None else f"{e.name}  {e.psn}"
    if e.marks:
        text += "  " + " ".join(e.marks)
    frac = 14 / max(abs(x1 - x0), 1)
    ly = y0 + (y1 - y0) * frac - 4
    out.append(f'<text class="lbl" x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}">'
               f'{escape(text)}</text>')
    return out


def _svg_head(xs: list[float], top: float, bottom: float, title: str | None,
              names: list[str]) -> list[str]:
    """The document's start: size, arrowheads and styles, the title, and each
    endpoint's name and lifeline."""
    width = xs[-1] + 140 if xs else 400
    head = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{bottom:.0f}" '
        f'viewBox="0 0 {width:.0f} {bottom:.0f}" font-family="monospace" font-size="11">',
        "<defs>",
        *(f'<marker id="head-{name}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
          f'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{rgb}"/>'
          f'</marker>' for name, rgb in _SVG_COLORS.items()),
        "<style>"
        + "".join(f".c-{name}{{stroke:{rgb}}}" for name, rgb in _SVG_COLORS.items())
        + ".arrow{stroke-width:1.3}.arrow.nak{stroke-width:2}.arrow.drop{stroke-dasharray:4 3}"
        ".x{stroke:#c62828;stroke-width:2.5}"
        ".life{stroke:#999;stroke-width:1}.lbl{fill:#222;paint-order:stroke;stroke:#fff;stroke-width:3px}"
        ".t{fill:#666}.ep{font-weight:bold}"
        ".gap{fill:#888;font-style:italic}"
        "</style>",
        "</defs>",
        '<rect width="100%" height="100%" fill="white"/>',
    ]
    if title:
        head.append(f'<text x="10" y="18" font-size="13">{escape(title)}</text>')
    for k, name in enumerate(names):
        head.append(f'<text class="ep" x="{xs[k]:.1f}" y="{top - 20:.1f}" text-anchor="middle">'
                    f'{escape(name)}</text>')
        head.append(f'<line class="life" x1="{xs[k]:.1f}" y1="{top - 10:.1f}" x2="{xs[k]:.1f}" '
                    f'y2="{bottom - _ROW:.1f}"/>')
    return head


# Arrow classes and their colors; the first class an arrow has picks its color.
_SVG_COLORS = {"drop": "#c62828", "corrupt": "#c62828", "nak": "#8e24aa", "retx": "#e08a00",
               "dup": "#00838f", "resp": "#2e7d32", "req": "#1f5fa8"}


def _svg_color(classes: list[str]) -> str:
    return next((c for c in _SVG_COLORS if c in classes), "req")


def _svg_unit(unit: str) -> str:
    return "\u00b5s" if unit == "us" else unit


# -- a simulated run ------------------------------------------------------------

@dataclass(frozen=True)
class SimRun:
    """What ``simulate`` returns: the fabric trace, names for the endpoints,
    and whether every work request completed and the data checked."""
    trace: list
    labels: dict[Address, str]
    ok: bool
    faults: str
    seed: int


def simulate(*, loss: float = 0.05, faults: str | None = None, seed: int = 2, mtu: int = 1024,
             size: int = 8192, read: bool = True, drop_requests: Iterable[int] = (),
             drop_responses: Iterable[int] = (),
             delay: float = 5e-6, capture: str | PathLike[str] | None = None) -> SimRun:
    """Two devices in the fabric: an RC WRITE of ``size`` bytes at path MTU
    ``mtu`` and then (with ``read``) a READ of ``size`` bytes back, over links
    with ``loss`` (or the fault model ``faults``, e.g. "loss=0.05,dup=0.01").

    ``drop_requests`` and ``drop_responses`` plant losses on top of the fault
    model: the indices (0-based, in send order) of the datagrams softnic0
    (the requester) and softnic1 send that the link loses.  ``capture`` names
    a pcap to write every delivered datagram to.
    """
    from ..core.device import Device, DeviceConfig
    from ..core.enums import SendFlags, WCStatus, WROpcode as W
    from ..core.qp import SendWR
    from ..driver.faults import FaultModel
    from ..experiments.rig import connect
    from ..transport.sim import Fabric

    model = FaultModel.parse(faults) if faults is not None else FaultModel(loss=loss)
    drops = (set(drop_requests), set(drop_responses))
    if any(drops) and model.p_enter_bad:
        raise ValueError("planted drops need a fault model without bursts")
    cfg = DeviceConfig(min_timer=100e-6)
    a = Device("softnic0", "10.0.0.1", config=cfg)
    b = Device("softnic1", "10.0.0.2", config=cfg)
    cap = None
    if capture is not None:
        from ..driver.capture import Capture
        cap = Capture(capture)
    link_model = model
    if any(drops) and not model.loss:
        link_model = replace(model, loss=1e-300)   # so that every datagram takes a loss draw
    fabric = Fabric(seed, default_faults=link_model, default_delay=delay, default_rate_bps=10e9,
                    trace=True, capture=cap)
    fabric.attach(a)
    fabric.attach(b)
    for (src, dst), planted in zip(((a, b), (b, a)), drops):
        if planted:
            injector = fabric.injector(src.address, dst.address)
            injector.rng = _PlantedLoss(injector.rng, injector.counters, planted)
    ea, eb = connect(a, b, mtu=mtu, psn_a=100, psn_b=5000, timeout=5, retry_cnt=7,
                     endpoint_args=dict(buf_size=max(2 * size, 4096)))
    rng = random.Random(seed)
    src = rng.randbytes(size)
    ea.buf.view[:size] = src
    far = rng.randbytes(size)
    eb.buf.view[size:2 * size] = far
    wrs = [SendWR(1, W.RDMA_WRITE, [ea.sge(0, size)], SendFlags.SIGNALED,
                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey)]
    if read:
        wrs.append(SendWR(2, W.RDMA_READ, [ea.sge(size, size)], SendFlags.SIGNALED,
                          remote_addr=eb.buf.addr + size, rkey=eb.mr.rkey))
    for wr in wrs:
        a.post_send(ea.qp, wr)
    done: list = []

    def finished() -> bool:
        done.extend(a.poll_cq(ea.send_cq, 16))
        return len(done) == len(wrs)

    fabric.run(until=1.0, stop=finished)
    fabric.run(until=fabric.now + 50e-6)     # let the last ACKs land
    if cap is not None:
        cap.close()
    ok = (len(done) == len(wrs) and all(wc.status == WCStatus.SUCCESS for wc in done)
          and bytes(eb.buf.view[:size]) == src
          and (not read or bytes(ea.buf.view[size:2 * size]) == far))
    return SimRun(fabric.trace, {a.address: f"{a.name} {a.ip}", b.address: f"{b.name} {b.ip}"},
                  ok, str(model), seed)


class _PlantedLoss(random.Random):
    """A link's rng that also loses chosen datagrams: the n-th datagram's first
    draw (the loss draw, when the model has no burst state) comes out 0."""

    def __init__(self, inner: random.Random, counters: dict, planted: Iterable[int]) -> None:
        super().__init__(0)
        self.inner = inner
        self.counters = counters
        self.planted = set(planted)

    def random(self) -> float:
        n = self.counters["sent"] - 1       # apply() counts the datagram before drawing
        if n in self.planted:
            self.planted.discard(n)
            return 0.0
        return self.inner.random()

    def getrandbits(self, k: int) -> int:
        return self.inner.getrandbits(k)
