"""The verbs calls of a device: protection domains, memory regions, CQs, SRQs,
QPs (create, modify, query, destroy) and posting work requests.

``Verbs`` is one of the classes ``core.device.Device`` is made of; it checks
each call as ``ibv_*`` would (the errno rdma-core's providers give) and
changes the device's tables.  Nothing here touches a packet.
"""

from __future__ import annotations

import errno
from dataclasses import replace

import congestion

from ..wire.psn import psn_add
from ..wire.roce import QPN_MASK
from . import responder, xrc
from .cq import CQ, WC
from .enums import EventType, QPAttrMask as M, QPState, QPType, SendFlags, WCOpcode, \
    WCStatus, WROpcode as W, mtu_bytes
from .errors import VerbsError, einval, enomem
from .memory import PD, MR, bytes_at
from .qp import QP, QPAttr, QPCap, QPInitAttr, RecvWR, SendWQE, SendWR, check_transition, \
    attr_with, merge_attr, same_family
from .srq import SRQ, RecvWQE
from .wr_opcode import ALLOWED, ATOMICS, MAY_INLINE, WC_OPCODE

# flag bits as plain ints: an IntFlag operation costs a few enum constructions,
# and these are tested on every work request
_INLINE = int(SendFlags.INLINE)
_SIGNALED = int(SendFlags.SIGNALED)
_WR_OPCODES = {int(w): w for w in W}
_NOT_SENDING = frozenset({QPState.RESET, QPState.INIT, QPState.RTR})
_UD = QPType.UD      # (read on every post_send: a module global, not the enum class's attribute)
# modify_qp's attribute-mask bits, as plain ints too
_M_RD_ATOMIC, _M_DEST_RD_ATOMIC = int(M.MAX_QP_RD_ATOMIC), int(M.MAX_DEST_RD_ATOMIC)
_M_PATH_MTU, _M_AV = int(M.PATH_MTU), int(M.AV)


def _check_sge_lengths(sgl) -> None:
    """A work request's SGEs, a send's or a receive's: none of negative length (a
    u32 in C: only the Python face can give one)."""
    for sge in sgl:
        if sge[1] < 0:
            raise einval("an SGE of negative length")


_U32_MAX, _U64_MAX = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


def _check_wr_fields(wr) -> None:
    """A send work request's fixed-width fields within the widths ``ibv_send_wr`` gives
    them (an rkey, an rkey to invalidate and a Q_Key 32 bits, a remote address 64, a
    remote QPN 24): one beyond, which only the Python face can give, is refused at
    post (EINVAL), not queued as a request the drain cannot build."""
    if not (0 <= wr.rkey <= _U32_MAX and 0 <= wr.invalidate_rkey <= _U32_MAX
            and 0 <= wr.remote_addr <= _U64_MAX and 0 <= wr.remote_qkey <= _U32_MAX
            and 0 <= wr.remote_qpn <= QPN_MASK):
        raise einval("a field of the work request beyond its width (rkey, invalidate_rkey "
                     "or remote_qkey 32 bits, remote_addr 64, remote_qpn 24)")


class Verbs:
    """The verbs calls (a part of ``Device``)."""

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
        cq.mirrored()
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
        _check_sge_lengths(wr.sg_list)
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
            qpn = (qpn + 1) & QPN_MASK or 0x11
        self._next_qpn = (qpn + 1) & QPN_MASK or 0x11
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

    def flow_info(self, mtu: int) -> congestion.FlowInfo:
        """What a controller of this device's QPs is told of its path (``mtu``: the
        QP's path MTU), from the device's configuration."""
        c = self.config
        return congestion.FlowInfo(c.line_rate_bps, mtu, c.base_rtt, c.expected_flows)

    def set_qp_transport(self, qp: QP, *, selective_repeat: bool | None = None,
                         window: int | None = None, cc: str | None = None) -> None:
        """Per-QP choice of loss recovery and in-flight cap (both peers must agree),
        and of congestion control (a ``congestion`` spec; it takes effect at RTS)."""
        if cc is not None:
            name, params = congestion.parse_spec(cc)
            congestion.create(name, self.flow_info(4096), **params)
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
        responder.keep_answers(qp)
        if not qp.resp.out:
            self._ready.pop(qp, None)

    def route(self, ah) -> tuple[str, int]:
        """The (IP, UDP port) an address vector ``ah`` names, if this device reaches
        it: a GID of the device's own address family (an IPv4 device sends to
        IPv4-mapped GIDs, an IPv6 one to IPv6 GIDs); else EINVAL."""
        addr = ah.addr
        if not same_family(addr[0], self.ip):
            raise einval(f"GID {ah.dgid} is not reachable from {self.name}'s address "
                         f"{self.ip} (another IP version)")
        return addr

    def modify_qp(self, qp: QP, attr: QPAttr, mask: int) -> None:
        nxt = check_transition(qp.qp_type, qp.state, attr, mask, qp.xrc)
        mask = int(mask)
        if mask & _M_RD_ATOMIC and attr.max_rd_atomic > self.config.max_rd_atomic:
            raise einval("max_rd_atomic above the device limit")
        if mask & _M_DEST_RD_ATOMIC and attr.max_dest_rd_atomic > self.config.max_rd_atomic:
            raise einval("max_dest_rd_atomic above the device limit")
        if mask & _M_PATH_MTU and mtu_bytes(attr.path_mtu) > self.config.active_mtu:
            raise einval("path MTU above the port's active MTU")
        if mask & _M_AV:
            self.route(attr.ah_attr)      # validates the GID
        cur = qp.state
        qp.set_attr(merge_attr(qp.attr, attr, mask))
        if nxt == QPState.RESET:
            qp.clean_cqs()
            qp.reset()
            self._ready.pop(qp, None)
        elif nxt == QPState.ERR:
            self.to_error(qp)
            return
        elif nxt == QPState.RTR and cur == QPState.INIT:
            qp.resp.epsn = qp.attr.rq_psn
        elif nxt == QPState.RTS and cur == QPState.RTR:
            qp.req.psn = qp.attr.sq_psn
            qp.comp.acked_psn = qp.req.max_sent_psn = psn_add(qp.attr.sq_psn, -1)
            qp.comp.retry_left = qp.attr.retry_cnt
            qp.comp.rnr_left = qp.attr.rnr_retry
            self._make_cc(qp)
        elif nxt == QPState.SQD:
            qp.comp.sqd_notified = False
        qp.state = nxt
        qp.set_attr(attr_with(qp.attr, {"qp_state": nxt}))
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
        qp.cc = congestion.create(name, self.flow_info(qp.mtu), **params)

    def query_qp(self, qp: QP) -> tuple[QPAttr, QPInitAttr]:
        attr = merge_attr(qp.attr, QPAttr(qp_state=qp.state, cur_qp_state=qp.state), M.STATE)
        attr = replace(attr, cur_qp_state=qp.state, cap=qp.cap,
                       sq_psn=qp.req.psn if qp.state in (QPState.RTS, QPState.SQD)
                       else attr.sq_psn,
                       rq_psn=qp.resp.epsn if qp.state in (QPState.RTR, QPState.RTS, QPState.SQD)
                       else attr.rq_psn)
        init = QPInitAttr(qp.qp_type, qp.send_cq, qp.recv_cq, qp.srq, qp.cap, qp.sq_sig_all)
        return attr, init

    # ------------------------------------------------------------ posting

    _ALLOWED = ALLOWED                    # QP type -> the WR opcodes it takes

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
        _check_wr_fields(wr)
        if op is W.ATOMIC_WRITE:        # as rxe: 8 bytes to an 8-byte aligned address
            if wr.atomic_data is None or len(wr.atomic_data) != 8 or wr.remote_addr & 7:
                raise einval("ATOMIC_WRITE needs 8 bytes and an 8-byte aligned address")
        if op is W.FLUSH:
            if qp.xrc is not None or wr.sg_list:
                raise einval("FLUSH is an RC request with no local memory")
            if not wr.flush_type or wr.flush_type & ~3 or wr.flush_level not in (0, 1):
                raise einval(f"FLUSH: placement type {wr.flush_type}, selectivity level "
                             f"{wr.flush_level}")
        sgl = wr.sg_list
        if len(sgl) > qp.cap.max_send_sge:       # ENOMEM as mlx5 ("max gs exceeded"); rxe: EINVAL
            raise enomem(f"{len(sgl)} SGEs > max_send_sge {qp.cap.max_send_sge}")
        if len(qp.sq) >= qp.cap.max_send_wr:
            raise enomem("send queue is full")
        _check_sge_lengths(sgl)
        length = sgl[0][1] if len(sgl) == 1 else sum(s[1] for s in sgl)
        if op is W.FLUSH:
            length = wr.length or 0             # the peer's range, not a message
        elif length > self.config.max_msg_size:
            raise einval("message longer than max_msg_size")
        inline = None
        flags = int(wr.send_flags)
        if flags & _INLINE and op in MAY_INLINE:    # (rxe: WR_INLINE_MASK; else ignored)
            if length > qp.cap.max_inline_data:
                raise einval(f"inline data {length} > max_inline_data {qp.cap.max_inline_data}")
            if len(sgl) == 1:
                inline = bytes_at(sgl[0][0], length)
            else:
                inline = b"".join(bytes_at(a, n) for a, n, _ in sgl)
        if op in ATOMICS:
            if length != 8 or wr.remote_addr & 7:    # as rxe's validate_send_wr
                raise einval("atomic needs one 8-byte SGE and an 8-byte aligned remote address")
        if qp.qp_type is _UD:
            if wr.ah is None:
                raise einval("UD send needs an address handle")
            self.route(wr.ah)
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
                                         WC_OPCODE[op], qp.qpn), qp)
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
        _check_sge_lengths(wr.sg_list)
        if len(qp.rq) >= qp.cap.max_recv_wr:
            raise enomem("receive queue is full")
        if qp.state == QPState.ERR:
            self.post_cqe(qp.recv_cq, WC(wr.wr_id, WCStatus.WR_FLUSH_ERR, WCOpcode.RECV,
                                         qp.qpn), qp)
            return
        qp.rq.append(RecvWQE(wr.wr_id, list(wr.sg_list)))

