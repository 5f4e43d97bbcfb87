"""``pyverbs.cmid``: rdma_cm with pyverbs' classes and signatures (rdma-core 44).

``CMID``, ``CMEventChannel``, ``CMEvent``, ``AddrInfo``, ``ConnParam``,
``UDParam`` and ``JoinMCAttrEx`` over softnic's connection manager
(``softnic.driver.rdmacm``, the same code the C librdmacm uses).  As in librdmacm, an
id made from an ``AddrInfo`` is synchronous (its calls wait for their outcome)
and one made from a ``CMEventChannel`` reports through the channel; the QP a
CMID creates is moved to RTR and RTS with the attributes the CM negotiated.
Multicast is not supported (``EOPNOTSUPP``).
"""

from __future__ import annotations

import ctypes
import errno
import weakref

from softnic.driver import rdmacm as R
from softnic.core.errors import VerbsError

from . import cm_enums as ce
from . import enums as e
from .addr import AHAttr, GlobalRoute
from .base import PyverbsCM, PyverbsObject, close_weakrefs
from .pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError

#: device name -> (Context, PD) shared by the CMIDs on it
_devices: dict = {}
RDMA_MAX_RESP_RES = 0xFF
RDMA_MAX_INIT_DEPTH = 0xFF


def _rdma(msg, err):
    if isinstance(err, VerbsError):
        return PyverbsRDMAError(f'{msg}. Errno: {err.errno}, {err.message}', err.errno)
    return PyverbsRDMAError(f'{msg}. Errno: {err}, {errno.errorcode.get(err, err)}', err)


class ConnParam(PyverbsObject):
    def __init__(self, resources=1, depth=1, flow_control=0, retry=5, rnr_retry=5, srq=0,
                 qp_num=0, data_len=0):
        super().__init__()
        self.responder_resources = resources
        self.initiator_depth = depth
        self.flow_control = flow_control
        self.retry_count = retry
        self.rnr_retry_count = rnr_retry
        self.srq = srq
        self.qp_num = qp_num
        self.data = (ctypes.c_char * data_len)()
        self._private = b''

    @property
    def qpn(self):
        return self.qp_num

    @qpn.setter
    def qpn(self, val):
        self.qp_num = val

    @property
    def private_data(self):
        return self._private

    def set_private_data(self, data):
        n = min(len(self.data), len(data))
        if n == 0:
            return
        ctypes.memset(self.data, 0, len(self.data))
        for i in range(n):
            self.data[i] = data[i]
        self._private = bytes(self.data[:n])

    def __str__(self):
        f = '{:<4}: {:<4}\n'
        return ('{}: {}\n'.format('Connection parameters', '') +
                f.format('responder resources', self.responder_resources) +
                f.format('initiator depth', self.initiator_depth) +
                f.format('flow control', self.flow_control) +
                f.format('retry count', self.retry_count) +
                f.format('rnr retry count', self.rnr_retry_count) +
                f.format('srq', self.srq) + f.format('qp number', self.qp_num))


class JoinMCAttrEx(PyverbsObject):
    def __init__(self, addr, comp_mask=0, join_flags=0):
        super().__init__()
        if addr is None:
            raise TypeError('JoinMCAttrEx needs an AddrInfo')
        self.addr = addr
        self.comp_mask = comp_mask
        self.join_flags = join_flags


class UDParam(PyverbsObject):
    def __init__(self, cm_event):
        super().__init__()
        if cm_event is None:
            raise TypeError('UDParam needs a CMEvent')
        ev = cm_event._ev
        self._qp_num = ev.qp_num if ev is not None else 0
        self._qkey = ev.qkey if ev is not None else 0
        if ev is not None and ev.mgid:
            self._dgid = ev.mgid
        else:
            self._dgid = ev.id.dgid if ev is not None and ev.id.dst else bytes(16)

    @property
    def qp_num(self):
        return self._qp_num

    @property
    def qkey(self):
        return self._qkey

    @property
    def ah_attr(self):
        return AHAttr(is_global=1, port_num=1, gr=GlobalRoute(dgid=self._dgid, hop_limit=64))


class AddrInfo(PyverbsObject):
    def __init__(self, src=None, dst=None, src_service=None, dst_service=None, port_space=0,
                 flags=0):
        super().__init__()
        self.src = self.dst = None
        self.flags = flags
        self.port_space = port_space or ce.RDMA_PS_TCP
        self.qp_type = e.IBV_QPT_UD if self.port_space == ce.RDMA_PS_UDP else e.IBV_QPT_RC
        # with nothing to resolve it stays empty, as pyverbs' (rdma-core 64's tests make
        # one so and call get_addrinfo later)
        if src or dst or src_service or dst_service:
            self.get_addrinfo(src, dst, src_service, dst_service, port_space, flags)

    def get_addrinfo(self, src=None, dst=None, src_service=None, dst_service=None,
                     port_space=0, flags=0):
        """rdma_getaddrinfo: resolve the source and destination addresses."""
        self.src = self.dst = None
        self.flags = flags
        self.port_space = port_space or ce.RDMA_PS_TCP
        self.qp_type = e.IBV_QPT_UD if self.port_space == ce.RDMA_PS_UDP else e.IBV_QPT_RC
        try:
            if flags & ce.RAI_PASSIVE:
                self.src = R.getaddrinfo(src, src_service, passive=True)["src"]
            else:
                if src is not None:
                    self.src = R.getaddrinfo(src, src_service, passive=True)["src"]
                if dst is not None or dst_service is not None or src is None:
                    self.dst = R.getaddrinfo(dst, dst_service)["dst"]
        except VerbsError as ex:
            raise _rdma('Failed to get Address Info', ex) from None

    def close(self):
        pass


class CMEventChannel(PyverbsCM):
    def __init__(self):
        super().__init__()
        self._ch = R.EventChannel()
        self.event_channel = self
        self.logger.debug('Created a CMEventChannel')

    def close(self):
        ch, self._ch = getattr(self, '_ch', None), None
        if ch is not None:
            ch.close()

    @property
    def fd(self):
        return self._ch.fd if self._ch is not None else -1


def _take(ch: R.EventChannel) -> R.Event:
    ev = ch.get()
    if ev is None:
        raise PyverbsRDMAError('Failed to create CMEvent', errno.EIO)
    ev = _process(ev)
    return ev


def _process(ev: R.Event) -> R.Event:
    """What librdmacm does to an event before the program sees it."""
    cmid = ev.id.cookie() if callable(ev.id.cookie) else None
    if ev.kind == R.CONNECT_RESPONSE and cmid is not None and cmid._qp is not None:
        try:
            cmid._move(e.IBV_QPS_RTR)
            cmid._move(e.IBV_QPS_RTS)
            ev.id.establish()
            ev.kind = R.ESTABLISHED
        except (PyverbsError, VerbsError) as ex:
            ev.kind = R.CONNECT_ERROR
            ev.status = -getattr(ex, 'errno', getattr(ex, 'error_code', errno.EINVAL))
            cmid._to_error()
    elif ev.kind == R.REJECTED and cmid is not None:
        cmid._to_error()
    elif ev.kind == R.MULTICAST_JOIN and cmid is not None and cmid._qp is not None:
        try:                          # as librdmacm's ucma_process_join
            cmid._qp.attach_mcast(ev.mgid, 0)
        except PyverbsRDMAError as ex:
            ev.kind = R.MULTICAST_ERROR
            ev.status = -ex.error_code
    return ev


class CMEvent(PyverbsCM):
    def __init__(self, channel):
        super().__init__()
        if channel is None or channel._ch is None:
            raise PyverbsRDMAError('Failed to create CMEvent', errno.EINVAL)
        self._ev = _take(channel._ch)
        self.logger.debug('Created a CMEvent')

    @classmethod
    def _wrap(cls, ev):
        obj = cls.__new__(cls)
        PyverbsCM.__init__(obj)
        obj._ev = ev
        return obj

    def close(self):
        self._ev = None

    @property
    def event_type(self):
        return ce.rdma_cm_event_type(self._ev.kind) if self._ev is not None else None

    @property
    def status(self):
        return self._ev.status if self._ev is not None else 0

    def ack_cm_event(self):
        if self._ev is None:
            raise PyverbsRDMAError('Failed to Acknowledge Event - ', errno.EINVAL)
        self._ev = None

    def event_str(self):
        if self._ev is None:
            return ''
        return ce.rdma_cm_event_type(self._ev.kind).name

    @property
    def private_data(self):
        return self._ev.private_data if self._ev is not None else b''


class CMID(PyverbsCM):
    def __init__(self, creator=None, qp_init_attr=None, pd=None, port_space=ce.RDMA_PS_TCP,
                 listen_id=None):
        super().__init__()
        self._id = None
        self._qp = None
        self._sync = False
        self._event = None
        self._ep_attr = None
        self.pd = None
        self.ctx = None
        self.event_channel = None
        self.mrs = weakref.WeakSet()
        self._own_cqs = []
        if creator is None:
            return
        if isinstance(creator, AddrInfo):
            self._sync = True
            self._id = R.CmId(R.EventChannel(), ps=creator.port_space, qp_type=creator.qp_type,
                              cookie=weakref.ref(self))
            self.pd = pd
            try:
                if creator.flags & ce.RAI_PASSIVE:
                    self._id.bind(*creator.src)
                    self._attach_device()
                    if qp_init_attr is not None:
                        self._ep_attr = qp_init_attr
                else:
                    self._id.resolve_addr(creator.src[0] if creator.src else None,
                                          *creator.dst)
                    self._complete('Failed to create CM ID')
                    self._id.resolve_route()
                    self._complete('Failed to create CM ID')
                    self._attach_device()
                    if qp_init_attr is not None:
                        self.create_qp(qp_init_attr)
            except VerbsError as ex:
                self._id.destroy()
                raise _rdma('Failed to create CM ID', ex) from None
        elif isinstance(creator, CMEventChannel):
            if port_space not in R.PORT_SPACES:
                raise PyverbsRDMAError('Failed to create CM ID', errno.EPROTONOSUPPORT)
            self.event_channel = creator
            qpt = e.IBV_QPT_UD if port_space in (ce.RDMA_PS_UDP, ce.RDMA_PS_IPOIB) \
                else e.IBV_QPT_RC
            self._id = R.CmId(creator._ch, ps=port_space, qp_type=qpt,
                              cookie=weakref.ref(self))
        elif isinstance(creator, CMEvent):
            if listen_id is None:
                raise PyverbsUserError('listen ID not provided')
            self._id = creator._ev.id
            self._id.cookie = weakref.ref(self)
            self.event_channel = listen_id.event_channel
            self._attach_device(listen_id)
        else:
            raise PyverbsRDMAError(f'Cannot create CM ID from {type(creator)}')

    # ---------------------------------------------------------- internals

    def _attach_device(self, like=None):
        """The Context and PD of the id's device (pyverbs makes them from the id)."""
        from .device import Context
        from .pd import PD
        if self._id is None or self._id.nic is None:
            return
        if like is not None and like.ctx is not None and like.ctx.name == self._id.nic.name:
            self.ctx, self.pd = like.ctx, self.pd or like.pd
        if self.ctx is None:
            # one Context and PD per device for every CMID, as librdmacm keeps them
            name = self._id.nic.name
            ctx, pd = _devices.get(name, (None, None))
            if ctx is None or ctx._closed or ctx._nic is not self._id.nic:
                ctx = Context(name=name)
                pd = PD(ctx)
                _devices[name] = (ctx, pd)
            self.ctx = ctx
            self.pd = self.pd or pd
        if self.pd is None:
            self.pd = PD(self.ctx)

    def _complete(self, msg):
        """A synchronous id waits for the event its call led to."""
        if not self._sync:
            return None
        self._event = None
        ev = _take(self._id.channel)
        self._event = ev
        if ev.kind == R.REJECTED:
            raise PyverbsRDMAError(f'{msg}. Errno: {errno.ECONNREFUSED}', errno.ECONNREFUSED)
        if ev.status:
            code = -ev.status if ev.status < 0 else ev.status
            raise PyverbsRDMAError(f'{msg}. Errno: {code}', code)
        return ev

    def _move(self, state, resp_res=None, depth=None):
        from .qp import QPAttr
        attrs, mask = self._id.init_qp_attr(state)
        a = QPAttr(qp_state=state)
        for k, val in attrs.items():
            if k in ('dgid', 'hop_limit'):
                continue
            setattr(a, k, val)
        if 'dgid' in attrs:
            a.ah_attr = AHAttr(is_global=1, port_num=1,
                               gr=GlobalRoute(dgid=bytes(attrs['dgid']),
                                              hop_limit=attrs.get('hop_limit', 64)))
        if resp_res is not None and state == e.IBV_QPS_RTR:
            a.max_dest_rd_atomic = resp_res
        if depth is not None and state == e.IBV_QPS_RTS:
            a.max_rd_atomic = depth
        self._qp.modify(a, mask)

    def _to_error(self):
        from .qp import QPAttr
        if self._qp is not None and not self._qp._closed:
            try:
                self._qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
            except PyverbsError:
                pass

    def _param(self, param, accepting):
        p = {'responder_resources': 16, 'initiator_depth': 16, 'retry_count': 7,
             'rnr_retry_count': 7, 'srq': 0, 'qpn': 0, 'private_data': b''}
        if accepting and self._event is not None:
            p['responder_resources'] = self._event.responder_resources
            p['initiator_depth'] = self._event.initiator_depth
        if param is not None:
            if param.responder_resources != RDMA_MAX_RESP_RES:
                p['responder_resources'] = param.responder_resources
            if param.initiator_depth != RDMA_MAX_INIT_DEPTH:
                p['initiator_depth'] = param.initiator_depth
            p.update(retry_count=param.retry_count, rnr_retry_count=param.rnr_retry_count,
                     srq=param.srq, qpn=param.qp_num, private_data=param.private_data)
        p['responder_resources'] = min(p['responder_resources'], 16)
        p['initiator_depth'] = min(p['initiator_depth'], 16)
        if self._qp is not None:
            p['qpn'] = self._qp.qp_num
            p['srq'] = int(self._qp.srq is not None)
        return p

    def _check(self):
        if self._id is None:
            raise PyverbsError('The CMID is closed')

    # ---------------------------------------------------------- pyverbs' API

    def add_ref(self, obj):
        from .mr import MR
        if isinstance(obj, MR):
            self.mrs.add(obj)
        else:
            raise PyverbsError('Unrecognized object type')

    @property
    def dev_name(self):
        self._check()
        return self._id.nic.name if self._id.nic is not None else None

    @property
    def port_num(self):
        return 1 if self._id is not None and self._id.nic is not None else 0

    @property
    def context(self):
        return self.ctx

    @property
    def qpn(self):
        return self._qp.qp_num if self._qp is not None else None

    @property
    def qp(self):
        return self._qp

    def close(self):
        if getattr(self, '_id', None) is None:
            return
        self.logger.debug('Closing CMID')
        close_weakrefs([self.mrs])
        if self._qp is not None:
            self._qp.close()
            self._qp = None
        for cq in self._own_cqs:
            cq.close()
        self._own_cqs = []
        cid, self._id = self._id, None
        cid.destroy()
        if self._sync:
            cid.channel.close()

    def get_request(self):
        self._check()
        if not self._sync:
            raise PyverbsRDMAError('Failed to get request, no connection established',
                                   errno.EINVAL)
        ev = self._complete('Failed to get request, no connection established')
        if ev.kind != R.CONNECT_REQUEST:
            raise PyverbsRDMAError('Failed to get request, no connection established',
                                   errno.EINVAL)
        child = ev.id
        child.channel = R.EventChannel()            # the new id is synchronous too
        to_conn = CMID()
        to_conn._id = child
        to_conn._sync = True
        to_conn._event = ev
        child.cookie = weakref.ref(to_conn)
        to_conn._attach_device(self)
        self.ctx, self.pd = self.ctx or to_conn.ctx, self.pd or to_conn.pd
        if self._ep_attr is not None:
            to_conn.create_qp(self._ep_attr)
        return to_conn

    def bind_addr(self, lai):
        self._check()
        if lai is None or lai.src is None:
            raise PyverbsRDMAError('Failed to Bind ID', errno.EINVAL)
        try:
            self._id.bind(*lai.src)
        except VerbsError as ex:
            raise _rdma('Failed to Bind ID', ex) from None
        self._attach_device()

    def resolve_addrinfo(self, node=None, service=None, port_space=0, flags=0):
        """rdma_resolve_addrinfo: ``node`` and ``service`` resolved as rdma_getaddrinfo
        resolves them (the source with RAI_PASSIVE, else the destination), reported as
        RDMA_CM_EVENT_ADDRINFO_RESOLVED on the id's channel, as librdmacm does once its
        resolution is done (a synchronous id takes the event here); ``query_addrinfo``
        then gives the result."""
        self._check()
        ai = AddrInfo()
        try:
            if flags & ce.RAI_PASSIVE:
                ai.get_addrinfo(src=node, src_service=service, port_space=port_space,
                                flags=flags)
            else:
                ai.get_addrinfo(dst=node, dst_service=service, port_space=port_space,
                                flags=flags)
        except PyverbsRDMAError as ex:
            raise PyverbsRDMAError('Failed to Resolve AddrInfo', ex.error_code) from None
        self._addrinfo = ai
        if self._id.channel is not None:
            self._id.channel.post(R.Event(ce.RDMA_CM_EVENT_ADDRINFO_RESOLVED, self._id))
        self._complete('Failed to Resolve AddrInfo')

    def query_addrinfo(self):
        """rdma_query_addrinfo: what resolve_addrinfo resolved (EINVAL before)."""
        ai = getattr(self, '_addrinfo', None)
        if ai is None:
            raise PyverbsRDMAError('Failed to Query AddrInfo', errno.EINVAL)
        return ai

    def resolve_addr(self, rai, timeout_ms=2000):
        self._check()
        if rai is None or rai.dst is None:
            raise PyverbsRDMAError('Failed to Resolve Address', errno.EINVAL)
        try:
            self._id.resolve_addr(rai.src[0] if rai.src else None, *rai.dst)
        except VerbsError as ex:
            raise _rdma('Failed to Resolve Address', ex) from None
        self._complete('Failed to Resolve Address')

    def join_multicast(self, addr=None, mc_attr=None, context=0):
        if not addr and not mc_attr:
            raise PyverbsUserError('Join to multicast must have AddrInfo or JoinMCAttrEx '
                                   'arguments')
        self._check()
        ai = mc_attr.addr if mc_attr is not None else addr
        if mc_attr is not None and mc_attr.join_flags not in (ce.RDMA_MC_JOIN_FLAG_FULLMEMBER,
                                                             ce.RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER):
            raise PyverbsRDMAError('Failed to Join multicast', errno.EINVAL)
        group = ai.src[0] if ai.src else (ai.dst[0] if ai.dst else None)
        if group is None:
            raise PyverbsRDMAError('Failed to Join multicast', errno.EINVAL)
        try:
            self._id.join_multicast(group)
        except VerbsError as ex:
            raise _rdma('Failed to Join multicast', ex) from None
        self._complete('Failed to Join multicast')

    def leave_multicast(self, addr):
        self._check()
        group = addr.src[0] if addr.src else (addr.dst[0] if addr.dst else None)
        try:
            mgid = self._id.leave_multicast(group)
        except VerbsError as ex:
            raise _rdma('Failed to leave multicast', ex) from None
        if self._qp is not None:
            try:
                self._qp.detach_mcast(mgid, 0)
            except PyverbsRDMAError:
                pass                  # never attached (the QP came after the join)

    def resolve_route(self, timeout_ms=2000):
        self._check()
        try:
            self._id.resolve_route()
        except VerbsError as ex:
            raise _rdma('Failed to Resolve Route', ex) from None
        self._complete('Failed to Resolve Route')
        self._attach_device()

    def listen(self, backlog=0):
        self._check()
        try:
            self._id.listen(backlog)
        except VerbsError as ex:
            raise _rdma('Listen Failed', ex) from None

    def connect(self, param=None):
        self._check()
        if self._id.ps == ce.RDMA_PS_TCP and self._qp is None and param is None:
            raise PyverbsRDMAError('Failed to Connect', errno.EINVAL)
        p = self._param(param, False)
        try:
            self._id.connect(qpn=p['qpn'], responder_resources=p['responder_resources'],
                             initiator_depth=p['initiator_depth'],
                             retry_count=p['retry_count'], rnr_retry_count=p['rnr_retry_count'],
                             srq=p['srq'], private_data=p['private_data'])
        except VerbsError as ex:
            raise _rdma('Failed to Connect', ex) from None
        self._complete('Failed to Connect')

    def disconnect(self):
        self._check()
        self._to_error()
        try:
            self._id.disconnect()
        except VerbsError as ex:
            raise _rdma('Failed to Disconnect', ex) from None
        self._complete('Failed to Disconnect')

    def accept(self, param=None):
        self._check()
        p = self._param(param, True)
        ud = self._id.qp_type == e.IBV_QPT_UD
        try:
            if self._qp is not None and not ud:
                self._move(e.IBV_QPS_RTR, resp_res=p['responder_resources'])
                self._move(e.IBV_QPS_RTS, depth=p['initiator_depth'])
            qkey = 0
            if ud and self._qp is not None:
                qkey = self._qp.query(e.IBV_QP_QKEY)[0].qkey
            self._id.accept(qpn=p['qpn'], responder_resources=p['responder_resources'],
                            initiator_depth=p['initiator_depth'],
                            rnr_retry_count=p['rnr_retry_count'], srq=p['srq'],
                            private_data=p['private_data'], qkey=qkey)
        except VerbsError as ex:
            self._to_error()
            raise _rdma('Failed to Accept Connection', ex) from None
        if not ud:
            self._complete('Failed to Accept Connection')

    def establish(self):
        self._check()
        try:
            self._id.establish()
        except VerbsError as ex:
            raise _rdma('Failed to Complete an active connection request', ex) from None

    def set_local_ece(self, ece):
        raise PyverbsRDMAError('Failed to set local ECE', errno.EOPNOTSUPP)

    def get_remote_ece(self):
        from .qp import ECE
        return ECE()

    def create_qp(self, qp_init):
        from .cq import CQ, CompChannel
        from .qp import QP
        self._check()
        if qp_init is None:
            raise TypeError('create_qp needs a QPInitAttr')
        if self._qp is not None or self.pd is None:
            raise PyverbsRDMAError('Failed to Create QP', errno.EINVAL)
        # CQs of the id's own when the attributes name none, as rdma_create_qp does
        if qp_init.send_cq is None:
            cq = CQ(self.ctx, max(1, qp_init.cap.max_send_wr), None, CompChannel(self.ctx), 0)
            self._own_cqs.append(cq)
            qp_init.send_cq = cq
        if qp_init.recv_cq is None:
            cq = CQ(self.ctx, max(1, qp_init.cap.max_recv_wr), None, CompChannel(self.ctx), 0)
            self._own_cqs.append(cq)
            qp_init.recv_cq = cq
        self._qp = QP(self.pd, qp_init)
        try:
            self._move(e.IBV_QPS_INIT)
            if self._id.qp_type == e.IBV_QPT_UD or qp_init.qp_type == e.IBV_QPT_UD:
                self._move(e.IBV_QPS_RTR)
                self._move(e.IBV_QPS_RTS)
        except (PyverbsError, VerbsError) as ex:
            self._qp.close()
            self._qp = None
            if isinstance(ex, VerbsError):
                raise _rdma('Failed to Create QP', ex) from None
            raise

    def query_qp(self, attr_mask):
        if self._qp is None:
            raise PyverbsRDMAError('Failed to query QP', errno.EINVAL)
        return self._qp.query(attr_mask)

    def init_qp_attr(self, qp_state):
        from .qp import QPAttr
        self._check()
        try:
            attrs, mask = self._id.init_qp_attr(qp_state)
        except VerbsError as ex:
            raise _rdma('Failed to get QP attributes', ex) from None
        a = QPAttr(qp_state=qp_state)
        for k, val in attrs.items():
            if k not in ('dgid', 'hop_limit'):
                setattr(a, k, val)
        if 'dgid' in attrs:
            a.ah_attr = AHAttr(is_global=1, port_num=1,
                               gr=GlobalRoute(dgid=bytes(attrs['dgid']),
                                              hop_limit=attrs.get('hop_limit', 64)))
        return a, mask

    def reg_msgs(self, size):
        from .mr import MR
        return self._reg(MR, size, e.IBV_ACCESS_LOCAL_WRITE)

    def reg_read(self, size=0):
        from .mr import MR
        # rdma_reg_read: local write too (rdma_verbs.h)
        return self._reg(MR, size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)

    def reg_write(self, size=0):
        from .mr import MR
        # rdma_reg_write: local write too (rdma_verbs.h)
        return self._reg(MR, size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)

    def _reg(self, MR, size, access):
        if self.pd is None:
            raise PyverbsRDMAError('Failed to register a MR: the CMID has no PD', errno.EINVAL)
        mr = MR(self.pd, size, access)
        self.mrs.add(mr)
        return mr

    def _sge(self, mr, length):
        from .wr import SGE
        return SGE(mr.buf, length if length else mr.length, mr.lkey)

    def post_recv(self, mr, length=None):
        from .wr import RecvWR
        if self._qp is None:
            raise PyverbsRDMAError('Failed to Post Receive', errno.EINVAL)
        self._qp.post_recv(RecvWR(wr_id=0, num_sge=1, sg=[self._sge(mr, length)]))

    def post_send(self, mr, flags=e.IBV_SEND_SIGNALED, length=None):
        from .wr import SendWR
        if self._qp is None:
            raise PyverbsRDMAError('Failed to Post Send', errno.EINVAL)
        self._qp.post_send(SendWR(wr_id=0, opcode=e.IBV_WR_SEND, num_sge=1,
                                  sg=[self._sge(mr, length)], send_flags=flags))

    def post_read(self, mr, length, remote_addr, rkey, flags=0):
        from .wr import SendWR
        wr = SendWR(wr_id=0, opcode=e.IBV_WR_RDMA_READ, num_sge=1,
                    sg=[self._sge(mr, length)], send_flags=flags)
        wr.set_wr_rdma(rkey, remote_addr)
        self._qp.post_send(wr)

    def post_write(self, mr, length, remote_addr, rkey, flags=0):
        from .wr import SendWR
        wr = SendWR(wr_id=0, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[self._sge(mr, length)], send_flags=flags)
        wr.set_wr_rdma(rkey, remote_addr)
        self._qp.post_send(wr)

    def post_ud_send(self, mr, ah, rqpn=0, flags=e.IBV_SEND_SIGNALED, length=None):
        from .wr import SendWR
        wr = SendWR(wr_id=0, opcode=e.IBV_WR_SEND, num_sge=1, sg=[self._sge(mr, length)],
                    send_flags=flags)
        wr.set_wr_ud(ah, rqpn, R.RDMA_UDP_QKEY)
        self._qp.post_send(wr)

    def _comp(self, cq):
        """rdma_get_*_comp: poll; if empty, arm and wait for the CQ's event."""
        while True:
            n, wcs = cq.poll()
            if n:
                return wcs[0]
            cq.req_notify()
            n, wcs = cq.poll()
            if n:
                return wcs[0]
            ch = cq.channel if getattr(cq, 'channel', None) is not None else None
            if ch is None:
                continue
            ch.get_cq_event(cq)
            cq.ack_events(1)

    def get_recv_comp(self):
        if self._qp is None:
            raise PyverbsRDMAError('Failed to retrieve receive completion', errno.EINVAL)
        return self._comp(self._qp.rcq)

    def get_send_comp(self):
        if self._qp is None:
            raise PyverbsRDMAError('Failed to retrieve send completion', errno.EINVAL)
        return self._comp(self._qp.scq)

    def set_option(self, level, optname, optval, optlen):
        if optname != ce.RDMA_OPTION_ID_ACK_TIMEOUT:
            raise PyverbsUserError('Currently only RDMA_OPTION_ID_ACK_TIMEOUT is supported '
                                   'in Pyverbs.')
        self._id.set_ack_timeout(int(optval))

    def reject(self, private_data=None):
        self._check()
        try:
            self._id.reject(bytes(private_data) if private_data else b'')
        except VerbsError as ex:
            raise _rdma('Failed to Reject Connection', ex) from None
