"""Queue pairs and their attributes (``pyverbs.qp``).

``QP(pd, init_attr, qp_attr=None)`` creates the QP and, given ``qp_attr``,
moves it as far towards RTS as it can without the peer: RC and UC to INIT,
UD to RTS, exactly as pyverbs does.  ``to_init`` / ``to_rtr`` / ``to_rts``
modify with the attribute masks pyverbs uses for each QP type; ``modify``
takes any mask, and the state table refuses what the kernel's refuses
(EINVAL).  ``QPAttr`` starts zeroed like the C struct apart from pyverbs'
defaults (qp_state INIT, cur_qp_state RESET, port_num 1, path_mtu 1024).
"""

from __future__ import annotations

import errno

from softnic.core.enums import Access as _Access
from softnic.core.errors import VerbsError
from softnic.driver import mcast as _mcast
from softnic.core.qp import (AHAttr as _EngineAH, QPAttr as _EngineQPAttr,
                             QPCap as _EngineQPCap, QPInitAttr as _EngineQPInitAttr,
                             SendWR as _EngineSendWR)

from . import enums as e
from .addr import AHAttr, ahattr_from_engine, engine_ah
from .base import PyverbsCM, PyverbsObject, engine_call, rdma_error
from .pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError
from .utils import access_flags_to_str, mig_state_to_str, mtu_to_str, qp_state_to_str, \
    qp_type_to_str

_CAP_FIELDS = ('max_send_wr', 'max_recv_wr', 'max_send_sge', 'max_recv_sge', 'max_inline_data')


def _cap_list(cap) -> list:
    return [0] * 5 if cap is None else [getattr(cap, f) for f in _CAP_FIELDS]


class QPCap(PyverbsObject):
    def __init__(self, max_send_wr=1, max_recv_wr=10, max_send_sge=1, max_recv_sge=1,
                 max_inline_data=0):
        super().__init__()
        self.max_send_wr = max_send_wr
        self.max_recv_wr = max_recv_wr
        self.max_send_sge = max_send_sge
        self.max_recv_sge = max_recv_sge
        self.max_inline_data = max_inline_data

    def __str__(self):
        f = '{:20}: {:<20}\n'
        return (f.format('max send wrs', self.max_send_wr) +
                f.format('max recv wrs', self.max_recv_wr) +
                f.format('max send sges', self.max_send_sge) +
                f.format('max recv sges', self.max_recv_sge) +
                f.format('max inline data', self.max_inline_data))


def _cap_property(i):
    def get(self):
        return self._cap[i]

    def set_(self, val):
        self._cap[i] = val
    return property(get, set_)


class _HasCaps(PyverbsObject):
    """The ibv_qp_cap inside an init attr / attr struct: ``cap`` returns a copy."""
    max_send_wr = _cap_property(0)
    max_recv_wr = _cap_property(1)
    max_send_sge = _cap_property(2)
    max_recv_sge = _cap_property(3)
    max_inline_data = _cap_property(4)

    @property
    def cap(self):
        return QPCap(*self._cap)

    @cap.setter
    def cap(self, val):
        if val is not None:
            self._cap = _cap_list(val)


def _check_cq(cq):
    from .cq import CQ, CQEX
    if cq is not None and not isinstance(cq, (CQ, CQEX)):
        raise PyverbsUserError(f'Expected CQ/CQEX, got {type(cq)}')
    return cq


class QPInitAttr(_HasCaps):
    def __init__(self, qp_type=e.IBV_QPT_UD, qp_context=None, scq=None, rcq=None, srq=None,
                 cap=None, sq_sig_all=1):
        super().__init__()
        self._cap = _cap_list(cap)
        self.qp_context = qp_context
        self.scq = _check_cq(scq)
        self.rcq = _check_cq(rcq)
        self._srq = srq
        self.qp_type = qp_type
        self.sq_sig_all = sq_sig_all

    @property
    def send_cq(self):
        return self.scq

    @send_cq.setter
    def send_cq(self, val):
        self.scq = _check_cq(val)

    @property
    def recv_cq(self):
        return self.rcq

    @recv_cq.setter
    def recv_cq(self, val):
        self.rcq = _check_cq(val)

    @property
    def srq(self):
        return self._srq

    @srq.setter
    def srq(self, val):
        self._srq = val

    # QPInitAttrEx fields, absent from ibv_qp_init_attr
    pd = None
    xrcd = None
    comp_mask = 0
    create_flags = 0
    send_ops_flags = 0

    def __str__(self):
        f = '{:20}: {:<20}\n'
        g = '    {:20}: {:<20}\n'
        return (f.format('QP type', qp_type_to_str(self.qp_type)) +
                f.format('SQ sig. all', self.sq_sig_all) + 'QP caps:\n' +
                g.format('max send WR', self.max_send_wr) +
                g.format('max recv WR', self.max_recv_wr) +
                g.format('max send SGE', self.max_send_sge) +
                g.format('max recv SGE', self.max_recv_sge) +
                g.format('max inline data', self.max_inline_data))


class QPInitAttrEx(QPInitAttr):
    def __init__(self, qp_type=e.IBV_QPT_UD, qp_context=None, scq=None, rcq=None, srq=None,
                 cap=None, sq_sig_all=0, comp_mask=0, pd=None, xrcd=None, create_flags=0,
                 max_tso_header=0, source_qpn=0, hash_conf=None, ind_table=None,
                 send_ops_flags=0):
        super().__init__(qp_type, qp_context, scq, rcq, srq, cap, sq_sig_all)
        if comp_mask & (e.IBV_QP_INIT_ATTR_IND_TABLE | e.IBV_QP_INIT_ATTR_RX_HASH):
            raise PyverbsUserError('RSS is not yet supported in pyverbs')
        self.comp_mask = comp_mask
        self._pd = pd
        self.xrcd = xrcd
        self.create_flags = create_flags
        self.max_tso_header = max_tso_header
        self.source_qpn = source_qpn
        self.send_ops_flags = send_ops_flags

    @property
    def pd(self):
        return self._pd

    @pd.setter
    def pd(self, val):
        self._pd = val


def _zero_ah():
    return AHAttr(port_num=0)


class QPAttr(_HasCaps):
    _ZERO = ('path_mig_state', 'qkey', 'rq_psn', 'sq_psn', 'dest_qp_num', 'qp_access_flags',
             'pkey_index', 'alt_pkey_index', 'en_sqd_async_notify', 'sq_draining',
             'max_rd_atomic', 'max_dest_rd_atomic', 'min_rnr_timer', 'timeout', 'retry_cnt',
             'rnr_retry', 'alt_port_num', 'alt_timeout', 'rate_limit')

    def __init__(self, qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET, port_num=1,
                 path_mtu=e.IBV_MTU_1024):
        super().__init__()
        for f in self._ZERO:
            setattr(self, f, 0)
        self._cap = [0] * 5
        self._ah = _zero_ah()
        self._alt_ah = _zero_ah()
        self.qp_state = qp_state
        self.cur_qp_state = cur_qp_state
        self.port_num = port_num
        self.path_mtu = path_mtu

    @property
    def ah_attr(self):
        return self._ah._copy()

    @ah_attr.setter
    def ah_attr(self, val):
        if val is not None:
            self._ah = val._copy()

    @property
    def alt_ah_attr(self):
        return self._alt_ah._copy()

    @alt_ah_attr.setter
    def alt_ah_attr(self, val):
        if val is not None:
            self._alt_ah = val._copy()

    def __str__(self):
        f = '{:22}: {:<20}\n'
        g = '  {:22}: {:<20}\n'
        return (f.format('QP state', qp_state_to_str(self.qp_state)) +
                f.format('QP current state', qp_state_to_str(self.cur_qp_state)) +
                f.format('Path MTU', mtu_to_str(self.path_mtu)) +
                f.format('Path mig. state', mig_state_to_str(self.path_mig_state)) +
                f.format('QKey', self.qkey) + f.format('RQ PSN', self.rq_psn) +
                f.format('SQ PSN', self.sq_psn) + f.format('Dest QP number', self.dest_qp_num) +
                f.format('QP access flags', access_flags_to_str(self.qp_access_flags)) +
                'QP caps:\n' + ''.join(g.format(n.replace('_', ' '), v)
                                       for n, v in zip(_CAP_FIELDS, self._cap)) +
                'AH Attr:\n' + str(self._ah) +
                f.format('PKey index', self.pkey_index) +
                f.format('En. SQD async notify', self.en_sqd_async_notify) +
                f.format('SQ draining', self.sq_draining) +
                f.format('Max RD atomic', self.max_rd_atomic) +
                f.format('Max dest. RD atomic', self.max_dest_rd_atomic) +
                f.format('Min RNR timer', self.min_rnr_timer) +
                f.format('Port number', self.port_num) + f.format('Timeout', self.timeout) +
                f.format('Retry counter', self.retry_cnt) + f.format('RNR retry', self.rnr_retry) +
                f.format('Rate limit', self.rate_limit))


_M = e.ibv_qp_attr_mask
_COMP_MASKS = {
    e.IBV_QPT_RC: {'INIT': _M.IBV_QP_PKEY_INDEX | _M.IBV_QP_PORT | _M.IBV_QP_ACCESS_FLAGS,
                   'RTR': _M.IBV_QP_AV | _M.IBV_QP_PATH_MTU | _M.IBV_QP_DEST_QPN |
                   _M.IBV_QP_RQ_PSN | _M.IBV_QP_MAX_DEST_RD_ATOMIC | _M.IBV_QP_MIN_RNR_TIMER,
                   'RTS': _M.IBV_QP_TIMEOUT | _M.IBV_QP_RETRY_CNT | _M.IBV_QP_RNR_RETRY |
                   _M.IBV_QP_SQ_PSN | _M.IBV_QP_MAX_QP_RD_ATOMIC},
    e.IBV_QPT_UC: {'INIT': _M.IBV_QP_PKEY_INDEX | _M.IBV_QP_PORT | _M.IBV_QP_ACCESS_FLAGS,
                   'RTR': _M.IBV_QP_AV | _M.IBV_QP_PATH_MTU | _M.IBV_QP_DEST_QPN |
                   _M.IBV_QP_RQ_PSN,
                   'RTS': _M.IBV_QP_SQ_PSN},
    e.IBV_QPT_UD: {'INIT': _M.IBV_QP_PKEY_INDEX | _M.IBV_QP_PORT | _M.IBV_QP_QKEY,
                   'RTR': 0, 'RTS': _M.IBV_QP_SQ_PSN},
}
# XRC: an initiator needs no responder attributes at RTR, a target no requester ones at RTS
_COMP_MASKS[e.IBV_QPT_XRC_SEND] = dict(_COMP_MASKS[e.IBV_QPT_RC], RTR=_M.IBV_QP_AV |
                                       _M.IBV_QP_PATH_MTU | _M.IBV_QP_DEST_QPN |
                                       _M.IBV_QP_RQ_PSN)
_COMP_MASKS[e.IBV_QPT_XRC_RECV] = dict(_COMP_MASKS[e.IBV_QPT_RC], RTS=_M.IBV_QP_TIMEOUT |
                                       _M.IBV_QP_SQ_PSN)


def _engine_attr(a: QPAttr, mask: int) -> _EngineQPAttr:
    ah = engine_ah(a._ah, 'Failed to modify QP') if mask & _M.IBV_QP_AV else _EngineAH()
    return _EngineQPAttr(
        qp_state=a.qp_state, cur_qp_state=a.cur_qp_state, path_mtu=a.path_mtu,
        qp_access_flags=_Access(int(a.qp_access_flags)), pkey_index=a.pkey_index,
        port_num=a.port_num, qkey=a.qkey, ah_attr=ah, dest_qp_num=a.dest_qp_num,
        rq_psn=a.rq_psn, sq_psn=a.sq_psn, max_rd_atomic=a.max_rd_atomic,
        max_dest_rd_atomic=a.max_dest_rd_atomic, min_rnr_timer=a.min_rnr_timer,
        timeout=a.timeout, retry_cnt=a.retry_cnt, rnr_retry=a.rnr_retry,
        en_sqd_async_notify=a.en_sqd_async_notify, path_mig_state=a.path_mig_state,
        cap=_EngineQPCap(*a._cap))


class ECE(PyverbsObject):
    """ibv_ece: enhanced connection establishment options (vendor, options, mask)."""

    def __init__(self, vendor_id=0, options=0, comp_mask=0):
        super().__init__()
        self.vendor_id, self.options, self.comp_mask = vendor_id, options, comp_mask

    def __str__(self):
        return (f'{"Vendor ID":<20}: {self.vendor_id}\n{"Options":<20}: {self.options}\n'
                f'{"Comp Mask":<20}: {self.comp_mask}\n')


def _context_and_pd(creator, init_attr, xrcd):
    """(context, PD) of a QP being created: from a PD (no context), or from a Context
    with a QPInitAttrEx naming its PD (an XRC target: its XRC domain, no PD)."""
    from .device import Context
    from .pd import PD
    ctx = None
    qpt = init_attr.qp_type
    if isinstance(creator, Context):
        creator._check()
        ctx, pd = creator, init_attr.pd
        if qpt == e.IBV_QPT_XRC_RECV:       # a target belongs to its XRC domain, no PD
            if xrcd is None or xrcd._closed:
                raise rdma_error('Failed to create QP: an XRC target QP needs an XRCD')
            pd = None
        elif pd is None:
            raise rdma_error('Failed to create QP: the QPInitAttrEx names no PD')
    elif isinstance(creator, PD):
        pd = creator
    else:
        raise PyverbsUserError(f'Cannot create QP from {type(creator)}')
    if qpt in (e.IBV_QPT_XRC_SEND, e.IBV_QPT_XRC_RECV) and ctx is None:
        raise rdma_error('Failed to create QP: XRC QPs are created with ibv_create_qp_ex')
    if pd is not None:
        pd._check()
    return ctx, pd


class QPRateLimitAttr(PyverbsObject):
    """ibv_qp_rate_limit_attr, for ``QP.modify_rate_limit`` (a raw packet QP's pacing)."""

    def __init__(self, rate_limit=0, max_burst_sz=0, typical_pkt_sz=0, comp_mask=0):
        super().__init__()
        self.rate_limit, self.max_burst_sz = rate_limit, max_burst_sz
        self.typical_pkt_sz, self.comp_mask = typical_pkt_sz, comp_mask


class QP(PyverbsCM):
    _kind = 'QP'

    ind_table = None        # a receive WQ indirection table (RSS): softnic's QPs have none

    def __init__(self, creator, init_attr, qp_attr=None):
        """Create a QP on ``creator`` (a PD with a QPInitAttr, or a Context with a
        QPInitAttrEx naming its PD); with ``qp_attr``, move it towards RTS."""
        super().__init__()
        self._closed = True
        self.pd = self.context = self.scq = self.rcq = self.srq = self.xrcd = None
        if creator is None or init_attr is None:
            raise TypeError('QP needs a creator and init_attr')
        qpt = init_attr.qp_type
        xrcd = init_attr.xrcd if init_attr.comp_mask & e.IBV_QP_INIT_ATTR_XRCD else None
        ctx, pd = _context_and_pd(creator, init_attr, xrcd)
        if init_attr.create_flags:
            raise rdma_error(f'Failed to create QP: create_flags {init_attr.create_flags:#x} '
                             'are not supported', errno.EOPNOTSUPP)
        scq, rcq, srq = init_attr.send_cq, init_attr.recv_cq, init_attr.srq
        nic = pd._nic if pd is not None else ctx._nic
        for obj in (scq, rcq, srq):
            if obj is not None and (obj._closed or obj._nic is not nic):
                raise rdma_error('Failed to create QP: a CQ or SRQ is closed or of another '
                                 'device')
        self._nic = nic
        role = {e.IBV_QPT_XRC_SEND: 'ini', e.IBV_QPT_XRC_RECV: 'tgt'}.get(qpt)
        if role == 'tgt':
            scq = rcq = srq = None              # a target sends nothing, receives from SRQs
        elif role == 'ini':
            rcq = srq = None                    # an initiator receives nothing
        einit = _EngineQPInitAttr(
            qp_type=e.IBV_QPT_RC if role else qpt,
            send_cq=scq._ecq if scq is not None else None,
            recv_cq=rcq._ecq if rcq is not None else None,
            srq=srq._esrq if srq is not None else None, cap=_EngineQPCap(*init_attr._cap),
            sq_sig_all=bool(init_attr.sq_sig_all), xrc=role,
            xrcd=xrcd._exrcd if role == 'tgt' else None)
        epd = pd._epd if pd is not None else xrcd._exrcd.pd
        self._eqp = engine_call(nic, 'Failed to create QP', nic.dev.create_qp, epd, einit)
        c = self._eqp.cap       # the caps given, written back as ibv_create_qp does
        init_attr._cap = [c.max_send_wr, c.max_recv_wr, c.max_send_sge, c.max_recv_sge,
                          c.max_inline_data]
        self._qp_type = init_attr.qp_type
        self._sq_sig_all = init_attr.sq_sig_all
        self.pd = pd
        if pd is not None:
            pd.add_ref(self)
        if role == 'tgt':
            self.xrcd = xrcd
            xrcd.add_ref(self)
        if ctx is not None:
            self.context = ctx
            ctx.add_ref(self)
        if scq is not None:
            scq.add_ref(self)
            self.scq = scq
        if rcq is not None and rcq is not scq:
            rcq.add_ref(self)
            self.rcq = rcq
        self.srq = srq
        self._send_cq, self._recv_cq = scq, rcq
        self._closed = False
        if qp_attr is not None:
            funcs = {e.IBV_QPT_RC: self.to_init, e.IBV_QPT_UC: self.to_init,
                     e.IBV_QPT_UD: self.to_rts, e.IBV_QPT_XRC_SEND: self.to_init,
                     e.IBV_QPT_XRC_RECV: self.to_init}
            funcs[self._qp_type](qp_attr)

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing QP')
        engine_call(self._nic, 'Failed to destroy QP', self._nic.dev.destroy_qp, self._eqp)
        if getattr(self._nic, '_mcast', None):
            _mcast.detach_qp(self._nic, self._eqp.qpn)
        self._closed = True
        self.pd = self.context = self.scq = self.rcq = self.srq = None

    def _check(self):
        if self._closed:
            raise PyverbsError('QP is closed')

    def attach_mcast(self, gid, lid):
        """ibv_attach_mcast: this UD QP receives what is sent to the group ``gid``
        (softnic extension: pyverbs v44's QP has no call for it; librdmacm makes it)."""
        self._check()
        try:
            _mcast.attach(self._nic, self._eqp.qpn, self._qp_type == e.IBV_QPT_UD,
                          gid.raw if hasattr(gid, 'raw') else gid)
        except VerbsError as ex:
            raise PyverbsRDMAError('Failed to attach QP to MC group', ex.errno) from None

    def detach_mcast(self, gid, lid):
        """ibv_detach_mcast."""
        self._check()
        try:
            _mcast.detach(self._nic, self._eqp.qpn, gid.raw if hasattr(gid, 'raw') else gid)
        except VerbsError as ex:
            raise PyverbsRDMAError('Failed to detach QP from MC group', ex.errno) from None

    def set_congestion_control(self, spec):
        """softnic extension (not in pyverbs): this QP's congestion controller, a
        ``congestion`` spec such as 'dcqcn' or 'hpcc:eta=0.9' (default: the
        device's, from SOFTNIC_CC).  Takes effect when the QP next enters RTS."""
        self._check()
        try:
            self._nic.call(self._nic.dev.set_qp_transport, self._eqp, cc=spec)
        except ValueError as ex:
            raise PyverbsError(f'Failed to set congestion control: {ex}') from None

    def set_window(self, packets):
        """softnic extension (not in pyverbs): the most packets this QP keeps sent and
        not yet acknowledged (default 128, rxe's ``RXE_MAX_UNACKED_PSNS``), 1 to
        2**22.  A stream's rate is at most this window per acknowledgement's round
        trip, which through two Python processes is far longer than in a kernel.
        Under selective repeat (``SOFTNIC_RECOVERY=sr``) both ends of a connection
        must use the same."""
        self._check()
        engine_call(self._nic, 'Failed to set the window', self._nic.dev.set_qp_transport,
                    self._eqp, window=int(packets))

    def _get_comp_mask(self, dst):
        return _COMP_MASKS[self._qp_type][dst] | _M.IBV_QP_STATE

    def to_init(self, qp_attr):
        """Modify to INIT with the mask this QP type needs."""
        mask = self._get_comp_mask('INIT')
        qp_attr.qp_state = e.IBV_QPS_INIT
        self._modify(qp_attr, mask, 'Failed to modify QP state to init')

    def to_rtr(self, qp_attr):
        """Modify to RTR (through INIT first if the QP is not in INIT)."""
        if self.qp_state != e.IBV_QPS_INIT:
            self.to_init(qp_attr)
        mask = self._get_comp_mask('RTR')
        qp_attr.qp_state = e.IBV_QPS_RTR
        self._modify(qp_attr, mask, 'Failed to modify QP state to RTR')

    def to_rts(self, qp_attr):
        """Modify to RTS (through INIT and RTR first if the QP is not in RTR)."""
        if self.qp_state != e.IBV_QPS_RTR:
            self.to_rtr(qp_attr)
        mask = self._get_comp_mask('RTS')
        qp_attr.qp_state = e.IBV_QPS_RTS
        self._modify(qp_attr, mask, 'Failed to modify QP state to RTS')

    def modify(self, qp_attr, comp_mask):
        """ibv_modify_qp with the attributes ``comp_mask`` selects."""
        if qp_attr is None:
            raise TypeError('modify needs a QPAttr')
        self._modify(qp_attr, comp_mask, 'Failed to modify QP')

    def _modify(self, qp_attr, mask, msg):
        self._check()
        ea = _engine_attr(qp_attr, mask)
        engine_call(self._nic, msg, self._nic.dev.modify_qp, self._eqp, ea, int(mask))

    def query_ece(self):
        """ibv_query_ece: softnic, like rxe, has no enhanced connection establishment."""
        self._check()
        raise rdma_error('Failed to query ECE', errno.EOPNOTSUPP)

    def set_ece(self, ece):
        """ibv_set_ece: not offered (as rxe)."""
        self._check()
        raise rdma_error('Failed to set ECE', errno.EOPNOTSUPP)

    def query(self, attr_mask):
        """(QPAttr, QPInitAttr) of the QP as it is now, with the caps it enforces."""
        self._check()
        ea, ei = engine_call(self._nic, 'Failed to query QP', self._nic.dev.query_qp, self._eqp)
        a = QPAttr(qp_state=int(ea.qp_state), cur_qp_state=int(ea.cur_qp_state),
                   port_num=ea.port_num, path_mtu=ea.path_mtu)
        a.path_mig_state = ea.path_mig_state
        a.qkey, a.rq_psn, a.sq_psn, a.dest_qp_num = ea.qkey, ea.rq_psn, ea.sq_psn, ea.dest_qp_num
        a.qp_access_flags = int(ea.qp_access_flags)
        a._cap = [ea.cap.max_send_wr, ea.cap.max_recv_wr, ea.cap.max_send_sge,
                  ea.cap.max_recv_sge, ea.cap.max_inline_data]
        a._ah = ahattr_from_engine(ea.ah_attr)
        a.pkey_index = ea.pkey_index
        a.en_sqd_async_notify = ea.en_sqd_async_notify
        a.sq_draining = int(int(ea.qp_state) == e.IBV_QPS_SQD and not self._eqp.sqd_notified)
        a.max_rd_atomic, a.max_dest_rd_atomic = ea.max_rd_atomic, ea.max_dest_rd_atomic
        a.min_rnr_timer, a.timeout = ea.min_rnr_timer, ea.timeout
        a.retry_cnt, a.rnr_retry = ea.retry_cnt, ea.rnr_retry
        i = QPInitAttr(qp_type=self._qp_type, scq=self._send_cq, rcq=self._recv_cq,
                       srq=self.srq, cap=a.cap, sq_sig_all=int(bool(self._sq_sig_all)))
        return a, i

    def post_recv(self, wr, bad_wr=None):
        """Post ``wr`` and the WRs chained after it; on a refusal the failing one is
        copied into ``bad_wr`` (those before it stay posted)."""
        self._check()
        post = self._nic.dev.post_recv
        self._post(wr, bad_wr, lambda w: post(self._eqp, w._engine()), 'Failed to post recv',
                   self._nic.post_recv)

    def post_send(self, wr, bad_wr=None):
        """Post ``wr`` and the WRs chained after it; on a refusal the failing one is
        copied into ``bad_wr`` (those before it stay posted)."""
        self._check()
        nic = self._nic
        if wr is not None and wr._next is None:      # one WR: no chain to walk
            try:
                nic.call(nic.dev.post_send, self._eqp, wr._engine())
            except (VerbsError, ValueError) as ex:
                self._refused(wr, bad_wr, ex, 'Failed to post send')
            return
        post = nic.dev.post_send
        self._post(wr, bad_wr, lambda w: post(self._eqp, w._engine()), 'Failed to post send')

    def modify_rate_limit(self, attr):
        """ibv_modify_qp_rate_limit: packet pacing of raw packet QPs, which softnic does not
        have (EOPNOTSUPP, libibverbs' answer for a provider without it, as rxe)."""
        raise PyverbsRDMAError('Failed to modify QP rate limit', errno.EOPNOTSUPP)

    def query_data_in_order(self, op, flags=0):
        """ibv_query_qp_data_in_order: 0, no guarantee.  With selective repeat a later
        packet's bytes may be placed before an earlier lost one's, so softnic promises
        nothing beyond the completion (as libibverbs answers for providers without the op)."""
        self._check()
        return 0

    def bind_mw(self, mw, mw_bind):
        """ibv_bind_mw: bind a type 1 window with a BIND_MW in this QP's send queue (its
        completion says whether it took); the window's rkey moves to the next key byte."""
        from .base import inc_rkey
        from .mr import MW
        self._check()
        if not isinstance(mw, MW) or mw._closed:
            raise PyverbsUserError('bind_mw needs an open MW')
        if mw.type != e.IBV_MW_TYPE_1:
            raise PyverbsRDMAError('Failed to Bind MW', errno.EINVAL)
        info = mw_bind.info
        if info.mr is None and (info.addr or info.length):
            raise PyverbsRDMAError('Failed to Bind MW', errno.EINVAL)
        new_rkey = inc_rkey(mw.rkey)
        wr = _EngineSendWR(mw_bind.wr_id, e.IBV_WR_BIND_MW, [], mw_bind.send_flags,
                           bind=info._engine(mw, new_rkey))
        nic = self._nic
        try:
            nic.call(nic.dev.post_send, self._eqp, wr)
        except (VerbsError, ValueError) as ex:
            err = ex.errno if isinstance(ex, VerbsError) else errno.EINVAL
            raise PyverbsRDMAError('Failed to Bind MW', err) from None
        mw._rkey = new_rkey

    def _post(self, wr, bad_wr, one, msg, call=None):
        if wr is None:
            raise TypeError('post needs a work request')

        def chain():
            cur = wr
            while cur is not None:
                try:
                    one(cur)
                except (VerbsError, ValueError) as ex:
                    return cur, ex
                cur = cur._next
            return None, None

        bad, ex = (call or self._nic.call)(chain)
        if bad is not None:
            self._refused(bad, bad_wr, ex, msg)

    @staticmethod
    def _refused(bad, bad_wr, ex, msg):
        if bad_wr is not None:
            bad_wr._copy_from(bad)
        err = ex.errno if isinstance(ex, VerbsError) else errno.EINVAL
        raise PyverbsRDMAError(f'{msg} (returned {err}): '
                               f'{getattr(ex, "message", ex)}', err)

    @property
    def qp_type(self):
        return self._qp_type

    @property
    def qp_state(self):
        return int(self._eqp.state)

    @property
    def qp_num(self):
        return self._eqp.qpn

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('QP type', qp_type_to_str(self.qp_type)) +
                f.format('  number', self.qp_num) +
                f.format('  state', qp_state_to_str(self.qp_state)))


class QPEx(QP):
    """A QP posted to with the ibv_wr_* calls: wr_start(), one opcode call and its
    address / SGE setters per WR, then wr_complete().  Immediate data is given in host
    order here (pyverbs converts it for ibv_wr_send_imm)."""

    def __init__(self, creator, init_attr, qp_attr=None):
        self._batch = None
        self.wr_id = 0
        self.wr_flags = 0
        super().__init__(creator, init_attr, qp_attr)

    def wr_start(self):
        self._check()
        self._batch = []

    def _new(self, opcode, **kw):
        if self._batch is None:
            raise PyverbsUserError('wr_start() must come first')
        wr = _EngineSendWR(self.wr_id, opcode, [], self.wr_flags, **kw)
        self._batch.append(wr)
        return wr

    def _last(self):
        if not self._batch:
            raise PyverbsUserError('no work request to set: call an opcode first')
        return self._batch[-1]

    def wr_send(self):
        self._new(e.IBV_WR_SEND)

    def wr_send_imm(self, imm_data):
        self._new(e.IBV_WR_SEND_WITH_IMM, imm_data=imm_data)

    def wr_send_inv(self, invalidate_rkey):
        self._new(e.IBV_WR_SEND_WITH_INV, invalidate_rkey=invalidate_rkey)

    def wr_rdma_write(self, rkey, remote_addr):
        self._new(e.IBV_WR_RDMA_WRITE, rkey=rkey, remote_addr=remote_addr)

    def wr_rdma_write_imm(self, rkey, remote_addr, imm_data):
        self._new(e.IBV_WR_RDMA_WRITE_WITH_IMM, rkey=rkey, remote_addr=remote_addr,
                  imm_data=imm_data)

    def wr_rdma_read(self, rkey, remote_addr):
        self._new(e.IBV_WR_RDMA_READ, rkey=rkey, remote_addr=remote_addr)

    def wr_atomic_write(self, rkey, remote_addr, atomic_wr):
        """ATOMIC_WRITE: the 8 bytes of ``atomic_wr`` placed at ``remote_addr`` as one."""
        self._new(e.IBV_WR_ATOMIC_WRITE, rkey=rkey, remote_addr=remote_addr,
                  atomic_data=bytes(memoryview(atomic_wr).cast('B')[:8]))

    def wr_flush(self, rkey, remote_addr, length, ptype, level):
        """FLUSH: make what was placed in ``[remote_addr, +length)`` (``level``
        IBV_FLUSH_RANGE) or in the whole region of ``rkey`` (IBV_FLUSH_MR) globally visible
        or persistent (``ptype``), as rxe does since Linux 6.2; no local memory."""
        self._new(e.IBV_WR_FLUSH, rkey=rkey, remote_addr=remote_addr, length=length,
                  flush_type=ptype, flush_level=level)

    def wr_atomic_cmp_swp(self, rkey, remote_addr, compare, swap):
        self._new(e.IBV_WR_ATOMIC_CMP_AND_SWP, rkey=rkey, remote_addr=remote_addr,
                  compare_add=compare, swap=swap)

    def wr_atomic_fetch_add(self, rkey, remote_addr, add):
        self._new(e.IBV_WR_ATOMIC_FETCH_AND_ADD, rkey=rkey, remote_addr=remote_addr,
                  compare_add=add)

    def wr_local_inv(self, invalidate_rkey):
        self._new(e.IBV_WR_LOCAL_INV, invalidate_rkey=invalidate_rkey)

    def wr_bind_mw(self, mw, rkey, bind_info):
        """Bind a type 2 window to ``bind_info``'s range, giving it ``rkey``."""
        self._new(e.IBV_WR_BIND_MW, bind=bind_info._engine(mw, rkey))

    def wr_set_xrc_srqn(self, remote_srqn):
        """The remote XRC SRQ of the last WR (an XRC initiator's XRCETH)."""
        self._last().xrc_srqn = remote_srqn

    def wr_set_ud_addr(self, ah, remote_qpn, remote_qkey):
        w = self._last()
        w.ah, w.remote_qpn, w.remote_qkey = ah._engine, remote_qpn, remote_qkey

    def wr_set_sge(self, sge):
        self._last().sg_list = [(sge.addr, sge.length, sge.lkey)]

    def wr_set_sge_list(self, num_sge, sg_list):
        self._last().sg_list = [(s.addr, s.length, s.lkey) for s in list(sg_list)[:num_sge]]

    def wr_set_inline_data(self, addr, length):
        w = self._last()
        w.sg_list = [(addr, length, 0)]
        w.send_flags |= e.IBV_SEND_INLINE

    def wr_set_inline_data_list(self, num_buf, buf_list):
        w = self._last()
        w.sg_list = [(a, n, 0) for a, n in list(buf_list)[:num_buf]]
        w.send_flags |= e.IBV_SEND_INLINE

    def wr_abort(self):
        self._batch = None

    def wr_complete(self):
        """Post the WRs built since wr_start(); all of them or, on a refusal, those
        before the refused one."""
        batch, self._batch = self._batch or [], None
        post = self._nic.dev.post_send

        def run():
            for w in batch:
                try:
                    post(self._eqp, w)
                except (VerbsError, ValueError) as ex:
                    return ex
            return None

        ex = self._nic.call(run)
        if ex is not None:
            err = ex.errno if isinstance(ex, VerbsError) else errno.EINVAL
            raise PyverbsRDMAError(f'Failed to complete post send: {ex}', err)
