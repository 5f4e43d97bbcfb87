"""Protection domains (``pyverbs.pd``)."""

from __future__ import annotations

import errno
import weakref

from . import enums as e
from .base import PyverbsCM, PyverbsObject, close_weakrefs, engine_call, keep_ref
from .pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError


class PD(PyverbsCM):
    _kind = 'PD'
    _is_imported = False       # made by PD(handle=...) / MR(handle=...)

    def __init__(self, creator, **kwargs):
        """A protection domain on ``creator``, an open Context; ``handle=``: the PD of
        that handle in a context sharing creator's command file, imported (ibv_import_pd)."""
        super().__init__()
        self._closed = True
        self._is_imported = False
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
        handle = kwargs.get('handle')
        if handle is not None:
            self._epd = creator._imported('PD', handle, 'PD')._epd
            self._is_imported = True
        else:
            self._epd = engine_call(self._nic, 'Failed to allocate PD', self._nic.dev.alloc_pd)
            creator._share('PD', self._epd.handle, self)
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
        if not self._is_imported:        # an imported PD is its creator's to deallocate
            engine_call(self._nic, 'Failed to dealloc PD', self._nic.dev.dealloc_pd, self._epd)
        self._closed = True
        self.ctx = None

    def unimport(self):
        """ibv_unimport_pd: let this import go (the PD stays its creator's)."""
        self.close()

    def _check(self):
        if self._closed:
            raise PyverbsError('PD is closed')

    _REFS = (('MR', 'mrs'), ('MW', 'mws'), ('AH', 'ahs'), ('QP', 'qps'), ('SRQ', 'srqs'))

    def add_ref(self, obj):
        keep_ref(self, obj, self._REFS)

    def remove_ref(self, obj):
        for s in (self.mrs, self.mws, self.ahs, self.qps, self.srqs):
            s.discard(obj)

    def advise_mr(self, advice, flags, sg_list):
        """ibv_advise_mr: prefetch has nothing to do (the memory is this process's own and
        never pinned); each SGE must still name an MR of this PD that covers it."""
        self._check()
        if advice not in (e._IBV_ADVISE_MR_ADVICE_PREFETCH,
                          e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                          e._IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT):
            raise PyverbsRDMAError('Advise MR failed', errno.EOPNOTSUPP)
        if flags & ~e._IBV_ADVISE_MR_FLAG_FLUSH:
            raise PyverbsRDMAError('Advise MR failed', errno.EINVAL)
        keys = self._nic.dev.keys
        for sge in sg_list:
            mr = keys.lookup(sge.lkey)
            if mr is None or mr.pd is not self._epd or not mr.valid or \
                    sge.addr < mr.addr or sge.addr + sge.length > mr.addr + mr.length:
                raise PyverbsRDMAError('Advise MR failed', errno.EINVAL)

    @property
    def handle(self):
        return self._epd.handle


class ParentDomainContext(PyverbsObject):
    """The allocators of a parent domain: ``alloc_func(pd, context, size, alignment,
    resource_type)`` and ``free_func(pd, context, ptr, resource_type)``, with ``user_data``."""

    def __init__(self, pd, alloc_func, free_func, user_data=None):
        super().__init__()
        self.pd, self.user_data = pd, user_data
        self.p_alloc, self.p_free = alloc_func, free_func


class ParentDomainInitAttr(PyverbsObject):
    def __init__(self, pd, pd_context=None, comp_mask=0):
        super().__init__()
        self.pd, self.pd_context = pd, pd_context
        self.comp_mask = comp_mask | (0 if pd_context is None else
                                      e.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
                                      e.IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)


class ParentDomain(PD):
    """ibv_alloc_parent_domain: a PD that stands for ``attr.pd`` (objects made on it are in
    that protection domain) and carries allocators for the provider's queue buffers.

    softnic keeps its work queues and completion queues inside the engine, not in
    user memory, so it has no buffer to ask the allocators for (as a provider with no
    such buffer, it never calls them); everything else behaves as on ``attr.pd``.
    """

    _kind = 'ParentDomain'

    def __init__(self, context, attr):
        PyverbsCM.__init__(self)
        self._closed = True
        from .device import Context
        if not isinstance(context, Context) or attr is None or not isinstance(attr.pd, PD):
            raise PyverbsUserError('ParentDomain needs a Context and a ParentDomainInitAttr '
                                   'with a PD')
        context._check()
        attr.pd._check()
        if attr.comp_mask & e.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOW_CC_UNPROTECTED_ALLOC:
            # memory shared with the host of a confidential guest: softnic's memory is
            # this process's own, it has none of another kind to offer
            raise PyverbsRDMAError('Failed to allocate Parent Domain', errno.EOPNOTSUPP)
        if attr.comp_mask & ~(e.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
                              e.IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT):
            raise PyverbsRDMAError('Failed to allocate Parent Domain', errno.EINVAL)
        self.protection_domain = attr.pd
        self.pd_context = attr.pd_context
        self._nic, self._epd = attr.pd._nic, attr.pd._epd
        self.ctx = context
        self.srqs, self.mrs, self.mws = weakref.WeakSet(), weakref.WeakSet(), weakref.WeakSet()
        self.ahs, self.qps = weakref.WeakSet(), weakref.WeakSet()
        self.parent_domains, self.cqs = weakref.WeakSet(), weakref.WeakSet()
        self._closed = False
        attr.pd.parent_domains.add(self)
        self.logger.debug('PD: Allocated ibv_parent_domain')

    _REFS = (('CQEX', 'cqs'),) + PD._REFS

    def add_ref(self, obj):
        keep_ref(self, obj, self._REFS)

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing ParentDomain')
        close_weakrefs([self.cqs, self.qps, self.ahs, self.mws, self.mrs, self.srqs])
        self._closed = True         # the engine PD belongs to attr.pd
        self.ctx = None
