"""One NIC: its object tables, packet dispatch, the one timer, and counters.

The device is a sans-I/O state machine in the manner of aioquic:

    receive_datagram(data, src, now)      a UDP payload arrived
    datagrams_to_send(now)                -> [(bytes, (ip, port)), ...]
    get_timer()                           -> earliest deadline or None
    handle_timer(now)                     the deadline passed

plus the verbs calls (alloc_pd, reg_mr, create_cq, create_qp, modify_qp,
post_send, post_recv, poll_cq, ...).  A driver, after every input, drains
``datagrams_to_send`` and re-arms one timer at ``get_timer()``.  Nothing here
reads a clock, opens a socket or draws global randomness.
"""

from __future__ import annotations

import errno
import heapq
from collections import Counter, deque
from dataclasses import dataclass, replace

from ..wire.icrc import append_icrc, check_icrc, icrc_start
from ..wire.roce import (BTH_LEN, ICRC_LEN, Kind, Opcode as O, WireError, decode,
                         encode, ROCEV2_PORT)
from . import completer, fastpath, requester, responder, xrc
from .cq import CQ, WC
from .enums import EventType, QPAttrMask as M, QPState, QPType, SendFlags, WCOpcode, \
    WCStatus, WROpcode as W, mtu_bytes
from .errors import VerbsError, einval, enomem
from .memory import PD, KeyTable, MR, view_at
from .qp import QP, QPAttr, QPCap, QPInitAttr, RecvWR, SendWQE, SendWR, check_transition, \
    gid_of, merge_attr
from .srq import SRQ, RecvWQE
from ..wire.datagram import CE, Datagram
import congestion

# flag bits as plain ints: an IntFlag operation costs a few enum constructions,
# and these are tested on every work request
_INLINE = int(SendFlags.INLINE)
_SIGNALED = int(SendFlags.SIGNALED)

#: opcodes of the bulk-WRITE receive shortcut (``Device._write_continue``)
_WRITE_LAST = int(O.RC_RDMA_WRITE_LAST)
_WRITE_MIDDLE = int(O.RC_RDMA_WRITE_MIDDLE)
_WRITE_CONTINUE = frozenset({int(O.RC_RDMA_WRITE_MIDDLE), _WRITE_LAST})
_RECEIVING = frozenset({QPState.RTR, QPState.RTS, QPState.SQD})

#: controllers that react to ECN marks (their packets are sent ECN-capable)
ECN_CONTROLLERS = frozenset({"dcqcn"})

#: Counter names, as Linux rxe exposes them (plus a few of our own).
RXE_COUNTERS = (
    "sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_rnr_err",
    "send_rnr_err", "rcvd_seq_err", "ack_deferred", "retry_exceeded_err",
    "retry_rnr_exceeded_err", "completer_retry_err", "send_err", "link_downed",
    "rdma_sends", "rdma_recvs",
)


#: Congestion-control counters, as mlx5 names them (notification / reaction point).
CC_COUNTERS = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored")


@dataclass(frozen=True)
class DeviceConfig:
    """Device-wide settings.  ``min_timer`` is the floor for the retransmission
    and RNR timers (a real-time driver cannot honour microseconds)."""
    max_qp: int = 65536
    max_qp_wr: int = 16384
    max_sge: int = 32
    max_cqe: int = 1 << 20
    max_inline_data: int = 4096
    max_rd_atomic: int = 16
    max_mr_size: int = 1 << 40
    max_msg_size: int = 1 << 31
    active_mtu: int = 4096
    min_timer: float = 1e-3
    selective_repeat: bool = False
    window: int = 128
    #: ask for an ACK every this many packets (None: every window/4)
    ack_every: int | None = None
    check_icrc: bool = True
    #: congestion control for every QP unless set per QP: a ``congestion`` spec
    #: such as ``"dcqcn"`` or ``"hpcc:eta=0.9"``; ``"none"`` for no control
    cc: str = "none"
    #: the NIC's line rate (bits/s) and the propagation round trip controllers
    #: start from (seconds)
    line_rate_bps: float = 100e9
    base_rtt: float = 10e-6
    #: mark sent packets ECN-capable (ECT(0)); None: when the device's
    #: controller reacts to ECN (DCQCN)
    ecn: bool | None = None
    #: take the small-message fast paths (``fastpath``); False runs everything
    #: through the general path (the same wire bytes and completions)
    fast_path: bool = True


#: an ACK's opcode, for the receive fast path
_ACKNOWLEDGE = int(O.RC_ACKNOWLEDGE)
_WR_OPCODES = {int(w): w for w in W}
_RD_ATOMIC = frozenset({W.RDMA_READ, W.ATOMIC_CMP_AND_SWP, W.ATOMIC_FETCH_AND_ADD})
_ATOMICS = frozenset({W.ATOMIC_CMP_AND_SWP, W.ATOMIC_FETCH_AND_ADD})
_NOT_SENDING = frozenset({QPState.RESET, QPState.INIT, QPState.RTR})
_SENDING = (QPState.RTS, QPState.SQD)


class Device:
    def __init__(self, name: str, ip: str, port: int = ROCEV2_PORT, *,
                 config: DeviceConfig | None = None):
        self.name = name
        self.ip = ip
        self.port = port
        self.gid = gid_of(ip)
        self.config = config or DeviceConfig()
        self.keys = KeyTable()
        self.counters: Counter = Counter({n: 0 for n in RXE_COUNTERS + CC_COUNTERS})
        self.qps: dict[int, QP] = {}
        self.cqs: dict[int, CQ] = {}
        self.srqs: dict[int, SRQ] = {}
        self.pds: dict[int, PD] = {}
        self.events: deque[tuple[EventType, object]] = deque()
        self._handles = 0
        self._next_qpn = 0x11
        self._ready: dict[QP, None] = {}     # QPs that may have packets to send (ordered set)
        self._timers: list[tuple[float, int, QP]] = []
        self._tseq = 0
        self._cnps: list[QP] = []            # QPs owing their requester a CNP
        # parse the device's controller spec now: a bad one is an error here
        self._cc_name, self._cc_params = congestion.parse_spec(self.config.cc)
        congestion.create(self._cc_name, congestion.FlowInfo(
            self.config.line_rate_bps, 4096, self.config.base_rtt), **self._cc_params)
        ecn = self.config.ecn
        #: are this device's packets ECN-capable (ECT(0) in the IP header)?
        self.ect = (self._cc_name in ECN_CONTROLLERS) if ecn is None else bool(ecn)
        self._fast = self.config.fast_path
        #: the compiled per-packet loops (``softnic.accel.load()``), given by the
        #: driver; None runs the same loops in Python
        self.kernel = None
        #: the agent behind QP1 (``core.cm.CM``), attached by whoever manages
        #: connections; None: MADs are counted and dropped
        self.gsi = None

    @property
    def address(self) -> tuple[str, int]:
        return (self.ip, self.port)

    def _handle(self) -> int:
        self._handles += 1
        return self._handles

    # ------------------------------------------------------------ resources

    def alloc_pd(self) -> PD:
        pd = PD(self._handle())
        self.pds[pd.handle] = pd
        return pd

    def dealloc_pd(self, pd: PD) -> None:
        if pd.mrs or pd.qps or pd.srqs:
            raise VerbsError(errno.EBUSY, "PD still has MRs, QPs or SRQs")
        pd.closed = True
        self.pds.pop(pd.handle, None)

    def reg_mr(self, pd: PD, addr: int, length: int, access: int, owner=None) -> MR:
        """Register ``[addr, addr+length)``.  ``owner``, if given, is the Python
        object that owns that memory; the MR keeps it alive until deregistered."""
        if length > self.config.max_mr_size:
            raise einval("MR larger than max_mr_size")
        return self.keys.register(pd, addr, length, access, owner)

    def dereg_mr(self, mr: MR) -> None:
        self.keys.deregister(mr)

    def create_cq(self, cqe: int) -> CQ:
        if not 1 <= cqe <= self.config.max_cqe:
            raise einval(f"CQ depth {cqe} outside 1..{self.config.max_cqe}")
        cq = CQ(self._handle(), cqe, on_overflow=self._cq_overflow)
        self.cqs[cq.handle] = cq
        return cq

    def destroy_cq(self, cq: CQ) -> None:
        if any(q.send_cq is cq or q.recv_cq is cq for q in self.qps.values()):
            raise VerbsError(errno.EBUSY, "CQ still in use by a QP")
        cq.closed = True
        self.cqs.pop(cq.handle, None)

    def poll_cq(self, cq: CQ, n: int = 1) -> list[WC]:
        return cq.poll(n)

    def _cq_overflow(self, cq: CQ) -> None:
        self.events.append((EventType.CQ_ERR, cq))

    def create_srq(self, pd: PD, max_wr: int, max_sge: int, srq_limit: int = 0) -> SRQ:
        if max_wr > self.config.max_qp_wr or max_sge > self.config.max_sge:
            raise einval("SRQ larger than the device allows")
        srq = SRQ(self._handle(), pd, max_wr, max_sge, srq_limit,
                  on_limit=lambda s: self.events.append((EventType.SRQ_LIMIT_REACHED, s)))
        pd.srqs.add(srq)
        self.srqs[srq.handle] = srq
        return srq

    def destroy_srq(self, srq: SRQ) -> None:
        if any(q.srq is srq for q in self.qps.values()):
            raise VerbsError(errno.EBUSY, "SRQ still in use by a QP")
        srq.closed = True
        xrc.forget_srq(srq)
        srq.pd.srqs.discard(srq)
        self.srqs.pop(srq.handle, None)

    def post_srq_recv(self, srq: SRQ, wr: RecvWR) -> None:
        srq.post(RecvWQE(wr.wr_id, list(wr.sg_list)))

    def srq_take(self, srq: SRQ):
        return srq.take()

    def create_qp(self, pd: PD, init: QPInitAttr) -> QP:
        t = init.qp_type
        if t not in (QPType.RC, QPType.UC, QPType.UD):
            raise VerbsError(errno.EOPNOTSUPP, f"QP type {t} not supported")
        if init.xrc is None and (init.send_cq is None or init.recv_cq is None):
            raise einval("a QP needs a send CQ and a receive CQ")
        c = init.cap
        lim = self.config
        if (c.max_send_wr > lim.max_qp_wr or c.max_recv_wr > lim.max_qp_wr
                or c.max_send_sge > lim.max_sge or c.max_recv_sge > lim.max_sge
                or c.max_inline_data > lim.max_inline_data):
            raise einval("QP capabilities exceed the device's")
        if len(self.qps) >= lim.max_qp:
            raise enomem("too many QPs")
        qpn = self._next_qpn
        while qpn in self.qps:
            qpn = (qpn + 1) & 0xFFFFFF or 0x11
        self._next_qpn = (qpn + 1) & 0xFFFFFF or 0x11
        # The caps actually enforced (as ibv_create_qp reports them back).  As in rxe
        # (rxe_qp_init_req), a send WQE holds max(SGEs * 16 bytes, inline data), so the
        # inline room and the send SGE count both grow to what that WQE holds.
        wqe = max(max(1, c.max_send_sge) * 16, c.max_inline_data)
        cap = QPCap(max(1, c.max_send_wr), 0 if init.srq is not None else max(1, c.max_recv_wr),
                    min(wqe // 16, lim.max_sge), max(1, c.max_recv_sge),
                    min(wqe, lim.max_inline_data))
        qp = QP(qpn, pd, init, cap)
        if init.xrc is not None:
            xrc.make_qp(qp, init.xrc, init.xrcd)
        qp.selective_repeat = self.config.selective_repeat
        qp.window = self.config.window
        self.qps[qpn] = qp
        pd.qps.add(qp)
        return qp

    def set_qp_transport(self, qp: QP, *, selective_repeat: bool | None = None,
                         window: int | None = None, cc: str | None = None) -> None:
        """Per-QP choice of loss recovery and in-flight cap (both peers must agree),
        and of congestion control (a ``congestion`` spec; it takes effect at RTS)."""
        if cc is not None:
            name, params = congestion.parse_spec(cc)
            congestion.create(name, congestion.FlowInfo(self.config.line_rate_bps, 4096,
                                                        self.config.base_rtt), **params)
            qp.cc_spec = cc
        if selective_repeat is not None:
            qp.selective_repeat = selective_repeat
        if window is not None:
            if not 1 <= window <= 1 << 22:
                raise einval("window out of range")
            qp.window = window

    def destroy_qp(self, qp: QP) -> None:
        xrc.forget_qp(qp)
        self.qps.pop(qp.qpn, None)
        qp.pd.qps.discard(qp)
        qp.closed = True
        qp.timer_at = None
        _keep_answers(qp)
        if not qp.resp_out:
            self._ready.pop(qp, None)

    def modify_qp(self, qp: QP, attr: QPAttr, mask: int) -> None:
        nxt = check_transition(qp.qp_type, qp.state, attr, mask, qp.xrc)
        if mask & M.MAX_QP_RD_ATOMIC and attr.max_rd_atomic > self.config.max_rd_atomic:
            raise einval("max_rd_atomic above the device limit")
        if mask & M.MAX_DEST_RD_ATOMIC and attr.max_dest_rd_atomic > self.config.max_rd_atomic:
            raise einval("max_dest_rd_atomic above the device limit")
        if mask & M.PATH_MTU and mtu_bytes(attr.path_mtu) > self.config.active_mtu:
            raise einval("path MTU above the port's active MTU")
        if mask & M.AV:
            attr.ah_attr.addr      # validates the GID
        cur = qp.state
        qp.attr = merge_attr(qp.attr, attr, mask)
        if nxt == QPState.RESET:
            qp.clean_cqs()
            qp.reset()
            self._ready.pop(qp, None)
        elif nxt == QPState.ERR:
            self.to_error(qp)
            return
        elif nxt == QPState.RTR and cur == QPState.INIT:
            qp.epsn = qp.attr.rq_psn
        elif nxt == QPState.RTS and cur == QPState.RTR:
            qp.sq_psn = qp.attr.sq_psn
            qp.acked_psn = qp.max_sent_psn = (qp.attr.sq_psn - 1) & 0xFFFFFF
            qp.retry_left = qp.attr.retry_cnt
            qp.rnr_left = qp.attr.rnr_retry
            self._make_cc(qp)
        elif nxt == QPState.SQD:
            qp.sqd_notified = False
        qp.state = nxt
        qp.attr = merge_attr(qp.attr, QPAttr(qp_state=nxt), M.STATE)
        if nxt in (QPState.RTS, QPState.SQD):
            self.mark_ready(qp)

    def _make_cc(self, qp: QP) -> None:
        if qp.qp_type == QPType.UD:
            qp.cc = None
            return
        if qp.cc_spec is not None:
            name, params = congestion.parse_spec(qp.cc_spec)
        else:
            name, params = self._cc_name, self._cc_params
        if name == "none" and not params:
            qp.cc = None                       # no controller: nothing on the per-packet path
            return
        qp.cc = congestion.create(name, congestion.FlowInfo(
            self.config.line_rate_bps, qp.mtu, self.config.base_rtt), **params)

    def query_qp(self, qp: QP) -> tuple[QPAttr, QPInitAttr]:
        attr = merge_attr(qp.attr, QPAttr(qp_state=qp.state, cur_qp_state=qp.state), M.STATE)
        attr = replace(attr, cur_qp_state=qp.state, cap=qp.cap,
                       sq_psn=qp.sq_psn if qp.state in (QPState.RTS, QPState.SQD)
                       else attr.sq_psn,
                       rq_psn=qp.epsn if qp.state in (QPState.RTR, QPState.RTS, QPState.SQD)
                       else attr.rq_psn)
        init = QPInitAttr(qp.qp_type, qp.send_cq, qp.recv_cq, qp.srq, qp.cap, qp.sq_sig_all)
        return attr, init

    # ------------------------------------------------------------ posting

    _ALLOWED = {
        QPType.RC: frozenset(W),          # ATOMIC_WRITE too (RC only, as rxe)
        QPType.UC: frozenset({W.SEND, W.SEND_WITH_IMM, W.RDMA_WRITE, W.RDMA_WRITE_WITH_IMM,
                              W.LOCAL_INV, W.BIND_MW}),
        QPType.UD: frozenset({W.SEND, W.SEND_WITH_IMM}),
    }

    def post_send(self, qp: QP, wr: SendWR) -> None:
        """Post one send WR.  Raises VerbsError (EINVAL / ENOMEM) as ibv_post_send would."""
        if qp.state in _NOT_SENDING:
            raise einval(f"post_send on a QP in {qp.state.name}")
        op = _WR_OPCODES.get(wr.opcode)
        if op is None:
            raise einval(f"unknown send opcode {wr.opcode}")
        if op not in self._ALLOWED[qp.qp_type]:
            raise einval(f"{op.name} is not valid on a {qp.qp_type.name} QP")
        if op is W.BIND_MW and wr.bind is None:
            raise einval("BIND_MW without a window to bind")
        if op is W.ATOMIC_WRITE:        # as rxe: 8 bytes to an 8-byte aligned address
            if wr.atomic_data is None or len(wr.atomic_data) != 8 or wr.remote_addr & 7:
                raise einval("ATOMIC_WRITE needs 8 bytes and an 8-byte aligned address")
        sgl = wr.sg_list
        if len(sgl) > qp.cap.max_send_sge:
            raise einval(f"{len(sgl)} SGEs > max_send_sge {qp.cap.max_send_sge}")
        if len(qp.sq) >= qp.cap.max_send_wr:
            raise enomem("send queue is full")
        length = sgl[0][1] if len(sgl) == 1 else sum(s[1] for s in sgl)
        if length > self.config.max_msg_size:
            raise einval("message longer than max_msg_size")
        inline = None
        flags = int(wr.send_flags)
        if flags & _INLINE and op not in _RD_ATOMIC:
            if length > qp.cap.max_inline_data:
                raise einval(f"inline data {length} > max_inline_data {qp.cap.max_inline_data}")
            inline = b"".join(bytes(view_at(a, n)) for a, n, _ in sgl)
        if op in _ATOMICS:
            if length != 8 or wr.remote_addr & 7:    # as rxe's validate_send_wr
                raise einval("atomic needs one 8-byte SGE and an 8-byte aligned remote address")
        if qp.qp_type is QPType.UD:
            if wr.ah is None:
                raise einval("UD send needs an address handle")
            wr.ah.addr
            if length > min(self.config.active_mtu, 4096):
                raise einval("UD message longer than the MTU")
        signaled = qp.sq_sig_all or bool(flags & _SIGNALED)
        if op is W.ATOMIC_WRITE:
            inline, length = bytes(wr.atomic_data), 8
        wqe = SendWQE(wr, signaled, inline, length)
        if qp.state == QPState.ERR:
            wqe.done = True
            wqe.status = WCStatus.WR_FLUSH_ERR
            self.post_cqe(qp.send_cq, WC(wqe.wr_id, WCStatus.WR_FLUSH_ERR,
                                         completer._WC_OPCODE[op], qp.qpn), qp)
            return
        qp.sq.append(wqe)
        self.mark_ready(qp)

    def post_recv(self, qp: QP, wr: RecvWR) -> None:
        if qp.state == QPState.RESET:
            raise einval("post_recv on a QP in RESET")
        if qp.srq is not None:
            raise einval("QP uses an SRQ")
        if len(wr.sg_list) > qp.cap.max_recv_sge:
            raise einval(f"{len(wr.sg_list)} SGEs > max_recv_sge {qp.cap.max_recv_sge}")
        if len(qp.rq) >= qp.cap.max_recv_wr:
            raise enomem("receive queue is full")
        if qp.state == QPState.ERR:
            self.post_cqe(qp.recv_cq, WC(wr.wr_id, WCStatus.WR_FLUSH_ERR, WCOpcode.RECV,
                                         qp.qpn), qp)
            return
        qp.rq.append(RecvWQE(wr.wr_id, list(wr.sg_list)))

    # ------------------------------------------------------------ engine hooks

    def mark_ready(self, qp: QP) -> None:
        self._ready[qp] = None

    def rto(self, qp: QP) -> float:
        """The retransmission timeout: ``4.096 us * 2**timeout`` (at least the
        timer floor), doubled for each timeout in a row without ACK progress
        (``completer.on_timeout``), up to ``2**completer.RTO_BACKOFF_MAX`` times.
        Any progress of the cumulative ACK since the last timeout ends the
        backoff (checked here, as the fast path's ACK restarts the timer too)."""
        t = max(4.096e-6 * (1 << qp.attr.timeout), self.config.min_timer)
        if qp.rto_shift:
            if qp.acked_psn == qp.rto_shift_psn:
                return t * (1 << qp.rto_shift)
            qp.rto_shift = 0
        return t

    def probe_interval(self, qp: QP) -> float:
        """Selective repeat's loss probe: with no ACK progress for this long, the
        requester resends its oldest unacknowledged PSN once (a lost resend or a
        lost NAK is then repaired without waiting out the retransmission timer)."""
        return max(self.rto(qp) / 8, self.config.min_timer)

    def arm(self, qp: QP) -> None:
        t = qp.rto_at
        if qp.probe_at is not None and (t is None or qp.probe_at < t):
            t = qp.probe_at
        if qp.rnr_at is not None and (t is None or qp.rnr_at < t):
            t = qp.rnr_at
        cc = qp.cc
        if cc is not None:
            if qp.pace_at is not None and (t is None or qp.pace_at < t):
                t = qp.pace_at
            c = cc.next_timer()
            if c is not None and (t is None or c < t):
                t = c
        if t == qp.timer_at:
            return
        qp.timer_at = t
        if t is not None:
            self._tseq += 1
            heapq.heappush(self._timers, (t, self._tseq, qp))

    def post_cqe(self, cq: CQ, wc: WC, qp: QP, solicited: bool = False) -> None:
        if not cq.push(wc, solicited=solicited) and qp.state != QPState.ERR:
            self.to_error(qp)          # completions were lost: the QP cannot go on

    def async_event(self, name: str, obj) -> None:
        self.events.append((EventType[name], obj))

    def to_error(self, qp: QP, keep_responses: bool = False) -> None:
        """Move a QP to ERR and flush all its outstanding work with WR_FLUSH_ERR."""
        if qp.state == QPState.ERR:
            return
        qp.state = QPState.ERR
        qp.attr = replace(qp.attr, qp_state=QPState.ERR)
        qp.rto_at = qp.rnr_at = qp.probe_at = None
        qp.timer_at = None
        qp.rd_atomic_inflight = 0
        sq, qp.sq = qp.sq, deque()
        qp.send_idx = 0
        for w in sq:      # all not yet reported, even those already executed, are flushed
            self.post_cqe(qp.send_cq, WC(w.wr_id, WCStatus.WR_FLUSH_ERR,
                                         completer._WC_OPCODE[w.opcode], qp.qpn), qp)
        rq = list(qp.rq)
        if qp.resp_wqe is not None:
            rq.insert(0, qp.resp_wqe)
            qp.resp_wqe = None
        qp.rq.clear()
        for r in rq:
            self.post_cqe(qp.recv_cq, WC(r.wr_id, WCStatus.WR_FLUSH_ERR, WCOpcode.RECV, qp.qpn),
                          qp)
        qp.ooo.clear()
        qp.sr_writes.clear()
        if not keep_responses:
            _keep_answers(qp)
        if qp.resp_out:
            self.mark_ready(qp)
        if qp.srq is not None:
            self.events.append((EventType.QP_LAST_WQE_REACHED, qp))

    # ------------------------------------------------------------ sans-I/O surface

    def receive_datagram(self, data: bytes, src: tuple[str, int], now: float, ecn: int = 0,
                         telemetry: tuple | None = None) -> None:
        """One UDP payload from ``src``.  ``ecn`` is the IP header's ECN codepoint
        (3 = CE, congestion experienced); ``telemetry`` the INT hop records the
        packet carries (for a response: those its responder echoed)."""
        if len(data) >= BTH_LEN + ICRC_LEN and ecn != CE and telemetry is None:
            op = data[0]
            if op in _WRITE_CONTINUE:
                if self._write_continue(data, src):
                    return
            elif self._fast:
                if op == _ACKNOWLEDGE:
                    if fastpath.ack(self, data, src, now):
                        return
                elif op in fastpath.REQUESTS:
                    if fastpath.request_only(self, data, src):
                        return
                elif op == fastpath.WRITE_FIRST and fastpath.write_first(self, data, src):
                    return
        c = self.counters
        c["rcvd_pkts"] += 1
        n = len(data)
        if self.config.check_icrc and not check_icrc(data, src[0], self.ip, src[1], self.port):
            c["rcvd_icrc_err"] += 1
            return
        try:
            pkt = decode(memoryview(data)[:n - 4])
        except WireError:
            c["rcvd_malformed"] += 1
            return
        if pkt.info.kind == Kind.CNP:
            c["rcvd_cnp"] += 1
            qp = self.qps.get(pkt.bth.dest_qp)
            if qp is not None and qp.cc is not None and tuple(src) == qp.dest:
                c["rp_cnp_handled"] += 1
                qp.cc.on_cnp(now=now)
                self.arm(qp)
                self.mark_ready(qp)
            else:
                c["rp_cnp_ignored"] += 1
            return
        if pkt.bth.dest_qp == 1:
            self._gsi_receive(pkt, src, now)
            return
        qp = self.qps.get(pkt.bth.dest_qp)
        if qp is None:
            c["rcvd_unknown_qp"] += 1
            return
        if pkt.info.qp_type != qp.wire:
            c["rcvd_wrong_qp_type"] += 1
            return
        if pkt.bth.pkey != 0xFFFF:
            c["rcvd_bad_pkey"] += 1
            return
        if qp.qp_type != QPType.UD:
            if qp.state in (QPState.RESET, QPState.INIT):   # no peer yet: its AV is unset
                c["rcvd_bad_state"] += 1
                return
            if tuple(src) != qp.dest:
                c["rcvd_wrong_source"] += 1
                return
        if pkt.info.is_request:
            if qp.state not in (QPState.RTR, QPState.RTS, QPState.SQD):
                c["rcvd_bad_state"] += 1
                return
            if ecn == CE:
                c["np_ecn_marked_roce_packets"] += 1
                if qp.cc is not None and qp.qp_type != QPType.UD and qp.cc.on_ecn(now=now):
                    self._cnps.append(qp)
            if telemetry is not None:
                qp.int_echo = telemetry
            responder.receive(self, qp, pkt, src, now)
        else:
            if qp.state not in (QPState.RTS, QPState.SQD):
                c["rcvd_bad_state"] += 1
                return
            if qp.cc is not None:
                qp.rx_telemetry = telemetry
                completer.receive(self, qp, pkt, now)
                qp.rx_telemetry = None
                self.arm(qp)
            else:
                completer.receive(self, qp, pkt, now)

    def _gsi_receive(self, pkt, src, now: float) -> None:
        """A packet for QP1: a MAD for the GSI agent, if it is a UD SEND with the
        GSI's Q_Key and P_Key."""
        c = self.counters
        if self.gsi is None:
            c["rcvd_unknown_qp"] += 1
        elif pkt.info.opcode != O.UD_SEND_ONLY or pkt.deth.qkey != 0x80010000 \
                or pkt.bth.pkey != 0xFFFF:
            c["rcvd_bad_mad"] += 1
        else:
            c["rcvd_mads"] += 1
            self.gsi.receive(pkt.payload, src, now)

    def receive_run(self, data: bytes, seg: int, src: tuple[str, int], now: float) -> None:
        """Datagrams from ``src`` laid end to end in ``data``, ``seg`` bytes each
        (the last may be shorter; 0: ``data`` is one datagram), as a socket with
        UDP GRO hands them over: ``receive_datagram`` of each in turn.  With a
        kernel, runs of a WRITE's MIDDLE packets are checked and placed in C."""
        n = len(data)
        if not seg or seg >= n:
            self.receive_datagram(data, src, now)
            return
        rx = self.receive_datagram
        o = 0
        if self.kernel is None:
            while o < n:
                rx(data[o:o + seg], src, now)
                o += seg
            return
        while o < n:
            if data[o] == _WRITE_MIDDLE and o + seg <= n:
                k = self._rx_middles(data, o, seg, src)
                if k:
                    o += k * seg
                    continue
            rx(data[o:o + seg], src, now)
            o += seg

    def _rx_middles(self, data, o: int, seg: int, src) -> int:
        """``_write_continue`` for the MIDDLE packets from ``data[o:]`` on, in the
        kernel: those it takes are exactly those ``_write_continue`` would place in
        sequence without an ACK.  Returns how many it took."""
        qp = self.qps.get(int.from_bytes(data[o + 5:o + 8], "big"))
        if qp is None or qp.cc is not None or qp.qp_type is not QPType.RC \
                or qp.state not in _RECEIVING or qp.resp_kind is not Kind.WRITE or qp.ooo \
                or seg != BTH_LEN + qp.mtu + ICRC_LEN or not self.config.check_icrc \
                or data[o + 1] & 0x30 or data[o + 2] != 0xFF or data[o + 3] != 0xFF \
                or tuple(src) != qp.dest:       # (a pad is not a MIDDLE's; the P_Key's all ones)
            return 0
        view = qp.write_view
        kern = self.kernel
        ffi = kern.ffi
        start = icrc_start(src[0], self.ip, src[1], self.port, seg, bytes(data[o:o + 8]))
        k = kern.lib.sn_rx_middles(ffi.from_buffer(data), len(data), o, seg,
                                   int.from_bytes(data[o:o + 4], "big"), qp.qpn, qp.epsn,
                                   start, ffi.from_buffer(view, require_writable=True),
                                   qp.write_off, min(qp.write_len, view.nbytes), 0xFFFFFFFF)
        if k:
            # placed_write for each, none of them last or asking for an ACK
            self.counters["rcvd_pkts"] += k
            qp.write_off += k * qp.mtu
            qp.epsn = (qp.epsn + k) & 0xFFFFFF
            qp.nak_sent = False
            if qp.sr_naked:
                qp.sr_naked.clear()
            qp.sr_scan = None
        return k

    def _write_continue(self, data, src) -> bool:
        """The common case of a bulk WRITE: the next MIDDLE or LAST packet of the
        WRITE a QP is receiving, in sequence, sized right, without congestion
        control.  It is placed straight from the datagram into the target memory,
        without decoding a ``Packet``; anything else (or any doubt) returns False
        and takes the general path, which reaches the same result."""
        n = len(data)
        w2 = int.from_bytes(data[4:8], "big")
        qp = self.qps.get(w2 & 0xFFFFFF)
        if qp is None or qp.cc is not None \
                or qp.qp_type is not QPType.RC or qp.state not in _RECEIVING:
            return False
        w3 = int.from_bytes(data[8:12], "big")
        psn = w3 & 0xFFFFFF
        if data[2] != 0xFF or data[3] != 0xFF or w2 >> 30:
            return False
        d = (psn - qp.epsn) & 0xFFFFFF
        mtu = qp.mtu
        last = data[0] == _WRITE_LAST
        plen = n - BTH_LEN - ICRC_LEN - ((data[1] >> 4) & 3)
        if plen < 0 or plen > mtu or (not last and plen != mtu) or tuple(src) != qp.dest:
            return False
        if d >= 0x800000:
            # A duplicate (a resend that crossed the original, or a go-back after a
            # timeout): acknowledge what has arrived, as ``responder._duplicate``
            # does, without decoding it.
            if self.config.check_icrc and not check_icrc(data, src[0], self.ip, src[1],
                                                         self.port):
                return False
            self.counters["rcvd_pkts"] += 1
            self.counters["duplicate_request"] += 1
            responder.queue_ack(self, qp, (qp.epsn - 1) & 0xFFFFFF)
            return True
        if d:
            # Selective repeat, beyond a hole: a packet of a WRITE of the run that
            # starts with the one being received (``responder.chain_writes``) has
            # a known target and offset (every packet before it in its message
            # carries a whole MTU).  It is placed now, skipping bytes newer PSNs
            # already placed (``responder.place_beyond``: later bytes win, as in
            # order), and held as a small record that the responder accounts for
            # once the hole fills.
            span = responder.SR_SPAN * qp.window
            if not qp.selective_repeat or d >= span or len(qp.ooo) >= span or psn in qp.ooo:
                return False
            chain = qp.sr_writes
            if not chain:
                responder.chain_writes(self, qp)
            for first, view, length, end, addr in reversed(chain):
                e = (psn - first) & 0xFFFFFF
                if e < ((end - first) & 0xFFFFFF):
                    break
                if e < 0x800000:
                    return False        # beyond the run
            else:
                return False
            off = e * mtu
            if off + plen > length or last != (((psn + 1) & 0xFFFFFF) == end) \
                    or (last and off + plen != length):
                return False
            if self.config.check_icrc and not check_icrc(data, src[0], self.ip, src[1],
                                                         self.port):
                return False
            self.counters["rcvd_pkts"] += 1
            self.counters["out_of_seq_request"] += 1
            if plen:
                responder.place_beyond(qp, psn, view, off,
                                       memoryview(data)[BTH_LEN:BTH_LEN + plen], addr)
            ackreq = bool(w3 & 0x80000000)
            responder.hold(self, qp, psn, ackreq, (psn, last, plen, ackreq))
            return True
        if qp.resp_kind is not Kind.WRITE or qp.ooo:
            return False            # (with packets held, the general path drains them)
        off = qp.write_off
        if off + plen > qp.write_len or (last and off + plen != qp.write_len):
            return False
        view = qp.write_view
        if self.config.check_icrc and not check_icrc(data, src[0], self.ip, src[1], self.port):
            return False
        self.counters["rcvd_pkts"] += 1
        if plen:
            view[off:off + plen] = memoryview(data)[BTH_LEN:BTH_LEN + plen]
        responder.placed_write(self, qp, (psn, last, plen, bool(w3 & 0x80000000)))
        if qp.sr_naked:
            qp.sr_naked.clear()
        qp.sr_scan = None
        return True

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, tuple[str, int]]]:
        res = []
        for item in self.datagram_runs(now):
            if len(item) == 2:
                data, dest = item
                res.append((data if type(data) is not bytearray else bytes(data), dest))
            else:
                buf, dest, seg = item
                mv = memoryview(buf)
                res.extend((bytes(mv[o:o + seg]), dest) for o in range(0, len(buf), seg))
        return res

    def datagram_runs(self, now: float) -> list[tuple]:
        """``datagrams_to_send`` for a driver that sends runs at once: items are
        ``(data, dest)``, one datagram, or ``(buffer, dest, seg)``, datagrams of
        ``seg`` bytes one after another in ``buffer`` (the last may be shorter),
        all to ``dest``, in the order they are to leave."""
        gsi = self.gsi
        if not self._ready and not self._cnps and not (gsi is not None and gsi.pending):
            return []
        out: list = []
        if gsi is not None and gsi.pending:
            out.extend(gsi.datagrams())
        if self._cnps:
            cnps, self._cnps = self._cnps, []
            for qp in cnps:
                if not qp.closed:
                    out.append((encode(O.CNP, dest_qp=qp.attr.dest_qp_num, psn=0), qp.dest))
            self.counters["np_cnp_sent"] += len(out)
        ready, self._ready = self._ready, {}
        for qp in ready:
            if qp.closed:
                if qp.resp_out:                 # the answers it owed when destroyed
                    self._responses(qp, out)
                continue
            # Requests before responses: a program that posts as soon as a peer's
            # request lands (a ping-pong, an RPC) gets its request out first, and
            # the ACK it owes follows in the same flush.
            if qp.state in _SENDING:
                sq = qp.sq
                if qp.send_idx < len(sq) or qp.rexmit:      # something to (re)send
                    n0 = len(out)
                    if not (self._fast and qp.xrc is None and
                            fastpath.send_only(self, qp, out)):
                        requester.generate(self, qp, now, out)
                    if len(out) > n0 and qp.qp_type is QPType.RC and qp.rto_at is None \
                            and qp.attr.timeout:
                        qp.rto_at = now + self.rto(qp)
                        if qp.selective_repeat:
                            qp.probe_at = now + self.probe_interval(qp)
                        self.arm(qp)
                if qp.cc is not None:
                    self.arm(qp)
                if (sq and sq[0].done) or qp.state is QPState.SQD:
                    completer.complete(self, qp)
            if qp.resp_out:
                self._responses(qp, out)
        ip, port = self.ip, self.port
        res = []
        npkts = len(out)
        for item in out:
            pkt, dest = item[0], item[1]
            n = len(item)
            if n == 2:
                res.append((append_icrc(pkt, ip, dest[0], port, dest[1]), dest))
            elif n == 4:                # a requester's run, ICRCs included
                res.append((pkt, dest, item[2]))
                npkts += item[3] - 1
            else:                       # an ACK echoing INT telemetry
                res.append((Datagram(append_icrc(pkt, ip, dest[0], port, dest[1]),
                                     echo=item[2]), dest))
        self.counters["sent_pkts"] += npkts
        return res

    def _responses(self, qp: QP, out: list) -> None:
        if qp.xrc is not None:
            start = len(out)
            self._rc_responses(qp, out)
            xrc.tag_responses(out, start)
        else:
            self._rc_responses(qp, out)

    def _rc_responses(self, qp: QP, out: list) -> None:
        dest = qp.dest
        dqpn = qp.attr.dest_qp_num
        mtu = qp.mtu
        while qp.resp_out:
            entry = qp.resp_out.popleft()
            kind, psn = entry[0], entry[1]
            if kind == "ack":
                ack = fastpath.ack_packet(dqpn, psn, entry[2], entry[3])
                if qp.int_echo is not None:
                    out.append((ack, dest, qp.int_echo))
                else:
                    out.append((ack, dest))
            elif kind == "atomic":
                out.append((encode(O.RC_ATOMIC_ACKNOWLEDGE, dest_qp=dqpn, psn=psn,
                                   aeth=(responder.ACK_CREDITS, entry[3]), atomicack=entry[2]),
                            dest))
            else:
                view, msn = entry[2], entry[3]
                total = len(view)
                npkts = max(1, -(-total // mtu))
                aeth = (responder.ACK_CREDITS, msn)
                for i in range(npkts):
                    if npkts == 1:
                        op, a = O.RC_RDMA_READ_RESPONSE_ONLY, aeth
                    elif i == 0:
                        op, a = O.RC_RDMA_READ_RESPONSE_FIRST, aeth
                    elif i == npkts - 1:
                        op, a = O.RC_RDMA_READ_RESPONSE_LAST, aeth
                    else:
                        op, a = O.RC_RDMA_READ_RESPONSE_MIDDLE, None
                    out.append((encode(op, dest_qp=dqpn, psn=(psn + i) & 0xFFFFFF,
                                       payload=view[i * mtu:(i + 1) * mtu], aeth=a), dest))

    def get_timer(self) -> float | None:
        h = self._timers
        t = None
        while h:
            t, _, qp = h[0]
            if qp.timer_at == t and not qp.closed:
                break
            heapq.heappop(h)
            t = None
        if self.gsi is not None:
            g = self.gsi.get_timer()
            if g is not None and (t is None or g < t):
                return g
        return t

    def handle_timer(self, now: float) -> None:
        if self.gsi is not None:
            g = self.gsi.get_timer()
            if g is not None and g <= now:
                self.gsi.handle_timer(now)
        h = self._timers
        while h and h[0][0] <= now:
            t, _, qp = heapq.heappop(h)
            if qp.timer_at != t or qp.closed:
                continue
            qp.timer_at = None
            cc = qp.cc
            if cc is not None:
                if qp.pace_at is not None and qp.pace_at <= now:
                    qp.pace_at = None
                    self.mark_ready(qp)
                c = cc.next_timer()
                if c is not None and c <= now:
                    cc.on_timer(now=now)
                    self.mark_ready(qp)
            completer.on_timeout(self, qp, now)
            self.arm(qp)


def _keep_answers(qp: QP) -> None:
    """A QP moved to ERR or destroyed keeps, of the responses it has queued, the
    ACKs, NAKs and atomic acknowledgements: each answers a request the responder
    already executed, whose receive completion the consumer may have seen (a live
    driver holds a spinning caller's ACK for its next call, and that call may be
    the move to ERR of ``rdma_disconnect``).  A NIC has them on the wire by then;
    without them the peer's requester retransmits to a QP that answers no more
    (for ever with retry_cnt 7, as rxe).  READ responses, which read registered
    memory the consumer may free next, are dropped."""
    if qp.resp_out:
        qp.resp_out = deque(e for e in qp.resp_out if e[0] != "read")
