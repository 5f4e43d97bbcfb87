"""XRC domains (``pyverbs.xrcd``)."""

from __future__ import annotations

import errno

from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError


class XRCDInitAttr(PyverbsObject):
    def __init__(self, comp_mask, oflags, fd):
        super().__init__()
        self.comp_mask, self.oflags, self.fd = comp_mask, oflags, fd


class XRCD(PyverbsCM):
    def __init__(self, context, init_attr):
        super().__init__()
        self._closed = True
        raise PyverbsRDMAError('Failed to allocate XRCD', errno.EOPNOTSUPP)
