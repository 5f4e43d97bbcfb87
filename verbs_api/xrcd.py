"""XRC domains (``pyverbs.xrcd``).

``XRCD(context, XRCDInitAttr(comp_mask, oflags, fd))`` opens an XRC domain.  With a file
descriptor (IBV_XRCD_INIT_ATTR_FD), the domain is the one that file names on this device:
opening it again through any descriptor of the same file gives the same domain (O_CREAT
creates it when there is none, O_EXCL refuses one that exists), as ibv_open_xrcd shares
domains between the processes of one host; softnic's devices belong to one process, so the
sharing is among the openers within it.
"""

from __future__ import annotations

import errno
import os
import weakref

from softnic.core import xrc as _xrc

from . import enums as e
from .base import PyverbsCM, PyverbsObject, engine_call
from .pyverbs_error import PyverbsError, PyverbsRDMAError

_BY_FILE: dict = {}     # (device name, st_dev, st_ino) -> [engine XRCD, openers]


class XRCDInitAttr(PyverbsObject):
    def __init__(self, comp_mask, oflags, fd):
        super().__init__()
        self.comp_mask, self.oflags, self.fd = comp_mask, oflags, fd


class XRCD(PyverbsCM):
    def __init__(self, context, init_attr):
        super().__init__()
        self._closed = True
        context._check()
        self._nic = context._nic
        self._key = None
        fd = init_attr.fd if init_attr.comp_mask & e.IBV_XRCD_INIT_ATTR_FD else -1
        oflags = init_attr.oflags if init_attr.comp_mask & e.IBV_XRCD_INIT_ATTR_OFLAGS else 0
        if init_attr.comp_mask & ~(e.IBV_XRCD_INIT_ATTR_FD | e.IBV_XRCD_INIT_ATTR_OFLAGS):
            raise PyverbsRDMAError('Failed to allocate XRCD', errno.EINVAL)
        if fd != -1:
            try:
                st = os.fstat(fd)
            except OSError as ex:
                raise PyverbsRDMAError('Failed to allocate XRCD', ex.errno) from None
            self._key = (context.name, st.st_dev, st.st_ino)
            shared = _BY_FILE.get(self._key)
            if shared is not None:
                if oflags & os.O_EXCL:
                    raise PyverbsRDMAError('Failed to allocate XRCD', errno.EEXIST)
                shared[1] += 1
                self._exrcd = shared[0]
            elif not oflags & os.O_CREAT:
                raise PyverbsRDMAError('Failed to allocate XRCD', errno.ENOENT)
        if fd == -1 or self._key not in _BY_FILE:
            self._exrcd = engine_call(self._nic, 'Failed to allocate XRCD', _xrc.open_xrcd,
                                      self._nic.dev)
            if self._key is not None:
                _BY_FILE[self._key] = [self._exrcd, 1]
        self.ctx = context
        self.srqs = weakref.WeakSet()
        self.qps = weakref.WeakSet()
        self._closed = False
        context.xrcds.add(self)

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing XRCD')
        for objs in (self.qps, self.srqs):
            for o in list(objs):
                o.close()
        self._closed = True
        if self._key is not None:
            shared = _BY_FILE.get(self._key)
            if shared is not None:
                shared[1] -= 1
                if shared[1] > 0:
                    return
                del _BY_FILE[self._key]
        engine_call(self._nic, 'Failed to dealloc XRCD', _xrc.close_xrcd, self._nic.dev,
                    self._exrcd)

    def _check(self):
        if self._closed:
            raise PyverbsError('XRCD is closed')

    def add_ref(self, obj):
        from .qp import QP
        (self.qps if isinstance(obj, QP) else self.srqs).add(obj)

    @property
    def handle(self):
        return self._exrcd.handle
