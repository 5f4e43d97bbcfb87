"""Send work-request opcodes: one table of what each is, as rxe's
``rxe_wr_opcode_info[]`` (drivers/infiniband/sw/rxe/rxe_opcode.c).

``WR_OPCODES`` says, for each ``ibv_wr_opcode``: the QP types that may post it,
the RC wire opcodes that carry it (FIRST, MIDDLE, LAST, ONLY; UC's and XRC's are
the RC ones with their prefix), its completion's opcode, and its masks.  Every
set of WR opcodes the engine, the faces and the test strategies test against is
derived here, never listed again.

``RD_ATOMIC`` is the set the IBA's "RDMA READ and atomic" rules count: each such
request takes one of the requester's max_rd_atomic credits and one of the
responder's max_dest_rd_atomic resources until its response arrives, is
answered by a response of its own (never completed by an ACK), and is what a
fenced WR waits for.  ATOMIC WRITE and FLUSH (IBTA Memory Placement Extensions)
are answered as an RDMA READ is, so they count too (rxe: ``WR_ATOMIC_WRITE_MASK``
and ``WR_FLUSH_MASK`` beside ``WR_ATOMIC_OR_READ_MASK``).
"""

from __future__ import annotations

from enum import IntFlag
from typing import NamedTuple

from ..wire.roce import Opcode as O
from .enums import QPType, WCOpcode, WROpcode as W

__all__ = ["WRMask", "WROpInfo", "WR_OPCODES", "ALLOWED", "RD_ATOMIC", "ATOMICS",
           "MAY_INLINE", "TAKES_RECV", "REMOTE", "SENDS", "WRITES", "LOCAL", "WITH_IMM", "WITH_INV", "SEGMENTED",
           "EMPTY_READ_RESPONSE", "EIGHT_BYTES",
           "WC_OPCODE", "only_opcode"]


class WRMask(IntFlag):
    """What a WR opcode is (rxe's ``enum rxe_wr_mask``, with the facts softnic reads)."""
    INLINE = 1 << 0        # IBV_SEND_INLINE applies: its data may be copied at post time
    ATOMIC = 1 << 1        # compare-and-swap, fetch-and-add: an AtomicETH, 8 bytes back
    SEND = 1 << 2          # a SEND: the responder places it by a receive WQE
    READ = 1 << 3          # an RDMA READ
    WRITE = 1 << 4         # an RDMA WRITE
    LOCAL = 1 << 5         # a local operation: no packet (LOCAL_INV, BIND_MW)
    ATOMIC_WRITE = 1 << 6  # 8 bytes placed as one (a RETH and a payload)
    FLUSH = 1 << 7         # placed data made visible/persistent (a FETH and a RETH)
    RETH = 1 << 8          # names remote memory: a RETH (or AtomicETH) with an rkey
    IMM = 1 << 9           # carries immediate data (ImmDt in its last packet)
    INV = 1 << 10          # carries an rkey to invalidate (IETH in its last packet)
    RECV = 1 << 11         # takes a receive WQE at the responder
    RD_ATOMIC = 1 << 12    # counts against max_rd_atomic; answered by its own response


class WROpInfo(NamedTuple):
    opcode: W
    name: str
    qp_types: frozenset           # the QP types that may post it
    wire: tuple | None            # RC opcodes (FIRST, MIDDLE, LAST, ONLY); None: no packet
    mask: WRMask
    wc_opcode: WCOpcode           # its send completion's opcode


def _build() -> dict[W, WROpInfo]:
    M = WRMask
    RC, UC, UD = QPType.RC, QPType.UC, QPType.UD
    rows = [
        (W.RDMA_WRITE, {RC, UC},
         (O.RC_RDMA_WRITE_FIRST, O.RC_RDMA_WRITE_MIDDLE, O.RC_RDMA_WRITE_LAST,
          O.RC_RDMA_WRITE_ONLY),
         M.INLINE | M.WRITE | M.RETH, WCOpcode.RDMA_WRITE),
        (W.RDMA_WRITE_WITH_IMM, {RC, UC},
         (O.RC_RDMA_WRITE_FIRST, O.RC_RDMA_WRITE_MIDDLE, O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
          O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE),
         M.INLINE | M.WRITE | M.RETH | M.IMM | M.RECV, WCOpcode.RDMA_WRITE),
        (W.SEND, {RC, UC, UD},
         (O.RC_SEND_FIRST, O.RC_SEND_MIDDLE, O.RC_SEND_LAST, O.RC_SEND_ONLY),
         M.INLINE | M.SEND | M.RECV, WCOpcode.SEND),
        (W.SEND_WITH_IMM, {RC, UC, UD},
         (O.RC_SEND_FIRST, O.RC_SEND_MIDDLE, O.RC_SEND_LAST_WITH_IMMEDIATE,
          O.RC_SEND_ONLY_WITH_IMMEDIATE),
         M.INLINE | M.SEND | M.IMM | M.RECV, WCOpcode.SEND),
        (W.SEND_WITH_INV, {RC},
         (O.RC_SEND_FIRST, O.RC_SEND_MIDDLE, O.RC_SEND_LAST_WITH_INVALIDATE,
          O.RC_SEND_ONLY_WITH_INVALIDATE),
         M.INLINE | M.SEND | M.INV | M.RECV, WCOpcode.SEND),
        (W.RDMA_READ, {RC}, (None, None, None, O.RC_RDMA_READ_REQUEST),
         M.READ | M.RETH | M.RD_ATOMIC, WCOpcode.RDMA_READ),
        (W.ATOMIC_CMP_AND_SWP, {RC}, (None, None, None, O.RC_COMPARE_SWAP),
         M.ATOMIC | M.RETH | M.RD_ATOMIC, WCOpcode.COMP_SWAP),
        (W.ATOMIC_FETCH_AND_ADD, {RC}, (None, None, None, O.RC_FETCH_ADD),
         M.ATOMIC | M.RETH | M.RD_ATOMIC, WCOpcode.FETCH_ADD),
        (W.ATOMIC_WRITE, {RC}, (None, None, None, O.RC_ATOMIC_WRITE),
         M.ATOMIC_WRITE | M.RETH | M.RD_ATOMIC, WCOpcode.ATOMIC_WRITE),
        (W.FLUSH, {RC}, (None, None, None, O.RC_FLUSH),
         M.FLUSH | M.RETH | M.RD_ATOMIC, WCOpcode.FLUSH),
        (W.LOCAL_INV, {RC, UC}, None, M.LOCAL, WCOpcode.LOCAL_INV),
        (W.BIND_MW, {RC, UC}, None, M.LOCAL, WCOpcode.BIND_MW),
    ]
    return {op: WROpInfo(op, op.name, frozenset(qpts), wire, mask, wc)
            for op, qpts, wire, mask, wc in rows}


#: WR opcode -> what it is
WR_OPCODES: dict[W, WROpInfo] = _build()


def _having(mask: WRMask) -> frozenset:
    return frozenset(op for op, i in WR_OPCODES.items() if i.mask & mask)


#: QP type -> the WR opcodes ``ibv_post_send`` takes on it
ALLOWED = {t: frozenset(op for op, i in WR_OPCODES.items() if t in i.qp_types)
           for t in (QPType.RC, QPType.UC, QPType.UD)}
RD_ATOMIC = _having(WRMask.RD_ATOMIC)
ATOMICS = _having(WRMask.ATOMIC)          # compare-and-swap and fetch-and-add
MAY_INLINE = _having(WRMask.INLINE)
TAKES_RECV = _having(WRMask.RECV)
REMOTE = _having(WRMask.RETH)             # names the peer's memory by rkey
SENDS = _having(WRMask.SEND)
WRITES = _having(WRMask.WRITE)
LOCAL = _having(WRMask.LOCAL)
WITH_IMM = _having(WRMask.IMM)
WITH_INV = _having(WRMask.INV)
#: answered by an empty RDMA READ RESPONSE ONLY (IBTA Memory Placement Extensions, as rxe)
EMPTY_READ_RESPONSE = _having(WRMask.ATOMIC_WRITE | WRMask.FLUSH)
#: an 8-byte operation: its completion's byte_len is 8
EIGHT_BYTES = _having(WRMask.ATOMIC | WRMask.ATOMIC_WRITE)
#: the WR opcodes a long message carries in FIRST/MIDDLE/LAST packets -> those opcodes
SEGMENTED = {op: i.wire for op, i in WR_OPCODES.items()
             if i.wire is not None and i.wire[1] is not None}
#: WR opcode -> its send completion's opcode
WC_OPCODE = {op: i.wc_opcode for op, i in WR_OPCODES.items()}


def only_opcode(op: W) -> O:
    """The RC opcode of ``op``'s packet when its message fits in one."""
    return WR_OPCODES[op].wire[3]
