"""Protection domains (``pyverbs.pd``)."""

from __future__ import annotations

import errno
import weakref

from .base import PyverbsCM, close_weakrefs, engine_call
from .pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError


class PD(PyverbsCM):
    def __init__(self, creator):
        """A protection domain on ``creator``, an open Context."""
        super().__init__()
        self._closed = True
        from .device import Context
        if creator is None:
            raise PyverbsUserError('Cannot create PD from None')
        if not isinstance(creator, Context):
            if type(creator).__name__ == 'CMID':
                raise PyverbsRDMAError('PD from a CMID is not supported by softnic',
                                       errno.EOPNOTSUPP)
            raise PyverbsUserError(f'Cannot create PD from {type(creator)}')
        creator._check()
        self._nic = creator._nic
        self._epd = engine_call(self._nic, 'Failed to allocate PD', self._nic.dev.alloc_pd)
        self.ctx = creator
        self.srqs = weakref.WeakSet()
        self.mrs = weakref.WeakSet()
        self.mws = weakref.WeakSet()
        self.ahs = weakref.WeakSet()
        self.qps = weakref.WeakSet()
        self.parent_domains = weakref.WeakSet()
        self._closed = False
        creator.add_ref(self)
        self.logger.debug('PD: Allocated ibv_pd')

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing PD')
        close_weakrefs([self.parent_domains, self.qps, self.ahs, self.mws, self.mrs, self.srqs])
        engine_call(self._nic, 'Failed to dealloc PD', self._nic.dev.dealloc_pd, self._epd)
        self._closed = True
        self.ctx = None

    def _check(self):
        if self._closed:
            raise PyverbsError('PD is closed')

    def add_ref(self, obj):
        from .addr import AH
        from .mr import MR, MW
        from .qp import QP
        from .srq import SRQ
        if isinstance(obj, MR):
            self.mrs.add(obj)
        elif isinstance(obj, MW):
            self.mws.add(obj)
        elif isinstance(obj, AH):
            self.ahs.add(obj)
        elif isinstance(obj, QP):
            self.qps.add(obj)
        elif isinstance(obj, SRQ):
            self.srqs.add(obj)
        else:
            raise PyverbsError('Unrecognized object type')

    def remove_ref(self, obj):
        for s in (self.mrs, self.mws, self.ahs, self.qps, self.srqs):
            s.discard(obj)

    @property
    def handle(self):
        return self._epd.handle
