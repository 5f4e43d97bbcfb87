"""RoCEv2 packet codecs: BTH and its extended transport headers.

Pure functions over bytes.  Every per-opcode fact (which headers follow the
BTH, whether there is a payload, where the packet sits in a message) lives in
the one table ``OPCODES``, built the way the IBA opcode table (and Linux rxe's
``rxe_opcode.c``) lays it out.  Header order on the wire:

    BTH [DETH] [XRCETH] [FETH] [RETH] [AtomicETH] [AETH] [AtomicAckETH] [ImmDt] [IETH] payload pad ICRC

FLUSH (IBTA Memory Placement Extensions; rxe since Linux 6.2) carries a FETH (its
placement type and selectivity level) before its RETH.

XRC opcodes (0xA0 + the RC suffix) carry an XRCETH (the target XRC SRQ number) in every
request packet; XRC responses are RC's with the XRC prefix.

All fields are big-endian.  The ICRC is handled in ``icrc.py``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import NamedTuple

from .psn import PSN_MASK, psn_add, psn_diff

__all__ = [
    "WireError", "Opcode", "OpInfo", "OPCODES", "Kind",
    "BTH", "RETH", "AETH", "AtomicETH", "AtomicAckETH", "ImmDt", "IETH", "DETH",
    "Packet", "encode", "encode_middle", "decode", "pad_count", "bth_word0", "AethCode", "NakCode",
    "BTH_LEN", "RETH_LEN", "AETH_LEN", "ATOMICETH_LEN", "ATOMICACKETH_LEN",
    "IMMDT_LEN", "IETH_LEN", "DETH_LEN", "XRCETH_LEN", "ICRC_LEN", "CNP_PAD_LEN",
    "FETH", "FETH_LEN",
    "ROCEV2_PORT", "PSN_MASK", "psn_add", "psn_diff",
    "BTH_FMT", "AETH_FMT", "RETH_FMT", "BTH_STRUCT", "BTH_AETH_STRUCT", "BTH_RETH_STRUCT",
    "RETH_STRUCT", "DETH_STRUCT", "BTH_OPCODE_SHIFT", "BTH_FLAGS_SHIFT",
    "BTH_SE", "BTH_MIGREQ", "BTH_PAD_SHIFT", "BTH_PAD_MASK", "BTH_TVER_MASK", "BTH_FECN",
    "BTH_BECN", "BTH_ACKREQ", "QPN_MASK", "DEFAULT_PKEY", "AETH_SYNDROME_SHIFT", "AETH_CODE_SHIFT", "MSN_MASK",
    "XRC_OPCODE_PREFIX",
]

ROCEV2_PORT = 4791

BTH_LEN = 12
RETH_LEN = 16
AETH_LEN = 4
ATOMICETH_LEN = 28
ATOMICACKETH_LEN = 8
IMMDT_LEN = 4
IETH_LEN = 4
DETH_LEN = 8
XRCETH_LEN = 4
FETH_LEN = 4
ICRC_LEN = 4
CNP_PAD_LEN = 16  # a CNP carries 16 reserved bytes after its BTH

# The BTH (IBA 9.2): word 0 the opcode, flags (SE, MigReq, PadCnt, TVer) and P_Key;
# word 1 FECN, BECN and the destination QP; word 2 AckReq and the PSN.  Each
# layout is written here once; the engine's packers and parsers use these.
BTH_FMT = "BBHII"
RETH_FMT = "QII"          # virtual address, R_Key, DMA length
AETH_FMT = "I"            # syndrome (bits 31:24) and MSN (23:0)
BTH_STRUCT = struct.Struct("!" + BTH_FMT)
BTH_AETH_STRUCT = struct.Struct("!" + BTH_FMT + AETH_FMT)     # an ACK, a CNP's first 16 bytes
BTH_RETH_STRUCT = struct.Struct("!" + BTH_FMT + RETH_FMT)     # a WRITE or READ's first headers
RETH_STRUCT = struct.Struct("!" + RETH_FMT)

# BTH word 0 (bytes 0-3)
BTH_OPCODE_SHIFT = 24     # the opcode, bits 31:24 (the flags byte 23:16, the P_Key 15:0)
BTH_FLAGS_SHIFT = 16      # the flags byte (byte 1, below), bits 23:16

# BTH byte 1
BTH_SE = 0x80             # solicited event
BTH_MIGREQ = 0x40         # migration state
BTH_PAD_SHIFT = 4         # PadCnt, bits 5:4
BTH_PAD_MASK = 0x3
BTH_TVER_MASK = 0x0F      # transport header version
# BTH word 1 (bytes 4-7)
BTH_FECN = 1 << 31
BTH_BECN = 1 << 30
QPN_MASK = 0xFFFFFF       # a QP number: 24 bits (the BTH's DestQP, DETH's and XRCETH's)
# BTH word 2 (bytes 8-11)
BTH_ACKREQ = 1 << 31      # the PSN is in bits 23:0 (``PSN_MASK``)
DEFAULT_PKEY = 0xFFFF     # the default full-membership partition key
AETH_SYNDROME_SHIFT = 24
AETH_CODE_SHIFT = 5       # within the syndrome: bits 6:5 the code (``AethCode``), 4:0 its value
MSN_MASK = 0xFFFFFF       # AETH's MSN: 24 bits
XRC_OPCODE_PREFIX = 0xA0  # an XRC opcode: this prefix and the RC opcode's low five bits


class WireError(ValueError):
    """A packet that cannot be decoded (truncated, unknown opcode, bad pad)."""


class Opcode(IntEnum):
    RC_SEND_FIRST = 0x00
    RC_SEND_MIDDLE = 0x01
    RC_SEND_LAST = 0x02
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03
    RC_SEND_ONLY = 0x04
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05
    RC_RDMA_WRITE_FIRST = 0x06
    RC_RDMA_WRITE_MIDDLE = 0x07
    RC_RDMA_WRITE_LAST = 0x08
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
    RC_RDMA_WRITE_ONLY = 0x0A
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    RC_RDMA_READ_REQUEST = 0x0C
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E
    RC_RDMA_READ_RESPONSE_LAST = 0x0F
    RC_RDMA_READ_RESPONSE_ONLY = 0x10
    RC_ACKNOWLEDGE = 0x11
    RC_ATOMIC_ACKNOWLEDGE = 0x12
    RC_COMPARE_SWAP = 0x13
    RC_FETCH_ADD = 0x14
    RC_SEND_LAST_WITH_INVALIDATE = 0x16
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17
    RC_FLUSH = 0x1C
    RC_ATOMIC_WRITE = 0x1D
    UC_SEND_FIRST = 0x20
    UC_SEND_MIDDLE = 0x21
    UC_SEND_LAST = 0x22
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23
    UC_SEND_ONLY = 0x24
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25
    UC_RDMA_WRITE_FIRST = 0x26
    UC_RDMA_WRITE_MIDDLE = 0x27
    UC_RDMA_WRITE_LAST = 0x28
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29
    UC_RDMA_WRITE_ONLY = 0x2A
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2B
    UD_SEND_ONLY = 0x64
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65
    CNP = 0x81
    XRC_SEND_FIRST = 0xA0
    XRC_SEND_MIDDLE = 0xA1
    XRC_SEND_LAST = 0xA2
    XRC_SEND_LAST_WITH_IMMEDIATE = 0xA3
    XRC_SEND_ONLY = 0xA4
    XRC_SEND_ONLY_WITH_IMMEDIATE = 0xA5
    XRC_RDMA_WRITE_FIRST = 0xA6
    XRC_RDMA_WRITE_MIDDLE = 0xA7
    XRC_RDMA_WRITE_LAST = 0xA8
    XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xA9
    XRC_RDMA_WRITE_ONLY = 0xAA
    XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xAB
    XRC_RDMA_READ_REQUEST = 0xAC
    XRC_RDMA_READ_RESPONSE_FIRST = 0xAD
    XRC_RDMA_READ_RESPONSE_MIDDLE = 0xAE
    XRC_RDMA_READ_RESPONSE_LAST = 0xAF
    XRC_RDMA_READ_RESPONSE_ONLY = 0xB0
    XRC_ACKNOWLEDGE = 0xB1
    XRC_ATOMIC_ACKNOWLEDGE = 0xB2
    XRC_COMPARE_SWAP = 0xB3
    XRC_FETCH_ADD = 0xB4
    XRC_SEND_LAST_WITH_INVALIDATE = 0xB6
    XRC_SEND_ONLY_WITH_INVALIDATE = 0xB7


class Kind(IntEnum):
    SEND = 1
    WRITE = 2
    READ_REQUEST = 3
    READ_RESPONSE = 4
    ACK = 5
    ATOMIC_ACK = 6
    ATOMIC = 7
    CNP = 8
    ATOMIC_WRITE = 9      # RETH and 8 bytes placed as one; answered by an empty READ RESPONSE
    FLUSH = 10            # FETH and RETH: make placed data visible/persistent; answered so too


class Pos(IntFlag):
    FIRST = 1
    MIDDLE = 2
    LAST = 4
    ONLY = FIRST | LAST


class OpInfo(NamedTuple):
    opcode: int
    name: str
    qp_type: str          # "RC", "UC", "UD", "XRC" or "CNP"
    kind: Kind
    first: bool           # starts a message
    last: bool            # ends a message
    deth: bool
    reth: bool
    atomiceth: bool
    aeth: bool
    atomicacketh: bool
    immdt: bool
    ieth: bool
    payload: bool         # may carry payload bytes
    hdr_len: int          # BTH plus every extended header
    xrceth: bool = False  # an XRC request: the target XRC SRQ follows the BTH
    feth: bool = False    # FLUSH: placement type and selectivity level, before the RETH

    @property
    def is_request(self) -> bool:
        """Requester -> responder direction (everything but responses, ACKs, CNPs)."""
        return self.kind in (Kind.SEND, Kind.WRITE, Kind.READ_REQUEST, Kind.ATOMIC,
                             Kind.ATOMIC_WRITE, Kind.FLUSH)

    @property
    def is_response(self) -> bool:
        return self.kind in (Kind.READ_RESPONSE, Kind.ACK, Kind.ATOMIC_ACK)


def _info(op: Opcode, kind: Kind, pos: Pos, *, deth=False, reth=False, atomiceth=False,
          aeth=False, atomicacketh=False, immdt=False, ieth=False, payload=False,
          feth=False) -> OpInfo:
    hdr = (BTH_LEN + DETH_LEN * deth + RETH_LEN * reth + ATOMICETH_LEN * atomiceth
           + AETH_LEN * aeth + ATOMICACKETH_LEN * atomicacketh + IMMDT_LEN * immdt
           + IETH_LEN * ieth + FETH_LEN * feth)
    qp_type = op.name.split("_", 1)[0]
    return OpInfo(int(op), op.name, qp_type, kind, bool(pos & Pos.FIRST), bool(pos & Pos.LAST),
                  deth, reth, atomiceth, aeth, atomicacketh, immdt, ieth, payload, hdr,
                  feth=feth)


def _xrc(rc: OpInfo) -> OpInfo:
    """The XRC opcode with ``rc``'s suffix: the same headers, and an XRCETH in a request."""
    op = Opcode(XRC_OPCODE_PREFIX | rc.opcode)
    x = rc.kind in (Kind.SEND, Kind.WRITE, Kind.READ_REQUEST, Kind.ATOMIC)
    return rc._replace(opcode=int(op), name=op.name, qp_type="XRC", xrceth=x,
                       hdr_len=rc.hdr_len + XRCETH_LEN * x)


def _build_table() -> dict[int, OpInfo]:
    F, M, L, O = Pos.FIRST, Pos.MIDDLE, Pos.LAST, Pos.ONLY
    t: list[OpInfo] = []
    for prefix in ("RC", "UC"):
        o = lambda n: Opcode[f"{prefix}_{n}"]  # noqa: E731
        t += [
            _info(o("SEND_FIRST"), Kind.SEND, F, payload=True),
            _info(o("SEND_MIDDLE"), Kind.SEND, M, payload=True),
            _info(o("SEND_LAST"), Kind.SEND, L, payload=True),
            _info(o("SEND_LAST_WITH_IMMEDIATE"), Kind.SEND, L, immdt=True, payload=True),
            _info(o("SEND_ONLY"), Kind.SEND, O, payload=True),
            _info(o("SEND_ONLY_WITH_IMMEDIATE"), Kind.SEND, O, immdt=True, payload=True),
            _info(o("RDMA_WRITE_FIRST"), Kind.WRITE, F, reth=True, payload=True),
            _info(o("RDMA_WRITE_MIDDLE"), Kind.WRITE, M, payload=True),
            _info(o("RDMA_WRITE_LAST"), Kind.WRITE, L, payload=True),
            _info(o("RDMA_WRITE_LAST_WITH_IMMEDIATE"), Kind.WRITE, L, immdt=True, payload=True),
            _info(o("RDMA_WRITE_ONLY"), Kind.WRITE, O, reth=True, payload=True),
            _info(o("RDMA_WRITE_ONLY_WITH_IMMEDIATE"), Kind.WRITE, O, reth=True, immdt=True,
                  payload=True),
        ]
    R = Opcode
    t += [
        _info(R.RC_RDMA_READ_REQUEST, Kind.READ_REQUEST, O, reth=True),
        _info(R.RC_RDMA_READ_RESPONSE_FIRST, Kind.READ_RESPONSE, F, aeth=True, payload=True),
        _info(R.RC_RDMA_READ_RESPONSE_MIDDLE, Kind.READ_RESPONSE, M, payload=True),
        _info(R.RC_RDMA_READ_RESPONSE_LAST, Kind.READ_RESPONSE, L, aeth=True, payload=True),
        _info(R.RC_RDMA_READ_RESPONSE_ONLY, Kind.READ_RESPONSE, O, aeth=True, payload=True),
        _info(R.RC_ACKNOWLEDGE, Kind.ACK, O, aeth=True),
        _info(R.RC_ATOMIC_ACKNOWLEDGE, Kind.ATOMIC_ACK, O, aeth=True, atomicacketh=True),
        _info(R.RC_COMPARE_SWAP, Kind.ATOMIC, O, atomiceth=True),
        _info(R.RC_FETCH_ADD, Kind.ATOMIC, O, atomiceth=True),
        _info(R.RC_SEND_LAST_WITH_INVALIDATE, Kind.SEND, L, ieth=True, payload=True),
        _info(R.RC_SEND_ONLY_WITH_INVALIDATE, Kind.SEND, O, ieth=True, payload=True),
        _info(R.RC_FLUSH, Kind.FLUSH, O, feth=True, reth=True),
        _info(R.RC_ATOMIC_WRITE, Kind.ATOMIC_WRITE, O, reth=True, payload=True),
        _info(R.UD_SEND_ONLY, Kind.SEND, O, deth=True, payload=True),
        _info(R.UD_SEND_ONLY_WITH_IMMEDIATE, Kind.SEND, O, deth=True, immdt=True, payload=True),
        _info(R.CNP, Kind.CNP, O),
    ]
    t += [_xrc(i) for i in t if i.qp_type == "RC" and i.opcode <= 0x17]
    return {i.opcode: i for i in t}


#: opcode -> OpInfo, for every RC, UC, UD and XRC opcode and the RoCEv2 CNP.
OPCODES: dict[int, OpInfo] = _build_table()


class AethCode(IntEnum):
    """AETH syndrome bits 6:5."""
    ACK = 0
    RNR_NAK = 1
    RESERVED = 2
    NAK = 3


class NakCode(IntEnum):
    """AETH syndrome bits 4:0 when the code is NAK (IBA table 'AETH syndrome')."""
    PSN_SEQUENCE_ERROR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2
    REMOTE_OPERATIONAL_ERROR = 3
    INVALID_RD_REQUEST = 4


@dataclass(frozen=True, slots=True)
class BTH:
    opcode: int
    se: bool = False
    migreq: bool = False
    pad: int = 0
    tver: int = 0
    pkey: int = DEFAULT_PKEY
    fecn: bool = False
    becn: bool = False
    dest_qp: int = 0
    ackreq: bool = False
    psn: int = 0


@dataclass(frozen=True, slots=True)
class RETH:
    va: int
    rkey: int
    dma_len: int


@dataclass(frozen=True, slots=True)
class AETH:
    syndrome: int
    msn: int

    @property
    def code(self) -> AethCode:
        return AethCode((self.syndrome >> AETH_CODE_SHIFT) & 3)

    @property
    def value(self) -> int:
        """Credit count (ACK), RNR timer (RNR NAK) or NAK code (NAK): bits 4:0."""
        return self.syndrome & 0x1F


@dataclass(frozen=True, slots=True)
class AtomicETH:
    va: int
    rkey: int
    swap_add: int
    compare: int


@dataclass(frozen=True, slots=True)
class FETH:
    """FLUSH's extended header: bits 5:4 the selectivity level (0 a range, 1 the whole
    memory region), bits 3:0 the placement type (1 global visibility, 2 persistence)."""
    sel: int
    plt: int


@dataclass(frozen=True, slots=True)
class AtomicAckETH:
    orig: int


@dataclass(frozen=True, slots=True)
class ImmDt:
    imm: int  # the 32-bit value as a host integer (wire order is big-endian)


@dataclass(frozen=True, slots=True)
class IETH:
    rkey: int


@dataclass(frozen=True, slots=True)
class DETH:
    qkey: int
    src_qp: int


@dataclass(frozen=True, slots=True)
class Packet:
    """A decoded RoCEv2 transport packet (the UDP payload minus its ICRC)."""
    bth: BTH
    info: OpInfo
    payload: bytes | memoryview = b""
    deth: DETH | None = None
    reth: RETH | None = None
    atomiceth: AtomicETH | None = None
    aeth: AETH | None = None
    atomicacketh: AtomicAckETH | None = None
    immdt: ImmDt | None = None
    ieth: IETH | None = None
    xrceth: int | None = None     # XRC requests: the target XRC SRQ number
    feth: FETH | None = None


_BTH = BTH_STRUCT
_RETH = RETH_STRUCT
_AETH = struct.Struct("!" + AETH_FMT)
_ATOMICETH = struct.Struct("!QIQQ")
_Q = struct.Struct("!Q")
_I = struct.Struct("!I")
DETH_STRUCT = struct.Struct("!II")   # Q_Key, and the source QP in bits 23:0
_DETH = DETH_STRUCT


def bth_word0(opcode: int, flags: int = 0) -> int:
    """A BTH's first 32-bit word: ``opcode``, the flags byte ``flags`` (SE,
    MigReq, PadCnt, TVer), the default P_Key; as the kernel compares a packet's
    and builds its own."""
    return (opcode << BTH_OPCODE_SHIFT) | (flags << BTH_FLAGS_SHIFT) | DEFAULT_PKEY


def pad_count(payload_len: int) -> int:
    """Bytes of pad that bring the payload to a multiple of 4 (BTH.PadCnt)."""
    return -payload_len & 3


def encode(opcode: int, *, dest_qp: int, psn: int, payload: bytes | memoryview = b"",
           se: bool = False, ackreq: bool = False, migreq: bool = False, pkey: int = DEFAULT_PKEY,
           fecn: bool = False, becn: bool = False,
           reth: tuple[int, int, int] | None = None,
           aeth: tuple[int, int] | None = None,
           atomiceth: tuple[int, int, int, int] | None = None,
           atomicack: int | None = None,
           imm: int | None = None,
           ieth: int | None = None,
           deth: tuple[int, int] | None = None,
           xrceth: int | None = None,
           feth: tuple[int, int] | None = None) -> bytearray:
    """Build headers + payload + pad (no ICRC) for ``opcode``.

    Extended headers are given as plain tuples in wire order
    (reth=(va, rkey, dma_len), aeth=(syndrome, msn),
    atomiceth=(va, rkey, swap_add, compare), deth=(qkey, src_qp), xrceth=srq number,
    feth=(selectivity level, placement type)).
    Raises WireError if a header the opcode requires is missing or one it
    forbids is given.
    """
    info = OPCODES.get(opcode)
    if info is None:
        raise WireError(f"unknown opcode {opcode:#x}")
    given = (deth is not None, reth is not None, atomiceth is not None, aeth is not None,
             atomicack is not None, imm is not None, ieth is not None, xrceth is not None,
             feth is not None)
    wanted = (info.deth, info.reth, info.atomiceth, info.aeth, info.atomicacketh,
              info.immdt, info.ieth, info.xrceth, info.feth)
    if given != wanted:
        raise WireError(f"{info.name}: extended headers {given} do not match {wanted}")
    plen = len(payload)
    if plen and not info.payload:
        raise WireError(f"{info.name} carries no payload")
    pad = -plen & 3
    if info.kind == Kind.CNP:
        pad = 0
    buf = bytearray(info.hdr_len + plen + pad + (CNP_PAD_LEN if info.kind == Kind.CNP else 0))
    _BTH.pack_into(buf, 0, opcode,
                   (BTH_SE if se else 0) | (BTH_MIGREQ if migreq else 0) | (pad << BTH_PAD_SHIFT),
                   pkey,
                   (BTH_FECN if fecn else 0) | (BTH_BECN if becn else 0) | (dest_qp & QPN_MASK),
                   (BTH_ACKREQ if ackreq else 0) | (psn & PSN_MASK))
    off = BTH_LEN
    if deth is not None:
        _DETH.pack_into(buf, off, deth[0], deth[1] & QPN_MASK)
        off += DETH_LEN
    if xrceth is not None:
        _I.pack_into(buf, off, xrceth & QPN_MASK)
        off += XRCETH_LEN
    if feth is not None:
        _I.pack_into(buf, off, ((feth[0] & 3) << 4) | (feth[1] & 0xF))
        off += FETH_LEN
    if reth is not None:
        _RETH.pack_into(buf, off, *reth)
        off += RETH_LEN
    if atomiceth is not None:
        _ATOMICETH.pack_into(buf, off, *atomiceth)
        off += ATOMICETH_LEN
    if aeth is not None:
        _AETH.pack_into(buf, off, ((aeth[0] & 0xFF) << AETH_SYNDROME_SHIFT) | (aeth[1] & MSN_MASK))
        off += AETH_LEN
    if atomicack is not None:
        _Q.pack_into(buf, off, atomicack)
        off += ATOMICACKETH_LEN
    if imm is not None:
        _I.pack_into(buf, off, imm)
        off += IMMDT_LEN
    if ieth is not None:
        _I.pack_into(buf, off, ieth)
        off += IETH_LEN
    if plen:
        buf[off:off + plen] = payload
    return buf


def encode_middle(opcode: int, dest_qp: int, psn: int, ackreq: bool,
                  payload: bytes | memoryview) -> bytearray:
    """``encode`` for the bulk of a long message: a MIDDLE packet (BTH and a
    payload of a whole MTU, so no pad; no SE, no extended header), the same
    bytes with less work per packet."""
    buf = bytearray(_BTH.pack(opcode, 0, DEFAULT_PKEY, dest_qp & QPN_MASK,
                              (BTH_ACKREQ if ackreq else 0) | (psn & PSN_MASK)))
    buf += payload                      # (not zero-filled first)
    return buf


def decode(data: bytes | bytearray | memoryview) -> Packet:
    """Decode a transport packet without its ICRC.  Raises WireError."""
    n = len(data)
    if n < BTH_LEN:
        raise WireError(f"truncated BTH ({n} bytes)")
    opcode, flags, pkey, w2, w3 = _BTH.unpack_from(data, 0)
    info = OPCODES.get(opcode)
    if info is None:
        raise WireError(f"unknown opcode {opcode:#x}")
    pad = (flags >> BTH_PAD_SHIFT) & BTH_PAD_MASK
    bth = BTH(opcode, bool(flags & BTH_SE), bool(flags & BTH_MIGREQ), pad, flags & BTH_TVER_MASK,
              pkey, bool(w2 & BTH_FECN), bool(w2 & BTH_BECN), w2 & QPN_MASK,
              bool(w3 & BTH_ACKREQ), w3 & PSN_MASK)
    if n < info.hdr_len:
        raise WireError(f"{info.name}: truncated headers ({n} < {info.hdr_len})")
    off = BTH_LEN
    deth = reth = atomiceth = aeth = atomicacketh = immdt = ieth = xrceth = feth = None
    if info.deth:
        deth = DETH(*_DETH.unpack_from(data, off))
        deth = DETH(deth.qkey, deth.src_qp & QPN_MASK)
        off += DETH_LEN
    if info.xrceth:
        xrceth = _I.unpack_from(data, off)[0] & QPN_MASK
        off += XRCETH_LEN
    if info.feth:
        w = _I.unpack_from(data, off)[0]
        feth = FETH((w >> 4) & 3, w & 0xF)
        off += FETH_LEN
    if info.reth:
        reth = RETH(*_RETH.unpack_from(data, off))
        off += RETH_LEN
    if info.atomiceth:
        atomiceth = AtomicETH(*_ATOMICETH.unpack_from(data, off))
        off += ATOMICETH_LEN
    if info.aeth:
        (w,) = _AETH.unpack_from(data, off)
        aeth = AETH(w >> AETH_SYNDROME_SHIFT, w & MSN_MASK)
        off += AETH_LEN
    if info.atomicacketh:
        atomicacketh = AtomicAckETH(_Q.unpack_from(data, off)[0])
        off += ATOMICACKETH_LEN
    if info.immdt:
        immdt = ImmDt(_I.unpack_from(data, off)[0])
        off += IMMDT_LEN
    if info.ieth:
        ieth = IETH(_I.unpack_from(data, off)[0])
        off += IETH_LEN
    if info.kind == Kind.CNP:
        if n - off != CNP_PAD_LEN:
            raise WireError(f"CNP: {n - off} bytes after BTH, expected {CNP_PAD_LEN}")
        payload: bytes | memoryview = b""
    else:
        plen = n - off - pad
        if plen < 0:
            raise WireError(f"{info.name}: pad count {pad} exceeds the {n - off} bytes left")
        if plen and not info.payload:
            raise WireError(f"{info.name}: unexpected {plen} payload bytes")
        payload = memoryview(data)[off:off + plen] if plen else b""
    return Packet(bth, info, payload, deth, reth, atomiceth, aeth, atomicacketh, immdt, ieth,
                  xrceth, feth)
