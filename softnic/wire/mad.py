"""Management datagrams on QP1 (the GSI): the MAD header and the IBTA CM messages.

A CM message is a 256-byte MAD (IBTA vol. 1, 13.4 and chapter 12) whose
common header names the management class (0x07, CM), the method and the
attribute (REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP).  On
RoCEv2 it travels as a UD SEND_ONLY to QP1 with the GSI's Q_Key.  Field
offsets are the spec's tables 106-120, counted from the end of the 24-byte
MAD header; ``bits`` counts from a byte's most significant bit, as the spec
draws them.

rdma_cm (IP addressing) adds two conventions, also here: the service ID is
``0x0000000001000000 | port_space << 16 | port`` and a REQ's (or SIDR_REQ's)
private data begins with a 36-byte header naming both IP addresses and the
source port (``CmaHeader``).

Pure functions over bytes; decoding raises ``MadError`` on anything malformed.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field, fields
from enum import IntEnum

MAD_LEN = 256
MAD_HDR_LEN = 24
CM_DATA_LEN = MAD_LEN - MAD_HDR_LEN
BASE_VERSION = 1
MGMT_CLASS_CM = 0x07
CM_CLASS_VERSION = 2
METHOD_SEND = 0x03
#: the GSI's well-known Q_Key (QP1)
GSI_QKEY = 0x80010000
GSI_QPN = 1

#: rdma_cm port spaces (librdmacm's enum rdma_port_space)
RDMA_PS_IPOIB = 0x0002
RDMA_PS_IB = 0x013F
RDMA_PS_TCP = 0x0106
RDMA_PS_UDP = 0x0111
_IP_PS_BASE = 0x0000000001000000


class MadError(ValueError):
    """A MAD that cannot be decoded."""


class Attr(IntEnum):
    CLASS_PORT_INFO = 0x0001
    REQ = 0x0010
    MRA = 0x0011
    REJ = 0x0012
    REP = 0x0013
    RTU = 0x0014
    DREQ = 0x0015
    DREP = 0x0016
    SIDR_REQ = 0x0017
    SIDR_REP = 0x0018
    LAP = 0x0019
    APR = 0x001A


class RejReason(IntEnum):
    """REJ reasons (table 109) that this CM sends or reports."""
    NO_QP = 1
    NO_RESOURCES = 3
    TIMEOUT = 4
    INVALID_COMM_ID = 6
    INVALID_SERVICE_ID = 8
    STALE_CONN = 10
    CONSUMER_DEFINED = 28


class SidrStatus(IntEnum):
    OK = 0
    UNSUPPORTED = 1     # no such service ID
    REJECT = 2
    NO_QP = 3


def service_id(port_space: int, port: int) -> int:
    """rdma_cm's service ID for an IP port in a port space."""
    return _IP_PS_BASE | (port_space & 0xFFFF) << 16 | (port & 0xFFFF)


def service_port(sid: int) -> tuple[int, int]:
    """(port space, port) of an rdma_cm service ID."""
    return (sid >> 16) & 0xFFFF, sid & 0xFFFF


# ---------------------------------------------------------------- the MAD header

_HDR = struct.Struct("!BBBBHHQHHI")


@dataclass(frozen=True)
class MadHeader:
    attr_id: int
    tid: int
    method: int = METHOD_SEND
    mgmt_class: int = MGMT_CLASS_CM
    class_version: int = CM_CLASS_VERSION
    base_version: int = BASE_VERSION
    status: int = 0
    class_specific: int = 0
    attr_mod: int = 0


def encode_header(h: MadHeader) -> bytes:
    return _HDR.pack(h.base_version, h.mgmt_class, h.class_version, h.method & 0xFF, h.status,
                     h.class_specific, h.tid, h.attr_id, 0, h.attr_mod)


def decode_header(mad: bytes) -> MadHeader:
    if len(mad) < MAD_HDR_LEN:
        raise MadError(f"MAD of {len(mad)} bytes is shorter than its header")
    bv, mc, cv, method, status, cs, tid, attr, _, mod = _HDR.unpack_from(mad)
    return MadHeader(attr, tid, method, mc, cv, bv, status, cs, mod)


# ---------------------------------------------------------------- field tables
#
# Each message is a frozen dataclass; its layout is a table of
# (field, byte offset, bit offset from the MSB, width in bits) rows, read by
# one encoder and one decoder.  Byte strings (GIDs, private data, ARI) are
# rows whose width is a multiple of 8 and that hold ``bytes``.

Row = tuple  # (name, byte, bit, width)


def _put(buf: bytearray, off: int, bit: int, width: int, value) -> None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        n = width // 8
        v = bytes(value)[:n]
        buf[off:off + len(v)] = v
        return
    nbytes = (bit + width + 7) // 8
    shift = nbytes * 8 - bit - width
    mask = ((1 << width) - 1) << shift
    cur = int.from_bytes(buf[off:off + nbytes], "big")
    cur = (cur & ~mask) | ((int(value) << shift) & mask)
    buf[off:off + nbytes] = cur.to_bytes(nbytes, "big")


def _get(buf: bytes, off: int, bit: int, width: int, raw: bool):
    if raw:
        return bytes(buf[off:off + width // 8])
    nbytes = (bit + width + 7) // 8
    shift = nbytes * 8 - bit - width
    return (int.from_bytes(buf[off:off + nbytes], "big") >> shift) & ((1 << width) - 1)


_RAW = ("gid", "private_data", "ari", "additional_info")


def _is_raw(name: str) -> bool:
    return any(name.endswith(s) or name == s for s in _RAW)


class _Msg:
    ATTR: Attr
    LAYOUT: tuple[Row, ...]
    PRIVATE_LEN: int

    def encode_data(self) -> bytes:
        buf = bytearray(CM_DATA_LEN)
        for name, off, bit, width in self.LAYOUT:
            _put(buf, off, bit, width, getattr(self, name))
        return bytes(buf)

    @classmethod
    def decode_data(cls, data: bytes):
        if len(data) < CM_DATA_LEN:
            raise MadError(f"{cls.ATTR.name}: {len(data)} bytes of CM data, not {CM_DATA_LEN}")
        kw = {name: _get(data, off, bit, width, _is_raw(name))
              for name, off, bit, width in cls.LAYOUT}
        return cls(**kw)


def gid_bytes(g) -> bytes:
    """A GID as the 16 bytes a CM message carries: bytes as they are, an IPv6
    address's, or an IPv4 address as its IPv4-mapped GID (``::ffff:a.b.c.d``)."""
    if isinstance(g, bytes):
        return g
    ip = ipaddress.ip_address(g)
    if ip.version == 4:
        ip = ipaddress.IPv6Address("::ffff:" + str(ip))
    return ip.packed


@dataclass(frozen=True)
class Req(_Msg):
    local_comm_id: int
    service_id: int
    local_ca_guid: int
    local_qpn: int
    starting_psn: int
    primary_local_port_gid: bytes
    primary_remote_port_gid: bytes
    local_qkey: int = 0
    responder_resources: int = 0
    initiator_depth: int = 0
    remote_cm_response_timeout: int = 16
    transport_service_type: int = 0        # 0 RC, 1 UC, 3 RD
    end_to_end_flow_control: int = 0
    local_cm_response_timeout: int = 16
    retry_count: int = 7
    partition_key: int = 0xFFFF
    path_mtu: int = 5
    rnr_retry_count: int = 7
    max_cm_retries: int = 15
    srq: int = 0
    primary_local_port_lid: int = 0xFFFF   # RoCE: permissive LIDs
    primary_remote_port_lid: int = 0xFFFF
    primary_flow_label: int = 0
    primary_packet_rate: int = 0
    primary_traffic_class: int = 0
    primary_hop_limit: int = 64
    primary_sl: int = 0
    primary_subnet_local: int = 1
    primary_local_ack_timeout: int = 14
    private_data: bytes = b""

    ATTR = Attr.REQ
    PRIVATE_LEN = 92
    LAYOUT = (
        ("local_comm_id", 0, 0, 32), ("service_id", 8, 0, 64), ("local_ca_guid", 16, 0, 64),
        ("local_qkey", 28, 0, 32), ("local_qpn", 32, 0, 24), ("responder_resources", 35, 0, 8),
        ("initiator_depth", 39, 0, 8), ("remote_cm_response_timeout", 43, 0, 5),
        ("transport_service_type", 43, 5, 2), ("end_to_end_flow_control", 43, 7, 1),
        ("starting_psn", 44, 0, 24), ("local_cm_response_timeout", 47, 0, 5),
        ("retry_count", 47, 5, 3), ("partition_key", 48, 0, 16), ("path_mtu", 50, 0, 4),
        ("rnr_retry_count", 50, 5, 3), ("max_cm_retries", 51, 0, 4), ("srq", 51, 4, 1),
        ("primary_local_port_lid", 52, 0, 16), ("primary_remote_port_lid", 54, 0, 16),
        ("primary_local_port_gid", 56, 0, 128), ("primary_remote_port_gid", 72, 0, 128),
        ("primary_flow_label", 88, 0, 20), ("primary_packet_rate", 91, 2, 6),
        ("primary_traffic_class", 92, 0, 8), ("primary_hop_limit", 93, 0, 8),
        ("primary_sl", 94, 0, 4), ("primary_subnet_local", 94, 4, 1),
        ("primary_local_ack_timeout", 95, 0, 5), ("private_data", 140, 0, 92 * 8),
    )


@dataclass(frozen=True)
class Mra(_Msg):
    local_comm_id: int
    remote_comm_id: int
    message_mraed: int = 0        # 0 REQ, 1 REP, 2 LAP
    service_timeout: int = 20
    private_data: bytes = b""

    ATTR = Attr.MRA
    PRIVATE_LEN = 222
    LAYOUT = (("local_comm_id", 0, 0, 32), ("remote_comm_id", 4, 0, 32),
              ("message_mraed", 8, 0, 2), ("service_timeout", 9, 0, 5),
              ("private_data", 10, 0, 222 * 8))


@dataclass(frozen=True)
class Rej(_Msg):
    local_comm_id: int
    remote_comm_id: int
    reason: int
    message_rejected: int = 0     # 0 REQ, 1 REP, 2 other
    rejected_info_length: int = 0
    ari: bytes = b""
    private_data: bytes = b""

    ATTR = Attr.REJ
    PRIVATE_LEN = 148
    LAYOUT = (("local_comm_id", 0, 0, 32), ("remote_comm_id", 4, 0, 32),
              ("message_rejected", 8, 0, 2), ("rejected_info_length", 9, 0, 7),
              ("reason", 10, 0, 16), ("ari", 12, 0, 72 * 8), ("private_data", 84, 0, 148 * 8))


@dataclass(frozen=True)
class Rep(_Msg):
    local_comm_id: int
    remote_comm_id: int
    local_qpn: int
    starting_psn: int
    local_ca_guid: int
    local_qkey: int = 0
    responder_resources: int = 0
    initiator_depth: int = 0
    target_ack_delay: int = 15
    failover_accepted: int = 0
    end_to_end_flow_control: int = 0
    rnr_retry_count: int = 7
    srq: int = 0
    private_data: bytes = b""

    ATTR = Attr.REP
    PRIVATE_LEN = 196
    LAYOUT = (("local_comm_id", 0, 0, 32), ("remote_comm_id", 4, 0, 32),
              ("local_qkey", 8, 0, 32), ("local_qpn", 12, 0, 24), ("starting_psn", 20, 0, 24),
              ("responder_resources", 24, 0, 8), ("initiator_depth", 25, 0, 8),
              ("target_ack_delay", 26, 0, 5), ("failover_accepted", 26, 5, 2),
              ("end_to_end_flow_control", 26, 7, 1), ("rnr_retry_count", 27, 0, 3),
              ("srq", 27, 3, 1), ("local_ca_guid", 28, 0, 64),
              ("private_data", 36, 0, 196 * 8))


@dataclass(frozen=True)
class Rtu(_Msg):
    local_comm_id: int
    remote_comm_id: int
    private_data: bytes = b""

    ATTR = Attr.RTU
    PRIVATE_LEN = 224
    LAYOUT = (("local_comm_id", 0, 0, 32), ("remote_comm_id", 4, 0, 32),
              ("private_data", 8, 0, 224 * 8))


@dataclass(frozen=True)
class Dreq(_Msg):
    local_comm_id: int
    remote_comm_id: int
    remote_qpn: int
    private_data: bytes = b""

    ATTR = Attr.DREQ
    PRIVATE_LEN = 220
    LAYOUT = (("local_comm_id", 0, 0, 32), ("remote_comm_id", 4, 0, 32),
              ("remote_qpn", 8, 0, 24), ("private_data", 12, 0, 220 * 8))


@dataclass(frozen=True)
class Drep(_Msg):
    local_comm_id: int
    remote_comm_id: int
    private_data: bytes = b""

    ATTR = Attr.DREP
    PRIVATE_LEN = 224
    LAYOUT = (("local_comm_id", 0, 0, 32), ("remote_comm_id", 4, 0, 32),
              ("private_data", 8, 0, 224 * 8))


@dataclass(frozen=True)
class SidrReq(_Msg):
    request_id: int
    service_id: int
    partition_key: int = 0xFFFF
    private_data: bytes = b""

    ATTR = Attr.SIDR_REQ
    PRIVATE_LEN = 216
    LAYOUT = (("request_id", 0, 0, 32), ("partition_key", 4, 0, 16), ("service_id", 8, 0, 64),
              ("private_data", 16, 0, 216 * 8))


@dataclass(frozen=True)
class SidrRep(_Msg):
    request_id: int
    status: int
    qpn: int
    service_id: int
    qkey: int
    additional_info_length: int = 0
    additional_info: bytes = b""
    private_data: bytes = b""

    ATTR = Attr.SIDR_REP
    PRIVATE_LEN = 136
    LAYOUT = (("request_id", 0, 0, 32), ("status", 4, 0, 8),
              ("additional_info_length", 5, 0, 8), ("qpn", 8, 0, 24),
              ("service_id", 12, 0, 64), ("qkey", 20, 0, 32),
              ("additional_info", 24, 0, 72 * 8), ("private_data", 96, 0, 136 * 8))


MESSAGES: dict[int, type] = {m.ATTR: m for m in (Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq,
                                                 SidrRep)}
CmMessage = Req | Mra | Rej | Rep | Rtu | Dreq | Drep | SidrReq | SidrRep


def encode_cm(msg: CmMessage, tid: int) -> bytes:
    """A whole 256-byte CM MAD carrying ``msg``."""
    pd = getattr(msg, "private_data", b"")
    if len(pd) > msg.PRIVATE_LEN:
        raise MadError(f"{msg.ATTR.name}: {len(pd)} bytes of private data, at most "
                       f"{msg.PRIVATE_LEN}")
    return encode_header(MadHeader(int(msg.ATTR), tid)) + msg.encode_data()


def decode_cm(mad: bytes) -> tuple[MadHeader, CmMessage]:
    """Header and message of a CM MAD; MadError if it is not one this CM reads."""
    if len(mad) != MAD_LEN:
        raise MadError(f"a MAD is {MAD_LEN} bytes, not {len(mad)}")
    h = decode_header(mad)
    if h.base_version != BASE_VERSION or h.mgmt_class != MGMT_CLASS_CM \
            or h.class_version != CM_CLASS_VERSION:
        raise MadError(f"not a CM MAD (version {h.base_version}, class {h.mgmt_class:#x}/"
                       f"{h.class_version})")
    cls = MESSAGES.get(h.attr_id)
    if cls is None:
        raise MadError(f"unsupported CM attribute {h.attr_id:#06x}")
    if h.method != METHOD_SEND:
        raise MadError(f"CM method {h.method:#x} (only Send is used)")
    return h, cls.decode_data(mad[MAD_HDR_LEN:])


# ---------------------------------------------------------------- rdma_cm's IP header

_CMA = struct.Struct("!BBH16s16s")
CMA_HDR_LEN = _CMA.size        # 36


@dataclass(frozen=True)
class CmaHeader:
    """The header rdma_cm puts before the user's private data of a REQ or a
    SIDR_REQ: IP version, the source port and both addresses (IPv4 in the
    last four bytes of each 16-byte field)."""
    src_ip: str
    dst_ip: str
    src_port: int
    version: int = 0

    def encode(self) -> bytes:
        s, d = ipaddress.ip_address(self.src_ip), ipaddress.ip_address(self.dst_ip)
        ipv = 4 if s.version == 4 else 6
        return _CMA.pack(self.version, ipv << 4, self.src_port,
                         s.packed.rjust(16, b"\0"), d.packed.rjust(16, b"\0"))

    @classmethod
    def decode(cls, data: bytes) -> "CmaHeader":
        if len(data) < CMA_HDR_LEN:
            raise MadError("private data shorter than rdma_cm's header")
        ver, ipv, port, s, d = _CMA.unpack_from(data)
        if ver != 0:
            raise MadError(f"rdma_cm header version {ver}")
        if ipv >> 4 == 4:
            return cls(str(ipaddress.IPv4Address(s[12:])), str(ipaddress.IPv4Address(d[12:])),
                       port, ver)
        if ipv >> 4 == 6:
            return cls(str(ipaddress.IPv6Address(s)), str(ipaddress.IPv6Address(d)), port, ver)
        raise MadError(f"rdma_cm header IP version {ipv >> 4}")


__all__ = [n for n in dir() if not n.startswith("_")]
del field, fields
