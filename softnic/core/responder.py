"""Responder: request packets -> memory, receive completions and responses.

The responder's rules, each written once (IBA vol. 1, chapter 9, the reliable
service's responder side):

- PSN verification: a request at the expected PSN (ePSN) is new and executed; one
  below it is a duplicate (``_duplicate``: SEND and WRITE are acknowledged again,
  a READ is re-read, an ATOMIC is answered from its saved result and never
  executed twice); one above it is out of sequence (go-back-N: one PSN SEQUENCE
  ERROR NAK until the ePSN arrives, ``_gap``; selective repeat: held, ``_hold``).
- Opcode sequence (``_check_sequence``): FIRST/ONLY start a message, MIDDLE/LAST
  continue one of the same kind; anything else is an INVALID REQUEST NAK.
- Resources (``take_recv``): a SEND or an immediate needs a receive WQE, else an
  RNR NAK and nothing is executed.
- Access (``write_target``, ``_read``, ``_atomic``): the QP's access flags, then
  the rkey's MR, bounds and rights; INVALID REQUEST or REMOTE ACCESS ERROR NAK.
- Placement (``place_recv``; a WRITE's by ``sr_place.place_in_order``) and
  receive completions (``recv_done``).
- Acknowledgement (``accept``): the ePSN moves past an executed packet, the MSN
  counts each completed message, and an ACK is queued for a message's last packet
  or a packet with AckReq set.  Responses leave in PSN order through
  ``qp.resp.out``; a plain ACK queued behind another plain ACK replaces it (ACK
  coalescing).

Two ways in, one set of rules.  ``receive`` takes a decoded ``Packet`` (every
opcode, every QP type).  ``receive_common``, which dispatch tries first, takes
the common case straight from the datagram's bytes when ``COMMON_CASE`` below holds:
it reads the few header fields the rules need (where ``wire.roce.OPCODES`` says
they are) and calls the same functions.  The chain's one early exit is
``execute``'s: a MIDDLE of the SEND or WRITE under way that fits where its bytes
go (``message_target``: the WRITE's MR view, the SEND's receive WQE's one SGE) is
placed and accepted at once.  ``receive_middles`` is that exit for a run of such
MIDDLEs, in the compiled kernel (``softnic.accel``, ``sn_rx_middles``), with the
per-packet conditions that kernel checks; ``stream_target`` lets a driver take
run after run of them.
"""

from __future__ import annotations

import functools
import struct
import sys
from collections import deque
from typing import NamedTuple

from ..wire.icrc import MEMO_MAX, check_icrc, icrc_start, ipv4_udp_headers, \
    ipv6_udp_headers
from ..wire.psn import PSN_HALF, PSN_MASK, PSN_MODULUS, psn_diff
from ..wire.roce import AETH_CODE_SHIFT, AETH_LEN, AETH_SYNDROME_SHIFT, ATOMICACKETH_LEN, \
    ATOMICETH_LEN, AethCode, BTH_ACKREQ, BTH_BECN, BTH_FECN, bth_word0, \
    BTH_LEN, BTH_PAD_MASK, BTH_PAD_SHIFT, BTH_SE, \
    BTH_STRUCT, DEFAULT_PKEY, ICRC_LEN, Kind, MSN_MASK, NakCode, OPCODES, Opcode as O, \
    QPN_MASK, RETH_LEN, RETH_STRUCT
from .cq import WC
from .enums import Access, QPState, QPType, WCFlags, WCOpcode, WCStatus
from .memory import MW, AccessError, view_span, write_checked
from . import sr_place, xrc

_REMOTE_WRITE = int(Access.REMOTE_WRITE)   # as a plain int: IntFlag operations are slow
_REMOTE_READ = int(Access.REMOTE_READ)
_NO_WC_FLAGS, _WITH_IMM, _WITH_INV = WCFlags(0), WCFlags.WITH_IMM, WCFlags.WITH_INV
_REMOTE_ATOMIC = int(Access.REMOTE_ATOMIC)
ACK_CREDITS = 0x1F   # AETH credit field "invalid": no end-to-end credit limit
SR_SPAN = 4          # selective repeat: the responder holds up to this many windows of PSNs
GRH_LEN = 40
_U64 = 0xFFFFFFFFFFFFFFFF


class Nak(Exception):
    """Abort the current packet with a NAK (and, for a receive, a WC status): what
    the responder's checks raise, and iWARP's DDP/RDMAP receive too (its
    ``take_recv``/``place_recv`` calls), which maps it to its terminate codes."""

    def __init__(self, code: NakCode, recv_status: WCStatus | None = None):
        self.code = code
        self.recv_status = recv_status


class Rnr(Exception):
    """No receive WQE for a message that needs one (``take_recv``): RoCE answers
    with an RNR NAK, iWARP with its own rule."""


# the names the rules below raise (other modules catch Nak and Rnr)
_Nak, _Rnr = Nak, Rnr


# ---------------------------------------------------------------- records
#
# The responses the responder queues in ``qp.resp.out`` for ``Output`` to send, in
# PSN order, told apart by type (by ``Output`` and the coalescing below): an ACK or
# NAK, the common case, is a plain ``(psn, syndrome, msn)`` tuple (the PSN it
# names, its AETH syndrome and MSN field: a tuple costs a tenth of a record to
# build, and one is built per message), a READ's responses a ``ReadReply``, an
# ATOMIC's an ``AtomicReply``.  And the READ / ATOMIC replay resources it keeps
# in ``qp.resp.resources`` (``max_dest_rd_atomic`` of them) to answer a
# duplicate request.


class ReadReply(NamedTuple):
    """A READ's responses (one packet per path MTU of ``view``, PSNs from ``psn``
    on; none but an ACK-like ONLY for an ATOMIC WRITE or FLUSH: ``view`` empty)."""
    psn: int
    view: memoryview
    msn: int


class AtomicReply(NamedTuple):
    """An ATOMIC ACKNOWLEDGE: the PSN it answers, the original value, the MSN."""
    psn: int
    orig: int
    msn: int


class WriteFirst(NamedTuple):
    """What a WRITE's FIRST held beyond a hole named, its target checked on arrival:
    the RETH's (va, rkey, length), the target's view, how many packets the WRITE
    takes and the address of its first byte."""
    reth: tuple
    view: memoryview
    packets: int
    addr: int


class PlacedWrite(NamedTuple):
    """A WRITE packet held beyond a hole (in ``qp.sr.ooo``, beside decoded packets)
    whose bytes are already in memory: ``placed_write`` accounts for it, as
    ``_write`` would have, once the hole fills.  ``first``: a FIRST's target
    (``WriteFirst``), checked again then, in order; None for a MIDDLE or LAST."""
    psn: int
    last: bool
    length: int
    ackreq: bool
    first: WriteFirst | None = None


class ReadResource(NamedTuple):
    """A READ (or ATOMIC WRITE, FLUSH) executed: its PSNs ``first`` .. ``last``,
    which a duplicate is answered for again (a READ re-read, the others not run
    again)."""
    first: int
    last: int


class AtomicResource(NamedTuple):
    """An ATOMIC executed at ``psn``, and the original value its duplicate gets
    (the operation never runs twice)."""
    psn: int
    orig: int


_WC_SUCCESS = WCStatus.SUCCESS     # (an enum member looked up once)


def queue_ack(dev, qp, psn: int, syndrome: int = ACK_CREDITS) -> None:
    resp = qp.resp
    out = resp.out
    last = out[-1] if out else None
    if syndrome == ACK_CREDITS and type(last) is tuple and last[1] == ACK_CREDITS:
        out[-1] = (psn, syndrome, resp.msn)      # a later plain ACK covers an earlier one
        dev.counters["ack_deferred"] += 1
    else:
        out.append((psn, syndrome, resp.msn))
    dev.mark_ready(qp)


def keep_answers(qp) -> None:
    """A QP moved to ERR or destroyed keeps, of the responses it has queued, the
    ACKs, NAKs and atomic acknowledgements: each answers a request the responder
    already executed, whose receive completion the consumer may have seen (a live
    driver holds a spinning caller's ACK for its next call, and that call may be
    the move to ERR of ``rdma_disconnect``).  A NIC has them on the wire by then;
    without them the peer's requester retransmits to a QP that answers no more
    until its retry_cnt runs out and its WR fails with RETRY EXCEEDED, though it
    succeeded.  READ responses, which read registered
    memory the consumer may free next, are dropped."""
    resp = qp.resp
    if resp.out:
        resp.out = deque(e for e in resp.out if type(e) is not ReadReply)


def _nak(dev, qp, psn: int, code: NakCode, msn: int | None = None) -> None:
    resp = qp.resp
    resp.out.append((psn, (AethCode.NAK << AETH_CODE_SHIFT) | code,
                        resp.msn if msn is None else msn))
    dev.mark_ready(qp)


def accept(dev, qp, psn: int, last: bool, ackreq: bool) -> None:
    """A request packet executed in sequence: the ePSN moves past it, the MSN
    counts a completed message, and its ACK is queued if it ends a message or
    asks for one (AckReq)."""
    resp = qp.resp
    resp.epsn = (psn + 1) & PSN_MASK
    resp.nak_sent = False
    if last:
        resp.msn = (resp.msn + 1) & MSN_MASK
        queue_ack(dev, qp, psn)
    elif ackreq:
        queue_ack(dev, qp, psn)


def _answered(qp, psn: int) -> None:
    """A READ, ATOMIC or ATOMIC WRITE request executed: the ePSN moves past its
    PSNs (``psn`` is its last) and the MSN counts it at once (for a READ, on
    receipt: IBA C9-148, as rxe); its response, not an ACK, answers it."""
    resp = qp.resp
    resp.epsn = (psn + 1) & PSN_MASK
    resp.nak_sent = False
    resp.msn = (resp.msn + 1) & MSN_MASK


def write_target(dev, qp, va: int, rkey: int, length: int):
    """The memory a WRITE's RETH names: the QP must allow remote writes (else
    INVALID REQUEST) and ``rkey`` must reach ``[va, va+length)`` with remote
    write access (else REMOTE ACCESS ERROR)."""
    if not int(qp.attr.qp_access_flags) & _REMOTE_WRITE:
        raise _Nak(NakCode.INVALID_REQUEST)
    try:
        return dev.keys.remote(qp.pd, rkey, va, length, Access.REMOTE_WRITE, qp)
    except AccessError:
        raise _Nak(NakCode.REMOTE_ACCESS_ERROR) from None


def message_target(dev, qp):
    """Where the next bytes of the SEND or WRITE being received go, for a MIDDLE
    that continues it: ``(view, offset, room)``, the bytes going to
    ``view[offset:]`` and none past ``room``.  A WRITE's: the MR view its FIRST's
    RETH named (``write_target``), at the write offset.  A SEND's: its receive
    WQE's one SGE, checked as ``place_recv`` checks it (the lkey, local write),
    at the bytes placed so far.  None for anything else (no message under way; a
    receive WQE with several SGEs, or an SGE that check refuses): the general
    way (``_write``, ``place_recv``) places it."""
    resp = qp.resp
    kind = resp.kind
    if kind is _WRITE_KIND:
        view = resp.write_view
        return view, resp.write_off, min(resp.write_len, view.nbytes)
    if kind is _SEND_KIND:
        wqe = resp.wqe
        t = None if wqe is None else recv_target(dev, qp, wqe)
        return None if t is None else (t[0], resp.off, t[1])
    return None


def recv_target(dev, qp, wqe):
    """Where a SEND's bytes go in the receive WQE ``wqe`` when it has one SGE:
    ``(view, room)``, the SGE's memory checked as ``place_recv`` checks it (the
    lkey, local write) and the bytes it may take.  None for several SGEs or an
    SGE that check refuses (``place_recv``, the general way, decides).  (The
    compiled receive's ``one_sge_target``, softnic/accel/responder.c, is this for
    an MR of the key table's own; tests/test_send_runs.py compares them.)"""
    if len(wqe.sges) != 1:
        return None
    addr, length, lkey = wqe.sges[0]
    try:
        view = dev.keys.local(qp.pd, lkey, addr, length, write=True)
    except AccessError:
        return None
    return view, min(length, wqe.length)


def _more_middles(dev, qp) -> None:
    """After a packet of a SEND or WRITE taken in order: if MIDDLEs of it are to
    come that ``message_target`` places (at least one more whole MTU before its
    last packet), a driver may stream them (``stream_target``)."""
    t = message_target(dev, qp)
    if t is not None and t[1] + qp.mtu < t[2]:
        dev.stream_qp = qp


def recv_done(dev, qp, wqe, opcode: WCOpcode, byte_len: int, imm: int, flags: WCFlags,
              solicited: bool, inv: int = 0) -> None:
    """The receive completion of a message that consumed ``wqe``."""
    dev.counters["rdma_recvs"] += 1
    # (WC's fields in their order, wr_id, status, opcode, qp_num, byte_len, imm_data,
    # wc_flags, src_qp, invalidated_rkey: by keyword, one a message, it costs twice as much)
    dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, _WC_SUCCESS, opcode, qp.qpn, byte_len, imm, flags,
                                qp.attr.dest_qp_num, inv), qp, solicited=solicited)


def _nothing_held(qp) -> None:
    """With no packet held out of order, selective repeat's bookkeeping of a
    hole is gone."""
    sr = qp.sr
    if sr.naked:
        sr.naked.clear()
    sr.scan = None
    if sr.writes:
        sr.writes.clear()
    if sr.placed is not None:
        sr.placed.clear()


def receive(dev, qp, pkt, src, now: float) -> None:
    """One request packet for this QP's receive side."""
    resp = qp.resp
    if qp.qp_type == QPType.UD:
        _receive_ud(dev, qp, pkt, src)
        return
    psn = pkt.bth.psn
    d = psn_diff(psn, resp.epsn)
    if qp.qp_type == QPType.UC:
        _receive_uc(dev, qp, pkt, d)
        return
    if d < 0:
        dev.counters["duplicate_request"] += 1
        _duplicate(dev, qp, pkt.info.kind, psn, pkt)
        return
    if d > 0:
        dev.counters["out_of_seq_request"] += 1
        if qp.selective_repeat:
            _hold(dev, qp, pkt, d)
        else:
            _gap(dev, qp)
        return
    _execute(dev, qp, pkt)
    ooo = qp.sr.ooo
    if ooo:
        while resp.epsn in ooo and qp.state != QPState.ERR:
            item = ooo.pop(resp.epsn)
            if type(item) is PlacedWrite:
                placed_write(dev, qp, item)
            else:
                _execute(dev, qp, item)
        if ooo and qp.state != QPState.ERR:
            # another hole below packets already held: name it at once
            _sack_nak(dev, qp, resp.epsn, max(ooo, key=lambda p: psn_diff(p, resp.epsn)))
            sr_place.prune(qp)
            chain_writes(dev, qp)
    if not ooo:
        _nothing_held(qp)


def _gap(dev, qp) -> None:
    """Go-back-N, a request beyond the ePSN: dropped, and NAKed (PSN SEQUENCE
    ERROR, naming the ePSN) if it is the first since the last one in sequence."""
    resp = qp.resp
    if not resp.nak_sent:
        resp.nak_sent = True
        _nak(dev, qp, resp.epsn, NakCode.PSN_SEQUENCE_ERROR)


_COMPARE_SWAP = (O.RC_COMPARE_SWAP, O.XRC_COMPARE_SWAP)
_SACK = (AethCode.NAK << AETH_CODE_SHIFT) | NakCode.PSN_SEQUENCE_ERROR
SACK_LOOKBACK = 8    # queued responses searched for a selective ACK to update


def _sack_nak(dev, qp, missing: int, held: int) -> None:
    """Selective repeat's NAK: BTH.PSN names a missing PSN and, as IRN's NACK
    does, the AETH's MSN field carries a PSN that did arrive (a selective ACK).
    One still queued that names the same PSN takes the newer held PSN instead of
    a second NAK leaving (the requester acts once per missing PSN and keeps the
    newest selective ACK), as plain ACKs coalesce."""
    out = qp.resp.out
    k = len(out) - 1
    stop = k - SACK_LOOKBACK
    while k > stop and k >= 0:
        e = out[k]
        if type(e) is tuple and e[0] == missing and e[1] == _SACK:     # (psn, syndrome, msn)
            if psn_diff(held, e[2]) > 0:
                out[k] = (missing, _SACK, held)
            dev.counters["sack_coalesced"] += 1
            return
        k -= 1
    _nak(dev, qp, missing, NakCode.PSN_SEQUENCE_ERROR, msn=held)


def _hold(dev, qp, pkt, d: int) -> None:
    """Selective repeat: keep an out-of-order packet (it is applied once the gap
    below it fills), NAK each newly missing PSN, and selectively ACK the held
    packet whenever the requester asked for an ACK.  A packet already held that
    comes again asking for an ACK is the requester's probe after a timeout
    (``completer._sr_timeout``): it is answered with a NAK naming the oldest hole
    again, since the NAKs that named it may all have been lost."""
    span = SR_SPAN * qp.window
    ooo = qp.sr.ooo
    if d >= span or len(ooo) >= span:
        return
    psn = pkt.bth.psn
    if psn in ooo:
        if pkt.bth.ackreq:
            _sack_nak(dev, qp, qp.resp.epsn, psn)
        return
    hold(dev, qp, psn, pkt.bth.ackreq, pkt)
    info = pkt.info
    if info.kind == Kind.WRITE and info.first:
        chain_writes(dev, qp)


def chain_writes(dev, qp) -> None:
    """Extend ``qp.sr.writes``, the run of WRITEs from the one being received on
    whose every PSN is known to be a packet of a WRITE with a checked target:
    the current WRITE, then each WRITE whose FIRST is held directly after the
    last one.  Their later packets may be placed before the hole below them
    fills (``_hold_placed_write``, ``sr_place.place_beyond``): only WRITE data is
    still to come before them, and its bytes skip what newer PSNs placed.  A
    SEND, READ, ATOMIC or unknown PSN ends the run (those execute in order,
    before anything after them lands).  Each FIRST is checked as ``_write``
    will check it; one that would be refused ends the run, and the general path
    refuses it in order, NAK and all."""
    resp = qp.resp
    chain = qp.sr.writes
    mtu = qp.mtu
    if chain:
        end = chain[-1][3]
    elif resp.kind is Kind.WRITE and resp.write_view is not None and len(resp.write_view):
        span = view_span(resp.write_view)
        if span is None:
            return
        first = (resp.epsn - resp.write_off // mtu) & PSN_MASK
        end = (first + max(1, -(-resp.write_len // mtu))) & PSN_MASK
        chain.append((first, resp.write_view, resp.write_len, end, span[0]))
    else:
        return
    ooo = qp.sr.ooo
    while True:
        pkt = ooo.get(end)
        if pkt is None:
            return
        if type(pkt) is PlacedWrite:
            if pkt.first is None:
                return              # (a MIDDLE or LAST: no FIRST here)
            reth, view, n, addr = pkt.first     # a FIRST placed beyond the hole: checked then
            first, end = end, (end + n) & PSN_MASK
            chain.append((first, view, reth[2], end, addr))
            continue
        info = pkt.info
        if info.kind != Kind.WRITE or not info.first or pkt.reth is None:
            return
        reth = pkt.reth
        target = _first_target(dev, qp, info, reth.va, reth.rkey, reth.dma_len, len(pkt.payload))
        if target is None:
            return
        view, n, addr = target
        first, end = end, (end + n) & PSN_MASK
        chain.append((first, view, reth.dma_len, end, addr))


def _first_target(dev, qp, info, va: int, rkey: int, length: int, plen: int):
    """A WRITE's FIRST (or ONLY) packet as ``chain_writes`` takes it into the run:
    its payload the whole MTU (all of the WRITE if it is its only packet) and its
    target what ``_write`` will check (``write_target``), with an address.
    ``(view, packets in the WRITE, address)``, or None for a FIRST the general
    path must refuse or hold as it is."""
    n = max(1, -(-length // qp.mtu))
    if info.last != (n == 1) or plen != (length if info.last else qp.mtu):
        return None
    try:
        view = write_target(dev, qp, va, rkey, length)
    except _Nak:
        return None
    span = view_span(view) if len(view) else (0, 0)
    if span is None:
        return None
    return view, n, span[0]


def placed_write(dev, qp, item) -> None:
    """A ``PlacedWrite`` whose bytes are already in memory (placed beyond a hole
    that has since filled): account for it as ``_write`` would have.  A FIRST's
    WRITE starts here, its target checked again now, in order, as ``_write``
    checks it (refused: the NAK and the error ``execute`` gives, and nothing
    accounted)."""
    resp = qp.resp
    psn, last, n, ackreq, first = item
    if first is not None:
        va, rkey, length = first.reth
        try:
            resp.write_view = write_target(dev, qp, va, rkey, length)
        except _Nak as e:
            _class_error(dev, qp, psn, e)
            return
        resp.write_off = 0
        resp.write_len = length
        resp.kind = Kind.WRITE
    resp.write_off += n
    if last:
        resp.kind = None
        resp.write_view = None
    accept(dev, qp, psn, last, ackreq)


def hold(dev, qp, psn: int, ackreq: bool, item) -> None:
    """Hold ``item`` (a decoded packet, or a placed WRITE packet's tuple) for
    ``psn``, in the span and not yet held, and name the PSNs missing below it."""
    resp = qp.resp
    sr = qp.sr
    sr.ooo[psn] = item
    named = 0
    p = resp.epsn
    scan = sr.scan
    if scan is not None and psn_diff(scan, p) > 0:
        # every PSN below ``scan`` is held or already named: start there, so a
        # window of packets beyond one hole costs a window of steps, not its square
        if psn_diff(psn, scan) < 0:
            p = psn
        else:
            p = scan
    while p != psn and named < 16:
        if p not in sr.ooo and p not in sr.naked:
            sr.naked.add(p)
            _sack_nak(dev, qp, p, psn)
            named += 1
        p = (p + 1) & PSN_MASK
    if scan is None or psn_diff(p, scan) > 0:
        sr.scan = p
    if not named and ackreq:
        _sack_nak(dev, qp, resp.epsn, psn)


def _execute(dev, qp, pkt) -> None:
    """Execute the request at the ePSN (every kind; SEND and WRITE by ``execute``)."""
    info = pkt.info
    bth = pkt.bth
    if qp.xrc is not None:           # the XRC SRQ this request is for (its PD, its CQ)
        code = xrc.target(dev, qp, pkt)
        if code is not None:
            _class_error(dev, qp, bth.psn, _Nak(code))
            return
    kind = info.kind
    if kind is Kind.SEND or kind is Kind.WRITE:
        reth = pkt.reth
        execute(dev, qp, info, bth.psn, bth.ackreq, bth.se, pkt.payload,
                (reth.va, reth.rkey, reth.dma_len) if reth is not None else None,
                pkt.immdt.imm if info.immdt else pkt.ieth.rkey if info.ieth else 0)
        return
    if kind is Kind.READ_REQUEST:
        r = pkt.reth
        answer(dev, qp, info, bth.psn, (r.va, r.rkey, r.dma_len))
        return
    if kind is Kind.ATOMIC:
        a = pkt.atomiceth
        answer(dev, qp, info, bth.psn, (a.va, a.rkey, a.swap_add, a.compare))
        return
    try:
        _check_sequence(qp, info)
        handler = _ANSWERED.get(kind)
        if handler is None:
            raise _Nak(NakCode.INVALID_REQUEST)
        handler(dev, qp, pkt)
    except _Nak as e:
        _class_error(dev, qp, bth.psn, e)


def execute(dev, qp, info, psn: int, ackreq: bool, se: bool, payload, reth, tail: int) -> None:
    """Execute the SEND or WRITE packet at the ePSN: ``info`` its opcode's entry in
    ``wire.roce.OPCODES``, ``reth`` its RETH as ``(va, rkey, length)`` or None,
    ``tail`` its ImmDt or IETH (0 if none).  Refused: NAKed (RNR, or an error
    that moves the QP to ERR); executed: accepted, acknowledged if due.

    The chain's early exit (with ``fast_path``): a MIDDLE of the SEND or WRITE
    under way that fits where its bytes go (``message_target``) passes every
    check below (sequence, size, room; a MIDDLE has no immediate and ends
    nothing), so it is placed and accepted at once."""
    resp = qp.resp
    if dev.fast and not info.first and not info.last and info.kind is resp.kind \
            and len(payload) == qp.mtu:
        t = message_target(dev, qp)
        if t is not None:
            view, off, room = t
            n = len(payload)
            if off + n <= room:
                if info.kind is _WRITE_KIND:
                    sr_place.place_in_order(qp, view, off, payload)
                    resp.write_off = off + n
                else:
                    view[off:off + n] = payload
                    resp.off = off + n
                accept(dev, qp, psn, False, ackreq)
                return
    try:
        _check_sequence(qp, info)
        if info.kind is _SEND_KIND:
            _send(dev, qp, info, payload, tail, se)
        else:
            _write(dev, qp, info, payload, reth, tail, se)
    except _Rnr:
        _rnr_nak(dev, qp, psn)
        return
    except _Nak as e:
        _class_error(dev, qp, psn, e)
        return
    accept(dev, qp, psn, info.last, ackreq)


def answer(dev, qp, info, psn: int, fields: tuple) -> None:
    """Execute the READ or ATOMIC request at the ePSN: ``info`` its opcode's entry
    in ``wire.roce.OPCODES``, ``fields`` its RETH ``(va, rkey, length)`` or its
    AtomicETH ``(va, rkey, swap_add, compare)``.  Refused: NAKed, the QP to ERR;
    executed: its response queued (``_read``, ``_atomic``)."""
    try:
        _check_sequence(qp, info)
        _FROM_FIELDS[info.kind](dev, qp, info, psn, *fields)
    except _Nak as e:
        _class_error(dev, qp, psn, e)


def _rnr_nak(dev, qp, psn: int) -> None:
    """No receive WQE for a request that needs one: RNR NAK, nothing executed,
    nothing held beyond it."""
    resp = qp.resp
    dev.counters["send_rnr_err"] += 1
    qp.sr.ooo.clear()
    qp.sr.naked.clear()
    qp.sr.scan = None
    resp.out.append((psn, (AethCode.RNR_NAK << AETH_CODE_SHIFT)
                        | qp.attr.min_rnr_timer, resp.msn))
    dev.mark_ready(qp)


def _class_error(dev, qp, psn: int, e: _Nak) -> None:
    """A request the responder must refuse (a class A or C error, as rxe's
    ``do_class_ac_error``): NAK it, fail any receive in use, QP to ERR."""
    resp = qp.resp
    dev.counters["resp_nak_" + e.code.name.lower()] += 1
    _nak(dev, qp, psn, e.code)
    if resp.wqe is not None:
        wqe, resp.wqe = resp.wqe, None
        dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, e.recv_status or WCStatus.REM_INV_REQ_ERR,
                                    WCOpcode.RECV, qp.qpn), qp)
    resp.kind = None
    dev.to_error(qp, keep_responses=True)


def _in_sequence(kind, info) -> bool:
    """FIRST/ONLY may only start a message (none under way: ``kind`` None);
    MIDDLE/LAST must continue one of the same kind."""
    if kind is None:
        return info.first
    return not info.first and info.kind == kind


def _check_sequence(qp, info) -> None:
    if not _in_sequence(qp.resp.kind, info):
        raise _Nak(NakCode.INVALID_REQUEST)


def _size_ok(mtu: int, info, n: int) -> bool:
    """A FIRST or MIDDLE carries a whole path MTU; no packet carries more."""
    return n <= mtu and (n == mtu or info.last)


def _check_size(qp, info, n: int) -> None:
    if not _size_ok(qp.mtu, info, n):
        raise _Nak(NakCode.INVALID_REQUEST)


def take_recv(dev, qp):
    """The receive WQE the next SEND (or immediate) consumes, from the QP's SRQ or
    its receive queue; ``Rnr`` if there is none.  (iWARP's untagged receive
    takes its WQE by the same rule.)"""
    if qp.srq is not None:
        wqe = dev.srq_take(qp.srq)
    else:
        wqe = qp.rq.popleft() if qp.rq else None
    if wqe is None:
        raise _Rnr()
    return wqe


def place_recv(dev, qp, data, checked: bool = False) -> None:
    """Scatter ``data`` into the receive WQE (``resp.wqe``) at the current
    offset (``resp.off``), through its SGEs' lkeys; ``Nak`` with the receive's
    WC status when it does not fit (LOC_LEN_ERR) or a key fails (LOC_PROT_ERR).
    ``checked``: each write by ``memory.write_checked``, LOC_PROT_ERR where the
    program has unmapped the memory (a UD datagram's).
    (iWARP's untagged receive places by the same rule.)"""
    resp = qp.resp
    wqe = resp.wqe
    n = len(data)
    if resp.off + n > wqe.length:
        raise _Nak(NakCode.INVALID_REQUEST, WCStatus.LOC_LEN_ERR)
    if not n:
        return
    off = resp.off
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
        if not checked:
            view[:] = data[pos:pos + take]
        elif not write_checked(view, data[pos:pos + take]):
            dev.counters["rx_unmapped"] += 1
            raise _Nak(NakCode.REMOTE_OPERATIONAL_ERROR, WCStatus.LOC_PROT_ERR)
        pos += take
        off = 0
        if pos == n:
            break
    resp.off += n


def _send(dev, qp, info, payload, tail: int, se: bool) -> None:
    resp = qp.resp
    _check_size(qp, info, len(payload))
    if info.first:
        resp.wqe = take_recv(dev, qp)
        resp.off = 0
    place_recv(dev, qp, payload)
    if info.last:
        _send_done(dev, qp, info, tail, se)
    else:
        resp.kind = Kind.SEND


def _send_done(dev, qp, info, tail: int, se: bool) -> None:
    """A SEND's LAST (or ONLY) placed: the message ends, its receive WQE
    completes with its immediate, or with the rkey its IETH invalidates (the
    local MR or MW it names must be invalidated, else LOC_PROT_ERR)."""
    resp = qp.resp
    wqe, resp.wqe = resp.wqe, None
    resp.kind = None
    flags = _NO_WC_FLAGS    # (enum members made once: IntFlag operations are slow)
    imm = inv = 0
    if info.immdt:
        flags = _WITH_IMM
        imm = tail
    elif info.ieth:         # (a packet carries an ImmDt or an IETH, never both)
        inv = tail
        if not dev.keys.invalidate(qp.pd, inv):
            resp.wqe = wqe
            raise _Nak(NakCode.INVALID_REQUEST, WCStatus.LOC_PROT_ERR)
        flags = _WITH_INV
    recv_done(dev, qp, wqe, WCOpcode.RECV, resp.off, imm, flags, se, inv)


def _write(dev, qp, info, payload, reth, tail: int, se: bool) -> None:
    resp = qp.resp
    n = len(payload)
    _check_size(qp, info, n)
    if info.first:
        va, rkey, length = reth
        resp.write_view = write_target(dev, qp, va, rkey, length)
        resp.write_off = 0
        resp.write_len = length
    off = resp.write_off
    if off + n > resp.write_len or (info.last and off + n != resp.write_len):
        raise _Nak(NakCode.INVALID_REQUEST)
    if info.immdt:
        # the immediate consumes a receive WQE; take it before touching memory so an
        # RNR NAK leaves nothing half done
        resp.wqe = take_recv(dev, qp)
    if n:
        sr_place.place_in_order(qp, resp.write_view, off, payload)
    resp.write_off = off + n
    if info.last:
        resp.kind = None
        resp.write_view = None
        if info.immdt:
            wqe, resp.wqe = resp.wqe, None
            recv_done(dev, qp, wqe, WCOpcode.RECV_RDMA_WITH_IMM, resp.write_len, tail,
                      WCFlags.WITH_IMM, se)
    else:
        resp.kind = Kind.WRITE


def _remember(qp, entry) -> None:
    res = qp.resp.resources
    res.append(entry)
    while len(res) > max(1, qp.attr.max_dest_rd_atomic):
        res.popleft()


def _read(dev, qp, info, psn: int, va: int, rkey: int, length: int) -> None:
    resp = qp.resp
    if not int(qp.attr.qp_access_flags) & _REMOTE_READ:
        raise _Nak(NakCode.INVALID_REQUEST)
    try:
        view = dev.keys.remote(qp.pd, rkey, va, length, Access.REMOTE_READ, qp)
    except AccessError:
        raise _Nak(NakCode.REMOTE_ACCESS_ERROR) from None
    last = (psn + max(1, -(-length // qp.mtu)) - 1) & PSN_MASK
    _remember(qp, ReadResource(psn, last))
    _answered(qp, last)
    resp.out.append(ReadReply(psn, view, resp.msn))
    dev.mark_ready(qp)
    if length:                                  # READs like it: a driver may answer
        resp.answer_hint = (ANSWER_READ if last == psn else ANSWER_READ_RUN, rkey, length)
        dev.answer_qp = qp                      # them (answer_target)


def _atomic(dev, qp, info, psn: int, va: int, rkey: int, swap_add: int, compare: int) -> None:
    resp = qp.resp
    if not int(qp.attr.qp_access_flags) & _REMOTE_ATOMIC:
        raise _Nak(NakCode.INVALID_REQUEST)
    if va & 7:
        raise _Nak(NakCode.INVALID_REQUEST)
    try:
        view = dev.keys.remote(qp.pd, rkey, va, 8, Access.REMOTE_ATOMIC, qp)
    except AccessError:
        raise _Nak(NakCode.REMOTE_ACCESS_ERROR) from None
    orig = int.from_bytes(view, sys.byteorder)
    if info.opcode in _COMPARE_SWAP:  # swap_add is the swap value
        if orig == compare:
            view[:] = swap_add.to_bytes(8, sys.byteorder)
    else:                             # FETCH_ADD
        view[:] = ((orig + swap_add) & _U64).to_bytes(8, sys.byteorder)
    _remember(qp, AtomicResource(psn, orig))
    _answered(qp, psn)
    resp.out.append(AtomicReply(psn, orig, resp.msn))
    dev.mark_ready(qp)
    resp.answer_hint = (ANSWER_COMPARE_SWAP if info.opcode in _COMPARE_SWAP else ANSWER_FETCH_ADD,
                        rkey, 8)            # ATOMICs like it: a driver may answer them
    dev.answer_qp = qp


#: the requests ``answer`` executes, by kind: their handlers take the header's fields
_FROM_FIELDS = {Kind.READ_REQUEST: _read, Kind.ATOMIC: _atomic}


def _atomic_write(dev, qp, pkt) -> None:
    """ATOMIC_WRITE: 8 bytes placed as one at an 8-byte aligned address the MR lets the
    peer write (rxe: REMOTE_WRITE), answered like a READ of nothing."""
    resp = qp.resp
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
    _remember(qp, ReadResource(psn, psn))           # a duplicate is answered, not placed again
    _answered(qp, psn)
    resp.out.append(ReadReply(psn, memoryview(b""), resp.msn))
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
    resp = qp.resp
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
    _remember(qp, ReadResource(psn, psn))           # a duplicate is answered, not run again
    resp.epsn = (psn + 1) & PSN_MASK
    resp.nak_sent = False
    resp.msn = (resp.msn + 1) & MSN_MASK
    resp.out.append(ReadReply(psn, memoryview(b""), resp.msn))
    dev.mark_ready(qp)


#: the other requests answered by a response (not an ACK): their handlers take the Packet
_ANSWERED = {Kind.ATOMIC_WRITE: _atomic_write, Kind.FLUSH: _flush}


def _duplicate(dev, qp, kind: Kind, psn: int, pkt) -> None:
    """A request below the ePSN: a SEND or WRITE is acknowledged again (up to
    the PSN before the ePSN; IBA C9-105, as rxe), a READ re-read, an ATOMIC
    WRITE answered without being placed again, an ATOMIC answered from the
    result saved when it executed; a FLUSH is answered again, not run again."""
    resp = qp.resp
    if kind is Kind.SEND or kind is Kind.WRITE:
        queue_ack(dev, qp, (resp.epsn - 1) & PSN_MASK)
        return
    for res in reversed(resp.resources):
        read = type(res) is ReadResource
        if read and kind == Kind.READ_REQUEST and psn_diff(psn, res.first) >= 0 \
                and psn_diff(psn, res.last) <= 0:
            reth = pkt.reth
            try:     # re-read memory with the (possibly shortened) re-issued request
                view = dev.keys.remote(qp.pd, reth.rkey, reth.va, reth.dma_len,
                                       Access.REMOTE_READ, qp)
            except AccessError:
                return
            resp.out.append(ReadReply(psn, view, resp.msn))
            dev.mark_ready(qp)
            return
        if read and kind in (Kind.ATOMIC_WRITE, Kind.FLUSH) and res.first == psn:
            resp.out.append(ReadReply(psn, memoryview(b""), resp.msn))   # not placed again
            dev.mark_ready(qp)
            return
        if not read and kind == Kind.ATOMIC and res.psn == psn:
            dev.counters["atomic_replayed"] += 1
            resp.out.append(AtomicReply(psn, res.orig, resp.msn))
            dev.mark_ready(qp)
            return
    dev.counters["duplicate_dropped"] += 1


def _receive_uc(dev, qp, pkt, d: int) -> None:
    """UC: no ACKs, no retries.  A PSN gap drops the rest of the message in progress."""
    resp = qp.resp
    info = pkt.info
    if d != 0:
        dev.counters["out_of_seq_request"] += 1
        if resp.wqe is not None:              # the partial message is lost; reuse its WQE
            (qp.rq if qp.srq is None else qp.srq.queue).appendleft(resp.wqe)
            resp.wqe = None
        resp.kind = None
        resp.write_view = None
        resp.epsn = (pkt.bth.psn + 1) & PSN_MASK
        resp.uc_drop = not info.first
        if info.first:
            _uc_execute(dev, qp, pkt)
        return
    resp.epsn = (pkt.bth.psn + 1) & PSN_MASK
    if resp.uc_drop:
        if info.first:
            resp.uc_drop = False
        else:
            return
    _uc_execute(dev, qp, pkt)


def _uc_execute(dev, qp, pkt) -> None:
    resp = qp.resp
    info = pkt.info
    reth = pkt.reth
    try:
        _check_sequence(qp, info)
        if info.kind == Kind.SEND:
            _send(dev, qp, info, pkt.payload, pkt.immdt.imm if info.immdt else 0, pkt.bth.se)
        else:
            _write(dev, qp, info, pkt.payload,
                   (reth.va, reth.rkey, reth.dma_len) if reth is not None else None,
                   pkt.immdt.imm if info.immdt else 0, pkt.bth.se)
    except (_Rnr, _Nak) as e:
        # UC has no NAKs: the message is silently dropped (a receive in use fails).
        dev.counters["uc_dropped"] += 1
        if isinstance(e, _Nak) and resp.wqe is not None:
            wqe, resp.wqe = resp.wqe, None
            dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, e.recv_status or WCStatus.LOC_LEN_ERR,
                                        WCOpcode.RECV, qp.qpn), qp)
        resp.kind = None
        resp.write_view = None
        resp.uc_drop = not pkt.info.last


def _receive_ud(dev, qp, pkt, src) -> None:
    resp = qp.resp
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
        wqe = take_recv(dev, qp)
    except _Rnr:
        dev.counters["ud_dropped"] += 1          # UD has no RNR: the datagram is lost
        return
    resp.wqe, resp.off = wqe, 0
    try:
        # the first 40 bytes of the buffer receive the GRH: for RoCEv2 over IPv4 the
        # IPv4 header in its last 20 bytes, over IPv6 the IPv6 header (as rxe does)
        if ":" in dev.ip:
            grh = ipv6_udp_headers(src[0], dev.ip, src[1], dev.port, pkt.payload)[:40]
        else:
            grh = bytes(20) + ipv4_udp_headers(src[0], dev.ip, src[1], dev.port,
                                               len(pkt.payload))[:20]
        place_recv(dev, qp, grh, True)
        place_recv(dev, qp, pkt.payload, True)
    except _Nak as e:
        resp.wqe = None
        dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, e.recv_status or WCStatus.LOC_LEN_ERR,
                                    WCOpcode.RECV, qp.qpn), qp)
        return
    resp.wqe = None
    flags = WCFlags.GRH
    imm = 0
    if pkt.immdt is not None:
        flags |= WCFlags.WITH_IMM
        imm = pkt.immdt.imm
    dev.counters["rdma_recvs"] += 1
    dev.post_cqe(qp.recv_cq, WC(wqe.wr_id, WCStatus.SUCCESS, WCOpcode.RECV, qp.qpn,
                                byte_len=GRH_LEN + len(pkt.payload), imm_data=imm,
                                wc_flags=flags, src_qp=deth.src_qp), qp, solicited=pkt.bth.se)


# ------------------------------------------------------------------ the common case
#
# COMMON_CASE: the conditions under which the responder's first branch
# (``receive_common``) takes a request straight from the datagram's bytes.  They
# are exactly those under which the general path's checks before ``receive``
# (``Device._dispatch``: ICRC, decode, QP number, QP type, P_Key, state, source)
# all pass and add nothing but the ``rcvd_pkts`` count and the packet's signals to
# the congestion control (``Device.request_signals``: a CE mark, INT telemetry),
# which the common case then passes on the same way:
#
#   the packet     an RC SEND, RDMA WRITE, RDMA READ request or ATOMIC opcode
#                  (``COMMON_OPCODES``); P_Key 0xFFFF; FECN and BECN clear; its
#                  headers and pad present (a READ or ATOMIC: no payload); a good
#                  ICRC
#   the QP         RC (with or without a congestion controller); not XRC; RTR,
#                  RTS or SQD; the packet from its peer's address
#   the PSN        the ePSN with nothing held out of order: executed (a SEND or
#                  WRITE by ``execute``, a MIDDLE that fits ``message_target`` by
#                  its early exit; a READ or ATOMIC by ``answer``)
#                  any other PSN of a READ or ATOMIC: not taken (its replay is
#                  the general path's, from the decoded packet)
#                  below the ePSN: a duplicate SEND or WRITE (``_duplicate``)
#                  above it, go-back-N: dropped, NAKed once per gap (``_gap``)
#                  above it, selective repeat, a WRITE's MIDDLE or LAST whose
#                  target is known: placed and held (``_hold_placed_write``);
#                  the FIRST of the WRITE that follows the known run: placed,
#                  held and the run extended (``_hold_placed_first``)
#
# Anything else returns False with nothing changed and takes the general path.
# The compiled kernel's run (``receive_middles``) and a SEND's FIRST and LAST
# around it (``receive_edge``) check the same conditions: the QP's here, in
# Python, once per run or packet; the packet's in ``sn_rx_middles`` (per packet)
# and ``sn_rx_edge``.

_BTH = BTH_STRUCT
_RETH = RETH_STRUCT
_I = struct.Struct("!I")
_ECN = BTH_FECN | BTH_BECN        # BTH word 1's FECN and BECN
_RC = QPType.RC
_SEND_KIND, _WRITE_KIND = Kind.SEND, Kind.WRITE
_ATOMICETH = struct.Struct("!QIQQ")
_RECEIVING = frozenset({QPState.RTR, QPState.RTS, QPState.SQD})

#: opcode -> its ``wire.roce.OPCODES`` entry, for the opcodes the common case takes
COMMON_OPCODES = {op: i for op, i in OPCODES.items() if i.qp_type == "RC" and i.kind in
                  (Kind.SEND, Kind.WRITE, Kind.READ_REQUEST, Kind.ATOMIC)}
#: those of them that ``answer`` executes (a READ request, an ATOMIC)
_ANSWERED_OPCODES = frozenset(op for op, i in COMMON_OPCODES.items()
                              if i.kind in (Kind.READ_REQUEST, Kind.ATOMIC))


def _common_qp(dev, w2: int, pkey: int, src):
    """The QP a request is for if it meets COMMON_CASE's conditions on the QP and
    the BTH's P_Key, FECN and BECN; else None."""
    qp = dev.qps.get(w2 & QPN_MASK)
    if qp is None or qp.qp_type is not _RC or qp.xrc is not None \
            or pkey != DEFAULT_PKEY or w2 & _ECN or qp.state not in _RECEIVING \
            or tuple(src) != qp.dest:
        return None
    return qp


def receive_common(dev, data, src, now: float = 0.0, ecn: int = 0, telemetry=None) -> bool:
    """The responder's first branch: a request that meets COMMON_CASE, taken
    from the datagram's bytes through the same rules as ``receive`` (``ecn`` and
    ``telemetry`` as ``Device.receive_datagram`` has them).  False, nothing
    changed, for anything else."""
    opcode, flags, pkey, w2, w3 = _BTH.unpack_from(data, 0)
    info = COMMON_OPCODES.get(opcode)
    if info is None:
        return False
    qp = _common_qp(dev, w2, pkey, src)
    if qp is None:
        return False
    hdr = info.hdr_len
    n = len(data) - ICRC_LEN
    plen = n - hdr - ((flags >> BTH_PAD_SHIFT) & BTH_PAD_MASK)
    answered = opcode in _ANSWERED_OPCODES
    if plen < 0 or (answered and plen):
        return False                    # malformed: the general path counts it
    psn = w3 & PSN_MASK
    d = (psn - qp.resp.epsn) & PSN_MASK
    sr = qp.sr
    if d == 0:
        if sr.ooo:
            return False                # the general path drains what is held
    elif answered:
        return False                    # a READ or ATOMIC's replay: the general path's
    elif d < PSN_HALF:
        if qp.selective_repeat:
            return _hold_placed_write(dev, qp, data, src, info, psn, d, plen, w3, now, ecn,
                                      telemetry)
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False                    # counted and dropped by the general path
    c = dev.counters
    c["rcvd_pkts"] += 1
    if ecn or telemetry is not None:
        dev.request_signals(qp, now, ecn, telemetry)
    if d:
        if d < PSN_HALF:                # beyond the ePSN, on go-back-N (as receive)
            c["out_of_seq_request"] += 1
            _gap(dev, qp)
            return True
        c["duplicate_request"] += 1
        _duplicate(dev, qp, info.kind, psn, None)
        return True
    if answered:
        answer(dev, qp, info, psn, (_RETH if info.reth else _ATOMICETH).unpack_from(data, BTH_LEN))
    else:
        execute(dev, qp, info, psn, w3 & BTH_ACKREQ, flags & BTH_SE,
                memoryview(data)[hdr:hdr + plen],
                _RETH.unpack_from(data, BTH_LEN) if info.reth else None,
                _I.unpack_from(data, hdr - 4)[0] if info.immdt or info.ieth else 0)
    _executed(dev, qp, info)
    return True


def _executed(dev, qp, info) -> None:
    """After a request executed at the ePSN by an early exit (``receive_common``,
    ``receive_edge``), with nothing held out of order: a message it began may
    have MIDDLEs a driver streams (``_more_middles``), and selective repeat's
    bookkeeping of a hole is gone (``_nothing_held``)."""
    sr = qp.sr
    if sr.ooo:
        return
    if info.first and not info.last:
        _more_middles(dev, qp)
    if sr.naked or sr.scan is not None or sr.writes or sr.placed is not None:
        _nothing_held(qp)                   # (it has nothing to clear otherwise)


#: the packets of a SEND around its MIDDLEs that ``receive_edge`` takes, and
#: their ``OPCODES`` entries: its FIRST, and its LAST, plain, with an immediate
#: or with an IETH
_SEND_EDGE_INFO = {int(op): OPCODES[op] for op in (
    O.RC_SEND_FIRST, O.RC_SEND_LAST, O.RC_SEND_LAST_WITH_IMMEDIATE,
    O.RC_SEND_LAST_WITH_INVALIDATE)}
SEND_EDGES = frozenset(_SEND_EDGE_INFO)
#: a SEND of one packet, plain, with an immediate or with an IETH, which
#: ``receive_edge`` takes too (``Dispatch._send_only``: compiled on a live NIC,
#: ``softnic/accel/responder.c``; taken by the Python alone, the kernel saved it
#: little, docs/performance.md)
_SEND_ONLY_INFO = {int(op): OPCODES[op] for op in (
    O.RC_SEND_ONLY, O.RC_SEND_ONLY_WITH_IMMEDIATE, O.RC_SEND_ONLY_WITH_INVALIDATE)}
SEND_ONLYS = frozenset(_SEND_ONLY_INFO)
#: what ``sn_rx_edge`` finds after the BTH (``kernel_edge``'s ``ext``): nothing
#: (0), an AETH that must be an ACK (a READ response's), or the 4 bytes of an
#: ImmDt or IETH (a SEND LAST's), which the caller reads once the packet is taken
EXT_AETH, EXT_TAIL = 1, 2


def receive_edge(dev, data, src, now: float = 0.0) -> bool:
    """``receive_common``, ``execute`` and ``_send`` for a SEND FIRST, LAST or
    ONLY at the ePSN into a receive WQE of one SGE, its packet checked and
    placed in the compiled kernel (``sn_rx_edge``), as ``receive_middles`` takes
    the MIDDLEs between them.  The QP's conditions are COMMON_CASE's
    (``_common_qp``, ICRC checking on, nothing held beyond a hole), the
    message's ``_send``'s: a FIRST or ONLY begins one (none under way, a receive
    WQE posted: else the general path's NAK or RNR NAK), a LAST (plain, with an
    immediate or with an IETH, as an ONLY may be) continues a SEND; a FIRST
    carries a whole MTU, a LAST or ONLY at most one; the
    WQE's one SGE (``recv_target``) has room for the payload (else LOC_LEN_ERR,
    the general path's).  Each packet's in the kernel: BTH word 0 (no flag but
    SE and the pad count its length implies), the QP, FECN/BECN, the ePSN, its
    length, the ICRC.  Taken, it is accounted for as those functions account
    for it (``took_send_edge``; an IETH's invalidation, refused, fails it
    there as ``execute`` fails it).  ``data`` is
    the datagram, maybe a view of the driver's receive buffer (copied into
    memory at once).  False: nothing changed."""
    size = len(data)
    if size < BTH_LEN + ICRC_LEN or not dev.config.check_icrc:
        return False
    op, flags, pkey, w2, w3 = _BTH.unpack_from(data, 0)
    qp = _common_qp(dev, w2, pkey, src)
    if qp is None or qp.sr.ooo:
        return False
    resp = qp.resp
    pad = (flags >> BTH_PAD_SHIFT) & BTH_PAD_MASK
    info = _SEND_EDGE_INFO.get(op) or _SEND_ONLY_INFO[op]
    hdr = info.hdr_len
    n = size - hdr - ICRC_LEN - pad
    if n < 0 or not _size_ok(qp.mtu, info, n) or not _in_sequence(resp.kind, info):
        return False
    if info.first:
        posted = qp.rq if qp.srq is None else qp.srq.queue
        if not posted:
            return False
        wqe, off = posted[0], 0         # (taken once placed: took_send_edge)
    else:
        wqe, off = resp.wqe, resp.off
        if wqe is None:
            return False
    t = recv_target(dev, qp, wqe)
    if t is None:
        return False
    view, room = t
    se = flags & BTH_SE
    tail = hdr != BTH_LEN
    if not kernel_edge(dev, data, src, op, se | pad << BTH_PAD_SHIFT, qp.qpn, resp.epsn,
                       EXT_TAIL if tail else 0, view, off, n, room):
        return False
    took_send_edge(dev, qp, info, n, bool(w3 & BTH_ACKREQ), bool(se),
                   _I.unpack_from(data, BTH_LEN)[0] if tail else 0)
    return True


def kernel_edge(dev, data, src, op: int, flags: int, qpn: int, psn: int, ext: int, view,
                off: int, n: int, cap: int) -> bool:
    """``sn_rx_edge`` on the datagram ``data`` from ``src``, a message's FIRST or
    LAST: its BTH word 0 must be opcode ``op``, flags byte ``flags`` and the
    default P_Key; it must be for QP ``qpn`` at PSN ``psn``; after its BTH,
    ``ext``: nothing (0), an AETH that is an ACK (``EXT_AETH``, a READ
    response's) or an ImmDt or IETH (``EXT_TAIL``); its ``n`` bytes of payload
    go to ``view[off:]``, none past ``cap``.  True if the kernel took it
    (responder.receive_edge, completer.receive_edge)."""
    ffi = dev.kernel.ffi
    w0 = bth_word0(op, flags)
    return bool(dev.kernel.lib.sn_rx_edge(ffi.from_buffer(data), len(data), w0, qpn, psn,
                                          rx_icrc_start(dev, src, len(data), w0, qpn), ext,
                                          ffi.from_buffer(view, require_writable=True), off,
                                          n, cap))


def rx_icrc_start(dev, src, size: int, w0: int, qpn: int) -> int:
    """``icrc_start`` for a datagram of ``size`` bytes from ``src`` to this device
    whose BTH words 0 and 1 are ``w0`` and the QP ``qpn``: what the kernel's
    receive loops check each packet's ICRC from (remembered in ``dev.rx_starts``:
    the same few are asked of every run)."""
    key = (src, size, w0, qpn)
    memo = dev.rx_starts
    c = memo.get(key)
    if c is None:
        if len(memo) >= MEMO_MAX:
            memo.clear()
        c = memo[key] = icrc_start(src[0], dev.ip, src[1], dev.port, size,
                                   _W0_DQPN.pack(w0, qpn))
    return c


def took_send_edge(dev, qp, info, n: int, ackreq: bool, se: bool, tail: int = 0) -> None:
    """Account for a SEND's FIRST, LAST or ONLY (``info``, its ``OPCODES`` entry)
    of ``n`` bytes that the kernel placed at the ePSN (``receive_edge``), as
    ``receive_common``, ``execute`` and ``_send`` account for it: counted; a
    FIRST takes the receive WQE it was placed in (``take_recv``) and begins the
    SEND, a LAST ends it (``_last``, ``tail`` its ImmDt or IETH), an ONLY does
    both; accepted (``accept``: its ACK queued)."""
    if not info.first:
        _last_taken(dev, qp, info, n, ackreq, se, tail)
    elif info.last:
        _only_taken(dev, qp, info, n, se, tail)
    else:
        _first_taken(dev, qp, n, ackreq)
    _executed(dev, qp, info)


def _first_taken(dev, qp, n: int, ackreq: bool) -> None:
    """A SEND's FIRST of ``n`` bytes placed at the ePSN in the first receive WQE
    posted: counted, that WQE taken (``take_recv``), the SEND begun, accepted."""
    resp = qp.resp
    dev.counters["rcvd_pkts"] += 1
    resp.wqe = take_recv(dev, qp)
    resp.off = n
    resp.kind = _SEND_KIND
    accept(dev, qp, resp.epsn, False, ackreq)


def _only_taken(dev, qp, info, n: int, se: bool, tail: int) -> None:
    """A SEND ONLY (``info``) of ``n`` bytes placed at the ePSN in the first receive
    WQE posted: counted, that WQE taken (``take_recv``), the SEND ended
    (``_last``) and, unless that refused it, accepted."""
    resp = qp.resp
    dev.counters["rcvd_pkts"] += 1
    resp.wqe = take_recv(dev, qp)
    resp.off = n
    psn = resp.epsn
    if _last(dev, qp, info, psn, tail, se):
        accept(dev, qp, psn, True, True)


def _last_taken(dev, qp, info, n: int, ackreq: bool, se: bool, tail: int) -> None:
    """A SEND's LAST (``info``) of ``n`` bytes placed at the ePSN: counted, the SEND
    ended (``_last``) and, unless that refused it, accepted."""
    resp = qp.resp
    dev.counters["rcvd_pkts"] += 1
    resp.off += n
    psn = resp.epsn
    if _last(dev, qp, info, psn, tail, se):
        accept(dev, qp, psn, True, ackreq)


def _last(dev, qp, info, psn: int, tail: int, se: bool) -> bool:
    """A SEND's LAST at ``psn``, its bytes placed: the receive completes
    (``_send_done``, with the immediate or the IETH ``tail``; ``se``: a solicited
    event, as UCX asks on every message).  False if the IETH's invalidation is
    refused: the request is then refused as ``execute`` refuses it
    (``_class_error``: NAK, the receive failed, the QP to ERR).  (The compiled
    receive's ``plain_last``, softnic/accel/responder.c, is this for a plain
    SEND whose CQ raises no event; tests/test_send_runs.py compares them.)"""
    try:
        _send_done(dev, qp, info, tail, se)
    except _Nak as e:
        _class_error(dev, qp, psn, e)
        return False
    return True


_SEND_FIRST, _SEND_MIDDLE = int(O.RC_SEND_FIRST), int(O.RC_SEND_MIDDLE)
_FIRST_INFO = OPCODES[O.RC_SEND_FIRST]
#: BTH word 0 of a SEND MIDDLE as ``sn_rx_middles`` takes it: no flag, the default P_Key
_W0_SEND_MIDDLE = bth_word0(_SEND_MIDDLE)


def receive_send_run(dev, data, o: int, seg: int, src) -> int:
    """``receive_edge``, ``receive_middles`` and ``receive_edge`` again, in one
    pass, for a run of datagrams (``seg`` bytes each from ``data[o:]`` on, the
    last maybe shorter, as ``Dispatch.receive_run`` has them) that begins with a
    SEND's FIRST: the FIRST, the MIDDLEs after it and, when the run ends with
    it, its LAST (plain, with an immediate or with an IETH), each by the kernel
    function that takes it alone (``sn_rx_edge``, ``sn_rx_middles``,
    ``sn_rx_edge`` again, called in one by ``sn_rx_send_run``), under those
    functions' conditions.  The QP's (``_common_qp``, nothing held beyond a
    hole, no message under way) and the receive's (posted, one SGE:
    ``recv_target``) are checked once for them all; the packets' in the kernel
    (the LAST's size first here, as ``receive_edge`` checks it).  An eager
    message of UCX or Open MPI, 8 KiB and a header (a FIRST, a MIDDLE, a short
    LAST), arrives as one such run.  The kernel stops at the first packet it
    does not take; what it took is accounted for as those functions account
    for it (``took_send_run``).  Returns how many datagrams were taken (0:
    nothing changed); the rest of the run goes its own way."""
    n = len(data)
    if o + seg >= n or not dev.config.check_icrc:
        return 0
    _, flags, pkey, w2, w3 = _BTH.unpack_from(data, o)
    qp = _common_qp(dev, w2, pkey, src)
    if qp is None or qp.sr.ooo:
        return 0
    mtu = qp.mtu
    pad = (flags >> BTH_PAD_SHIFT) & BTH_PAD_MASK
    if not _size_ok(mtu, _FIRST_INFO, seg - BTH_LEN - ICRC_LEN - pad) \
            or not _in_sequence(qp.resp.kind, _FIRST_INFO):
        return 0
    posted = qp.rq if qp.srq is None else qp.srq.queue
    if not posted:
        return 0
    t = recv_target(dev, qp, posted[0])     # (taken once placed: took_send_run)
    if t is None:
        return 0
    view, room = t
    last_at = o + (n - o - 1) // seg * seg  # the run's last datagram: its LAST?
    n_last = lflags = 0
    linfo = _SEND_EDGE_INFO.get(data[last_at])
    if linfo is not None and linfo.last and n - last_at >= BTH_LEN:    # (else too short)
        lflags = data[last_at + 1]
        n_last = n - last_at - linfo.hdr_len - ICRC_LEN \
            - ((lflags >> BTH_PAD_SHIFT) & BTH_PAD_MASK)
        if n_last < 0 or not _size_ok(mtu, linfo, n_last):
            last_at = 0
    else:
        last_at = 0
    qpn, psn = qp.qpn, qp.resp.epsn
    w0 = bth_word0(_SEND_FIRST, (flags & BTH_SE) | pad << BTH_PAD_SHIFT)
    ext = lw0 = lstart = 0
    if last_at:
        ext = EXT_TAIL if linfo.hdr_len != BTH_LEN else 0
        lw0 = bth_word0(data[last_at], lflags)
        lstart = rx_icrc_start(dev, src, n - last_at, lw0, qpn)
    ffi = dev.kernel.ffi
    out = rx_acks(dev)
    # sn_rx_edge (the FIRST), sn_rx_middles, sn_rx_edge (the LAST) in one call
    r = dev.kernel.lib.sn_rx_send_run(
        ffi.from_buffer(data), n, o, seg, qpn, psn, w0, rx_icrc_start(dev, src, seg, w0, qpn),
        _W0_SEND_MIDDLE, rx_icrc_start(dev, src, seg, _W0_SEND_MIDDLE, qpn), last_at, lw0,
        lstart, ext, n_last, ffi.from_buffer(view, require_writable=True), room, out + 1,
        _ACKS_PER_RUN, out)
    if r < 0:
        return 0
    m, last = r >> 1, r & 1
    tail = _I.unpack_from(data, last_at + BTH_LEN)[0] if last and ext else 0
    took_send_run(dev, qp, bool(w3 & BTH_ACKREQ), m, out, linfo if last else None, n_last,
                  bool(lflags & BTH_SE), tail)
    return 1 + m + last


def took_send_run(dev, qp, ackreq: bool, m: int, acks, last, n_last: int, se: bool,
                  tail: int) -> None:
    """Account for a SEND's FIRST (``ackreq``: its AckReq), the ``m`` MIDDLEs
    after it (the AckReqs among them: ``acks[0]`` of them, their indexes from
    the first MIDDLE in ``acks[1:]``) and its LAST if ``last`` (its ``OPCODES``
    entry; None: not taken) of ``n_last`` bytes (``se``: its SE bit; ``tail``
    its ImmDt or IETH), that the kernel placed in sequence from the ePSN
    (``receive_send_run``), by the functions ``took_send_edge`` and
    ``took_middles`` account for each with; ``_executed`` once, after the
    last."""
    _first_taken(dev, qp, qp.mtu, ackreq)
    if m:
        took_middles(dev, qp, m, acks, 1, acks[0])
    if last is not None:
        _last_taken(dev, qp, last, n_last, True, se, tail)     # (a LAST is ACKed anyway)
        _executed(dev, qp, last)
    else:
        _executed(dev, qp, _FIRST_INFO)     # (the SEND under way: a driver may stream it)


def _chain_target(dev, qp, psn: int):
    """The WRITE of ``qp.sr.writes`` (extended by ``chain_writes`` if empty) whose
    PSNs hold ``psn``: ``(view, length, address, index of psn in it, its packet
    count)``; None if ``psn`` is beyond the run."""
    chain = qp.sr.writes
    if not chain:
        chain_writes(dev, qp)
    for first, view, length, end, addr in reversed(chain):
        e = (psn - first) & PSN_MASK
        n = (end - first) & PSN_MASK
        if e < n:
            return view, length, addr, e, n
        if e < PSN_HALF:
            return None             # beyond the run
    return None


def _hold_placed_write(dev, qp, data, src, info, psn: int, d: int, plen: int, w3: int,
                       now: float, ecn: int, telemetry) -> bool:
    """Selective repeat, beyond a hole: a MIDDLE or LAST of a WRITE of the run
    that starts with the one being received (``chain_writes``) has a known target
    and offset (every packet before it in its message carries a whole MTU).  It
    is placed now (``place_beyond``: bytes newer PSNs already placed are skipped,
    later bytes win, as in order) and held as a small record that ``receive``
    accounts for (``placed_write``) once the hole fills.  False for anything
    else (the general path holds the decoded packet)."""
    if info.kind is not Kind.WRITE:
        return False
    span = SR_SPAN * qp.window
    ooo = qp.sr.ooo
    if not qp.selective_repeat or d >= span or len(ooo) >= span or psn in ooo:
        return False
    if info.first:
        return _hold_placed_first(dev, qp, data, src, info, psn, plen, w3, now, ecn, telemetry)
    mtu = qp.mtu
    last = info.last
    if plen > mtu or (not last and plen != mtu) or info.immdt:
        return False
    target = _chain_target(dev, qp, psn)
    if target is None:
        return False
    view, length, addr, e, n = target
    off = e * mtu
    if off + plen > length or last != (e + 1 == n) \
            or (last and off + plen != length):
        return False
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False
    dev.counters["rcvd_pkts"] += 1
    if ecn or telemetry is not None:
        dev.request_signals(qp, now, ecn, telemetry)
    dev.counters["out_of_seq_request"] += 1
    if plen:
        sr_place.place_beyond(qp, psn, view, off,
                              memoryview(data)[BTH_LEN:BTH_LEN + plen], addr)
    ackreq = bool(w3 & BTH_ACKREQ)
    hold(dev, qp, psn, ackreq, PlacedWrite(psn, last, plen, ackreq))
    return True


def _hold_placed_first(dev, qp, data, src, info, psn: int, plen: int, w3: int, now: float,
                       ecn: int, telemetry) -> bool:
    """``_hold_placed_write`` for the FIRST (or ONLY) packet of the WRITE that
    directly follows the run ``chain_writes`` knows: what ``_hold`` and
    ``chain_writes`` do with the decoded packet (hold it, check it, extend the
    run with its WRITE), from its bytes, and its payload placed at once as the
    MIDDLEs after it are.  ``placed_write`` checks its target again in order.
    False for anything else (the general path holds the decoded packet)."""
    if info.immdt:
        return False            # (its receive WQE is taken in order, by _write)
    chain = qp.sr.writes
    if not chain:
        chain_writes(dev, qp)
        if not chain:
            return False
    if chain[-1][3] != psn:
        return False
    reth = _RETH.unpack_from(data, BTH_LEN)
    target = _first_target(dev, qp, info, reth[0], reth[1], reth[2], plen)
    if target is None:
        return False
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False
    view, n, addr = target
    dev.counters["rcvd_pkts"] += 1
    if ecn or telemetry is not None:
        dev.request_signals(qp, now, ecn, telemetry)
    dev.counters["out_of_seq_request"] += 1
    hdr = info.hdr_len
    if plen:
        sr_place.place_beyond(qp, psn, view, 0, memoryview(data)[hdr:hdr + plen], addr)
    ackreq = bool(w3 & BTH_ACKREQ)
    hold(dev, qp, psn, ackreq, PlacedWrite(psn, info.last, plen, ackreq,
                                          WriteFirst(reth, view, n, addr)))
    chain.append((psn, view, reth[2], (psn + n) & PSN_MASK, addr))
    chain_writes(dev, qp)       # (FIRSTs held after it, decoded, join the run too)
    if n > 2:
        qp.sr.stream_psn = (psn + 1) & PSN_MASK
        dev.stream_qp = qp      # MIDDLEs of its WRITE to come: a driver may stream them
    return True


_WRITE_MIDDLE = int(O.RC_RDMA_WRITE_MIDDLE)
#: the MIDDLE opcodes whose runs the kernel takes, and the kind each continues
_MIDDLE_KIND = {int(O.RC_SEND_MIDDLE): Kind.SEND, _WRITE_MIDDLE: Kind.WRITE}
_MIDDLE_OPCODE = {k: op for op, k in _MIDDLE_KIND.items()}
_W0_DQPN = struct.Struct("!II")  # BTH words 0 and 1 (byte 4, FECN/BECN, is masked by icrc_start)
_ACKS_PER_RUN = 64              # AckReqs one kernel call takes (a GRO run is <= 64 datagrams)


def receive_middles(dev, data, o: int, seg: int, src) -> int:
    """``execute``'s early exit for the run of MIDDLE packets of the SEND or WRITE
    under way from ``data[o:]`` on (``seg`` bytes each), in the compiled kernel:
    the QP's COMMON_CASE conditions and the target (``message_target``) are
    checked here, each packet's in ``sn_rx_middles`` (the message being
    received and continued in sequence, P_Key, FECN/BECN, ePSN, room in the
    target, a whole MTU, a good ICRC); it places each and stops at the first
    that is not so.  Each taken packet is then accounted for as the early exit
    accounts for it: its offset moved, ``accept``, not last, which queues an
    ACK for each that asked for one (AckReq) before the ePSN moves past the
    run.  A SEND whose receive WQE has several SGEs takes the general way,
    packet by packet (``place_recv``).  Returns how many it took."""
    kind = _MIDDLE_KIND.get(data[o])
    if kind is None:
        return 0
    qp = _common_qp(dev, int.from_bytes(data[o + 4:o + 8], "big"),
                    int.from_bytes(data[o + 2:o + 4], "big"), src)
    if qp is None or data[o + 1] & 0x30 or seg != BTH_LEN + qp.mtu + ICRC_LEN \
            or not dev.config.check_icrc:
        return 0                # (a MIDDLE has no pad; the kernel checks every ICRC)
    if qp.sr.ooo:
        if kind is not _WRITE_KIND:
            return 0            # (only a WRITE's bytes are placed beyond a hole)
        return _middles_beyond(dev, qp, data, o, seg, src)
    if qp.resp.kind is not kind:
        return 0
    t = message_target(dev, qp)
    if t is None:
        return 0
    view, off, room = t
    k, out = kernel_middles(dev, qp, data, o, seg, src, qp.resp.epsn, view, off, room)
    if k:
        took_middles(dev, qp, k, out, 1, out[0])
        if off + (k + 1) * qp.mtu < room:
            dev.stream_qp = qp      # more MIDDLEs to come: a driver may stream them
    return k


def kernel_middles(dev, qp, data, o: int, seg: int, src, psn: int, view, off: int,
                    room: int):
    """``sn_rx_middles`` on the run at ``data[o:]``: the MIDDLEs of ``qp`` from PSN
    ``psn`` on, placed at ``view[off:]`` up to ``room``.  Returns how many it took
    and the AckReqs' array (their count, then their indexes from the first)."""
    ffi = dev.kernel.ffi
    w0 = int.from_bytes(data[o:o + 4], "big")
    out = rx_acks(dev)
    k = dev.kernel.lib.sn_rx_middles(ffi.from_buffer(data), len(data), o, seg, w0, qp.qpn, psn,
                                     rx_icrc_start(dev, src, seg, w0, qp.qpn),
                                     ffi.from_buffer(view, require_writable=True), off, room,
                                     0xFFFFFFFF, out + 1, _ACKS_PER_RUN, out)
    return k, out


def rx_acks(dev):
    """The device's array of the AckReqs a receive by the kernel reports
    (``sn_rx_middles``' count, then their indexes), made once per kernel."""
    ffi = dev.kernel.ffi
    acks = dev.rx_acks
    if acks is None or acks[0] is not ffi:
        acks = dev.rx_acks = (ffi, ffi.new(f"uint32_t[{_ACKS_PER_RUN + 1}]"))
    return acks[1]


def took_middles(dev, qp, k: int, acks, first: int, nacks: int) -> None:
    """Account for ``k`` MIDDLEs of ``qp``'s SEND or WRITE the kernel placed in
    sequence from the ePSN on, as ``execute``'s early exit accounts for each:
    counted, the message's offset moved,
    ``accept`` (not last), which queues an ACK for each that asked for one (their
    indexes from the first: ``acks[first:first + nacks]``) before the ePSN moves
    past them."""
    resp = qp.resp
    dev.counters["rcvd_pkts"] += k
    if resp.kind is _WRITE_KIND:
        resp.write_off += k * qp.mtu
    else:
        resp.off += k * qp.mtu
    e = resp.epsn
    for i in range(first, first + nacks):
        queue_ack(dev, qp, (e + acks[i]) & PSN_MASK)
    accept(dev, qp, (e + k - 1) & PSN_MASK, False, False)
    _nothing_held(qp)


def stream_target(dev):
    """The QP whose MIDDLEs the kernel took last (``receive_middles``,
    ``took_beyond``), if it may take more of them without the engine between
    runs (``sn_rx_stream``, whose packets meet the conditions ``sn_rx_middles``
    checks): the SEND or WRITE it receives in order under COMMON_CASE's
    conditions on the QP, into ``message_target``, or, beyond a hole, a
    WRITE's MIDDLEs from the PSN after the last taken
    (``beyond_run``).  ``(qp, seg, w0, start, psn, view, offset, room, at)``:
    the datagram size, BTH word 0 and ICRC state of its MIDDLEs, the PSN the
    stream starts at, the target and where that PSN's bytes go in it, the end
    of what it may fill, and (beyond a hole, else None) the address of that
    PSN's first byte; else None."""
    qp = dev.stream_qp
    if qp is None:
        return None
    if dev.qps.get(qp.qpn) is not qp or qp.qp_type is not _RC or qp.xrc is not None \
            or qp.state not in _RECEIVING or not dev.config.check_icrc \
            or dev.kernel is None or not dev.fast:
        dev.stream_qp = None
        return None
    if qp.sr.ooo:
        psn = qp.sr.stream_psn
        run = beyond_run(dev, qp, psn, PSN_MODULUS)
        if run is None:
            dev.stream_qp = None
            return None
        view, off, room, at = run
        w0 = bth_word0(_WRITE_MIDDLE)
    else:
        t = message_target(dev, qp)
        if t is None:
            dev.stream_qp = None
            return None
        view, off, room = t
        psn, at = qp.resp.epsn, None
        w0 = bth_word0(_MIDDLE_OPCODE[qp.resp.kind])
    seg = BTH_LEN + qp.mtu + ICRC_LEN
    start = rx_icrc_start(dev, qp.dest, seg, w0, qp.qpn)
    return qp, seg, w0, start, psn, view, off, room, at


def _middles_beyond(dev, qp, data, o: int, seg: int, src) -> int:
    """``_hold_placed_write`` for a run of a WRITE's MIDDLEs beyond a hole (the
    run of WRITEs ``chain_writes`` knows), in the compiled kernel: the run's
    conditions are checked here (``beyond_run``), each packet's in
    ``sn_rx_middles`` (as in order, with the PSNs from the run's first on and
    room up to the WRITE's last packet, which is not a MIDDLE).  Each taken
    packet is then accounted for as ``_hold_placed_write`` does
    (``took_beyond``).  Returns how many it took."""
    psn = _BTH.unpack_from(data, o)[4] & PSN_MASK
    run = beyond_run(dev, qp, psn, (len(data) - o) // seg)
    if run is None:
        return 0
    view, off, room, at = run
    k, out = kernel_middles(dev, qp, data, o, seg, src, psn, view, off, room)
    if k:
        took_beyond(dev, qp, psn, k, at, out, 1, out[0])
    return k


def beyond_run(dev, qp, psn: int, m: int):
    """May up to ``m`` MIDDLEs of a WRITE, PSNs from ``psn`` on, be placed now,
    beyond a hole (``_hold_placed_write``'s conditions, for a run)?  Each PSN in
    the span and not yet held, of a WRITE of the run ``chain_writes`` knows and
    before its last packet, its bytes not placed by a newer PSN
    (``sr_place.plain_run``), with selective repeat.  Returns ``(view, offset,
    room, address)``: the WRITE's target, where ``psn``'s bytes go in it, the end
    of what the run may fill (``sn_rx_middles``' ``len``) and the address of
    ``psn``'s first byte; None if not even one may."""
    if not qp.selective_repeat:
        return None
    d = (psn - qp.resp.epsn) & PSN_MASK
    if d == 0 or d >= PSN_HALF:
        return None             # in order (the general path drains what is held) or old
    target = _chain_target(dev, qp, psn)
    if target is None:
        return None
    view, length, addr, e, n = target
    span = SR_SPAN * qp.window
    ooo = qp.sr.ooo
    m = min(m, span - d, span - len(ooo), n - 1 - e)
    k = 0
    while k < m and (psn + k) & PSN_MASK not in ooo:
        k += 1
    mtu = qp.mtu
    off = e * mtu
    k = sr_place.plain_run(qp, addr + off, psn, k, mtu)
    if k <= 0:
        return None
    return view, off, min(length - 1, view.nbytes, off + k * mtu), addr + off


def took_beyond(dev, qp, psn: int, k: int, at: int, acks, first: int, nacks: int) -> None:
    """Account for ``k`` MIDDLEs the kernel placed beyond a hole, PSNs from ``psn``
    on, from address ``at`` on (a ``beyond_run``), as ``_hold_placed_write``
    accounts for each: counted, its bytes remembered (``sr_place.record_run``,
    what ``place_beyond`` records), and held (``hold``; the packets that asked
    for an ACK, their indexes from the first ``acks[first:first + nacks]``,
    selectively acknowledged).  A driver's stream may go on from the next PSN
    (``stream_target``) if that is a MIDDLE of the WRITE too."""
    c = dev.counters
    c["rcvd_pkts"] += k
    c["out_of_seq_request"] += k
    mtu = qp.mtu
    sr_place.record_run(qp, at, psn, k, mtu)
    asked = {acks[i] for i in range(first, first + nacks)}
    a = 0 in asked
    hold(dev, qp, psn, a, PlacedWrite(psn, False, mtu, a))
    ooo = qp.sr.ooo
    for i in range(1, k):
        p = (psn + i) & PSN_MASK
        a = i in asked
        if qp.sr.scan != (p - 1) & PSN_MASK:
            hold(dev, qp, p, a, PlacedWrite(p, False, mtu, a))
            continue
        # ``hold`` when every PSN below ``p`` is held or named: nothing to name
        ooo[p] = PlacedWrite(p, False, mtu, a)
        qp.sr.scan = p
        if a:
            _sack_nak(dev, qp, qp.resp.epsn, p)
    nxt = qp.sr.stream_psn = (psn + k) & PSN_MASK
    run = _chain_target(dev, qp, nxt)
    if run is not None and run[3] < run[4] - 1:
        dev.stream_qp = qp          # more MIDDLEs of the WRITE to come: a driver may stream them


# ------------------------------------------------------------------ answered by the kernel
#
# A READ or an ATOMIC at the ePSN, answered by a driver's kernel (``sn_rx_answers``:
# ``sn_read_only``, ``sn_read_run``, ``sn_atomic_ack``) as it arrives, under
# ``answer_target``'s conditions; ``took_answers`` accounts for each as
# ``answer`` does.

#: what the kernel answers (``AnswerTarget.kind``; ``sn_rx_answers``' ``kind``): a
#: READ of one packet, an ATOMIC, a READ of more (``sn_read_run``)
ANSWER_READ, ANSWER_FETCH_ADD, ANSWER_COMPARE_SWAP, ANSWER_READ_RUN = 0, 1, 2, 3
_READ_MIDDLE = int(O.RC_RDMA_READ_RESPONSE_MIDDLE)
_READ_LAST = int(O.RC_RDMA_READ_RESPONSE_LAST)
_ANSWER_REQUEST = {ANSWER_READ: (int(O.RC_RDMA_READ_REQUEST), RETH_LEN, _REMOTE_READ,
                                 int(O.RC_RDMA_READ_RESPONSE_ONLY)),
                   ANSWER_READ_RUN: (int(O.RC_RDMA_READ_REQUEST), RETH_LEN, _REMOTE_READ,
                                     int(O.RC_RDMA_READ_RESPONSE_FIRST)),
                   ANSWER_FETCH_ADD: (int(O.RC_FETCH_ADD), ATOMICETH_LEN, _REMOTE_ATOMIC,
                                      int(O.RC_ATOMIC_ACKNOWLEDGE)),
                   ANSWER_COMPARE_SWAP: (int(O.RC_COMPARE_SWAP), ATOMICETH_LEN, _REMOTE_ATOMIC,
                                         int(O.RC_ATOMIC_ACKNOWLEDGE))}


class AnswerTarget(NamedTuple):
    """What a driver's kernel needs to answer a QP's next READs or ATOMICs
    (``sn_rx_answers``; ``answer_target`` says when it may): which
    (``kind``), the request's BTH word 0, its ICRC state (``icrc_start``) and
    the ePSN; the R_Key and length of the requests it may answer (those of the
    last one answered), the MR's bounds ``[lo, hi)`` and its bytes ``mem``; the
    response's BTH word 0, destination QP, AETH syndrome bits, the MSN before
    the first, and ICRC state.  For a READ of more than one packet
    (``ANSWER_READ_RUN``), the response is its FIRST, and the path MTU, the
    MIDDLEs' BTH word 0 and ICRC state, and the LAST's follow (0 otherwise)."""
    qp: object
    kind: int
    w0: int
    req_start: int
    epsn: int
    rkey: int
    length: int
    lo: int
    hi: int
    mem: memoryview
    resp_w0: int
    dqpn: int
    syndrome: int
    msn: int
    resp_start: int
    mtu: int = 0
    mid_w0: int = 0
    mid_start: int = 0
    last_w0: int = 0
    last_start: int = 0


def answer_target(dev) -> AnswerTarget | None:
    """May the driver's kernel answer ``dev.answer_qp``'s next requests
    (``sn_read_only``, ``sn_atomic_ack``, through ``sn_rx_answers``)?  So it may
    while a READ or ATOMIC at the ePSN would take ``receive_common``'s way
    through ``answer`` with nothing else to do: COMMON_CASE's conditions on the
    QP (RC, not XRC, RTR, RTS or SQD, nothing held beyond a hole), no message
    under way (``_check_sequence``), no response waiting to go out before it
    (its order on the wire), no congestion controller to tell, the access the
    QP must allow (``_read``, ``_atomic``), ICRCs checked and sent
    (``DeviceConfig.icrc``, ``check_icrc``), and the request's R_Key that of an
    MR of the QP's PD granting that access (``KeyTable.remote_region``; not a
    memory window, not an on-demand one).  Only requests like the last the
    engine answered (``resp.answer_hint``: a READ and its length, or the same
    ATOMIC; the same R_Key) are taken: a response's ICRC state depends on its
    length.  A READ of more than one packet only where the driver sends a run
    gathered from memory (``tx_gather``), as its MIDDLEs go.  The kernel checks
    each packet's conditions and the VA (its range; an ATOMIC's alignment);
    ``took_answers`` accounts for what it answered."""
    qp = dev.answer_qp
    if qp is None:
        return None
    resp = qp.resp
    hint = resp.answer_hint
    cfg = dev.config
    sr = qp.sr
    if hint is None or dev.qps.get(qp.qpn) is not qp or qp.qp_type is not _RC \
            or qp.xrc is not None or qp.state not in _RECEIVING or qp.cc is not None \
            or not (cfg.icrc and cfg.check_icrc) or dev.kernel is None or not dev.fast:
        dev.answer_qp = None
        return None
    if resp.kind is not None or resp.out or sr.ooo or sr.naked or sr.scan is not None \
            or sr.writes or sr.placed is not None:
        return None                 # the engine's turn first (it may be again after)
    kind, rkey, length = hint
    mr = dev.keys.remote_region(qp.pd, rkey, _ANSWER_ACCESS[kind])
    mtu = qp.mtu
    if mr is None or (length > mtu) != (kind == ANSWER_READ_RUN) \
            or kind == ANSWER_READ_RUN and not dev.tx_gather \
            or not int(qp.attr.qp_access_flags) & _ANSWER_REQUEST[kind][2]:
        dev.answer_qp = None
        return None
    dqpn = qp.attr.dest_qp_num & QPN_MASK
    w0, req_start, resp_w0, resp_start, run = _answer_heads(
        kind, length, mtu, qp.qpn, dqpn, qp.dest, (dev.ip, dev.port))
    return AnswerTarget(
        qp, kind, w0, req_start, resp.epsn, rkey, length, mr.addr, mr.addr + mr.length,
        mr.view, resp_w0, dqpn, ACK_CREDITS << AETH_SYNDROME_SHIFT, resp.msn, resp_start, *run)


#: the access an answer's QP and MR must allow, by kind (``_ANSWER_REQUEST``'s, as an Access)
_ANSWER_ACCESS = {kind: Access(a[2]) for kind, a in _ANSWER_REQUEST.items()}


@functools.lru_cache(maxsize=256)
def _answer_heads(kind: int, length: int, mtu: int, qpn: int, dqpn: int, src, here) -> tuple:
    """``answer_target``'s BTH words 0 of the request and of its response (flags: a
    READ RESPONSE ONLY's pad count) and their ICRC states, as the engine's packets
    carry them (``run``: a READ of more than one packet's MIDDLE and LAST), for a
    QP ``qpn`` whose peer ``src`` sends to ``here``: a pure function of its
    arguments, kept (each answered call asks the same)."""
    ip, port = here
    opcode, eth_len, _, resp_opcode = _ANSWER_REQUEST[kind]
    head = _BTH.pack(opcode, 0, DEFAULT_PKEY, qpn, 0)[:8]
    run = ()
    if kind == ANSWER_READ:
        pad = -length & 3
        resp_len = BTH_LEN + AETH_LEN + length + pad + ICRC_LEN
    elif kind == ANSWER_READ_RUN:                   # its FIRST, then (output._read_run)
        pad = 0
        resp_len = BTH_LEN + AETH_LEN + mtu + ICRC_LEN
        n_last = length - (-(-length // mtu) - 1) * mtu
        last_pad = -n_last & 3
        mid_head = _BTH.pack(_READ_MIDDLE, 0, DEFAULT_PKEY, dqpn, 0)[:8]
        last_head = _BTH.pack(_READ_LAST, last_pad << BTH_PAD_SHIFT, DEFAULT_PKEY, dqpn, 0)[:8]
        run = (mtu, _W0_DQPN.unpack(mid_head)[0],
               icrc_start(ip, src[0], port, src[1], BTH_LEN + mtu + ICRC_LEN, mid_head),
               _W0_DQPN.unpack(last_head)[0],
               icrc_start(ip, src[0], port, src[1],
                          BTH_LEN + AETH_LEN + n_last + last_pad + ICRC_LEN, last_head))
    else:
        pad = 0
        resp_len = BTH_LEN + AETH_LEN + ATOMICACKETH_LEN + ICRC_LEN
    resp_head = _BTH.pack(resp_opcode, pad << BTH_PAD_SHIFT, DEFAULT_PKEY, dqpn, 0)[:8]
    return (_W0_DQPN.unpack(head)[0],
            icrc_start(src[0], ip, src[1], port, BTH_LEN + eth_len + ICRC_LEN, head),
            _W0_DQPN.unpack(resp_head)[0],
            icrc_start(ip, src[0], port, src[1], resp_len, resp_head), run)


def took_answers(dev, qp, kind: int, k: int, origs=None) -> None:
    """Account for ``k`` requests the kernel answered from the ePSN on (READs, or
    ATOMICs, ``kind``; their responses sent), as ``receive_common`` and
    ``answer`` account for each: counted (``rcvd_pkts``; its responses in
    ``sent_pkts``, as ``Output`` counts what it seals), remembered for a
    duplicate's replay (a READ with its responses' PSNs, an ATOMIC with the
    original value the kernel read, ``origs[i]``), the ePSN moved past its
    responses' PSNs and the MSN past it."""
    n = 1
    if kind == ANSWER_READ_RUN:             # (each of the length the hint names)
        n = -(-qp.resp.answer_hint[2] // qp.mtu)
    dev.counters["rcvd_pkts"] += k
    dev.counters["sent_pkts"] += k * n
    resp = qp.resp
    for i in range(k):
        psn = resp.epsn
        last = (psn + n - 1) & PSN_MASK
        _remember(qp, AtomicResource(psn, origs[i]) if kind in _ANSWER_ATOMICS
                  else ReadResource(psn, last))
        _answered(qp, last)


_ANSWER_ATOMICS = (ANSWER_FETCH_ADD, ANSWER_COMPARE_SWAP)
