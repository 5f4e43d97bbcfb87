"""Memory regions (``pyverbs.mr``).

``MR(pd, length, access)`` allocates page-aligned, zeroed memory of this
process (libc posix_memalign, as pyverbs does) and registers it; ``buf`` is
its real address, usable in SGEs and as a remote address.  With
``address=`` the caller's memory is registered instead and is not freed on
close.  Registration is checked as the kernel checks it: REMOTE_WRITE or
REMOTE_ATOMIC without LOCAL_WRITE is EINVAL.
"""

from __future__ import annotations

import ctypes
import errno
import resource

from . import enums as e
from . import mem_alloc
from .base import PyverbsCM, PyverbsObject, engine_call
from .pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError

HUGE_PAGE_SIZE = 0x200000


class MR(PyverbsCM):
    _kind = 'MR'
    _is_imported = False       # made by PD(handle=...) / MR(handle=...)

    def __init__(self, creator, length=0, access=0, address=None, implicit=False, **kwargs):
        super().__init__()
        self._closed = True
        self._buf = 0
        self._owned = None                  # ('free', addr) or ('munmap', addr, len)
        self._emr = None
        from .pd import PD
        if creator is None:
            raise PyverbsUserError('MR needs a PD')
        if not isinstance(creator, PD):
            raise PyverbsRDMAError(f'MR on a {type(creator).__name__} is not supported by softnic',
                                   errno.EOPNOTSUPP)
        creator._check()
        self._is_imported = False
        self.is_huge = bool(access & e.IBV_ACCESS_HUGETLB)
        self.is_user_addr = bool(address)
        if address:
            self._buf = int(address)
        if kwargs.get('handle') is not None:
            # ibv_import_mr: the MR of that handle in a context sharing the PD's command
            # file; its keys and length are the MR's, its address NULL unless given
            self._emr = creator.ctx._imported('MR', kwargs['handle'], 'MR')._emr
            self._is_imported = True
            self._length = self._emr.length
            self._nic = creator._nic
            self.pd = creator
            self._closed = False
            creator.add_ref(self)
            return
        if not address and length > 0:
            self._buf = self._allocate(length)
        self._length = length
        self._nic = creator._nic
        try:
            msg = f'Failed to register a MR. length: {length}, access flags: {access}'
            if implicit:      # ibv_reg_mr(pd, NULL, SIZE_MAX, access): the whole address space
                self._emr = engine_call(self._nic, msg, self._nic.dev.keys.register_implicit,
                                        creator._epd, int(access))
            else:
                self._emr = engine_call(
                    self._nic, msg, self._nic.dev.reg_mr, creator._epd, self._buf, length,
                    int(access) & ~int(e.IBV_ACCESS_ON_DEMAND))  # never pinned: always ODP
        except PyverbsRDMAError:
            self._release_buffer()
            raise
        self.pd = creator
        self._closed = False
        creator.add_ref(self)
        creator.ctx._share('MR', self.handle, self)
        self.logger.debug(f'Registered ibv_mr. Length: {length}, access flags {access}')

    def _allocate(self, length):
        if self.is_huge:
            n = -(-length // HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE
            try:
                addr = mem_alloc.mmap(length=n, flags=mem_alloc.MAP_PRIVATE_ |
                                      mem_alloc.MAP_ANONYMOUS_ | mem_alloc.MAP_HUGETLB_, fd=-1)
                self._owned = ('munmap', addr, n)
                ctypes.memset(addr, 0, length)
                return addr
            except MemoryError:
                pass                        # no huge pages here: ordinary pages serve
        try:
            addr = mem_alloc.posix_memalign(length, resource.getpagesize())
        except MemoryError:
            raise PyverbsError(f'Failed to allocate MR buffer of size {length}') from None
        self._owned = ('free', addr)
        return addr

    def _release_buffer(self):
        owned, self._owned = self._owned, None
        if owned is None:
            return
        if owned[0] == 'free':
            mem_alloc.free(owned[1])
        else:
            mem_alloc.munmap(owned[1], owned[2])

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing MR')
        self._closed = True
        if not self._is_imported:        # an imported MR is its creator's to deregister
            engine_call(self._nic, 'Failed to dereg MR', self._nic.dev.dereg_mr, self._emr)
        self._release_buffer()
        self._buf = 0
        self.pd = None

    def unimport(self):
        """ibv_unimport_mr: let this import go (the MR stays its creator's)."""
        self.close()

    def _range(self, length, offset, what):
        if self._closed or not self._buf or length < 0:
            raise PyverbsUserError(f"The MR buffer isn't allocated or length {length} is invalid")
        if offset < 0:
            raise PyverbsUserError(f'Invalid offset {offset}')
        if self._owned is not None and offset + length > self._length:
            raise PyverbsUserError(f'{what} of {length} bytes at offset {offset} is outside '
                                   f'the MR buffer of {self._length} bytes')

    def write(self, data, length, offset=0):
        """Copy ``length`` bytes of ``data`` (bytes or str) into the buffer at ``offset``."""
        if isinstance(data, str):
            data = data.encode()
        self._range(length, offset, 'Write')
        data = bytes(memoryview(data).cast('B')[:length])
        ctypes.memmove(self._buf + offset, data, len(data))

    def read(self, length, offset):
        """``length`` bytes of the buffer from ``offset``."""
        self._range(length, offset, 'Read')
        return ctypes.string_at(self._buf + offset, length)

    def rereg(self, flags, pd=None, addr=0, length=0, access=0):
        """ibv_rereg_mr: change the translation, the PD and/or the access in place (the
        lkey and rkey stay)."""
        if self._closed:
            raise PyverbsError('MR is closed')
        if flags & e.IBV_REREG_MR_CHANGE_PD:
            from .pd import PD
            if not isinstance(pd, PD) or pd._closed:
                raise PyverbsRDMAError('Failed to rereg MR: IBV_REREG_MR_ERR_INPUT',
                                       errno.EINVAL)
        engine_call(self._nic, 'Failed to rereg MR: IBV_REREG_MR_ERR_INPUT',
                    self._nic.dev.keys.rereg, self._emr, int(flags),
                    pd._epd if pd is not None else None, int(addr), int(length), int(access))
        if flags & e.IBV_REREG_MR_CHANGE_TRANSLATION:
            self._release_buffer()
            self._buf = int(addr)
            self._length = int(length)
            self.is_user_addr = True
        if flags & e.IBV_REREG_MR_CHANGE_PD:
            self.pd.remove_ref(self)
            self.pd = pd
            pd.add_ref(self)

    @property
    def buf(self):
        return self._buf

    @property
    def lkey(self):
        return self._emr.lkey

    @property
    def rkey(self):
        return self._emr.rkey

    @property
    def length(self):
        return self._length

    @property
    def handle(self):
        return self._emr.lkey >> 8

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return ('MR\n' + f.format('lkey', self.lkey) + f.format('rkey', self.rkey) +
                f.format('length', self.length) + f.format('buf', self.buf) +
                f.format('handle', self.handle))


class MWBindInfo(PyverbsCM):
    def __init__(self, mr, addr, length, mw_access_flags):
        super().__init__()
        self.mr = mr
        self._addr, self._length, self._flags = addr, length, mw_access_flags

    def _engine(self, mw, new_rkey):
        from softnic.core.memory import MWBind as _EngineBind
        lkey = self.mr.lkey if self.mr is not None else 0
        return _EngineBind(mw_rkey=mw.rkey, rkey=new_rkey, mr_lkey=lkey, addr=int(self._addr),
                           length=int(self._length), access=int(self._flags))

    @property
    def mw_access_flags(self):
        return self._flags

    @property
    def length(self):
        return self._length

    @property
    def addr(self):
        return self._addr


class MWBind(PyverbsCM):
    def __init__(self, info, send_flags, wr_id=0):
        super().__init__()
        self.info, self.send_flags, self.wr_id = info, send_flags, wr_id


class MW(PyverbsCM):
    """A memory window of type 1 (bound with QP.bind_mw) or 2 (bound by an IBV_WR_BIND_MW
    work request, freed by LOCAL_INV or SEND_WITH_INV)."""

    _kind = 'MW'

    def __init__(self, pd, mw_type):
        super().__init__()
        self._closed = True
        from .pd import PD
        if not isinstance(pd, PD):
            raise PyverbsUserError('MW needs a PD')
        pd._check()
        self._nic = pd._nic
        self._emw = engine_call(self._nic, 'Failed to allocate MW',
                                self._nic.dev.keys.alloc_mw, pd._epd, int(mw_type))
        self._rkey = self._emw.rkey          # the rkey as the consumer knows it (struct ibv_mw)
        self._type = int(mw_type)
        self.pd = pd
        self._closed = False
        pd.add_ref(self)
        self.logger.debug(f'Allocated memory window of type {mwtype2str(mw_type)}')

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing MW')
        self._closed = True
        engine_call(self._nic, 'Failed to dealloc MW', self._nic.dev.keys.dealloc_mw, self._emw)
        self.pd = None

    @property
    def handle(self):
        return self._emw.rkey >> 8

    @property
    def rkey(self):
        return self._rkey

    @property
    def type(self):
        return self._type

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return ('MW:\n' + f.format('Rkey', self.rkey) + f.format('Handle', self.handle) +
                f.format('MW Type', mwtype2str(self.type)))


class DMMR(MR):
    """ibv_reg_dm_mr: an MR over ``length`` bytes of device memory from ``offset``,
    zero-based (``buf`` is 0: peers and SGEs address it by offset)."""

    def __init__(self, pd, length, access, dm, offset):
        PyverbsObject.__init__(self)
        self._closed = True
        self._owned = None
        self._buf = 0
        from .pd import PD
        if not isinstance(pd, PD) or dm is None or dm._closed:
            raise PyverbsRDMAError(f'Failed to register a device MR. length: {length}, access '
                                   f'flags: {access}', errno.EINVAL)
        pd._check()
        self._nic = pd._nic
        self._emr = engine_call(self._nic, f'Failed to register a device MR. length: {length}, '
                                f'access flags: {access}', self._nic.dev.keys.reg_dm_mr,
                                pd._epd, dm._edm, int(offset), int(length), int(access))
        self._length = int(length)
        self.is_huge = self.is_user_addr = False
        self.pd, self.dm, self._offset = pd, dm, int(offset)
        self._closed = False
        pd.add_ref(self)
        dm.add_ref(self)

    def write(self, data, length, offset=0):
        return self.dm.copy_to_dm(offset, data, length)

    def read(self, length, offset):
        return self.dm.copy_from_dm(offset, length)


def mwtype2str(mw_type):
    return {1: 'IBV_MW_TYPE_1', 2: 'IBV_MW_TYPE_2'}.get(mw_type, f'Unknown MW type ({mw_type})')


class DmaBufMR(MR):
    """ibv_reg_dmabuf_mr: an MR over a dma-buf (``pyverbs.dmabuf.DmaBuf``, allocated from a
    GPU unless given).  softnic allocates no GPU memory, so without a dmabuf this fails
    as DmaBuf does (EOPNOTSUPP); given one (none can be made here) it refuses likewise."""

    def __init__(self, pd, length, access, dmabuf=None, offset=0, gpu=0, gtt=0):
        PyverbsObject.__init__(self)
        self._closed = True
        self._owned = None
        if dmabuf is None:
            from .dmabuf import DmaBuf
            dmabuf = DmaBuf(length + offset, gpu, gtt)
        raise PyverbsRDMAError(f'Failed to register a dma-buf MR. length: {length}, access '
                               f'flags: {access}', errno.EOPNOTSUPP)


# rdma-core 64's registration API: ibv_reg_mr_ex, ibv_alloc_buf / ibv_reg_buf_mr, DMA
# handles.  softnic's libibverbs answers them as libibverbs does for a provider without
# ops of its own for them (rxe): ibv_reg_mr_ex goes to the plain registration, a buffer
# is page-aligned memory of this process, a DMA handle is EOPNOTSUPP.

def _mr_ex_error(why, err):
    """pyverbs' error for a failed ibv_reg_mr_ex (``why`` is for the reader)."""
    return PyverbsRDMAError('Failed to register MR using extended API', err)


class DmaHandleInitAttr(PyverbsObject):
    def __init__(self, comp_mask=0, cpu_id=0, ph=0, tph_mem_type=0):
        super().__init__()
        self.comp_mask, self.cpu_id, self.ph, self.tph_mem_type = \
            comp_mask, cpu_id, ph, tph_mem_type


class DMAHandle(PyverbsCM):
    """ibv_alloc_dmah: a PCIe TLP processing hint for DMA, which softnic has no PCIe
    device to give (EOPNOTSUPP, libibverbs' answer for a provider without it)."""

    def __init__(self, ctx, init_attr):
        super().__init__()
        raise PyverbsRDMAError('Failed to create DMA Handle', errno.EOPNOTSUPP)


class Buf(PyverbsCM):
    """ibv_alloc_buf: ``size`` bytes of page-aligned memory for MRs of ``pd`` (what
    libibverbs allocates for a provider with no memory of its own to offer)."""

    def __init__(self, pd, size):
        super().__init__()
        self._addr = 0
        from .pd import PD
        if not isinstance(pd, PD) or pd._closed:
            raise PyverbsUserError('Buf needs an open PD')
        import weakref
        self.mrs = weakref.WeakSet()
        try:
            self._addr = mem_alloc.posix_memalign(size, resource.getpagesize())
        except MemoryError:
            raise PyverbsRDMAError(f'Failed to allocate ibv_buf of size {size}',
                                   errno.ENOMEM) from None
        self.size, self.pd = size, pd

    def add_ref(self, obj):
        self.mrs.add(obj)

    def close(self):
        if self._addr:
            for mr in list(self.mrs):
                mr.close()
            mem_alloc.free(self._addr)
            self._addr = 0
            self.pd = None

    @property
    def addr(self):
        return self._addr

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return 'Buf:\n' + f.format('addr', self.addr) + f.format('size', self.size)


class MREx(MR):
    """ibv_reg_mr_ex: an MR of an address range (``address``, or memory allocated here,
    or ``buf`` from ``address`` or its start), the whole address space (``implicit``),
    or a dma-buf (``fd``); as libibverbs registers it for a provider without its own
    ``reg_mr_ex``: a DMA handle is EOPNOTSUPP, a dma-buf goes to the dma-buf registration
    (which softnic does not have: EOPNOTSUPP), an address range to ibv_reg_mr."""

    def __init__(self, pd, length=0, access=0, address=None, iova=None, fd=None, fd_offset=0,
                 dmah=None, implicit=False, buf=None, **kwargs):
        PyverbsCM.__init__(self)
        self._closed = True
        self._owned = None
        self.backing_buf = buf
        if buf is not None:
            if buf.pd is not pd or not buf.addr:
                raise _mr_ex_error('the buffer is not of this PD', errno.EINVAL)
            address = buf.addr if address is None else address
            if address < buf.addr or address + length > buf.addr + buf.size or fd is not None:
                raise _mr_ex_error('the range is not inside the buffer', errno.EINVAL)
        has_addr = implicit or bool(address) or (fd is None and length > 0)
        if dmah is not None:
            raise _mr_ex_error('DMA handles are not supported', errno.EOPNOTSUPP)
        if fd is not None:
            if has_addr or iova is None:
                raise _mr_ex_error('a dma-buf takes an IOVA and no address', errno.EINVAL)
            raise _mr_ex_error('dma-buf registration is not supported', errno.EOPNOTSUPP)
        if not has_addr:
            raise _mr_ex_error('no address to register', errno.EINVAL)
        if iova is not None and iova != (address or 0):
            # remote addresses are this process's virtual addresses (as ibv_reg_mr_iova2)
            raise _mr_ex_error('an IOVA other than the address', errno.EOPNOTSUPP)
        try:
            super().__init__(pd, length, access, address=address, implicit=implicit)
        except PyverbsRDMAError as ex:
            raise _mr_ex_error('ibv_reg_mr refused it', ex.error_code) from None
        if buf is not None:
            buf.add_ref(self)


class BufMR(MR):
    """ibv_reg_buf_mr: an MR over ``length`` bytes of ``buf`` from ``offset`` (the memory
    stays the buffer's)."""

    def __init__(self, pd, buf, length=0, access=0, offset=0):
        if buf is None or buf.pd is not pd or not buf.addr or offset < 0 or \
                offset + length > buf.size:
            PyverbsCM.__init__(self)
            self._closed, self._owned = True, None
            raise PyverbsRDMAError(f'Failed to register a buf MR. length: {length}, access '
                                   f'flags: {access}', errno.EINVAL)
        try:
            super().__init__(pd, length, access, address=buf.addr + offset)
        except PyverbsRDMAError as ex:
            raise PyverbsRDMAError(f'Failed to register a buf MR. length: {length}, access '
                                   f'flags: {access}', ex.error_code) from None
        self.backing_buf = buf
        buf.add_ref(self)
