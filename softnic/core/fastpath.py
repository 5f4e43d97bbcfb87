"""Small-message fast paths: the common case of RC traffic in few steps.

Latency-bound programs (ping-pong, RPC, perftest's ``*_lat``) move one-packet
messages: a WRITE or SEND that fits one MTU, answered by one ACK.  The general
path builds a ``Packet`` of frozen dataclasses for each, walks the send queue,
and dispatches through the requester, responder and completer; about a hundred
microseconds of interpreter work per message and its ACK.  These functions
handle exactly that common case with a handful of struct operations each, in
the manner of ``Device._write_continue``:

``send_only(dev, qp, out)``
    the requester's step for an RC QP whose one new WQE is a single-packet
    WRITE / SEND (with or without immediate) and nothing else to send.
``request_only(dev, data, src)``
    a WRITE ONLY or SEND ONLY request (with or without immediate) in sequence:
    checked, placed, completed and acknowledged without decoding a ``Packet``.
``write_first(dev, data, src)``
    the FIRST packet of a multi-packet WRITE, in sequence: its target looked
    up and its MTU of data placed (the MIDDLEs and LAST that follow take
    ``Device._write_continue``, or the kernel).
``ack(dev, data, src, now)``
    a plain ACK for the oldest outstanding WQE: completes it.

Each returns False, having changed nothing, whenever any condition of the
common case does not hold (an error to report, a NAK to send, a resend, a
congestion controller, selective-repeat state, ECN marks, ...); the general
path then handles the packet and reaches the same result.  A test drives the
same random workloads with and without the fast paths and compares every byte
on the wire and every completion (tests/test_fastpath.py).
"""

from __future__ import annotations

import struct

from ..wire.icrc import check_icrc
from ..wire.roce import Kind, Opcode as O, psn_diff
from . import completer, requester, responder
from .cq import WC
from .enums import Access, QPState, QPType, SendFlags, WCFlags, WCOpcode, WCStatus, \
    WROpcode as W
from .memory import AccessError

_RC = QPType.RC
_RTS = QPState.RTS
_RECEIVING = frozenset({QPState.RTR, QPState.RTS, QPState.SQD})
_FENCE = int(SendFlags.FENCE)
_SOLICITED = int(SendFlags.SOLICITED)
_REMOTE_WRITE = int(Access.REMOTE_WRITE)

_WRITE_ONLY = int(O.RC_RDMA_WRITE_ONLY)
_WRITE_ONLY_IMM = int(O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
_SEND_ONLY = int(O.RC_SEND_ONLY)
_SEND_ONLY_IMM = int(O.RC_SEND_ONLY_WITH_IMMEDIATE)
_ACK = int(O.RC_ACKNOWLEDGE)
WRITE_FIRST = int(O.RC_RDMA_WRITE_FIRST)
_WRITE = Kind.WRITE

#: request opcodes ``request_only`` takes
REQUESTS = frozenset({_WRITE_ONLY, _WRITE_ONLY_IMM, _SEND_ONLY, _SEND_ONLY_IMM})

#: WR opcode -> (ONLY opcode, carries a RETH, carries an immediate)
_ONLY = {
    W.RDMA_WRITE: (_WRITE_ONLY, True, False),
    W.RDMA_WRITE_WITH_IMM: (_WRITE_ONLY_IMM, True, True),
    W.SEND: (_SEND_ONLY, False, False),
    W.SEND_WITH_IMM: (_SEND_ONLY_IMM, False, True),
}

_BTH = struct.Struct("!BBHII")
_RETH = struct.Struct("!QII")
_BTH_RETH = struct.Struct("!BBHIIQII")
_I = struct.Struct("!I")
_ACK_PKT = struct.Struct("!BBHIII")        # BTH + AETH
_MASK = 0xFFFFFF

# ------------------------------------------------------------------ requester


def send_only(dev, qp, out: list) -> bool:
    """``requester.generate`` for its most common call: an RC QP whose one new
    WQE, the last posted, is a single-packet WRITE or SEND, with no resend
    pending and no congestion controller.  Appends the packet (without ICRC,
    as ``generate`` does) and returns True; False, nothing changed, otherwise."""
    sq = qp.sq
    if qp.send_idx != len(sq) - 1 or qp.qp_type is not _RC or qp.state is not _RTS \
            or qp.cc is not None or qp.rnr_wait or qp.req_error or qp.rexmit:
        return False
    wqe = sq[-1]
    spec = _ONLY.get(wqe.opcode)
    if spec is None or wqe.first_psn is not None or wqe.done or wqe.length > qp.mtu:
        return False
    if wqe.flags & _FENCE and qp.rd_atomic_inflight:
        return False
    if requester._window_full(qp, qp.sq_psn):
        return False
    requester._start(dev, qp, wqe)
    if wqe.done:                    # a local protection error
        qp.req_error = True
        qp.send_idx += 1
        return True
    psn = wqe.first_psn
    # the general path's bookkeeping for one packet
    qp.pkts_since_ackreq = 0                # an ONLY asks for an ACK
    if psn_diff(psn, qp.max_sent_psn) <= 0:
        dev.counters["retransmitted_pkts"] += 1
    else:
        qp.max_sent_psn = psn
    wqe.next_pkt = 1
    qp.send_idx += 1
    opcode, reth, imm = spec
    n = wqe.length
    pad = -n & 3
    hdr = 28 if reth else 12
    if imm:
        hdr += 4
    buf = bytearray(hdr + n + pad)
    flags = (0x80 if wqe.flags & _SOLICITED else 0) | (pad << 4)
    if reth:
        _BTH_RETH.pack_into(buf, 0, opcode, flags, 0xFFFF, qp.attr.dest_qp_num & _MASK,
                            0x80000000 | psn, wqe.remote_addr, wqe.rkey, n)
    else:
        _BTH.pack_into(buf, 0, opcode, flags, 0xFFFF, qp.attr.dest_qp_num & _MASK,
                       0x80000000 | psn)
    if imm:
        _I.pack_into(buf, hdr - 4, wqe.imm)
    if n:
        views = wqe.views
        buf[hdr:hdr + n] = views[0] if len(views) == 1 else requester.gather(wqe, 0, n)
    out.append((buf, qp.dest))
    return True


# ------------------------------------------------------------------ responder


def _next_request(dev, data, min_len: int):
    """``(qp, opcode, flags, w3, psn)`` for a request of at least ``min_len``
    bytes that starts a message at the PSN an RC QP without a controller
    expects, with nothing held out of order; None for anything else."""
    if len(data) < min_len:
        return None
    opcode, flags, pkey, w2, w3 = _BTH.unpack_from(data, 0)
    qp = dev.qps.get(w2 & _MASK)
    if qp is None or qp.qp_type is not _RC or qp.cc is not None or pkey != 0xFFFF or w2 >> 30:
        return None
    psn = w3 & _MASK
    if psn != qp.epsn or qp.resp_kind is not None or qp.ooo or qp.state not in _RECEIVING:
        return None
    return qp, opcode, flags, w3, psn


def _nothing_held(qp) -> None:
    """What ``responder.receive`` clears after a packet when no packet is held
    out of order (the selective-repeat bookkeeping of a hole now gone)."""
    if qp.sr_naked:
        qp.sr_naked.clear()
    qp.sr_scan = None
    if qp.sr_writes:
        qp.sr_writes.clear()
    if qp.sr_placed is not None:
        qp.sr_placed.clear()


def write_first(dev, data, src) -> bool:
    """The FIRST packet of a multi-packet RDMA WRITE, in sequence, that the
    responder can execute without a NAK: the RETH's range looked up, a whole
    MTU placed, the QP left receiving the WRITE; False (nothing changed)
    otherwise."""
    head = _next_request(dev, data, 32)
    if head is None:
        return False
    qp, opcode, flags, w3, psn = head
    n = len(data)
    mtu = qp.mtu
    if n != 32 + mtu or flags & 0x30 or tuple(src) != qp.dest:
        return False                      # a FIRST carries a whole MTU and no pad
    va, rkey, dlen = _RETH.unpack_from(data, 12)
    if dlen < mtu or not int(qp.attr.qp_access_flags) & _REMOTE_WRITE:
        return False
    try:
        view = dev.keys.remote(qp.pd, rkey, va, dlen, Access.REMOTE_WRITE, qp)
    except AccessError:
        return False                      # the general path NAKs it
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False
    dev.counters["rcvd_pkts"] += 1
    view[0:mtu] = memoryview(data)[28:28 + mtu]
    qp.write_view = view
    qp.write_len = dlen
    qp.write_off = mtu
    qp.resp_kind = _WRITE
    qp.epsn = (psn + 1) & _MASK
    qp.nak_sent = False
    if w3 & 0x80000000:
        responder.queue_ack(dev, qp, psn)
    _nothing_held(qp)
    return True


def request_only(dev, data, src) -> bool:
    """A one-packet WRITE or SEND request, in sequence, that the responder can
    execute without a NAK; False (nothing changed) otherwise."""
    head = _next_request(dev, data, 16)
    if head is None:
        return False
    qp, opcode, flags, w3, psn = head
    n = len(data)
    write = opcode <= _WRITE_ONLY_IMM and opcode >= _WRITE_ONLY
    imm = opcode == _WRITE_ONLY_IMM or opcode == _SEND_ONLY_IMM
    hdr = 28 if write else 12
    if imm:
        hdr += 4
    plen = n - 4 - hdr - ((flags >> 4) & 3)
    if plen < 0 or plen > qp.mtu or tuple(src) != qp.dest:
        return False
    if write:
        va, rkey, dlen = _RETH.unpack_from(data, 12)
        if dlen != plen or not int(qp.attr.qp_access_flags) & _REMOTE_WRITE:
            return False
        try:
            view = dev.keys.remote(qp.pd, rkey, va, dlen, Access.REMOTE_WRITE, qp)
        except AccessError:
            return False                  # the general path NAKs it
        wqe = None
        if imm:
            if qp.srq is not None or not qp.rq:
                return False              # an SRQ, or RNR: the general path
            wqe = qp.rq[0]
    else:
        if qp.srq is not None or not qp.rq:
            return False
        wqe = qp.rq[0]
        if len(wqe.sges) != 1 or plen > wqe.sges[0][1]:
            return False
        addr, length, lkey = wqe.sges[0]
        try:
            view = dev.keys.local(qp.pd, lkey, addr, plen, write=True) if plen else None
        except AccessError:
            return False
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False                      # counted and dropped by the general path
    c = dev.counters
    c["rcvd_pkts"] += 1
    if plen:
        view[:] = memoryview(data)[hdr:hdr + plen]
    if write:
        qp.write_off = qp.write_len = plen
    else:
        qp.resp_off = plen
    qp.epsn = (psn + 1) & _MASK
    qp.nak_sent = False
    qp.msn = (qp.msn + 1) & _MASK
    if wqe is not None:
        qp.rq.popleft()
        c["rdma_recvs"] += 1
        if write:
            dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, WCStatus.SUCCESS, WCOpcode.RECV_RDMA_WITH_IMM,
                                        qp.qpn, byte_len=plen,
                                        imm_data=_I.unpack_from(data, 28)[0],
                                        wc_flags=WCFlags.WITH_IMM, src_qp=qp.attr.dest_qp_num),
                         qp, solicited=bool(flags & 0x80))
        else:
            dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, WCStatus.SUCCESS, WCOpcode.RECV, qp.qpn,
                                        byte_len=plen,
                                        imm_data=_I.unpack_from(data, 12)[0] if imm else 0,
                                        wc_flags=WCFlags.WITH_IMM if imm else WCFlags(0),
                                        src_qp=qp.attr.dest_qp_num),
                         qp, solicited=bool(flags & 0x80))
    responder.queue_ack(dev, qp, psn)
    _nothing_held(qp)
    return True


def ack_packet(dqpn: int, psn: int, syndrome: int, msn: int) -> bytearray:
    """An ACK's BTH + AETH (without ICRC), the bytes ``encode`` gives."""
    buf = bytearray(16)
    _ACK_PKT.pack_into(buf, 0, _ACK, 0, 0xFFFF, dqpn & _MASK, psn & _MASK,
                       ((syndrome & 0xFF) << 24) | (msn & _MASK))
    return buf


# ------------------------------------------------------------------ completer


def ack(dev, data, src, now: float) -> bool:
    """A plain ACK of the last PSN of the oldest outstanding WQE (a WRITE or a
    SEND): complete it.  False, nothing changed, for anything else."""
    if len(data) != 20:
        return False
    _, flags, pkey, w2, w3, aeth = _ACK_PKT.unpack_from(data, 0)
    qp = dev.qps.get(w2 & _MASK)
    if qp is None or qp.qp_type is not _RC or qp.cc is not None or pkey != 0xFFFF or w2 >> 30 \
            or flags & 0x30 or aeth >> 29:
        return False
    if qp.state is not _RTS or not qp.sq or tuple(src) != qp.dest:
        return False
    w = qp.sq[0]
    if w.done or w.first_psn is None or w.rd_atomic or (w3 & _MASK) != w.last_psn:
        return False
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False
    dev.counters["rcvd_pkts"] += 1
    before = qp.acked_psn
    completer._finish(qp, w)
    completer._progress(dev, qp, before, now)
    return True
