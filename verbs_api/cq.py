"""Completion queues, completion channels and work completions (``pyverbs.cq``).

``CQ.poll()`` first drives the device's progress inline (receive what waits
on its socket, fire due timers, send), so a program that spins on its CQ
makes progress without waiting for the progress thread.  Completion events
follow ibv_req_notify_cq: a CQ armed with ``req_notify()`` raises one event
for the next completion, which ``CompChannel.get_cq_event(cq)`` waits for.
"""

from __future__ import annotations

import errno
import socket
import weakref

import softnic.driver.nic as _nic
from softnic.core.errors import VerbsError

from . import enums as e
from .base import PyverbsCM, PyverbsObject, close_weakrefs, engine_call, keep_ref, kinds, rdma_error
from .pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError

_WITH_IMM = int(e.IBV_WC_WITH_IMM)
_WITH_INV = int(e.IBV_WC_WITH_INV)


class CompChannel(PyverbsCM):
    """A completion event channel (ibv_comp_channel)."""

    _kind = 'CompChannel'

    def __init__(self, context):
        super().__init__()
        self._closed = True
        if context is None:
            raise TypeError('CompChannel needs a Context')
        context._check()
        self._nic = context._nic
        self.context = context
        self.cqs = weakref.WeakSet()
        self._closed = False
        context.add_ref(self)

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing completion channel')
        close_weakrefs([self.cqs])
        self._closed = True
        self.context = None

    def get_cq_event(self, expected_cq):
        """Block until a CQ of this channel raises a completion event; that CQ must be
        ``expected_cq``."""
        if self._closed:
            raise PyverbsError('Completion channel is closed')
        got = []

        def ready():
            if self._closed:
                return True
            for cq in [expected_cq, *self.cqs]:
                if cq is not None and cq.channel is self and not cq._closed \
                        and cq._ecq.events > cq._events_taken:
                    got.append(cq)
                    return True
            return False

        if not self._nic.wait_until(ready) or not got:
            raise rdma_error('Failed to get CQ event', errno.EIO)
        cq = got[0]
        cq._events_taken += 1
        if cq is not expected_cq:
            raise PyverbsRDMAError('Received event on an unexpected CQ')
        expected_cq.num_events += 1

    def add_ref(self, obj):
        if kinds(obj) & {'CQ', 'CQEX'}:
            self.cqs.add(obj)


#: receives a poll's inline step may take while they are a READ's responses before
#: its LAST and complete nothing (``NIC.poll``'s ``reads``): the READ's FIRST, the run
#: of its MIDDLEs and its LAST in one call.  Anything else ends the step after one
#: receive, as before: a peer's request a program may spin on memory for (``softnic
#: perf write_lat`` answers it before the ACK behind it is taken), an ACK, a completion.
POLL_RUNS = 4


def _idle(nic):
    """After an empty poll, move this process's other NICs along too: the peer of a
    program that spins on one CQ is often another device of the same process, whose
    progress thread would otherwise wait for the interpreter lock.  (A device whose
    ``poll_others`` is False says its peers move otherwise: the virtual cluster's.)"""
    if _nic.open_count() < 2 or not getattr(nic, 'poll_others', True):
        return                       # (read without the lock: a hint, as any poll is)
    for other in _nic.open_nics():
        if other is not nic:
            other.poll()


class _CQBase(PyverbsCM):
    def _create(self, context, cqe, channel, comp_vector):
        self._closed = True
        self.channel = None
        self.qps = weakref.WeakSet()
        self.srqs = weakref.WeakSet()
        self.num_events = 0
        self._events_taken = 0
        if context is None:
            raise TypeError('a CQ needs a Context')
        context._check()
        if not 0 <= comp_vector < context.num_comp_vectors:
            raise rdma_error(f'Failed to create a CQ: comp_vector {comp_vector} out of range')
        if channel is not None and (channel._closed or channel.context is not context):
            raise rdma_error('Failed to create a CQ: the channel is closed or of another device')
        self._nic = context._nic
        self._ecq = engine_call(self._nic, 'Failed to create a CQ', self._nic.dev.create_cq, cqe)
        self.context = context
        if channel is not None:
            self.channel = channel
            channel.add_ref(self)
        self._closed = False
        context.add_ref(self)

    _REFS = (('QP', 'qps'), ('SRQ', 'srqs'))

    def add_ref(self, obj):
        keep_ref(self, obj, self._REFS)

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing CQ')
        close_weakrefs([self.qps, self.srqs])
        if self.num_events:
            self.ack_events(self.num_events)
        engine_call(self._nic, 'Failed to close CQ', self._nic.dev.destroy_cq, self._ecq)
        self._closed = True
        if self.channel is not None:
            self.channel.cqs.discard(self)
        self.context = None
        self.channel = None

    def _check(self):
        if self._closed:
            raise PyverbsError('CQ is closed')

    def _poll(self, n):
        nic = self._nic
        nic.poll(POLL_RUNS, reads=True)
        try:
            with nic.lock:
                got = nic.dev.poll_cq(self._ecq, n)
        except VerbsError as ex:
            raise PyverbsRDMAError(f'Failed to poll CQ: {ex.message}', ex.errno) from None
        if not got:
            _idle(nic)
        return got

    @property
    def engine_cq(self):
        """softnic's own (pyverbs has no such attribute): the engine's CQ behind
        this one (``softnic.core.cq.CQ``), for a driver that watches its entries
        itself (the virtual cluster's scheduler)."""
        return self._ecq

    def wait(self, timeout):
        """softnic's own (pyverbs has no such call; the collectives use it on softnic's
        devices): block until this CQ holds a
        completion (or has overflowed or closed), at most ``timeout`` seconds.  The
        caller's thread moves the device meanwhile as its progress thread would
        (every datagram that waits, acknowledgements every half window) and sleeps
        on the device's socket between datagrams, instead of spinning on ``poll``,
        whose inline step takes one datagram or run per call.  True if it holds
        one."""
        self._check()
        ecq = self._ecq
        return self._nic.wait_until(lambda: bool(ecq.entries) or ecq.overflowed or ecq.closed,
                                    timeout=timeout)

    def req_notify(self, solicited_only=False):
        """Arm the CQ: the next completion (the next solicited one, if asked) raises an
        event on its channel."""
        self._check()
        with self._nic.lock:
            self._ecq.req_notify(bool(solicited_only))

    def ack_events(self, num_events):
        self.num_events -= num_events

    @property
    def comp_channel(self):
        return self.channel

    @property
    def cqe(self):
        return self._ecq.depth

    def resize(self, cqe):
        """ibv_resize_cq: at least as deep as what it holds, at most the device's max_cqe."""
        self._check()
        with self._nic.lock:
            if not len(self._ecq.entries) <= cqe <= self._nic.dev.config.max_cqe or cqe < 1:
                raise rdma_error(f'Failed to resize CQ to {cqe} entries')
            self._ecq.depth = cqe

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return 'CQ\n' + f.format('Handle', self._ecq.handle) + f.format('CQEs', self._ecq.depth)


class CQ(_CQBase):
    _kind = 'CQ'

    def __init__(self, context, cqe, cq_context=None, channel=None, comp_vector=0):
        """A CQ of ``cqe`` entries on ``context``; with ``channel``, its events go there."""
        super().__init__()
        self.cq_context = cq_context
        self._create(context, cqe, channel, comp_vector)

    def poll(self, num_entries=1):
        """Take up to ``num_entries`` completions: returns (npolled, [WC, ...])."""
        self._check()
        wcs = [_to_wc(w) for w in self._poll(num_entries)]
        return len(wcs), wcs


class CqInitAttrEx(PyverbsObject):
    def __init__(self, cqe=100, channel=None, comp_vector=0, wc_flags=0, comp_mask=0, flags=0,
                 parent_domain=None):
        super().__init__()
        self.parent_domain = parent_domain
        self.cqe = cqe
        self.comp_channel = channel
        self.comp_vector = comp_vector
        self.wc_flags = wc_flags
        self.comp_mask = comp_mask
        self.flags = flags
        self.cq_context = None


class CQEX(_CQBase):
    """An extended CQ, read with start_poll / poll_next / end_poll and read_*()."""

    _kind = 'CQEX'

    def __init__(self, context, init_attr=None):
        super().__init__()
        if init_attr is None:
            init_attr = CqInitAttrEx()
        # as rxe (and the C face): fields softnic's completions never carry are refused
        if init_attr.wc_flags & (e.IBV_WC_EX_WITH_CVLAN | e.IBV_WC_EX_WITH_FLOW_TAG |
                                 e.IBV_WC_EX_WITH_TM_INFO):
            self._closed = True
            raise rdma_error('Failed to create extended CQ', errno.EOPNOTSUPP)
        self.wc_flags = init_attr.wc_flags
        self._cur = None
        self._create(context, init_attr.cqe, init_attr.comp_channel, init_attr.comp_vector)
        pd = getattr(init_attr, 'parent_domain', None)
        if pd is not None and init_attr.comp_mask & e.IBV_CQ_INIT_ATTR_MASK_PD:
            if 'ParentDomain' not in kinds(pd) or pd._closed:
                self.close()
                raise rdma_error('Failed to create extended CQ: parent_domain is not an open '
                                 'parent domain')
            self.parent_domain = pd
            pd.add_ref(self)

    def _next(self):
        self._check()
        got = self._poll(1)
        if not got:
            self._cur = None
            return errno.ENOENT
        self._cur = got[0]
        return 0

    def start_poll(self, attr=None):
        """0 and the first completion, or ENOENT if there is none."""
        return self._next()

    def poll_next(self):
        return self._next()

    def end_poll(self):
        self._cur = None

    def _wc(self):
        if self._cur is None:
            raise PyverbsUserError('No completion: start_poll() / poll_next() first')
        return self._cur

    @property
    def status(self):
        return int(self._wc().status)

    @status.setter
    def status(self, val):
        self._wc().status = val

    @property
    def wr_id(self):
        return self._wc().wr_id

    @wr_id.setter
    def wr_id(self, val):
        self._wc().wr_id = val

    def read_opcode(self):
        return int(self._wc().opcode)

    def read_vendor_err(self):
        return self._wc().vendor_err

    def read_byte_len(self):
        return self._wc().byte_len

    def read_imm_data(self):
        return _imm(self._wc())

    def read_qp_num(self):
        return self._wc().qp_num

    def read_src_qp(self):
        return self._wc().src_qp

    def read_wc_flags(self):
        return int(self._wc().wc_flags)

    def read_slid(self):
        return self._wc().slid

    def read_sl(self):
        return self._wc().sl

    def read_dlid_path_bits(self):
        return self._wc().dlid_path_bits

    def read_timestamp(self):
        return 0

    def read_cvlan(self):
        return 0

    def read_flow_tag(self):
        return 0

    def read_tm_info(self):
        return WcTmInfo()

    def read_completion_wallclock_ns(self):
        return 0


class WC(PyverbsObject):
    """ibv_wc.  ``imm_data`` is in network byte order (as ibv_wc holds it); with
    IBV_WC_WITH_INV it holds the invalidated rkey instead."""
    def __init__(self, wr_id=0, status=0, opcode=0, vendor_err=0, byte_len=0, qp_num=0,
                 src_qp=0, imm_data=0, wc_flags=0, pkey_index=0, slid=0, sl=0,
                 dlid_path_bits=0):
        self.wr_id = wr_id
        self.status = status
        self.opcode = opcode
        self.vendor_err = vendor_err
        self.byte_len = byte_len
        self.qp_num = qp_num
        self.src_qp = src_qp
        self.imm_data = imm_data
        self.wc_flags = wc_flags
        self.pkey_index = pkey_index
        self.slid = slid
        self.sl = sl
        self.dlid_path_bits = dlid_path_bits

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('WR ID', self.wr_id) + f.format('status', cqe_status_to_str(self.status))
                + f.format('opcode', cqe_opcode_to_str(self.opcode))
                + f.format('vendor error', self.vendor_err) + f.format('byte length', self.byte_len)
                + f.format('QP num', self.qp_num) + f.format('source QP', self.src_qp)
                + f.format('WC flags', cqe_flags_to_str(self.wc_flags))
                + f.format('pkey index', self.pkey_index) + f.format('slid', self.slid)
                + f.format('sl', self.sl) + f.format('imm_data', self.imm_data)
                + f.format('dlid path bits', self.dlid_path_bits))


def _imm(w) -> int:
    flags = int(w.wc_flags)
    if flags & _WITH_INV:
        return w.invalidated_rkey
    if flags & _WITH_IMM:
        return socket.htonl(w.imm_data & 0xFFFFFFFF)
    return 0


def _to_wc(w) -> WC:
    return WC(w.wr_id, int(w.status), int(w.opcode), w.vendor_err, w.byte_len, w.qp_num,
              w.src_qp, _imm(w), int(w.wc_flags), w.pkey_index, w.slid, w.sl, w.dlid_path_bits)


class PollCqAttr(PyverbsObject):
    def __init__(self):
        super().__init__()
        self.comp_mask = 0


class WcTmInfo(PyverbsObject):
    def __init__(self):
        super().__init__()
        self.tag = 0
        self.priv = 0


def cqe_status_to_str(status):
    names = ('success', 'local length error', 'local QP op error', 'local EEC op error',
             'local protection error', 'WR flush error', 'memory window bind error',
             'bad response error', 'local access error', 'remote invalidate request error',
             'remote access error', 'remote op error', 'retry exceeded error',
             'RNR retry exceeded', 'local RDD violation error',
             'remote invalidate RD request error', 'remote abort error',
             'invalidate EECN error', 'invalidate EEC state error', 'WC fatal error',
             'response timeout error', 'general error')
    return names[status] if 0 <= status < len(names) else 'Unknown CQE status'


def cqe_opcode_to_str(opcode):
    names = {0x0: 'Send', 0x1: 'RDMA write', 0x2: 'RDMA read', 0x3: 'Compare and swap',
             0x4: 'Fetch and add', 0x5: 'Bind Memory window', 0x6: 'Local invalidate',
             0x7: 'TSO', 0x80: 'Receive', 0x81: 'Receive RDMA with immediate',
             0x82: 'Tag matching - add', 0x83: 'Tag matching - delete',
             0x84: 'Tag matching - sync', 0x85: 'Tag matching - receive',
             0x86: 'Tag matching - no tag'}
    return names.get(opcode, f'Unknown CQE opcode {opcode}')


def flags_to_str(flags, dictionary):
    return ''.join(f'{n} ' for f, n in dictionary.items() if flags & f)


def cqe_flags_to_str(flags):
    return flags_to_str(flags, {1: 'GRH', 2: 'With immediate', 4: 'IP csum OK',
                                8: 'With invalidate', 16: 'TM sync request', 32: 'TM match',
                                64: 'TM data valid'})


def create_wc_flags_to_str(flags):
    return flags_to_str(flags, {m.value: m.name for m in e.ibv_create_cq_wc_flags})
