"""iWARP framing for the TCP transport: MPA (RFC 5044), DDP (RFC 5041), RDMAP (RFC 5040).

Pure functions over bytes, no state.  What goes on a TCP stream is:

* once per direction, an MPA Request or Reply frame: the 16-byte key
  ("MPA ID Req Frame" / "MPA ID Rep Frame"), the flags byte (M markers,
  C CRC, R reject), the revision and the private data length, then the
  private data;
* then FPDUs: the 16-bit ULPDU length, the ULPDU (one DDP segment: DDP and
  RDMAP headers and payload), a pad to a 4-byte boundary, and the CRC32c of
  all of that.  Markers are never negotiated on (M = 0).

A DDP segment is tagged (RDMA Write, RDMA Read Response: STag and tagged
offset) or untagged (Send, Read Request, Terminate, Immediate Data: queue
number, MSN and message offset).  The second byte of both is RDMAP's control
byte: its version and opcode.  ``OPCODES`` holds each opcode's facts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from crc32c import crc32c

MPA_KEY_REQ = b"MPA ID Req Frame"
MPA_KEY_REP = b"MPA ID Rep Frame"
MPA_REVISION = 1
MPA_MAX_PRIVATE_DATA = 512          # RFC 5044 section 7.1
MPA_FLAG_MARKERS = 0x80
MPA_FLAG_CRC = 0x40
MPA_FLAG_REJECT = 0x20
DDP_VERSION = 1
RDMAP_VERSION = 1
DDP_FLAG_TAGGED = 0x80
DDP_FLAG_LAST = 0x40
TAGGED_HDR = 14                     # DDP control, RDMAP control, STag, TO
UNTAGGED_HDR = 18                   # DDP control, RDMAP control, 4 reserved/Inv STag, QN, MSN, MO
READ_REQUEST_LEN = 28               # sink STag, sink TO, size, source STag, source TO
TERMINATE_CTRL_LEN = 4
MAX_ULPDU = 0xFFFF


class IwarpError(Exception):
    """Bytes that are not a well-formed MPA frame or FPDU."""


class CrcError(IwarpError):
    """An FPDU whose CRC32c does not check."""


class Opcode(IntEnum):
    """RDMAP opcodes (RFC 5040 section 4.3; 8 and 9 from RFC 7306)."""
    RDMA_WRITE = 0x0
    RDMA_READ_REQUEST = 0x1
    RDMA_READ_RESPONSE = 0x2
    SEND = 0x3
    SEND_INVALIDATE = 0x4
    SEND_SE = 0x5
    SEND_SE_INVALIDATE = 0x6
    TERMINATE = 0x7
    IMMEDIATE_DATA = 0x8
    IMMEDIATE_DATA_SE = 0x9


class QN(IntEnum):
    """Untagged queue numbers RDMAP uses (RFC 5040 section 5.1)."""
    SEND = 0
    READ_REQUEST = 1
    TERMINATE = 2


@dataclass(frozen=True)
class OpInfo:
    tagged: bool
    qn: int | None          # untagged messages: the queue they go to
    solicited: bool = False
    invalidate: bool = False


#: One table of per-opcode facts.
OPCODES: dict[Opcode, OpInfo] = {
    Opcode.RDMA_WRITE: OpInfo(True, None),
    Opcode.RDMA_READ_RESPONSE: OpInfo(True, None),
    Opcode.RDMA_READ_REQUEST: OpInfo(False, QN.READ_REQUEST),
    Opcode.SEND: OpInfo(False, QN.SEND),
    Opcode.SEND_INVALIDATE: OpInfo(False, QN.SEND, invalidate=True),
    Opcode.SEND_SE: OpInfo(False, QN.SEND, solicited=True),
    Opcode.SEND_SE_INVALIDATE: OpInfo(False, QN.SEND, solicited=True, invalidate=True),
    Opcode.TERMINATE: OpInfo(False, QN.TERMINATE),
    Opcode.IMMEDIATE_DATA: OpInfo(False, QN.SEND),
    Opcode.IMMEDIATE_DATA_SE: OpInfo(False, QN.SEND, solicited=True),
}


# ---------------------------------------------------------------- MPA request / reply

@dataclass(frozen=True)
class MpaFrame:
    request: bool
    private_data: bytes = b""
    markers: bool = False
    crc: bool = True
    reject: bool = False
    revision: int = MPA_REVISION


def encode_mpa(f: MpaFrame) -> bytes:
    if len(f.private_data) > MPA_MAX_PRIVATE_DATA:
        raise ValueError("MPA private data longer than 512 bytes")
    flags = ((MPA_FLAG_MARKERS if f.markers else 0) | (MPA_FLAG_CRC if f.crc else 0)
             | (MPA_FLAG_REJECT if f.reject else 0))
    return (MPA_KEY_REQ if f.request else MPA_KEY_REP) + struct.pack(
        ">BBH", flags, f.revision, len(f.private_data)) + bytes(f.private_data)


def decode_mpa(buf, request: bool) -> tuple[MpaFrame, int] | None:
    """The MPA Request (or Reply) at the start of ``buf`` and its length; None
    while incomplete.  Raises IwarpError for a wrong key or length."""
    if len(buf) < 20:
        return None
    key = bytes(buf[:16])
    if key != (MPA_KEY_REQ if request else MPA_KEY_REP):
        raise IwarpError(f"not an MPA {'Request' if request else 'Reply'}: key {key!r}")
    flags, rev, pd_len = struct.unpack_from(">BBH", buf, 16)
    if pd_len > MPA_MAX_PRIVATE_DATA:
        raise IwarpError(f"MPA private data length {pd_len} > {MPA_MAX_PRIVATE_DATA}")
    if len(buf) < 20 + pd_len:
        return None
    return MpaFrame(request, bytes(buf[20:20 + pd_len]), bool(flags & MPA_FLAG_MARKERS),
                    bool(flags & MPA_FLAG_CRC), bool(flags & MPA_FLAG_REJECT), rev), 20 + pd_len


# ---------------------------------------------------------------- DDP / RDMAP segments

@dataclass(frozen=True)
class Segment:
    """One DDP segment with its RDMAP opcode.  Tagged: ``stag``, ``to``.
    Untagged: ``qn``, ``msn``, ``mo`` and ``inv_stag`` (Send with Invalidate)."""
    opcode: Opcode
    last: bool
    payload: bytes | memoryview = b""
    stag: int = 0
    to: int = 0
    qn: int = 0
    msn: int = 0
    mo: int = 0
    inv_stag: int = 0

    @property
    def tagged(self) -> bool:
        return OPCODES[self.opcode].tagged

    def header(self) -> bytes:
        """The DDP and RDMAP headers of this segment (what a Terminate quotes)."""
        info = OPCODES[self.opcode]
        ddp = (DDP_FLAG_TAGGED if info.tagged else 0) | (DDP_FLAG_LAST if self.last else 0) \
            | DDP_VERSION
        rdmap = (RDMAP_VERSION << 6) | int(self.opcode)
        if info.tagged:
            return struct.pack(">BBIQ", ddp, rdmap, self.stag, self.to)
        return struct.pack(">BBIIII", ddp, rdmap, self.inv_stag, self.qn, self.msn, self.mo)


def encode_fpdu(seg: Segment) -> bytes:
    """An FPDU carrying ``seg``: length, ULPDU, pad, CRC32c (sent least significant byte
    first, as iSCSI sends the same CRC: RFC 3720 appendix B.4)."""
    hdr = seg.header()
    n = len(hdr) + len(seg.payload)
    if n > MAX_ULPDU:
        raise ValueError(f"ULPDU of {n} bytes does not fit MPA's 16-bit length")
    body = b"".join((n.to_bytes(2, "big"), hdr, seg.payload, bytes(-(2 + n) & 3)))
    return body + crc32c(body).to_bytes(4, "little")


def fpdu_len(ulpdu_len: int) -> int:
    """Bytes on the wire of an FPDU whose ULPDU has ``ulpdu_len`` bytes."""
    return (2 + ulpdu_len + 3) // 4 * 4 + 4


def decode_fpdu(buf, off: int = 0, check_crc: bool = True) -> tuple[Segment, int] | None:
    """The FPDU at ``buf[off:]`` and the offset after it; None while incomplete.
    Raises CrcError or IwarpError."""
    if len(buf) - off < 2:
        return None
    n = int.from_bytes(buf[off:off + 2], "big")
    end = off + fpdu_len(n)
    if len(buf) < end:
        return None
    mv = memoryview(buf)
    if check_crc and crc32c(mv[off:end - 4]) != int.from_bytes(mv[end - 4:end], "little"):
        raise CrcError("MPA CRC32c mismatch")
    return decode_ulpdu(mv[off + 2:off + 2 + n]), end


def decode_ulpdu(u: memoryview) -> Segment:
    if len(u) < 2:
        raise IwarpError("ULPDU shorter than the DDP control field")
    ddp, rdmap = u[0], u[1]
    if ddp & 3 != DDP_VERSION:
        raise IwarpError(f"DDP version {ddp & 3}")
    if rdmap >> 6 != RDMAP_VERSION:
        raise IwarpError(f"RDMAP version {rdmap >> 6}")
    try:
        op = Opcode(rdmap & 0xF)
    except ValueError:
        raise IwarpError(f"unknown RDMAP opcode {rdmap & 0xF}") from None
    tagged = bool(ddp & DDP_FLAG_TAGGED)
    if tagged != OPCODES[op].tagged:
        raise IwarpError(f"{op.name} in a {'tagged' if tagged else 'untagged'} segment")
    last = bool(ddp & DDP_FLAG_LAST)
    if tagged:
        if len(u) < TAGGED_HDR:
            raise IwarpError("short tagged DDP header")
        _, _, stag, to = struct.unpack_from(">BBIQ", u)
        return Segment(op, last, u[TAGGED_HDR:], stag=stag, to=to)
    if len(u) < UNTAGGED_HDR:
        raise IwarpError("short untagged DDP header")
    _, _, inv, qn, msn, mo = struct.unpack_from(">BBIIII", u)
    return Segment(op, last, u[UNTAGGED_HDR:], qn=qn, msn=msn, mo=mo, inv_stag=inv)


# ---------------------------------------------------------------- Read Request, Terminate

@dataclass(frozen=True)
class ReadRequest:
    sink_stag: int
    sink_to: int
    size: int
    src_stag: int
    src_to: int

    def encode(self) -> bytes:
        return struct.pack(">IQIIQ", self.sink_stag, self.sink_to, self.size, self.src_stag,
                           self.src_to)

    @classmethod
    def decode(cls, b) -> "ReadRequest":
        if len(b) != READ_REQUEST_LEN:
            raise IwarpError(f"Read Request payload of {len(b)} bytes, not 28")
        return cls(*struct.unpack_from(">IQIIQ", b))


class Layer(IntEnum):
    RDMAP = 0
    DDP = 1
    LLP = 2


class RdmapEtype(IntEnum):
    CATASTROPHIC = 0
    REMOTE_PROTECTION = 1
    REMOTE_OPERATION = 2


class RdmapEcode(IntEnum):
    INVALID_STAG = 0x00
    BASE_BOUNDS = 0x01
    ACCESS_RIGHTS = 0x02
    STAG_NOT_ASSOCIATED = 0x03
    TO_WRAP = 0x04
    VERSION = 0x05
    OPCODE = 0x06
    CATASTROPHIC_STREAM = 0x07
    CATASTROPHIC_GLOBAL = 0x08
    CANNOT_INVALIDATE = 0x09
    UNSPECIFIED = 0xFF


class DdpEtype(IntEnum):
    CATASTROPHIC = 0
    TAGGED_BUFFER = 1
    UNTAGGED_BUFFER = 2


class DdpTaggedEcode(IntEnum):
    INVALID_STAG = 0x00
    BASE_BOUNDS = 0x01
    STAG_NOT_ASSOCIATED = 0x02
    TO_WRAP = 0x03
    VERSION = 0x04


class DdpUntaggedEcode(IntEnum):
    INVALID_QN = 0x01
    INVALID_MSN_NO_BUFFER = 0x02
    INVALID_MSN_RANGE = 0x03
    INVALID_MO = 0x04
    MESSAGE_TOO_LONG = 0x05
    VERSION = 0x06


class LlpEcode(IntEnum):
    STREAM_LOST = 0x01
    CRC = 0x02
    FPDU_START = 0x03
    INVALID_REQ_REP = 0x04


@dataclass(frozen=True)
class Terminate:
    """A Terminate message's payload (RFC 5040 section 4.8): layer, error type
    and code, and the quoted headers of the segment that failed.  ``ddp_len``
    (the M bit) is that segment's MPA ULPDU length; ``ddp_header`` (D) its DDP
    and RDMAP headers; ``rdmap_header`` (R) a Read Request's 28 bytes."""
    layer: int
    etype: int
    ecode: int
    ddp_len: int | None = None
    ddp_header: bytes | None = None
    rdmap_header: bytes | None = None

    def encode(self) -> bytes:
        m, d, r = self.ddp_len is not None, self.ddp_header is not None, \
            self.rdmap_header is not None
        ctrl = (self.layer << 28) | (self.etype << 24) | (self.ecode << 16) \
            | (m << 15) | (d << 14) | (r << 13)
        return b"".join((ctrl.to_bytes(4, "big"),
                         self.ddp_len.to_bytes(2, "big") if m else b"",
                         self.ddp_header or b"", self.rdmap_header or b""))

    @classmethod
    def decode(cls, b) -> "Terminate":
        if len(b) < TERMINATE_CTRL_LEN:
            raise IwarpError("short Terminate")
        ctrl = int.from_bytes(b[:4], "big")
        pos = 4
        ddp_len = ddp_hdr = rdmap_hdr = None
        if ctrl & 0x8000:
            ddp_len = int.from_bytes(b[pos:pos + 2], "big")
            pos += 2
        if ctrl & 0x4000:
            if len(b) <= pos:
                raise IwarpError("Terminate says D but quotes no DDP header")
            n = TAGGED_HDR if b[pos] & DDP_FLAG_TAGGED else UNTAGGED_HDR
            ddp_hdr = bytes(b[pos:pos + n])
            pos += n
        if ctrl & 0x2000:
            rdmap_hdr = bytes(b[pos:pos + READ_REQUEST_LEN])
        return cls(ctrl >> 28, (ctrl >> 24) & 0xF, (ctrl >> 16) & 0xFF, ddp_len, ddp_hdr,
                   rdmap_hdr)

    def quoted_segment(self) -> Segment | None:
        """The failed segment's headers, decoded (no payload)."""
        if self.ddp_header is None:
            return None
        try:
            return decode_ulpdu(memoryview(self.ddp_header))
        except IwarpError:
            return None

    def describe(self) -> str:
        layer = Layer(self.layer).name if self.layer in Layer._value2member_map_ else self.layer
        return f"{layer} etype {self.etype} ecode {self.ecode:#x}"


def terminate_segment(term: Terminate, msn: int = 1) -> Segment:
    """The untagged segment (queue 2) that carries a Terminate."""
    return Segment(Opcode.TERMINATE, True, term.encode(), qn=QN.TERMINATE, msn=msn, mo=0)


# ---------------------------------------------------------------- softnic's private data

PRIVATE_MAGIC = b"snic"


def encode_private(src_qpn: int, dst_qpn: int) -> bytes:
    """MPA private data that names the QP pair: magic, sender's QPN, receiver's QPN."""
    return PRIVATE_MAGIC + struct.pack(">II", src_qpn, dst_qpn)


def decode_private(b: bytes) -> tuple[int, int]:
    if len(b) < 12 or b[:4] != PRIVATE_MAGIC:
        raise IwarpError("MPA private data does not name a softnic QP pair")
    return struct.unpack_from(">II", b, 4)
