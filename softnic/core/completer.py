"""Completer: ACKs, NAKs, READ responses and ATOMIC ACKs -> send completions.

Responses arrive in PSN order; a response naming PSN p (an ACK, a READ or
ATOMIC response, a NAK: PSN sequence error, RNR or an error) implicitly
acknowledges every PSN before p (``_ack_before``): the WRs it covers complete,
and a later timeout resends from p.  (With selective repeat a PSN SEQUENCE
ERROR NAK names one hole among several and acknowledges nothing.)  A gap in
READ responses, or an ACK past a READ whose responses never came, means
responses were lost: the requester re-issues from the first missing PSN.

``receive`` checks a decoded response and hands it to its kind's handler
(``_RESPONSES``: ``_ack``, ``_read_response``, ``_atomic_ack``; a PSN SEQUENCE
ERROR NAK to ``_sequence_nak``); ``_progress`` then resets the retry counts if
the acknowledged PSN moved (``_forward``), restarts the retransmission timer
and posts completions (``complete``).  ``retry_cnt`` n is n retries (after
timeouts, and go-back-N resends for a PSN SEQUENCE ERROR NAK or an implied NAK:
``_take_retry``) since the last such progress, for every n in 0..7 (then RETRY
EXCEEDED, the QP to ERR, its other work flushed); ``rnr_retry`` likewise, but
7 is for ever (ibv_modify_qp(3)).  ``receive_common``, which dispatch tries
first, takes a plain ACK of the oldest WQE from its bytes through the same
``acknowledged`` and ``_progress``.  Timeouts: ``on_timeout``.
"""

from __future__ import annotations

import struct
import sys
from typing import NamedTuple

from ..wire.icrc import check_icrc
from ..wire.psn import PSN_HALF, PSN_MASK, psn_add, psn_before, psn_diff
from ..wire.roce import AETH_LEN, OPCODES, AethCode, AtomicAckETH, BTH_AETH_STRUCT, BTH_BECN, \
    BTH_FECN, BTH_LEN, BTH_PAD_MASK, BTH_PAD_SHIFT, bth_word0, \
    DEFAULT_PKEY, ICRC_LEN, Kind, NakCode, OpInfo, Opcode as O, QPN_MASK
from .cq import WC
from .enums import QPState, QPType, RNR_TIMER_SECONDS, WCFlags, WCStatus, WROpcode as W
from . import requester, responder
from .wr_opcode import ATOMICS, EIGHT_BYTES, EMPTY_READ_RESPONSE, SENDS, WC_OPCODE

_NAK_STATUS = {
    NakCode.INVALID_REQUEST: WCStatus.REM_INV_REQ_ERR,
    NakCode.REMOTE_ACCESS_ERROR: WCStatus.REM_ACCESS_ERR,
    NakCode.REMOTE_OPERATIONAL_ERROR: WCStatus.REM_OP_ERR,
    NakCode.INVALID_RD_REQUEST: WCStatus.REM_INV_RD_REQ_ERR,
}
_WC_OPCODE = WC_OPCODE


_SUCCESS = WCStatus.SUCCESS
_SENDS = SENDS                  # (module globals: read per completion)
_EIGHT_BYTES = EIGHT_BYTES


def _finish(qp, wqe, status=WCStatus.SUCCESS) -> None:
    wqe.done = True
    if wqe.status is None:
        wqe.status = status
    if wqe.first_psn is not None:
        qp.comp.acked_psn = wqe.last_psn
    if wqe.rd_atomic and wqe.first_psn is not None:
        qp.req.rd_atomic -= 1


def _ack_before(qp, psn: int) -> bool:
    """A response naming ``psn`` (an ACK, a NAK with its PSN, a READ or ATOMIC
    response) acknowledges every PSN before it: complete every started WQE that
    ends before ``psn``, and if ``psn`` lies inside a SEND or WRITE, that
    message's packets before it (a later timeout resends from ``psn``, not from
    the message's start).  False if a WQE before it is a READ/ATOMIC still
    waiting for its responses (they were lost)."""
    for w in qp.sq:
        if w.first_psn is None:
            break
        if w.done:
            continue
        if psn_diff(w.last_psn, psn) >= 0:
            # ``psn`` is in ``w``: a READ's responses are counted from its first
            # PSN by ``_read_response``, not acknowledged by a later one
            comp = qp.comp
            if (not w.rd_atomic or psn == w.first_psn) and \
                    psn_diff(psn_add(psn, -1), comp.acked_psn) > 0:
                comp.acked_psn = (psn - 1) & PSN_MASK
            break
        if w.rd_atomic:
            return False
        _finish(qp, w)
    return True


def _retry_from(dev, qp, psn: int, before: int) -> None:
    """Responses were lost (a PSN SEQUENCE ERROR NAK, an implied NAK): resend from
    ``psn``, once per PSN.  The resend is a retry as a timeout's is (IBA; qib and
    rxe count both): it counts against ``retry_cnt``, and with none left the WQE
    fails with RETRY_EXC_ERR, so a responder that NAKs every resend cannot keep
    the requester busy for ever.  A response that acknowledged new PSNs (the
    acknowledged PSN moved from ``before``) starts the count afresh."""
    if qp.comp.retry_pending == psn:
        return
    qp.comp.retry_pending = psn
    dev.counters["completer_retry_err"] += 1
    _forward(qp, before)
    if not _take_retry(dev, qp):
        return
    requester.rewind(qp, psn)
    dev.mark_ready(qp)


def _take_retry(dev, qp) -> bool:
    """Count one retry (a timeout's or a NAK's resend) against ``retry_cnt``: n
    retries for every n in 0..7 (7 is not infinite: IBA, mlx5; only rnr_retry has
    an infinite value).  None left: False, and the oldest unacknowledged WQE
    completes with RETRY_EXC_ERR (the QP goes to ERR and flushes the rest of its
    work, ``complete``)."""
    if qp.comp.retry_left:
        qp.comp.retry_left -= 1
        return True
    dev.counters["retry_exceeded_err"] += 1
    comp = (qp.comp.acked_psn + 1) & PSN_MASK
    i = requester.wqe_index(qp, comp)
    w = qp.sq[i] if i is not None else next((w for w in qp.sq if not w.done), None)
    if w is not None:
        _finish(qp, w, WCStatus.RETRY_EXC_ERR)
    complete(dev, qp)
    return False


def receive(dev, qp, pkt, now: float) -> None:
    """Handle one response packet for an RC QP's send side."""
    psn = pkt.bth.psn
    before = qp.comp.acked_psn
    comp_psn = (before + 1) & PSN_MASK
    if psn_diff(psn, comp_psn) < 0 or psn_diff(psn, qp.req.psn) >= 0:
        dev.counters["rcvd_stale_response"] += 1       # old duplicate, or PSN we never sent
        return
    kind = pkt.info.kind
    aeth = pkt.aeth
    code = aeth.code if aeth is not None else AethCode.ACK
    if kind == Kind.ACK and code == AethCode.NAK and aeth.value == NakCode.PSN_SEQUENCE_ERROR:
        _sequence_nak(dev, qp, psn, aeth.msn, comp_psn, before, now)
        return
    # a response for PSN p acknowledges every request before the one it answers
    if not _ack_before(qp, psn):
        _retry_from(dev, qp, (qp.comp.acked_psn + 1) & PSN_MASK, before)
        _progress(dev, qp, before, now)
        return
    i = requester.wqe_index(qp, psn)
    wqe = qp.sq[i] if i is not None else None
    if kind is not Kind.ACK and code != AethCode.ACK:
        # a READ response or ATOMIC ACKNOWLEDGE whose AETH is an RNR NAK or a NAK: a
        # responder says those in an ACKNOWLEDGE, so this one answers nothing (rxe's
        # check_ack takes it for an error too)
        ok = _bad_response(dev, qp, wqe)
    else:
        ok = _RESPONSES[kind](dev, qp, pkt, psn, wqe, now, before)
    if ok:
        _progress(dev, qp, before, now)


def _sequence_nak(dev, qp, psn: int, msn: int, comp_psn: int, before: int, now: float) -> None:
    """A PSN SEQUENCE ERROR NAK: the responder misses ``psn``.  Go-back-N: the
    NAK implicitly acknowledges what comes before it, and everything from it is sent again.
    Selective repeat: only ``psn`` is resent, and the MSN field names a PSN the
    responder holds (a selective ACK).  Such a NAK names one hole of perhaps
    several (the responder names each PSN missing below one it holds), so it
    acknowledges nothing before it: the cumulative ACKs do."""
    dev.counters["rcvd_seq_err"] += 1
    if qp.cc is not None:
        qp.cc.on_loss(now=now, kind="nak")
    if qp.selective_repeat:
        _selective_nak(dev, qp, psn, msn, comp_psn, now)
        return
    if not _ack_before(qp, psn):
        _retry_from(dev, qp, (qp.comp.acked_psn + 1) & PSN_MASK, before)
    else:
        qp.comp.retry_pending = None
        _retry_from(dev, qp, psn, before)
    _progress(dev, qp, before, now)


def _selective_nak(dev, qp, psn: int, sack: int, comp_psn: int, now: float) -> None:
    comp = qp.comp
    if psn_diff(sack, comp_psn) >= 0 and psn_diff(sack, qp.req.psn) < 0 and (
            comp.sacked_psn is None or psn_diff(sack, comp.sacked_psn) > 0):
        comp.sacked_psn = sack
        if comp.rto_at is not None:
            # the responder holds newer packets: the path works, and the
            # hole's resend may wait behind a queue; restart both timers
            comp.rto_at = now + dev.rto(qp)
            comp.probe_at = now + dev.probe_interval(qp)
            dev.arm(qp)
    mark = comp.rexmitted.get(psn)
    if mark is None or psn_diff(sack, mark) > 0:
        # Not resent yet, or resent and lost: the responder holds a packet
        # first sent after that resend (resends leave before new packets),
        # so on an in-order path the resend is gone.  Resend it now rather
        # than waiting for the retransmission timer.
        if mark is not None:
            dev.counters["rexmit_lost"] += 1
        comp.rexmitted[psn] = qp.req.max_sent_psn
        comp.rexmit.append(psn)
    dev.mark_ready(qp)


def acknowledged(qp, psn: int, wqe) -> None:
    """A plain ACK of ``psn`` (everything before ``wqe`` already acknowledged):
    ``wqe`` is done if ``psn`` is its last PSN; a READ or ATOMIC waits for its
    response, not an ACK."""
    if wqe is not None and not wqe.rd_atomic:
        if psn == wqe.last_psn:
            _finish(qp, wqe)
        else:
            qp.comp.acked_psn = psn           # part of a multi-packet message


def _ack(dev, qp, pkt, psn: int, wqe, now: float, before: int) -> bool:
    """An ACK, an RNR NAK or an error NAK (a PSN SEQUENCE ERROR NAK is
    ``_sequence_nak``'s).  True: ``_progress`` follows."""
    aeth = pkt.aeth
    code = aeth.code
    if code == AethCode.ACK:
        acknowledged(qp, psn, wqe)
    elif code == AethCode.RNR_NAK:
        return _rnr_nak(dev, qp, psn, aeth.value, wqe, now, before)
    elif code == AethCode.NAK:
        dev.counters["rcvd_nak"] += 1
        if wqe is not None:
            _finish(qp, wqe, _NAK_STATUS.get(aeth.value, WCStatus.REM_INV_REQ_ERR))
            qp.req.error = True
    return True


def _rnr_nak(dev, qp, psn: int, timer: int, wqe, now: float, before: int) -> bool:
    """The responder had no receive WQE: wait the RNR timer and resend from
    ``psn``, ``rnr_retry`` times (7: forever, ibv_modify_qp(3)); the resend
    counts (``on_timeout``).  A NAK that acknowledges new PSNs starts a new
    series (``_forward``) before it is counted."""
    dev.counters["rcvd_rnr_err"] += 1
    _forward(qp, before)
    if qp.comp.rnr_left == 0 and qp.attr.rnr_retry != 7:
        dev.counters["retry_rnr_exceeded_err"] += 1
        if wqe is not None:
            _finish(qp, wqe, WCStatus.RNR_RETRY_EXC_ERR)
        qp.req.error = True
        complete(dev, qp)
        return False
    requester.rewind(qp, psn)
    qp.comp.rnr_wait = True
    qp.comp.rnr_at = now + max(RNR_TIMER_SECONDS[timer], dev.config.min_timer)
    # An RNR NAK is a response: stop the transport timer while waiting (the
    # resend restarts it), so RNR waits never count against retry_cnt.
    qp.comp.rto_at = None
    dev.arm(qp)
    return True


def _read_response(dev, qp, pkt, psn: int, wqe, now: float, before: int) -> bool:
    """A READ RESPONSE: its data scattered into the READ's gather list, in
    order (a gap means responses were lost: the READ is re-issued from the
    first missing one; selective repeat places it and asks for the hole only).
    An ATOMIC WRITE or a FLUSH is answered by an empty READ RESPONSE ONLY (as rxe)."""
    if wqe is not None and wqe.opcode in EMPTY_READ_RESPONSE:
        if psn != wqe.first_psn or not pkt.info.first or not pkt.info.last or pkt.payload:
            return _bad_response(dev, qp, wqe)
        _finish(qp, wqe)
        return True
    if wqe is None or wqe.opcode != W.RDMA_READ:
        return _bad_response(dev, qp, wqe)
    if psn == wqe.first_psn:
        qp.comp.acked_psn = (psn - 1) & PSN_MASK       # everything before the READ is done
    expected = (qp.comp.acked_psn + 1) & PSN_MASK
    idx = (psn - wqe.first_psn) & PSN_MASK
    off = idx * qp.mtu
    n = len(pkt.payload)
    is_last = idx == wqe.npkts - 1
    if n != ((wqe.length - off) if is_last else qp.mtu):
        return _bad_response(dev, qp, wqe)
    # The opcode must fit the response's place: the READ's first response is a
    # FIRST or an ONLY, its last one a LAST or an ONLY (a READ re-issued from
    # response k starts again at k with a FIRST); under go-back-N nothing else
    # ends it, while selective repeat asks for a hole only, whose LAST may fall
    # inside the READ.
    if psn == expected and ((idx == 0 and not pkt.info.first) or (
            pkt.info.last != is_last and (is_last or not qp.selective_repeat))):
        return _bad_response(dev, qp, wqe)
    if psn != expected:
        if not qp.selective_repeat or psn_diff(expected, wqe.first_psn) < 0:
            _retry_from(dev, qp, max_psn(expected, wqe.first_psn), before)
        else:
            _read_beyond_hole(dev, qp, wqe, expected, idx, off, pkt.payload)
        return False
    scatter(wqe, off, pkt.payload)
    qp.comp.acked_psn = psn
    qp.comp.retry_pending = None
    if wqe.got:
        nxt = idx + 1
        while nxt in wqe.got:
            wqe.got.discard(nxt)
            qp.comp.acked_psn = (wqe.first_psn + nxt) & PSN_MASK
            nxt += 1
        is_last = nxt - 1 == wqe.npkts - 1
    if is_last:
        _finish(qp, wqe)
    return True


def read_target(dev, qp):
    """The READ whose RESPONSE MIDDLEs may be taken now, in order, by the way
    ``receive_middles`` takes a run of them: the oldest outstanding WQE, a READ
    whose first response came (the acknowledged PSN inside it), nothing held
    beyond a hole (``wqe.got``), one SGE, on an RC QP that may receive responses
    (RTS, SQD), not XRC, no congestion controller.  ``(view, offset, room)``: its
    SGE's view, where the expected response's bytes go, and the end of its
    MIDDLEs' bytes (the LAST's start); None for anything else."""
    if qp.qp_type is not _RC or qp.xrc is not None or qp.cc is not None \
            or (qp.state is not _RTS and qp.state is not _SQD):
        return None
    expected = (qp.comp.acked_psn + 1) & PSN_MASK
    for w in qp.sq:
        if w.first_psn is None:
            return None
        if not w.done:
            break
    else:
        return None
    if w.opcode != W.RDMA_READ or w.got or expected == w.first_psn \
            or len(w.views) != 1 or psn_diff(expected, w.last_psn) >= 0:
        return None
    mtu = qp.mtu
    view = w.views[0]
    return view, ((expected - w.first_psn) & PSN_MASK) * mtu, min((w.npkts - 1) * mtu, len(view))


_READ_MIDDLE = int(O.RC_RDMA_READ_RESPONSE_MIDDLE)


def receive_middles(dev, data, o: int, seg: int, src, now: float) -> int:
    """``_read_response`` for a run of READ RESPONSE MIDDLEs from ``data[o:]`` on
    (``seg`` bytes each), in the compiled kernel (``sn_rx_middles``, as the
    responder's ``receive_middles`` takes a SEND's or WRITE's): the QP's and the
    READ's conditions are checked here (``read_target``, its peer's address, a
    whole MTU, the ICRC checked), each packet's in the kernel (BTH word 0, the
    QP, FECN/BECN, the expected PSN, room before the READ's LAST, a good ICRC).
    Each taken packet is what ``receive`` and ``_read_response`` make of a MIDDLE
    at the expected PSN: counted, scattered, the acknowledged PSN past it, any
    pending retry done with, then ``_progress``.  Returns how many it took."""
    if data[o] != _READ_MIDDLE:
        return 0
    qp = dev.qps.get(int.from_bytes(data[o + 5:o + 8], "big"))
    if qp is None or tuple(src) != qp.dest or data[o + 1] & 0x30 \
            or data[o + 2:o + 4] != b"\xff\xff" or seg != BTH_LEN + qp.mtu + ICRC_LEN \
            or not dev.config.check_icrc:
        return 0
    t = read_target(dev, qp)
    if t is None:
        return 0
    view, off, room = t
    before = qp.comp.acked_psn
    k, _ = responder.kernel_middles(dev, qp, data, o, seg, src, (before + 1) & PSN_MASK,
                                    view, off, room)
    if k:
        took_responses(dev, qp, k, now)
        if off + (k + 1) * qp.mtu < room:
            dev.stream_qp = qp      # more of the READ's MIDDLEs to come: a driver may stream them
    return k


def took_responses(dev, qp, k: int, now: float, finished=()) -> None:
    """Account for ``k`` READ responses the kernel placed from the expected PSN on
    (a run of MIDDLEs, or its FIRST or LAST: ``receive_edge``; or a stream of
    READs' responses: ``reads_target``), as ``receive`` and ``_read_response``
    account for each: counted, the READs ``finished`` by their LAST, the
    acknowledged PSN past them all, any pending retry done with, then
    ``_progress`` (once: what it does for each in turn comes to the same)."""
    before = qp.comp.acked_psn
    dev.counters["rcvd_pkts"] += k
    for w in finished:
        _finish(qp, w)
    qp.comp.acked_psn = (before + k) & PSN_MASK
    qp.comp.retry_pending = None
    _progress(dev, qp, before, now)


_READ_FIRST = int(O.RC_RDMA_READ_RESPONSE_FIRST)
_READ_LAST = int(O.RC_RDMA_READ_RESPONSE_LAST)
#: the responses ``receive_edge`` may take: a READ's FIRST and LAST, which carry an AETH
READ_EDGES = frozenset({_READ_FIRST, _READ_LAST})


def receive_edge(dev, data, src, now: float) -> bool:
    """``receive_answer_common`` and ``_read_response`` for the READ RESPONSE FIRST
    or LAST at the expected PSN of the oldest outstanding WQE, a READ of one SGE,
    its packet checked and placed in the compiled kernel (``sn_rx_edge``), as
    ``receive_middles`` takes the MIDDLEs between them.  The QP's conditions and
    the READ's are checked here (``receive_answer_common``'s: an RC QP in RTS
    with no congestion controller, its peer, the READ the oldest WQE, not done,
    its next PSN expected; ``_read_response``'s: a FIRST at the READ's first
    PSN and not its last, a LAST at its last PSN and not its first, nothing held
    beyond a hole, the payload the place expects), each packet's in the kernel
    (BTH word 0, the QP, FECN/BECN, the PSN, an AETH of ACK, the length, the
    ICRC).  Taken, it is accounted for as those two functions account for it
    (``took_responses``); a FIRST with MIDDLEs to come names its QP the one a
    driver may stream (``dev.stream_qp``), as ``receive_middles`` does.
    ``data`` is the datagram, maybe a view of the driver's receive buffer
    (copied into memory at once).  False: nothing changed."""
    if len(data) < _ACK_LEN:
        return False
    op, _, pkey, w2, _, aeth = _ACK_PKT.unpack_from(data, 0)
    qp = _common_qp(dev, pkey, w2, aeth, src)
    if qp is None or qp.cc is not None or qp.xrc is not None or not dev.config.check_icrc:
        return False
    w = qp.sq[0]
    first = w.first_psn
    if w.done or first is None or w.opcode != _RDMA_READ or w.got \
            or len(w.views) != 1 or w.npkts < 2:
        return False
    expected = (qp.comp.acked_psn + 1) & PSN_MASK
    last = op == _READ_LAST
    if expected != (w.last_psn if last else first):
        return False
    mtu = qp.mtu
    off = (w.npkts - 1) * mtu if last else 0
    n = w.length - off if last else mtu
    view = w.views[0]
    if not responder.kernel_edge(dev, data, src, op, (-n & 3) << BTH_PAD_SHIFT, qp.qpn,
                                 expected, responder.EXT_AETH, view, off, n, len(view)):
        return False
    took_responses(dev, qp, 1, now, (w,) if last else ())
    if not last and w.npkts > 2:
        dev.stream_qp = qp      # its MIDDLEs to come: a driver may stream them
    return True


#: the most READs a driver's receive of their responses takes at once (``reads_target``)
READS_MAX = 16


class ReadsTarget(NamedTuple):
    """What a driver's kernel needs to take a QP's READ responses as they come
    (``sn_rx_reads``; ``reads_target`` says when it may): the expected PSN, the
    first READ's packets already taken (``p0``), the path MTU, the BTH word 0 and
    ICRC state of a FIRST and of a MIDDLE; for each READ (``wqes``, in PSN
    order) its SGE's view and length, and its LAST's BTH word 0 (its pad count)
    and ICRC state."""
    psn: int
    p0: int
    mtu: int
    first_w0: int
    first_start: int
    mid_w0: int
    mid_start: int
    wqes: list
    views: list
    lens: list
    last_w0s: list
    last_starts: list


def reads_target(dev, qp) -> ReadsTarget | None:
    """May a driver's kernel take the READ responses that come for ``qp`` now, the
    way ``receive_edge`` takes a READ's FIRST and LAST and ``receive_middles`` its
    MIDDLEs, one READ after another?  So it may under their conditions: an RC QP
    that may receive responses (RTS, SQD), not XRC, no congestion controller,
    ICRCs checked (``dev.config.check_icrc``); the oldest WQE not done a READ
    whose expected response is one of its own, nothing held beyond a hole, one
    SGE, two responses at least; and, after it, the READs whose PSNs follow on
    (sent), each the same, up to ``READS_MAX`` (the kernel checks each packet:
    BTH word 0, the QP, FECN and BECN, the PSN, an AETH of ACK, the length, room,
    the ICRC).  ``took_responses`` accounts for what it took."""
    if qp.qp_type is not _RC or qp.xrc is not None or qp.cc is not None \
            or (qp.state is not _RTS and qp.state is not _SQD) or not dev.config.check_icrc:
        return None
    expected = (qp.comp.acked_psn + 1) & PSN_MASK
    mtu = qp.mtu
    wqes, views, lens, last_w0s, last_starts = [], [], [], [], []
    nxt = None
    src = qp.dest
    start = responder.rx_icrc_start
    for w in qp.sq:
        if w.first_psn is None:
            break
        if w.done:
            if wqes:
                break
            continue
        if w.opcode != W.RDMA_READ or w.got or len(w.views) != 1 or w.npkts < 2 \
                or len(w.views[0]) != w.length:
            break
        if nxt is None:
            if psn_diff(expected, w.first_psn) < 0 or psn_diff(expected, w.last_psn) > 0:
                return None
        elif w.first_psn != nxt:
            break
        rest = w.length - (w.npkts - 1) * mtu
        pad = -rest & 3
        lw0 = bth_word0(_READ_LAST, pad << BTH_PAD_SHIFT)
        wqes.append(w)
        views.append(w.views[0])
        lens.append(w.length)
        last_w0s.append(lw0)
        last_starts.append(start(dev, src, BTH_LEN + AETH_LEN + rest + pad + ICRC_LEN, lw0,
                                 qp.qpn))
        nxt = (w.last_psn + 1) & PSN_MASK
        if len(wqes) == READS_MAX:
            break
    if not wqes:
        return None
    fw0 = bth_word0(_READ_FIRST)
    mw0 = bth_word0(_READ_MIDDLE)
    return ReadsTarget(expected, (expected - wqes[0].first_psn) & PSN_MASK, mtu, fw0,
                       start(dev, src, BTH_LEN + AETH_LEN + mtu + ICRC_LEN, fw0, qp.qpn),
                       mw0, start(dev, src, BTH_LEN + mtu + ICRC_LEN, mw0, qp.qpn),
                       wqes, views, lens, last_w0s, last_starts)


def _read_beyond_hole(dev, qp, wqe, expected: int, idx: int, off: int, payload) -> None:
    """Selective repeat: place a READ response beyond a gap now and ask again
    only for the responses missing below it."""
    if wqe.got is None:
        wqe.got, wqe.asked = set(), set()
    if idx not in wqe.got:
        scatter(wqe, off, payload)
        wqe.got.add(idx)
    first_missing = (expected - wqe.first_psn) & PSN_MASK
    hole = [i for i in range(first_missing, idx) if i not in wqe.got and i not in wqe.asked]
    if hole:
        wqe.asked.update(hole)
        qp.comp.rexmit.append(((wqe.first_psn + hole[0]) & PSN_MASK, hole[-1] - hole[0] + 1))
        dev.counters["read_holes_requested"] += 1
        dev.mark_ready(qp)


def _atomic_ack(dev, qp, pkt, psn: int, wqe, now: float, before: int) -> bool:
    """An ATOMIC ACKNOWLEDGE: the original value goes to the ATOMIC's buffer."""
    if wqe is None or wqe.opcode not in _ATOMICS:
        return _bad_response(dev, qp, wqe)
    scatter(wqe, 0, pkt.atomicacketh.orig.to_bytes(8, sys.byteorder))
    _finish(qp, wqe)
    return True


_ATOMICS = ATOMICS


def _bad_response(dev, qp, wqe) -> bool:
    """A response that cannot answer the request at its PSN (a READ response for a
    WRITE, an ATOMIC ACKNOWLEDGE for a READ, a READ response whose opcode or length
    does not fit its place): the requester's unexpected-opcode error, which the
    verbs report as IBV_WC_BAD_RESP_ERR ("an unexpected transport layer opcode was
    returned by the responder", ibv_poll_cq(3)); the QP goes to ERR."""
    dev.counters["rcvd_bad_response"] += 1
    if wqe is None:
        return False
    _finish(qp, wqe, WCStatus.BAD_RESP_ERR)
    qp.req.error = True
    return True


#: response kind -> its handler (True: ``_progress`` follows)
_RESPONSES = {Kind.ACK: _ack, Kind.READ_RESPONSE: _read_response, Kind.ATOMIC_ACK: _atomic_ack}


def max_psn(a: int, b: int) -> int:
    a &= PSN_MASK
    return a if psn_diff(a, b) >= 0 else b


def scatter(wqe, off: int, data) -> None:
    """Copy ``data`` into a READ's (or atomic's) local buffers, ``wqe.views``
    (checked by ``requester.start``), from byte ``off`` of the message on: how
    READ responses land, on RoCE and iWARP alike."""
    n = len(data)
    pos = 0
    for v in wqe.views:
        lv = len(v)
        if off >= lv:
            off -= lv
            continue
        take = min(lv - off, n - pos)
        v[off:off + take] = data[pos:pos + take]
        pos += take
        off = 0
        if pos == n:
            break


def _progress(dev, qp, before: int, now: float) -> None:
    comp = qp.comp
    acked = comp.acked_psn
    cc = qp.cc
    if cc is not None and (acked != before or qp.ccs.rx_telemetry is not None):
        requester.cc_acked(qp, before, now)
    if acked != before:
        if comp.sacked_psn is not None and psn_diff(comp.sacked_psn, acked) <= 0:
            comp.sacked_psn = None
        if comp.rexmitted:
            comp.rexmitted = {p: m for p, m in comp.rexmitted.items() if psn_diff(p, acked) > 0}
        _forward(qp, before)
        if cc is None and (qp.req.send_idx < len(qp.sq) or comp.rexmit):
            dev.mark_ready(qp)            # the window may have opened
        # restart the retransmission timer for what is still in flight
        comp.rto_at = rto_at = now + dev.rto(qp) if _inflight(qp) else None
        comp.probe_at = now + dev.probe_interval(qp) \
            if rto_at is not None and qp.selective_repeat else None
        dev.arm(qp)
        complete(dev, qp)
        if cc is not None and not dev.drain_idle(qp, now):
            # its window may have opened (the controller's too): ready unless
            # the drain would do nothing for it (asked once its completions
            # are posted: one due is something to do)
            dev.mark_ready(qp)
        return
    complete(dev, qp)


def _forward(qp, before: int) -> None:
    """Forward progress (a response acknowledged PSNs beyond ``before``) starts
    both retry series afresh: ``retry_cnt`` and ``rnr_retry`` count retries
    since the last progress, not over the QP's life (as rdmavt's qib and hfi1,
    and mlx5, reset them on each ACK that moves the acknowledged PSN)."""
    comp = qp.comp
    if comp.acked_psn != before:
        attr = qp.attr
        comp.retry_left = attr.retry_cnt
        comp.rnr_left = attr.rnr_retry


def _inflight(qp) -> bool:
    """Is any started WQE still unacknowledged?  (Started WQEs sit at the head.)"""
    for w in qp.sq:
        if w.first_psn is None:
            return False
        if not w.done:
            return True
    return False


def _probe(dev, qp) -> None:
    """Selective repeat's loss probe: resend the oldest unacknowledged PSN (and
    the newest, ``_probe_newest``) once the requester has sent nothing new and
    heard no progress for a probe interval (once per quiet spell; it neither
    rewinds nor counts against retry_cnt).  The responder either takes it as the
    hole it was missing, naming any next hole, or acknowledges it as a duplicate."""
    if qp.state not in (QPState.RTS, QPState.SQD) or qp.comp.rnr_wait or not _inflight(qp):
        return
    if _paced_idle(qp):
        return                                  # the pacer holds everything: no loss
    if qp.comp.rto_shift and qp.comp.acked_psn == qp.comp.rto_shift_psn:
        return                  # a timeout resent both since the last progress: wait for it
    comp = (qp.comp.acked_psn + 1) & PSN_MASK
    if psn_diff(comp, qp.req.max_sent_psn) > 0 or comp in qp.comp.rexmit:
        return
    dev.counters["loss_probes"] += 1
    qp.comp.rexmitted[comp] = qp.req.max_sent_psn
    qp.comp.rexmit.append(comp)
    _probe_newest(qp, comp)
    dev.mark_ready(qp)


def _probe_newest(qp, comp: int) -> None:
    """Resend, besides ``comp``, the newest PSN sent if the responder has not
    reported holding it: if the tail of what was sent was lost, it arrives beyond
    the hole and the responder names the PSNs it misses (a window of them in a
    few NAKs) instead of the oldest being resent one per probe.  Not a READ or
    ATOMIC: its resend would repeat the whole operation."""
    hi = qp.req.max_sent_psn
    if psn_diff(hi, comp) <= 0 or hi in qp.comp.rexmit or (
            qp.comp.sacked_psn is not None and psn_diff(hi, qp.comp.sacked_psn) <= 0):
        return
    i = requester.wqe_index(qp, hi)
    if i is not None and not qp.sq[i].rd_atomic:
        qp.comp.rexmitted[hi] = hi
        qp.comp.rexmit.append(hi)


def _paced_idle(qp) -> bool:
    """Has a congestion-controlled QP nothing on the wire unacknowledged, its
    next packet held back by the pacer?  (The next PSN to send follows the last
    acknowledged one; a READ still waiting for responses is past it.)"""
    return qp.cc is not None and qp.next_send_psn() == (qp.comp.acked_psn + 1) & PSN_MASK


#: the retransmission timeout doubles with each timeout in a row that saw no ACK
#: progress, up to 2**RTO_BACKOFF_MAX times its base (``Device.rto``): a round
#: trip stretched beyond the RTO (a loaded host, a long queue) then costs a few
#: timeouts, not one per RTO for as long as it lasts
RTO_BACKOFF_MAX = 3


def on_timeout(dev, qp, now: float) -> None:
    """Retransmission timer expired with no progress."""
    if qp.comp.rnr_wait and qp.comp.rnr_at is not None and now >= qp.comp.rnr_at:
        qp.comp.rnr_wait = False
        qp.comp.rnr_at = None
        if qp.attr.rnr_retry != 7:             # 7: RNR retries for ever
            qp.comp.rnr_left -= 1
        dev.mark_ready(qp)
    if qp.comp.probe_at is not None and now >= qp.comp.probe_at:
        qp.comp.probe_at = None
        if qp.comp.probe_mark != qp.req.max_sent_psn:
            # still sending: later packets reveal any hole; look again later
            qp.comp.probe_mark = qp.req.max_sent_psn
            qp.comp.probe_at = now + dev.probe_interval(qp)
        else:
            _probe(dev, qp)
    if qp.comp.rto_at is None or now < qp.comp.rto_at:
        return
    qp.comp.rto_at = None
    if qp.state not in (QPState.RTS, QPState.SQD) or not _inflight(qp):
        return
    if _paced_idle(qp):
        # Started work, but nothing sent is unacknowledged: the pacer holds the
        # next packet.  Not a loss; wait another timeout.
        qp.comp.rto_at = now + dev.rto(qp)
        return
    dev.counters["timeouts"] += 1
    # back off: the next timeout waits twice as long unless an ACK makes progress
    dev.rto(qp)                                # (ends a backoff that progress outdated)
    qp.comp.rto_shift = min(qp.comp.rto_shift + 1, RTO_BACKOFF_MAX)
    qp.comp.rto_shift_psn = qp.comp.acked_psn
    if qp.cc is not None:
        qp.cc.on_loss(now=now, kind="timeout")
    if not _take_retry(dev, qp):
        return
    qp.comp.retry_pending = None
    comp = (qp.comp.acked_psn + 1) & PSN_MASK
    for w in qp.sq:
        if w.asked:
            w.asked = set()
    if qp.selective_repeat:
        _sr_timeout(qp, comp)
    else:
        requester.rewind(qp, comp)             # go back N
    dev.mark_ready(qp)


def _sr_timeout(qp, comp: int) -> None:
    """Selective repeat's timeout: resend the oldest unacknowledged PSN and, as a
    probe, the newest PSN sent that the responder has not reported holding, not a
    window.  A timeout is often only a round trip longer than the RTO (everything
    still on its way); where packets were lost, the oldest one's resend moves the
    cumulative ACK and the probe, arriving beyond any lost tail, makes the
    responder name the PSNs it misses, which are then resent one by one."""
    qp.comp.rexmitted = {comp: qp.req.max_sent_psn}    # older resends may be named again and resent
    qp.comp.rexmit.clear()
    qp.comp.rexmit.append(comp)
    _probe_newest(qp, comp)


def complete(dev, qp) -> None:
    """Post completions for finished WQEs at the head of the SQ, in order: a
    signaled one's on success, every one's on an error (IBA 10.7.3.1, "a Work
    Completion will always be generated" for a completion error)."""
    sq = qp.sq
    req = qp.req
    while sq and sq[0].done:
        w = sq.popleft()
        if req.send_idx:
            req.send_idx -= 1
        if w.status == _SUCCESS:
            op = w.opcode
            if w.signaled:
                dev.post_cqe(qp.send_cq, WC(w.wr_id, _SUCCESS, _WC_OPCODE[op], qp.qpn,
                                            byte_len=8 if op in _EIGHT_BYTES else w.length), qp)
            if op in _SENDS:
                dev.counters["rdma_sends"] += 1
        else:
            dev.post_cqe(qp.send_cq, WC(w.wr_id, w.status, _WC_OPCODE[w.opcode], qp.qpn), qp)
            if w.status != WCStatus.WR_FLUSH_ERR:
                fail(dev, qp)
                return
    # Drained once nothing started before SQD is outstanding; WRs posted since
    # wait unstarted at the head and do not hold the event back.
    if qp.state is _SQD and (not sq or sq[0].first_psn is None) and not qp.comp.sqd_notified:
        qp.comp.sqd_notified = True
        if qp.attr.en_sqd_async_notify:
            dev.async_event("SQ_DRAINED", qp)


def fail(dev, qp) -> None:
    """A fatal error: the QP goes to ERR and flushes its work."""
    dev.to_error(qp)


# ------------------------------------------------------------------ the common case
#
# The completer's first branch (``receive_common``) takes a plain ACK straight
# from the datagram's bytes when: it is 20 bytes (BTH, AETH, ICRC) with P_Key
# 0xFFFF, FECN, BECN and pad clear, an AETH syndrome of ACK; for an RC QP (with
# or without a congestion controller), in RTS, from its peer; acknowledging a
# PSN of the oldest WQE (started, not done, not a READ or ATOMIC) beyond the
# last one acknowledged; a good ICRC; no INT telemetry (a response's ECN mark
# changes nothing).  Then ``receive``'s checks all pass, ``_ack_before`` has
# nothing to do, ``requester.wqe_index`` names that WQE, and the ACK is
# ``acknowledged`` then ``_progress``, as here; a controlled QP's timers are then
# armed as they are, as ``Device._response`` does after any response
# (``_progress`` armed them, and only a completion that failed the QP changes
# them since).  Anything else: False, nothing changed, the general path.

_ACK_PKT = BTH_AETH_STRUCT
_ACK_OPCODE = int(O.RC_ACKNOWLEDGE)     # (completer.c's: what it takes)
_READ_ONLY_OPCODE = int(O.RC_RDMA_READ_RESPONSE_ONLY)
_ATOMIC_ACK_OPCODE = int(O.RC_ATOMIC_ACKNOWLEDGE)
_NO_WC_FLAGS = WCFlags(0)               # (completer.c's: a send completion's flags)
_ACK_LEN = BTH_LEN + AETH_LEN + ICRC_LEN      # an ACK datagram
_ECN = BTH_FECN | BTH_BECN
_PAD = BTH_PAD_MASK << BTH_PAD_SHIFT
_RC = QPType.RC
_RTS = QPState.RTS
_RDMA_READ = W.RDMA_READ
_SQD = QPState.SQD


def _common_qp(dev, pkey: int, w2: int, aeth: int, src):
    """The QP a response is for if it meets the common case's conditions on the QP
    and on the BTH and AETH (the block above): an RC QP in RTS with work queued,
    from its peer, P_Key default, FECN and BECN clear, an AETH syndrome of ACK;
    else None."""
    qp = dev.qps.get(w2 & QPN_MASK)
    if qp is None or qp.qp_type is not _RC or pkey != DEFAULT_PKEY or w2 & _ECN or aeth >> 29 \
            or qp.state is not _RTS or not qp.sq or tuple(src) != qp.dest:
        return None
    return qp


def receive_common(dev, data, src, now: float, ecn: int = 0, telemetry=None) -> bool:
    """A plain ACK of a PSN of the oldest outstanding WQE, from its bytes; or of a
    later one, with no READ or ATOMIC outstanding (``qp.req.rd_atomic``: none
    of them waits for its responses, so ``_ack_before`` completes every WQE
    before the one the PSN is in, as ``receive`` has it, and
    ``requester.wqe_index`` names that one): a coalesced ACK of several SENDs or
    WRITEs."""
    if len(data) != _ACK_LEN or telemetry is not None:
        return False
    _, flags, pkey, w2, w3, aeth = _ACK_PKT.unpack_from(data, 0)
    if flags & _PAD:
        return False
    qp = _common_qp(dev, pkey, w2, aeth, src)
    if qp is None:
        return False
    w = qp.sq[0]
    psn = w3 & PSN_MASK
    before = qp.comp.acked_psn
    if w.done or w.first_psn is None or w.rd_atomic:
        return False
    # psn_diff(psn, first_psn) >= 0 and psn_diff(psn, before) > 0, inline (asked
    # for every ACK); then psn_diff(psn, last_psn) <= 0, or beyond the oldest WQE,
    # psn_diff(psn, qp.req.psn) < 0 (a PSN sent: else ``receive`` drops it as stale)
    if (psn - w.first_psn) & PSN_HALF or (psn - before - 1) & PSN_MASK >= PSN_HALF - 1:
        return False
    beyond = (psn - w.last_psn - 1) & PSN_MASK < PSN_HALF - 1
    if beyond and (qp.req.rd_atomic or not (psn - qp.req.psn) & PSN_HALF):
        return False
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False
    dev.counters["rcvd_pkts"] += 1
    if beyond:
        _ack_before(qp, psn)
        w = qp.sq[requester.wqe_index(qp, psn)]
    acknowledged(qp, psn, w)
    _progress(dev, qp, before, now)     # (the ACK moved the acknowledged PSN: it arms)
    if qp.cc is not None and qp.state is not _RTS:
        dev.arm(qp)                     # (completing failed the QP: armed again as it is)
    return True


#: the opcodes of the answers ``receive_answer_common`` takes: every response with an
#: AETH that a READ or an ATOMIC gets (a READ's MIDDLEs carry none: ``receive_middles``)
_ANSWER_OPCODES = {int(op): OPCODES[op] for op in (
    O.RC_RDMA_READ_RESPONSE_ONLY, O.RC_RDMA_READ_RESPONSE_FIRST, O.RC_RDMA_READ_RESPONSE_LAST,
    O.RC_ATOMIC_ACKNOWLEDGE)}
_ATOMIC_ACK_LEN = OPCODES[O.RC_ATOMIC_ACKNOWLEDGE].hdr_len + ICRC_LEN
_Q = struct.Struct("!Q")
_AETH_END = BTH_LEN + AETH_LEN          # where a response's payload or AtomicAckETH starts


class Response(NamedTuple):
    """An answer taken from its bytes by ``receive_answer_common``: what the
    response handlers (``_read_response``, ``_atomic_ack``) read of it, by a
    decoded ``Packet``'s names."""
    info: OpInfo
    payload: memoryview | bytes
    atomicacketh: AtomicAckETH | None


def receive_answer_common(dev, data, src, now: float, ecn: int = 0, telemetry=None) -> bool:
    """A READ RESPONSE (ONLY, FIRST or LAST) or an ATOMIC ACKNOWLEDGE answering the
    oldest outstanding WQE (a READ, an ATOMIC, an ATOMIC WRITE or a FLUSH) at the
    next PSN to be acknowledged, from its bytes, under the ACK's conditions above:
    the PSN inside that WQE's range and below the next PSN to send, so
    ``receive``'s stale check passes, ``_ack_before`` has nothing to do (every PSN
    before it is acknowledged) and ``requester.wqe_index`` names that WQE; its
    kind's handler (``_RESPONSES``) then applies the rules (the opcode's place, length,
    placement, completion) and ``_progress`` follows, as ``receive`` does.
    Anything else: False, nothing changed."""
    n = len(data)
    if n < _ACK_LEN or telemetry is not None:
        return False
    opcode, flags, pkey, w2, w3, aeth = _ACK_PKT.unpack_from(data, 0)
    qp = _common_qp(dev, pkey, w2, aeth, src)
    if qp is None:
        return False
    w = qp.sq[0]
    psn = w3 & PSN_MASK
    before = qp.comp.acked_psn
    first = w.first_psn
    if w.done or not w.rd_atomic or first is None or psn != (before + 1) & PSN_MASK:
        return False
    # inside the WQE's PSNs (at its first: an ONLY, a FIRST), and sent
    if psn != first and (psn_before(psn, first) or psn_diff(psn, w.last_psn) > 0):
        return False
    if not psn_before(psn, qp.req.psn):
        return False
    info = _ANSWER_OPCODES[opcode]
    if info.atomicacketh:
        if n != _ATOMIC_ACK_LEN or flags & _PAD:
            return False
        resp = Response(info, b"", AtomicAckETH(_Q.unpack_from(data, _AETH_END)[0]))
    else:
        plen = n - _ACK_LEN - ((flags >> BTH_PAD_SHIFT) & BTH_PAD_MASK)
        if plen < 0:
            return False
        resp = Response(info, memoryview(data)[_AETH_END:_AETH_END + plen], None)
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False
    dev.counters["rcvd_pkts"] += 1
    if _RESPONSES[info.kind](dev, qp, resp, psn, w, now, before):
        _progress(dev, qp, before, now)
    if qp.cc is not None:
        dev.arm(qp)
    return True


#: opcode -> the completer's first branch for it (``dispatch.ROUTES`` reads it)
COMMON = {int(O.RC_ACKNOWLEDGE): receive_common, **{op: receive_answer_common
                                                   for op in _ANSWER_OPCODES}}
