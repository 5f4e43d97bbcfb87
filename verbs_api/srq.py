"""Shared receive queues (``pyverbs.srq``)."""

from __future__ import annotations

import errno

from softnic.core.errors import VerbsError

from . import enums as e
from .base import PyverbsCM, PyverbsObject, engine_call, rdma_error
from .pyverbs_error import PyverbsError, PyverbsRDMAError


class SrqAttr(PyverbsObject):
    def __init__(self, max_wr=100, max_sge=1, srq_limit=0):
        super().__init__()
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.srq_limit = srq_limit


class SrqInitAttr(PyverbsObject):
    def __init__(self, attr=None):
        super().__init__()
        self._attr = SrqAttr(0, 0, 0) if attr is None else \
            SrqAttr(attr.max_wr, attr.max_sge, attr.srq_limit)

    @property
    def max_wr(self):
        return self._attr.max_wr

    @property
    def max_sge(self):
        return self._attr.max_sge

    @property
    def srq_limit(self):
        return self._attr.srq_limit


class SrqInitAttrEx(SrqInitAttr):
    def __init__(self, max_wr=100, max_sge=1, srq_limit=0):
        super().__init__(SrqAttr(max_wr, max_sge, srq_limit))
        self.comp_mask = 0
        self.srq_type = e.IBV_SRQT_BASIC
        self.pd = None
        self.xrcd = None
        self.cq = None


class OpsWr(PyverbsCM):
    """A tag-matching operation on an SRQ (ibv_ops_wr, for ``SRQ.post_srq_ops``): add or
    remove a tag's receive buffer, or sync the unexpected count.  softnic's devices have
    no tag matching (``tm_caps.max_num_tags`` 0), so no SRQ takes one."""

    def __init__(self, wr_id=0, opcode=e.IBV_WR_TAG_ADD, flags=e.IBV_OPS_SIGNALED,
                 next_wr=None, unexpected_cnt=0, recv_wr_id=0, num_sge=None, tag=0, mask=0,
                 sg_list=None):
        super().__init__()
        self.wr_id, self.opcode, self.flags, self.next_wr = wr_id, opcode, flags, next_wr
        self.unexpected_cnt, self.recv_wr_id, self.tag, self.mask = \
            unexpected_cnt, recv_wr_id, tag, mask
        self.sg_list = list(sg_list or [])
        self.num_sge = len(self.sg_list) if num_sge is None else num_sge


class SRQ(PyverbsCM):
    _kind = 'SRQ'

    def __init__(self, creator, attr):
        """An SRQ on a PD (with SrqInitAttr) or a Context (with SrqInitAttrEx naming
        its PD; basic SRQs only)."""
        super().__init__()
        self._closed = True
        self.cq = self.xrcd = None
        self._xrc = False
        from .device import Context
        from .pd import PD
        if creator is None or attr is None:
            raise TypeError('SRQ needs a creator and attributes')
        xrc = None
        if isinstance(creator, PD):
            pd = creator
        elif isinstance(creator, Context):
            creator._check()
            srq_type = getattr(attr, 'srq_type', e.IBV_SRQT_BASIC) \
                if attr.comp_mask & e.IBV_SRQ_INIT_ATTR_TYPE else e.IBV_SRQT_BASIC
            if srq_type not in (e.IBV_SRQT_BASIC, e.IBV_SRQT_XRC):
                raise rdma_error(f'Failed to create SRQ: SRQ type {srq_type}', errno.EOPNOTSUPP)
            if srq_type == e.IBV_SRQT_XRC:
                xrcd, cq = getattr(attr, 'xrcd', None), getattr(attr, 'cq', None)
                if xrcd is None or cq is None or xrcd._closed or cq._closed or \
                        not attr.comp_mask & e.IBV_SRQ_INIT_ATTR_XRCD or \
                        not attr.comp_mask & e.IBV_SRQ_INIT_ATTR_CQ:
                    raise rdma_error('Failed to create SRQ: an XRC SRQ needs an XRCD and a CQ')
                xrc = (xrcd, cq)
            pd = getattr(attr, 'pd', None)
            if pd is None:
                raise rdma_error('Failed to create SRQ: the SrqInitAttrEx names no PD')
        else:
            raise PyverbsRDMAError('Srq needs either Context or PD for creation')
        pd._check()
        self._nic = pd._nic
        self._esrq = engine_call(self._nic, 'Failed to create SRQ', self._nic.dev.create_srq,
                                 pd._epd, attr.max_wr, attr.max_sge, attr.srq_limit)
        self.pd = pd
        self._xrc = xrc is not None
        if xrc is not None:
            from softnic.core import xrc as _xrc
            xrcd, cq = xrc
            try:
                engine_call(self._nic, 'Failed to create SRQ', _xrc.make_srq, self._esrq,
                            xrcd._exrcd, cq._ecq)
            except PyverbsRDMAError:
                engine_call(self._nic, 'Failed to destroy SRQ', self._nic.dev.destroy_srq,
                            self._esrq)
                raise
            self.xrcd, self.cq = xrcd, cq
            xrcd.add_ref(self)
            cq.add_ref(self)
        self._closed = False
        pd.add_ref(self)
        self.logger.debug('SRQ Created')

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing SRQ')
        engine_call(self._nic, 'Failed to destroy SRQ', self._nic.dev.destroy_srq, self._esrq)
        self._closed = True
        self.pd = None
        self.cq = None

    def _check(self):
        if self._closed:
            raise PyverbsError('SRQ is closed')

    def get_srq_num(self):
        """The XRC SRQ number initiators name in their XRCETH."""
        self._check()
        if not self._xrc:
            raise rdma_error('Failed to retrieve SRQ number: not an XRC SRQ', errno.EOPNOTSUPP)
        return self._esrq.handle

    def modify(self, attr, comp_mask):
        """ibv_modify_srq: resize (IBV_SRQ_MAX_WR) and / or arm the limit (IBV_SRQ_LIMIT)."""
        self._check()
        kw = {}
        if comp_mask & e.IBV_SRQ_MAX_WR:
            if attr.max_wr > self._nic.dev.config.max_qp_wr:
                raise rdma_error(f'Failed to modify SRQ: max_wr {attr.max_wr} too large')
            kw['max_wr'] = attr.max_wr
        if comp_mask & e.IBV_SRQ_LIMIT:
            kw['srq_limit'] = attr.srq_limit
        if comp_mask & ~(e.IBV_SRQ_MAX_WR | e.IBV_SRQ_LIMIT):
            raise rdma_error(f'Failed to modify SRQ: mask {comp_mask:#x}')
        engine_call(self._nic, 'Failed to modify SRQ', self._esrq.modify, **kw)

    def query(self):
        self._check()
        with self._nic.lock:
            s = self._esrq
            return SrqAttr(s.max_wr, s.max_sge, s.srq_limit)

    def post_srq_ops(self, wr, bad_wr=None):
        """ibv_post_srq_ops: tag matching, which softnic's SRQs do not do (EOPNOTSUPP,
        libibverbs' answer for a provider without it)."""
        raise PyverbsRDMAError('Failed to post SRQ ops', errno.EOPNOTSUPP)

    def post_recv(self, wr, bad_wr=None):
        """Post ``wr`` and the WRs chained after it to the SRQ."""
        self._check()
        if wr is None:
            raise TypeError('post_recv needs a RecvWR')
        post = self._nic.dev.post_srq_recv

        def chain():
            cur = wr
            while cur is not None:
                try:
                    post(self._esrq, cur._engine())
                except VerbsError as ex:
                    return cur, ex
                cur = cur._next
            return None, None

        bad, ex = self._nic.post_recv(chain)
        if bad is not None:
            if bad_wr is not None:
                bad_wr._copy_from(bad)
            raise PyverbsRDMAError(f'Failed to post receive to SRQ ({ex.errno}): {ex.message}',
                                   ex.errno)
