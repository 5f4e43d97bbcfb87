"""Scatter/gather elements and work requests (``pyverbs.wr``).

A work request copies its SGEs when it is made (as pyverbs copies them into
the C struct).  ``imm_data`` is the 32-bit immediate in network byte order,
as in ``struct ibv_send_wr`` (so ``socket.htonl(x)`` sends the value x); for
the *_INV opcodes the same field holds the rkey to invalidate.
"""

from __future__ import annotations

import ctypes
import socket

from softnic.core.qp import RecvWR as _EngineRecvWR, SendWR as _EngineSendWR

from . import enums as e
from .base import PyverbsCM
from .pyverbs_error import PyverbsUserError

_INV_OPCODES = (e.IBV_WR_SEND_WITH_INV, e.IBV_WR_LOCAL_INV)
_ATOMIC_OPCODES = (e.IBV_WR_ATOMIC_CMP_AND_SWP, e.IBV_WR_ATOMIC_FETCH_AND_ADD)


class SGE(PyverbsCM):
    """ibv_sge: an address, a length and the lkey of the MR that covers it."""
    def __init__(self, addr, length, lkey):
        self.addr = addr
        self.length = length
        self.lkey = lkey

    def close(self):
        pass

    def __del__(self):
        pass

    def read(self, length, offset):
        """``length`` bytes at the SGE's address + ``offset``."""
        return ctypes.string_at(self.addr + offset, length)

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('Address', hex(self.addr)) + f.format('Length', self.length) +
                f.format('Key', hex(self.lkey)))


def _copy_sges(sg, num_sge):
    if num_sge < 0:
        raise PyverbsUserError(f'Invalid num_sge {num_sge}')
    if num_sge == 0:
        return []
    if sg is None:
        raise PyverbsUserError('A WR needs at least one SGE')
    sg = list(sg)
    if len(sg) < num_sge:
        raise PyverbsUserError(f'num_sge is {num_sge} but only {len(sg)} SGEs were given')
    return [(s.addr, s.length, s.lkey) for s in sg[:num_sge]]


class RecvWR(PyverbsCM):
    def __init__(self, wr_id=0, num_sge=0, sg=None, next_wr=None):
        self._sges = _copy_sges(sg, num_sge)
        self.num_sge = num_sge
        self.wr_id = wr_id
        self._next = next_wr

    def close(self):
        pass

    def __del__(self):
        pass

    @property
    def next_wr(self):
        return self._next

    @next_wr.setter
    def next_wr(self, val):
        if val is None:
            raise TypeError('next_wr must be a RecvWR')
        self._next = val

    @property
    def sg_list(self):
        raise AttributeError('sg_list can only be set')

    @sg_list.setter
    def sg_list(self, val):
        self._sges = [(val.addr, val.length, val.lkey)]

    def _engine(self):
        return _EngineRecvWR(self.wr_id, self._sges[:self.num_sge])

    def _copy_from(self, other):
        self._sges, self.num_sge, self.wr_id = list(other._sges), other.num_sge, other.wr_id
        self._next = other._next

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return f.format('WR ID', self.wr_id) + f.format('Num SGE', self.num_sge)


class SendWR(PyverbsCM):
    def __init__(self, wr_id=0, opcode=e.IBV_WR_SEND, num_sge=0, imm_data=0, sg=None,
                 send_flags=e.IBV_SEND_SIGNALED, next_wr=None):
        if isinstance(imm_data, (list, tuple)):
            # called positionally in the older order (wr_id, opcode, num_sge, sg, send_flags,
            # next_wr), before imm_data had a parameter of its own
            next_wr = send_flags if isinstance(send_flags, SendWR) else next_wr
            send_flags = sg if sg is not None else e.IBV_SEND_SIGNALED
            imm_data, sg = 0, imm_data
        self._sges = _copy_sges(sg, num_sge)
        self.num_sge = num_sge
        self.wr_id = wr_id
        self.opcode = opcode
        self.send_flags = send_flags
        self.imm_data = imm_data
        self._next = next_wr
        self._rdma = (0, 0)                 # remote_addr, rkey
        self._atomic = (0, 0, 0, 0)         # remote_addr, rkey, compare_add, swap
        self._ud = None                     # (AH, remote_qpn, remote_qkey)
        self._bind = None                   # (MW, new rkey, MWBindInfo)
        self._xrc_srqn = 0                  # XRC: the remote XRC SRQ number

    def close(self):
        pass

    def __del__(self):
        pass

    @property
    def next_wr(self):
        return self._next

    @next_wr.setter
    def next_wr(self, val):
        if val is None:
            raise TypeError('next_wr must be a SendWR')
        self._next = val

    @property
    def sg_list(self):
        raise AttributeError('sg_list can only be set')

    @sg_list.setter
    def sg_list(self, val):
        self._sges = [(val.addr, val.length, val.lkey)]

    def set_wr_ud(self, ah, rqpn, rqkey):
        """Address a UD send: the AH, the remote QP number and its Q_Key."""
        if ah is None:
            raise TypeError('set_wr_ud needs an AH')
        self._ud = (ah, rqpn, rqkey)

    def set_wr_rdma(self, rkey, addr):
        """Remote address and rkey of an RDMA WRITE / READ."""
        self._rdma = (addr, rkey)

    def set_wr_atomic(self, rkey, addr, compare_add, swap=0):
        """Remote address, rkey and operands of an atomic (compare_add is the add
        value for FETCH_AND_ADD, the compare value for CMP_AND_SWP)."""
        self._atomic = (addr, rkey, compare_add, swap)

    def set_bind_wr(self, mw, bind_info):
        """The window and range an IBV_WR_BIND_MW binds; the new rkey is the window's
        with the next key byte (``rkey`` reads it)."""
        from .base import inc_rkey
        self._bind = (mw, inc_rkey(mw.rkey), bind_info)

    @property
    def rkey(self):
        return self._bind[1] if self._bind is not None else 0

    def set_qp_type_xrc(self, remote_srqn):
        self._xrc_srqn = remote_srqn

    def _engine(self):
        op = self.opcode
        imm = inv = 0
        if op in _INV_OPCODES:
            inv = self.imm_data & 0xFFFFFFFF
        else:
            imm = socket.ntohl(self.imm_data & 0xFFFFFFFF)
        if op in _ATOMIC_OPCODES:
            raddr, rkey, cmp_add, swap = self._atomic
        else:
            (raddr, rkey), cmp_add, swap = self._rdma, 0, 0
        ah = qpn = qkey = None
        if self._ud is not None:
            ah_obj, qpn, qkey = self._ud
            ah = ah_obj._engine
        bind = None
        if op == e.IBV_WR_BIND_MW and self._bind is not None:
            mw, new_rkey, info = self._bind
            bind = info._engine(mw, new_rkey)
        return _EngineSendWR(self.wr_id, op, self._sges[:self.num_sge], self.send_flags,
                             imm_data=imm, invalidate_rkey=inv, remote_addr=raddr, rkey=rkey,
                             compare_add=cmp_add, swap=swap, ah=ah, remote_qpn=qpn or 0,
                             remote_qkey=qkey or 0, bind=bind, xrc_srqn=self._xrc_srqn)

    def _copy_from(self, other):
        self.__dict__.update({k: v for k, v in other.__dict__.items() if k != '_logger'})

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('WR ID', self.wr_id) + f.format('Num SGE', self.num_sge) +
                f.format('Opcode', self.opcode) +
                f.format('Send flags', send_flags_to_str(self.send_flags)))


def send_flags_to_str(flags):
    names = {e.IBV_SEND_FENCE: 'IBV_SEND_FENCE', e.IBV_SEND_SIGNALED: 'IBV_SEND_SIGNALED',
             e.IBV_SEND_SOLICITED: 'IBV_SEND_SOLICITED', e.IBV_SEND_INLINE: 'IBV_SEND_INLINE',
             e.IBV_SEND_IP_CSUM: 'IBV_SEND_IP_CSUM'}
    return ''.join(f'{n} ' for f, n in names.items() if flags & f)
