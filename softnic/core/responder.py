"""Responder: request packets -> memory, receive completions and responses.

Per packet: PSN check (new, duplicate, out of sequence), opcode sequence
check, resource check (a receive WQE, else RNR NAK), access check (rkey,
bounds, permissions, alignment), execution, then the response.  Duplicate
READs are re-read from memory; a duplicate ATOMIC is answered from the
stored original value and never executed twice.  Responses leave in PSN
order through ``qp.resp_out``; a plain ACK queued behind another plain ACK
replaces it (ACK coalescing).
"""

from __future__ import annotations

import sys
from bisect import bisect_right

from ..wire.icrc import ipv4_udp_headers
from ..wire.roce import AethCode, Kind, NakCode, psn_diff
from .cq import WC
from .enums import Access, QPState, QPType, WCFlags, WCOpcode, WCStatus
from .memory import MW, AccessError, view_span
from . import xrc

_REMOTE_WRITE = int(Access.REMOTE_WRITE)   # as a plain int: IntFlag operations are slow
ACK_CREDITS = 0x1F   # AETH credit field "invalid": no end-to-end credit limit
SR_SPAN = 4          # selective repeat: the responder holds up to this many windows of PSNs
GRH_LEN = 40
_U64 = 0xFFFFFFFFFFFFFFFF


class _Nak(Exception):
    """Abort the current packet with a NAK (and, for a receive, a WC status)."""

    def __init__(self, code: NakCode, recv_status: WCStatus | None = None):
        self.code = code
        self.recv_status = recv_status


class _Rnr(Exception):
    pass


# response queue entries: ("ack", psn, syndrome) | ("read", psn, view, msn) | ("atomic", psn, orig)

def queue_ack(dev, qp, psn: int, syndrome: int = ACK_CREDITS) -> None:
    out = qp.resp_out
    plain = syndrome == ACK_CREDITS
    if plain and out and out[-1][0] == "ack" and out[-1][2] == ACK_CREDITS:
        out[-1] = ("ack", psn, syndrome, qp.msn)
        dev.counters["ack_deferred"] += 1
    else:
        out.append(("ack", psn, syndrome, qp.msn))
    dev.mark_ready(qp)


def _nak(dev, qp, psn: int, code: NakCode, msn: int | None = None) -> None:
    qp.resp_out.append(("ack", psn, (AethCode.NAK << 5) | code, qp.msn if msn is None else msn))
    dev.mark_ready(qp)


def receive(dev, qp, pkt, src, now: float) -> None:
    """One request packet for this QP's receive side."""
    if qp.qp_type == QPType.UD:
        _receive_ud(dev, qp, pkt, src)
        return
    psn = pkt.bth.psn
    d = psn_diff(psn, qp.epsn)
    if qp.qp_type == QPType.UC:
        _receive_uc(dev, qp, pkt, d)
        return
    if d < 0:
        dev.counters["duplicate_request"] += 1
        _duplicate(dev, qp, pkt)
        return
    if d > 0:
        dev.counters["out_of_seq_request"] += 1
        if qp.selective_repeat:
            _hold(dev, qp, pkt, d)
        elif not qp.nak_sent:
            qp.nak_sent = True
            _nak(dev, qp, qp.epsn, NakCode.PSN_SEQUENCE_ERROR)
        return
    _execute(dev, qp, pkt)
    if qp.ooo:
        while qp.epsn in qp.ooo and qp.state != QPState.ERR:
            item = qp.ooo.pop(qp.epsn)
            if type(item) is tuple:
                placed_write(dev, qp, item)
            else:
                _execute(dev, qp, item)
        if qp.ooo and qp.state != QPState.ERR:
            # another hole below packets already held: name it at once
            _sack_nak(dev, qp, qp.epsn, max(qp.ooo, key=lambda p: psn_diff(p, qp.epsn)))
            _prune_chain(qp)
            chain_writes(dev, qp)
    if not qp.ooo:
        qp.sr_naked.clear()
        qp.sr_scan = None
        qp.sr_writes.clear()
        if qp.sr_placed is not None:
            qp.sr_placed.clear()


_SACK = (AethCode.NAK << 5) | NakCode.PSN_SEQUENCE_ERROR
SACK_LOOKBACK = 8    # queued responses searched for a selective ACK to update


def _sack_nak(dev, qp, missing: int, held: int) -> None:
    """Selective repeat's NAK: BTH.PSN names a missing PSN and, as IRN's NACK
    does, the AETH's MSN field carries a PSN that did arrive (a selective ACK).
    One still queued that names the same PSN takes the newer held PSN instead of
    a second NAK leaving (the requester acts once per missing PSN and keeps the
    newest selective ACK), as plain ACKs coalesce."""
    out = qp.resp_out
    k = len(out) - 1
    stop = k - SACK_LOOKBACK
    while k > stop and k >= 0:
        e = out[k]
        if e[1] == missing and e[2] == _SACK and e[0] == "ack":
            if psn_diff(held, e[3]) > 0:
                out[k] = ("ack", missing, _SACK, held)
            dev.counters["sack_coalesced"] += 1
            return
        k -= 1
    _nak(dev, qp, missing, NakCode.PSN_SEQUENCE_ERROR, msn=held)


def _hold(dev, qp, pkt, d: int) -> None:
    """Selective repeat: keep an out-of-order packet (it is applied once the gap
    below it fills), NAK each newly missing PSN, and selectively ACK the held
    packet whenever the requester asked for an ACK."""
    span = SR_SPAN * qp.window
    if d >= span or len(qp.ooo) >= span:
        return
    psn = pkt.bth.psn
    if psn in qp.ooo:
        return
    hold(dev, qp, psn, pkt.bth.ackreq, pkt)
    info = pkt.info
    if info.kind == Kind.WRITE and info.first:
        chain_writes(dev, qp)


def chain_writes(dev, qp) -> None:
    """Extend ``qp.sr_writes``, the run of WRITEs from the one being received on
    whose every PSN is known to be a packet of a WRITE with a checked target:
    the current WRITE, then each WRITE whose FIRST is held directly after the
    last one.  Their later packets may be placed before the hole below them
    fills (the device's receive shortcut, ``place_beyond``): only WRITE data is
    still to come before them, and its bytes skip what newer PSNs placed.  A
    SEND, READ, ATOMIC or unknown PSN ends the run (those execute in order,
    before anything after them lands).  Each FIRST is checked as ``_write``
    will check it; one that would be refused ends the run, and the general path
    refuses it in order, NAK and all."""
    chain = qp.sr_writes
    mtu = qp.mtu
    if chain:
        end = chain[-1][3]
    elif qp.resp_kind is Kind.WRITE and qp.write_view is not None and len(qp.write_view):
        span = view_span(qp.write_view)
        if span is None:
            return
        first = (qp.epsn - qp.write_off // mtu) & 0xFFFFFF
        end = (first + max(1, -(-qp.write_len // mtu))) & 0xFFFFFF
        chain.append((first, qp.write_view, qp.write_len, end, span[0]))
    else:
        return
    ooo = qp.ooo
    while True:
        pkt = ooo.get(end)
        if pkt is None or type(pkt) is tuple:
            return
        info = pkt.info
        if info.kind != Kind.WRITE or not info.first or pkt.reth is None:
            return
        reth = pkt.reth
        n = max(1, -(-reth.dma_len // mtu))
        plen = len(pkt.payload)
        if info.last != (n == 1) or plen != (reth.dma_len if info.last else mtu):
            return
        if not int(qp.attr.qp_access_flags) & _REMOTE_WRITE:
            return
        try:
            view = dev.keys.remote(qp.pd, reth.rkey, reth.va, reth.dma_len,
                                   Access.REMOTE_WRITE, qp)
        except AccessError:
            return
        span = view_span(view) if len(view) else (0, 0)
        if span is None:
            return
        first, end = end, (end + n) & 0xFFFFFF
        chain.append((first, view, reth.dma_len, end, span[0]))


def _prune_chain(qp) -> None:
    """Forget the WRITEs of ``qp.sr_writes`` already received in full and the
    placed ranges already accounted for (PSNs below the expected one)."""
    chain = qp.sr_writes
    epsn = qp.epsn
    k = 0
    while k < len(chain) and psn_diff(chain[k][3], epsn) <= 0:
        k += 1
    if k:
        del chain[:k]
    pl = qp.sr_placed
    if pl is not None and pl.starts:
        pl.prune(epsn)


class Placed:
    """The bytes placed beyond a hole, as sorted disjoint address ranges
    ``[starts[i], ends[i])``, each with the PSN that wrote it last.  A range
    whose PSN is below the expected PSN is stale (accounted for in order)."""

    __slots__ = ("starts", "ends", "psns")

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.psns: list[int] = []

    def clear(self) -> None:
        self.starts.clear()
        self.ends.clear()
        self.psns.clear()

    def prune(self, epsn: int) -> None:
        keep = [i for i, q in enumerate(self.psns) if psn_diff(q, epsn) >= 0]
        if len(keep) != len(self.psns):
            self.starts = [self.starts[i] for i in keep]
            self.ends = [self.ends[i] for i in keep]
            self.psns = [self.psns[i] for i in keep]


def place_beyond(qp, psn: int, view, off: int, data, addr: int) -> None:
    """Write the WRITE packet ``psn``'s ``data`` at ``view[off:]`` (``addr`` is the
    address of ``view[0]``) beyond a hole: bytes a newer PSN already placed are
    skipped (later bytes win, as in order), and what it writes is remembered."""
    n = len(data)
    if not n:
        return
    pl = qp.sr_placed
    if pl is None:
        pl = qp.sr_placed = Placed()
    elif not qp.ooo:
        pl.clear()          # a new hole: nothing placed before it is beyond one
    starts, ends, psns = pl.starts, pl.ends, pl.psns
    s = addr + off
    e = s + n
    i = bisect_right(ends, s)
    if i == len(starts) or starts[i] >= e:
        view[off:off + n] = data
        starts.insert(i, s)
        ends.insert(i, e)
        psns.insert(i, psn)
        return
    epsn = qp.epsn
    if starts[i] == s and ends[i] == e:
        # the common case (WRITEs of one size to one buffer): the same bytes as
        # one earlier packet; newer only if not yet accounted for in order
        q = psns[i]
        if 0 < (q - psn) & 0xFFFFFF < 0x800000 and (q - epsn) & 0xFFFFFF < 0x800000:
            return
        view[off:off + n] = data
        psns[i] = psn
        return
    ns: list[int] = []
    ne: list[int] = []
    np: list[int] = []
    cur = s
    tail = None
    j = i
    while j < len(starts) and starts[j] < e:
        ss, ee, q = starts[j], ends[j], psns[j]
        if ss < s:
            ns.append(ss)
            ne.append(s)
            np.append(q)
        if ee > e:
            tail = (e, ee, q)
        if psn_diff(q, psn) > 0 and psn_diff(q, epsn) >= 0:
            lo = ss if ss > s else s
            if cur < lo:
                view[cur - addr:lo - addr] = data[cur - s:lo - s]
                ns.append(cur)
                ne.append(lo)
                np.append(psn)
            cur = ee if ee < e else e
            ns.append(lo)
            ne.append(cur)
            np.append(q)
        j += 1
    if cur < e:
        view[cur - addr:e - addr] = data[cur - s:]
        ns.append(cur)
        ne.append(e)
        np.append(psn)
    if tail is not None:
        ns.append(tail[0])
        ne.append(tail[1])
        np.append(tail[2])
    starts[i:j] = ns
    ends[i:j] = ne
    psns[i:j] = np


def _place_in_order(qp, view, off: int, data) -> None:
    """Write the expected PSN's WRITE data at ``view[off:]``, skipping the bytes
    that packets beyond a hole (newer PSNs) already placed."""
    n = len(data)
    pl = qp.sr_placed
    if pl is None or not pl.starts or not qp.ooo or not n:
        # (with nothing held, every placed range is accounted for: none is newer)
        view[off:off + n] = data
        return
    span = view_span(view)
    if span is None:            # (no address, so nothing beyond a hole was placed in it)
        view[off:off + n] = data
        return
    starts, ends, psns = pl.starts, pl.ends, pl.psns
    addr = span[0]
    s = addr + off
    e = s + n
    epsn = qp.epsn
    cur = s
    j = bisect_right(ends, s)
    while j < len(starts) and starts[j] < e:
        if psn_diff(psns[j], epsn) > 0:
            lo = starts[j] if starts[j] > s else s
            if cur < lo:
                view[cur - addr:lo - addr] = data[cur - s:lo - s]
            hi = ends[j] if ends[j] < e else e
            if hi > cur:
                cur = hi
        j += 1
    if cur < e:
        view[cur - addr:e - addr] = data[cur - s:]


def placed_write(dev, qp, item) -> None:
    """A WRITE packet ``(psn, last, length, ackreq)`` whose bytes are already in
    memory (placed in sequence by the device's shortcut, or beyond a hole that
    has since filled): account for it as ``_write`` would have."""
    psn, last, n, ackreq = item
    qp.write_off += n
    qp.epsn = (psn + 1) & 0xFFFFFF
    qp.nak_sent = False
    if last:
        qp.resp_kind = None
        qp.write_view = None
        qp.msn = (qp.msn + 1) & 0xFFFFFF
        queue_ack(dev, qp, psn)
    elif ackreq:
        queue_ack(dev, qp, psn)


def hold(dev, qp, psn: int, ackreq: bool, item) -> None:
    """Hold ``item`` (a decoded packet, or a placed WRITE packet's tuple) for
    ``psn``, in the span and not yet held, and name the PSNs missing below it."""
    qp.ooo[psn] = item
    named = 0
    p = qp.epsn
    scan = qp.sr_scan
    if scan is not None and psn_diff(scan, p) > 0:
        # every PSN below ``scan`` is held or already named: start there, so a
        # window of packets beyond one hole costs a window of steps, not its square
        if psn_diff(psn, scan) < 0:
            p = psn
        else:
            p = scan
    while p != psn and named < 16:
        if p not in qp.ooo and p not in qp.sr_naked:
            qp.sr_naked.add(p)
            _sack_nak(dev, qp, p, psn)
            named += 1
        p = (p + 1) & 0xFFFFFF
    if scan is None or psn_diff(p, scan) > 0:
        qp.sr_scan = p
    if not named and ackreq:
        _sack_nak(dev, qp, qp.epsn, psn)


def _execute(dev, qp, pkt) -> None:
    info = pkt.info
    psn = pkt.bth.psn
    try:
        if qp.xrc is not None:           # the XRC SRQ this request is for (its PD, its CQ)
            code = xrc.target(dev, qp, pkt)
            if code is not None:
                raise _Nak(code)
        _check_sequence(qp, info)
        if info.kind == Kind.SEND:
            _send(dev, qp, pkt)
        elif info.kind == Kind.WRITE:
            _write(dev, qp, pkt)
        elif info.kind == Kind.READ_REQUEST:
            _read(dev, qp, pkt)
            return
        elif info.kind == Kind.ATOMIC:
            _atomic(dev, qp, pkt)
            return
        elif info.kind == Kind.ATOMIC_WRITE:
            _atomic_write(dev, qp, pkt)
            return
        elif info.kind == Kind.FLUSH:
            _flush(dev, qp, pkt)
            return
        else:
            raise _Nak(NakCode.INVALID_REQUEST)
    except _Rnr:
        dev.counters["send_rnr_err"] += 1
        qp.ooo.clear()
        qp.sr_naked.clear()
        qp.sr_scan = None
        qp.resp_out.append(("ack", psn, (AethCode.RNR_NAK << 5) | qp.attr.min_rnr_timer, qp.msn))
        dev.mark_ready(qp)
        return
    except _Nak as e:
        _class_error(dev, qp, pkt, e)
        return
    qp.epsn = (psn + 1) & 0xFFFFFF
    qp.nak_sent = False
    if info.last:
        qp.msn = (qp.msn + 1) & 0xFFFFFF
        queue_ack(dev, qp, psn)
    elif pkt.bth.ackreq:
        queue_ack(dev, qp, psn)


def _class_error(dev, qp, pkt, e: _Nak) -> None:
    """A request the responder must refuse: NAK it, fail any receive in use, QP to ERR."""
    dev.counters["resp_nak_" + e.code.name.lower()] += 1
    _nak(dev, qp, pkt.bth.psn, e.code)
    if qp.resp_wqe is not None:
        wqe, qp.resp_wqe = qp.resp_wqe, None
        dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, e.recv_status or WCStatus.REM_INV_REQ_ERR,
                                    WCOpcode.RECV, qp.qpn), qp)
    qp.resp_kind = None
    dev.to_error(qp, keep_responses=True)


def _check_sequence(qp, info) -> None:
    """FIRST/ONLY may only start a message; MIDDLE/LAST must continue one of the same kind."""
    if qp.resp_kind is None:
        if not info.first:
            raise _Nak(NakCode.INVALID_REQUEST)
    elif info.first or info.kind != qp.resp_kind:
        raise _Nak(NakCode.INVALID_REQUEST)


def _check_size(qp, pkt) -> None:
    n = len(pkt.payload)
    if not pkt.info.last and n != qp.mtu:
        raise _Nak(NakCode.INVALID_REQUEST)
    if n > qp.mtu:
        raise _Nak(NakCode.INVALID_REQUEST)


def _take_recv(dev, qp):
    if qp.srq is not None:
        wqe = dev.srq_take(qp.srq)
    else:
        wqe = qp.rq.popleft() if qp.rq else None
    if wqe is None:
        raise _Rnr()
    return wqe


def _place_recv(dev, qp, data) -> None:
    """Scatter ``data`` into the receive WQE at the current offset."""
    wqe = qp.resp_wqe
    n = len(data)
    if qp.resp_off + n > wqe.length:
        raise _Nak(NakCode.INVALID_REQUEST, WCStatus.LOC_LEN_ERR)
    if not n:
        return
    off = qp.resp_off
    pos = 0
    for addr, length, lkey in wqe.sges:
        if off >= length:
            off -= length
            continue
        take = min(length - off, n - pos)
        try:
            view = dev.keys.local(qp.pd, lkey, addr + off, take, write=True)
        except AccessError:
            raise _Nak(NakCode.REMOTE_OPERATIONAL_ERROR, WCStatus.LOC_PROT_ERR) from None
        view[:] = data[pos:pos + take]
        pos += take
        off = 0
        if pos == n:
            break
    qp.resp_off += n


def _send(dev, qp, pkt) -> None:
    info = pkt.info
    _check_size(qp, pkt)
    if info.first:
        qp.resp_wqe = _take_recv(dev, qp)
        qp.resp_off = 0
    _place_recv(dev, qp, pkt.payload)
    if info.last:
        wqe, qp.resp_wqe = qp.resp_wqe, None
        qp.resp_kind = None
        flags = WCFlags(0)
        imm = inv = 0
        if info.immdt:
            flags |= WCFlags.WITH_IMM
            imm = pkt.immdt.imm
        if info.ieth:
            inv = pkt.ieth.rkey
            if not dev.keys.invalidate(qp.pd, inv):
                qp.resp_wqe = wqe
                raise _Nak(NakCode.INVALID_REQUEST, WCStatus.LOC_PROT_ERR)
            flags |= WCFlags.WITH_INV
        dev.counters["rdma_recvs"] += 1
        dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, WCStatus.SUCCESS, WCOpcode.RECV, qp.qpn,
                                    byte_len=qp.resp_off, imm_data=imm, wc_flags=flags,
                                    src_qp=qp.attr.dest_qp_num, invalidated_rkey=inv), qp,
                     solicited=pkt.bth.se)
    else:
        qp.resp_kind = Kind.SEND


def _write(dev, qp, pkt) -> None:
    info = pkt.info
    _check_size(qp, pkt)
    if info.first:
        if not int(qp.attr.qp_access_flags) & _REMOTE_WRITE:
            raise _Nak(NakCode.INVALID_REQUEST)
        reth = pkt.reth
        try:
            qp.write_view = dev.keys.remote(qp.pd, reth.rkey, reth.va, reth.dma_len,
                                            Access.REMOTE_WRITE, qp)
        except AccessError:
            raise _Nak(NakCode.REMOTE_ACCESS_ERROR) from None
        qp.write_off = 0
        qp.write_len = reth.dma_len
    n = len(pkt.payload)
    off = qp.write_off
    if off + n > qp.write_len or (info.last and off + n != qp.write_len):
        raise _Nak(NakCode.INVALID_REQUEST)
    if info.immdt:
        # the immediate consumes a receive WQE; take it before touching memory so an
        # RNR NAK leaves nothing half done
        qp.resp_wqe = _take_recv(dev, qp)
    if n:
        _place_in_order(qp, qp.write_view, off, pkt.payload)
    qp.write_off = off + n
    if info.last:
        qp.resp_kind = None
        qp.write_view = None
        if info.immdt:
            wqe, qp.resp_wqe = qp.resp_wqe, None
            dev.counters["rdma_recvs"] += 1
            dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, WCStatus.SUCCESS, WCOpcode.RECV_RDMA_WITH_IMM,
                                        qp.qpn, byte_len=qp.write_len, imm_data=pkt.immdt.imm,
                                        wc_flags=WCFlags.WITH_IMM, src_qp=qp.attr.dest_qp_num),
                         qp, solicited=pkt.bth.se)
    else:
        qp.resp_kind = Kind.WRITE


def _remember(qp, entry) -> None:
    res = qp.resources
    res.append(entry)
    while len(res) > max(1, qp.attr.max_dest_rd_atomic):
        res.popleft()


def _read(dev, qp, pkt) -> None:
    if not qp.attr.qp_access_flags & Access.REMOTE_READ:
        raise _Nak(NakCode.INVALID_REQUEST)
    reth = pkt.reth
    try:
        view = dev.keys.remote(qp.pd, reth.rkey, reth.va, reth.dma_len, Access.REMOTE_READ,
                               qp)
    except AccessError:
        raise _Nak(NakCode.REMOTE_ACCESS_ERROR) from None
    psn = pkt.bth.psn
    npkts = max(1, -(-reth.dma_len // qp.mtu))
    last = (psn + npkts - 1) & 0xFFFFFF
    _remember(qp, ("read", psn, last))
    qp.epsn = (last + 1) & 0xFFFFFF
    qp.nak_sent = False
    qp.msn = (qp.msn + 1) & 0xFFFFFF
    qp.resp_out.append(("read", psn, view, qp.msn))
    dev.mark_ready(qp)


def _atomic(dev, qp, pkt) -> None:
    if not qp.attr.qp_access_flags & Access.REMOTE_ATOMIC:
        raise _Nak(NakCode.INVALID_REQUEST)
    a = pkt.atomiceth
    if a.va & 7:
        raise _Nak(NakCode.INVALID_REQUEST)
    try:
        view = dev.keys.remote(qp.pd, a.rkey, a.va, 8, Access.REMOTE_ATOMIC, qp)
    except AccessError:
        raise _Nak(NakCode.REMOTE_ACCESS_ERROR) from None
    orig = int.from_bytes(view, sys.byteorder)
    if pkt.info.opcode & 0x1F == 0x13:  # (RC or XRC) COMPARE_SWAP: swap_add is the swap value
        if orig == a.compare:
            view[:] = a.swap_add.to_bytes(8, sys.byteorder)
    else:                             # FETCH_ADD
        view[:] = ((orig + a.swap_add) & _U64).to_bytes(8, sys.byteorder)
    psn = pkt.bth.psn
    _remember(qp, ("atomic", psn, orig))
    qp.epsn = (psn + 1) & 0xFFFFFF
    qp.nak_sent = False
    qp.msn = (qp.msn + 1) & 0xFFFFFF
    qp.resp_out.append(("atomic", psn, orig, qp.msn))
    dev.mark_ready(qp)


def _atomic_write(dev, qp, pkt) -> None:
    """ATOMIC_WRITE: 8 bytes placed as one at an 8-byte aligned address the MR lets the
    peer write (rxe: REMOTE_WRITE), answered like a READ of nothing."""
    if not qp.attr.qp_access_flags & Access.REMOTE_WRITE:
        raise _Nak(NakCode.INVALID_REQUEST)
    reth = pkt.reth
    if len(pkt.payload) != 8 or reth.va & 7:
        raise _Nak(NakCode.INVALID_REQUEST)
    try:
        view = dev.keys.remote(qp.pd, reth.rkey, reth.va, 8, Access.REMOTE_WRITE, qp)
    except AccessError:
        raise _Nak(NakCode.REMOTE_ACCESS_ERROR) from None
    view[:] = pkt.payload
    psn = pkt.bth.psn
    _remember(qp, ("read", psn, psn))           # a duplicate is answered, not placed again
    qp.epsn = (psn + 1) & 0xFFFFFF
    qp.nak_sent = False
    qp.msn = (qp.msn + 1) & 0xFFFFFF
    qp.resp_out.append(("read", psn, memoryview(b""), qp.msn))
    dev.mark_ready(qp)


#: FLUSH placement type bits -> the access a QP and the memory must grant for it
_FLUSH_ACCESS = ((1, Access.FLUSH_GLOBAL), (2, Access.FLUSH_PERSISTENT))


def _flush(dev, qp, pkt) -> None:
    """FLUSH (rxe's process_flush): the placement its FETH asks for (global visibility,
    persistence) of a range, or of the whole memory region the rkey names, answered like a
    READ of nothing.  The QP must allow each placement type asked (else invalid request,
    as rxe's check_qp_attr_access), the MR or window too (else remote access error, as
    rxe's check_rkey), and a range must lie inside it.  What softnic places is in the
    host's memory once the engine has stored it, visible to every CPU: nothing is left
    to write back.  (Persistence is never granted: no MR is registered with it.)"""
    feth = pkt.feth
    if not feth.plt or feth.plt & ~3 or feth.sel > 1:
        raise _Nak(NakCode.INVALID_REQUEST)
    needs = [a for bit, a in _FLUSH_ACCESS if feth.plt & bit]
    if any(not qp.attr.qp_access_flags & a for a in needs):
        raise _Nak(NakCode.INVALID_REQUEST)
    reth = pkt.reth
    try:
        region = dev.keys.region(qp.pd, reth.rkey)
        addr, length = (region.addr, 0) if feth.sel == 1 else (reth.va, reth.dma_len)
        for a in needs:
            if type(region) is MW:
                region.remote_view(qp, addr, length, a)
            else:
                region.remote_view(addr, length, a)
    except AccessError:
        raise _Nak(NakCode.REMOTE_ACCESS_ERROR) from None
    psn = pkt.bth.psn
    _remember(qp, ("read", psn, psn))           # a duplicate is answered, not run again
    qp.epsn = (psn + 1) & 0xFFFFFF
    qp.nak_sent = False
    qp.msn = (qp.msn + 1) & 0xFFFFFF
    qp.resp_out.append(("read", psn, memoryview(b""), qp.msn))
    dev.mark_ready(qp)


def _duplicate(dev, qp, pkt) -> None:
    kind = pkt.info.kind
    psn = pkt.bth.psn
    if kind in (Kind.SEND, Kind.WRITE):
        queue_ack(dev, qp, (qp.epsn - 1) & 0xFFFFFF)
        return
    for res in reversed(qp.resources):
        if res[0] == "read" and kind == Kind.READ_REQUEST and psn_diff(psn, res[1]) >= 0 \
                and psn_diff(psn, res[2]) <= 0:
            reth = pkt.reth
            try:     # re-read memory with the (possibly shortened) re-issued request
                view = dev.keys.remote(qp.pd, reth.rkey, reth.va, reth.dma_len,
                                       Access.REMOTE_READ, qp)
            except AccessError:
                return
            qp.resp_out.append(("read", psn, view, qp.msn))
            dev.mark_ready(qp)
            return
        if res[0] == "read" and kind in (Kind.ATOMIC_WRITE, Kind.FLUSH) and res[1] == psn:
            qp.resp_out.append(("read", psn, memoryview(b""), qp.msn))   # not placed again
            dev.mark_ready(qp)
            return
        if res[0] == "atomic" and kind == Kind.ATOMIC and res[1] == psn:
            dev.counters["atomic_replayed"] += 1
            qp.resp_out.append(("atomic", psn, res[2], qp.msn))
            dev.mark_ready(qp)
            return
    dev.counters["duplicate_dropped"] += 1


def _receive_uc(dev, qp, pkt, d: int) -> None:
    """UC: no ACKs, no retries.  A PSN gap drops the rest of the message in progress."""
    info = pkt.info
    if d != 0:
        dev.counters["out_of_seq_request"] += 1
        if qp.resp_wqe is not None:              # the partial message is lost; reuse its WQE
            (qp.rq if qp.srq is None else qp.srq.queue).appendleft(qp.resp_wqe)
            qp.resp_wqe = None
        qp.resp_kind = None
        qp.write_view = None
        qp.epsn = (pkt.bth.psn + 1) & 0xFFFFFF
        qp.uc_drop = not info.first
        if info.first:
            _uc_execute(dev, qp, pkt)
        return
    qp.epsn = (pkt.bth.psn + 1) & 0xFFFFFF
    if qp.uc_drop:
        if info.first:
            qp.uc_drop = False
        else:
            return
    _uc_execute(dev, qp, pkt)


def _uc_execute(dev, qp, pkt) -> None:
    try:
        _check_sequence(qp, pkt.info)
        if pkt.info.kind == Kind.SEND:
            _send(dev, qp, pkt)
        else:
            _write(dev, qp, pkt)
    except (_Rnr, _Nak) as e:
        # UC has no NAKs: the message is silently dropped (a receive in use fails).
        dev.counters["uc_dropped"] += 1
        if isinstance(e, _Nak) and qp.resp_wqe is not None:
            wqe, qp.resp_wqe = qp.resp_wqe, None
            dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, e.recv_status or WCStatus.LOC_LEN_ERR,
                                        WCOpcode.RECV, qp.qpn), qp)
        qp.resp_kind = None
        qp.write_view = None
        qp.uc_drop = not pkt.info.last


def _receive_ud(dev, qp, pkt, src) -> None:
    deth = pkt.deth
    if deth is None or pkt.info.qp_type != "UD":
        dev.counters["ud_dropped"] += 1
        return
    if deth.qkey != qp.attr.qkey:
        dev.counters["rcvd_bad_qkey"] += 1
        return
    if len(pkt.payload) > min(dev.config.active_mtu, 4096):   # UD has no path MTU: the port's
        dev.counters["ud_dropped"] += 1
        return
    try:
        wqe = _take_recv(dev, qp)
    except _Rnr:
        dev.counters["ud_dropped"] += 1          # UD has no RNR: the datagram is lost
        return
    qp.resp_wqe, qp.resp_off = wqe, 0
    try:
        # the first 40 bytes of the buffer receive the GRH; for RoCEv2 over IPv4 the
        # IPv4 header sits in its last 20 bytes (as rxe does)
        grh = bytes(20) + ipv4_udp_headers(src[0], dev.ip, src[1], dev.port,
                                           len(pkt.payload))[:20]
        _place_recv(dev, qp, grh)
        _place_recv(dev, qp, pkt.payload)
    except _Nak as e:
        qp.resp_wqe = None
        dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, e.recv_status or WCStatus.LOC_LEN_ERR,
                                    WCOpcode.RECV, qp.qpn), qp)
        return
    qp.resp_wqe = None
    flags = WCFlags.GRH
    imm = 0
    if pkt.immdt is not None:
        flags |= WCFlags.WITH_IMM
        imm = pkt.immdt.imm
    dev.counters["rdma_recvs"] += 1
    dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, WCStatus.SUCCESS, WCOpcode.RECV, qp.qpn,
                                byte_len=GRH_LEN + len(pkt.payload), imm_data=imm,
                                wc_flags=flags, src_qp=deth.src_qp), qp, solicited=pkt.bth.se)
