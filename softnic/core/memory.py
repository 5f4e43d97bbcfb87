"""Protection domains and memory regions over real process memory.

An MR covers ``[addr, addr + length)`` of this process.  The engine reaches
that memory through one memoryview made over the address range (slice
assignment runs at C speed, with no staging copy).  Every access goes through
``MR.local_view`` / ``MR.remote_view``, which check the key's state, the
access flags and the bounds before a byte is touched.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from dataclasses import dataclass, field

from .enums import Access
from .errors import VerbsError, einval

PAGE = mmap.PAGESIZE

_LOCAL_WRITE = int(Access.LOCAL_WRITE)


class AccessError(Exception):
    """A key, bounds or permission check failed (becomes a NAK / WC status)."""


def view_at(addr: int, length: int) -> memoryview:
    """A writable byte view of ``length`` bytes of this process at ``addr``."""
    if length == 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


def bytes_at(addr: int, length: int) -> bytes:
    """A copy of the ``length`` bytes of this process at ``addr`` (``bytes(view_at(addr,
    length))`` in one call)."""
    return ctypes.string_at(addr, length)


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_process_vm_writev = getattr(ctypes.CDLL(None, use_errno=True), "process_vm_writev", None)
if _process_vm_writev is not None:
    _process_vm_writev.restype = ctypes.c_ssize_t
    _process_vm_writev.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                                   ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong]


def write_checked(view: memoryview, data) -> bool:
    """``view[:] = data`` (as long as ``view``) unless the pages of this process that
    ``view`` covers are gone: False then, and what could not be written is not.  A
    program may unmap memory it still has registered (UCX 1.13's UD interface frees
    its receive buffers before it destroys its QP); a NIC's write lands in the
    pages the registration pinned, harmlessly, where a write through the mapping
    would kill the process.  The copy is ``process_vm_writev`` to this process,
    which reports the fault (EFAULT); where it cannot run (a sandbox refusing the
    call), the plain copy.  It costs a system call for each write: for traffic
    where that is little (UD datagrams), not for the data path."""
    span = view_span(view)
    if span is None or _process_vm_writev is None:
        view[:] = data
        return True
    src = bytes(data)
    n = len(src)
    local = _IOVec(ctypes.cast(ctypes.c_char_p(src), ctypes.c_void_p), n)
    remote = _IOVec(span[0], n)
    done = _process_vm_writev(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if done == n:
        return True
    if done >= 0 or ctypes.get_errno() == errno.EFAULT:
        return False                    # (a short write: it faulted part way)
    view[:] = data
    return True


def view_span(v: memoryview) -> tuple[int, int] | None:
    """The address range ``[start, end)`` a writable byte view covers (None if
    it cannot tell: an empty or read-only view)."""
    if len(v) == 0:
        return None
    try:
        a = ctypes.addressof(ctypes.c_char.from_buffer(v))
    except (TypeError, ValueError):
        return None
    return (a, a + len(v))


class Buffer:
    """Page-aligned anonymous memory owned by softnic (what posix_memalign gives a C program)."""

    def __init__(self, length: int):
        if length <= 0:
            raise einval("buffer length must be positive")
        self._map = mmap.mmap(-1, (length + PAGE - 1) // PAGE * PAGE)
        self.length = length
        self._c = ctypes.c_char.from_buffer(self._map)
        self.addr = ctypes.addressof(self._c)
        self.view = memoryview(self._map)[:length]

    def close(self) -> None:
        if self._map is not None:
            self.view.release()
            del self._c
            self._map.close()
            self._map = None


def address_of(obj) -> int:
    """Address of a writable buffer (bytearray, numpy array, mmap, ctypes array)."""
    mv = memoryview(obj)
    if mv.readonly:
        raise einval("memory must be writable")
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


@dataclass(eq=False)
class PD:
    handle: int
    mrs: set = field(default_factory=set)
    qps: set = field(default_factory=set)
    srqs: set = field(default_factory=set)
    closed: bool = False


@dataclass(eq=False)
class MR:
    pd: PD
    addr: int
    length: int
    access: Access
    lkey: int
    rkey: int
    view: memoryview
    valid: bool = True
    owner: object = None     # keeps Python-owned memory alive while registered
    num_mw: int = 0          # memory windows bound to it (it cannot be deregistered meanwhile)

    def _check(self, addr: int, length: int) -> int:
        if not self.valid:
            raise AccessError("memory region invalidated")
        off = addr - self.addr
        if off < 0 or length < 0 or off + length > self.length:
            raise AccessError(f"[{addr:#x}, +{length}) outside MR [{self.addr:#x}, +{self.length})")
        return off

    def local_view(self, addr: int, length: int, *, write: bool) -> memoryview:
        if write and not int(self.access) & _LOCAL_WRITE:     # (IntFlag operations are slow)
            raise AccessError("MR lacks LOCAL_WRITE")
        off = self._check(addr, length)
        return self.view[off:off + length]

    def remote_view(self, addr: int, length: int, need: Access) -> memoryview:
        if not int(self.access) & int(need):
            raise AccessError(f"MR lacks {need!r}")
        off = self._check(addr, length)
        return self.view[off:off + length]


@dataclass(frozen=True)
class MWBind:
    """What a bind (IBV_WR_BIND_MW, or ibv_bind_mw for type 1) asks: the window by its
    current rkey, the rkey it is to have (a new key byte, same index), and the range of
    the MR (by lkey) it is to grant with ``access``.  A zero length unbinds."""
    mw_rkey: int
    rkey: int
    mr_lkey: int
    addr: int
    length: int
    access: int


@dataclass(eq=False)
class MW:
    """A memory window: an rkey granting remote access to a range of a bound MR.

    Type 1 is bound by ibv_bind_mw and is valid from allocation (zero length until
    bound); type 2 is bound by a BIND_MW work request from a QP of its PD, is free until
    then, is reachable only through that QP, and is freed by LOCAL_INV or SEND_WITH_INV.
    """
    pd: PD
    type: int
    rkey: int
    valid: bool                  # type 1 from allocation; type 2 once bound
    mr: MR | None = None
    addr: int = 0
    length: int = 0
    access: int = 0
    qp: object = None            # type 2: the QP that bound it

    def remote_view(self, qp, addr: int, length: int, need: Access) -> memoryview:
        mr = self.mr
        if not self.valid or mr is None or self.length == 0:
            raise AccessError(f"memory window {self.rkey:#x} is not bound")
        if self.type == 2 and qp is not None and self.qp is not qp:
            raise AccessError("a type 2 window is reached only through the QP that bound it")
        if not self.access & int(need):
            raise AccessError(f"memory window lacks {need!r}")
        off = addr - self.addr
        if off < 0 or length < 0 or off + length > self.length:
            raise AccessError(f"[{addr:#x}, +{length}) outside the window "
                              f"[{self.addr:#x}, +{self.length})")
        if not mr.valid:
            raise AccessError("the window's memory region is invalidated")
        start = addr - mr.addr
        return mr.view[start:start + length]

    def unbind(self) -> None:
        if self.mr is not None:
            self.mr.num_mw -= 1
        self.mr, self.addr, self.length, self.access, self.qp = None, 0, 0, 0, None


DM_MAX_SIZE = 256 << 10        # device memory per device, as a ConnectX's on-chip memory
DM_ALIGN = 4                   # copies to and from it are in whole 4-byte words (as mlx5)


class DeviceMemory:
    """Device memory (ibv_alloc_dm): memory of the NIC rather than of the host.  softnic's
    "on-chip" memory is a buffer the device owns, reached by the host only through
    ibv_memcpy_to_dm / ibv_memcpy_from_dm (4-byte aligned) and by the wire through an MR
    registered over it (zero-based: addressed by offset)."""

    def __init__(self, pool: "DMPool", handle: int, length: int):
        self.pool, self.handle, self.length = pool, handle, length
        self.buf = Buffer(length)
        self.mrs: set = set()
        self.closed = False

    def _range(self, offset: int, length: int) -> None:
        if self.closed:
            raise einval("device memory freed")
        if offset % DM_ALIGN or length % DM_ALIGN or offset < 0 or length < 0 or \
                offset + length > self.length:
            raise einval(f"device memory copy of {length} bytes at offset {offset}: must be "
                         f"{DM_ALIGN}-byte aligned and inside {self.length} bytes")

    def copy_to(self, offset: int, data) -> None:
        data = memoryview(data).cast("B")
        self._range(offset, len(data))
        self.buf.view[offset:offset + len(data)] = data

    def copy_from(self, offset: int, length: int) -> bytes:
        self._range(offset, length)
        return bytes(self.buf.view[offset:offset + length])


class _Memory:
    """Memory someone else owns (the C library's device memory), seen as a Buffer is."""

    def __init__(self, addr: int, length: int):
        self.addr, self.length = addr, length
        self.view = view_at(addr, length)

    def close(self) -> None:
        self.view = memoryview(b"")


def external_device_memory(addr: int, length: int) -> DeviceMemory:
    """Device memory the C library allocated (so that a forked child, whose engine is not
    running, can still allocate and copy it): the engine only registers MRs over it."""
    dm = DeviceMemory.__new__(DeviceMemory)
    dm.pool, dm.handle, dm.length = None, 0, length
    dm.buf = _Memory(addr, length)
    dm.mrs, dm.closed = set(), False
    return dm


class DMPool:
    """A device's device memory: DM_MAX_SIZE bytes shared by its allocations."""

    def __init__(self, size: int = DM_MAX_SIZE):
        self.size = size
        self.used = 0
        self._next = 1
        self.by_handle: dict[int, DeviceMemory] = {}

    def alloc(self, length: int, log_align: int = 0, comp_mask: int = 0) -> DeviceMemory:
        if comp_mask:
            raise einval(f"alloc_dm comp_mask {comp_mask:#x}")
        if length <= 0 or log_align < 0 or log_align > 12:
            raise einval(f"alloc_dm of {length} bytes, log_align {log_align}")
        if self.used + length > self.size:
            raise VerbsError(errno.ENOMEM, f"{length} bytes of device memory: "
                             f"{self.size - self.used} of {self.size} free")
        dm = DeviceMemory(self, self._next, length)
        self._next += 1
        self.used += length
        self.by_handle[dm.handle] = dm
        return dm

    def free(self, dm: DeviceMemory) -> None:
        if dm.closed:
            return
        if dm.mrs:
            raise VerbsError(errno.EBUSY, "memory regions are registered over the device memory")
        dm.closed = True
        self.used -= dm.length
        self.by_handle.pop(dm.handle, None)
        dm.buf.close()


class ProcessMaps:
    """Which address ranges of this process are mapped, and how (``/proc/self/maps``),
    read again when an address is not found: what an implicit ODP MR's page faults ask
    the kernel, so that an access the mapping would refuse fails instead of crashing."""

    def __init__(self, path: str = "/proc/self/maps"):
        self.path = path
        self.maps: list[tuple[int, int, str]] = []

    def _load(self) -> None:
        maps = []
        try:
            with open(self.path) as f:
                for line in f:
                    rng, perms = line.split(None, 2)[:2]
                    lo, hi = rng.split("-")
                    maps.append((int(lo, 16), int(hi, 16), perms))
        except OSError:
            maps = []
        self.maps = maps

    def allows(self, addr: int, length: int, write: bool) -> bool:
        for attempt in (0, 1):
            if attempt:
                self._load()
            pos, end = addr, addr + length
            for lo, hi, perms in self.maps:
                if lo <= pos < hi:
                    if "r" not in perms or (write and "w" not in perms):
                        break
                    pos = hi
                    if pos >= end:
                        return True
            if pos >= end:
                return True
        return False


class ImplicitMR(MR):
    """An implicit on-demand-paging MR (ibv_reg_mr(pd, NULL, SIZE_MAX, ON_DEMAND)): the
    whole address space of the process, each access reaching it as a page fault would,
    where the process's mapping allows."""

    def _reach(self, addr: int, length: int, write: bool) -> memoryview:
        if not self.valid:
            raise AccessError("memory region invalidated")
        if addr < 0 or length < 0 or not (length == 0 or self.maps.allows(addr, length, write)):
            raise AccessError(f"[{addr:#x}, +{length}) is not mapped for this access")
        return view_at(addr, length)

    def local_view(self, addr: int, length: int, *, write: bool) -> memoryview:
        if write and not int(self.access) & _LOCAL_WRITE:     # (IntFlag operations are slow)
            raise AccessError("MR lacks LOCAL_WRITE")
        return self._reach(addr, length, write)

    def remote_view(self, addr: int, length: int, need: Access) -> memoryview:
        if not int(self.access) & int(need):
            raise AccessError(f"MR lacks {need!r}")
        return self._reach(addr, length, bool(int(need) & int(Access.REMOTE_WRITE |
                                                              Access.REMOTE_ATOMIC)))


IMPLICIT_LENGTH = (1 << 64) - 1      # SIZE_MAX: what ibv_reg_mr is given for an implicit MR


_REMOTE_WRITE_OR_ATOMIC = int(Access.REMOTE_WRITE | Access.REMOTE_ATOMIC)
_FLUSH_PERSISTENT = int(Access.FLUSH_PERSISTENT)


def _check_mr_access(access: Access) -> None:
    """The access flags a new MR may have."""
    # IBA o10-37: remote write or atomic needs local write.  (The flags as an int:
    # IntFlag operations cost a few enum constructions each.)
    access = int(access)
    if access & _REMOTE_WRITE_OR_ATOMIC and not access & _LOCAL_WRITE:
        raise einval("REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE")
    _no_persistence(access)


def _no_persistence(access: Access) -> None:
    """FLUSH_PERSISTENT is granted only over persistent memory (rxe: pmem pages, else
    EINVAL); softnic's memory is the process's, never persistent."""
    if int(access) & _FLUSH_PERSISTENT:
        raise einval("FLUSH_PERSISTENT needs persistent memory; this is not")


class KeyTable:
    """lkey/rkey allocation: an index in the high 24 bits and a key byte that
    changes on every reuse of the index, as hardware does, so a stale key misses."""

    def __init__(self):
        self.dm = DMPool()
        self._by_key: dict[int, MR] = {}
        self._next_index = 1
        self._key_byte = 0

    def register(self, pd: PD, addr: int, length: int, access: int, owner=None,
                 iova: int | None = None) -> MR:
        """Register ``[addr, addr + length)``; keys and SGEs address it by ``iova``
        (default ``addr``; 0 for a zero-based MR such as one over device memory)."""
        access = Access(access)
        if length < 0 or addr < 0:
            raise einval("negative address or length")
        _check_mr_access(access)
        if pd.closed:
            raise VerbsError(errno.EINVAL, "PD is closed")
        key = self._new_key()
        mr = MR(pd, addr if iova is None else iova, length, access, key, key,
                view_at(addr, length), owner=owner)
        self._by_key[key] = mr
        pd.mrs.add(mr)
        return mr

    def _new_key(self) -> int:
        self._key_byte = (self._key_byte + 0x11) & 0xFF
        key = (self._next_index << 8) | self._key_byte
        self._next_index = (self._next_index + 1) & 0xFFFFFF or 1
        return key

    def deregister(self, mr: MR) -> None:
        if mr.num_mw:                   # as rxe: a window still grants access through it
            raise VerbsError(errno.EINVAL,
                             f"{mr.num_mw} memory window(s) bound to the MR")
        self._by_key.pop(mr.lkey, None)
        if isinstance(mr.owner, DeviceMemory):
            mr.owner.mrs.discard(mr)
        mr.pd.mrs.discard(mr)
        mr.valid = False
        mr.view = memoryview(b"")
        mr.owner = None

    def rereg(self, mr: MR, flags: int, pd: PD | None, addr: int, length: int,
              access: int) -> None:
        """ibv_rereg_mr in place: the keys stay (a peer holding the rkey keeps it), the PD,
        the translation (address, length) and the access change as ``flags`` say
        (IBV_REREG_MR_CHANGE_TRANSLATION 1, _PD 2, _ACCESS 4)."""
        if flags & ~7 or not flags:
            raise einval(f"rereg flags {flags:#x}")
        if not mr.valid or self._by_key.get(mr.lkey) is not mr:
            raise einval("the MR is not registered")
        if mr.num_mw:
            raise einval("memory windows are bound to the MR")
        new_access = Access(access) if flags & 4 else mr.access
        _check_mr_access(new_access)
        if flags & 2 and (pd is None or pd.closed):
            raise einval("rereg to a missing or closed PD")
        if flags & 1 and (addr < 0 or length < 0):
            raise einval("negative address or length")
        if flags & 1:
            mr.view = view_at(addr, length)
            mr.addr, mr.length, mr.owner = addr, length, None
        if flags & 2:
            mr.pd.mrs.discard(mr)
            mr.pd = pd
            pd.mrs.add(mr)
        mr.access = new_access

    def register_implicit(self, pd: PD, access: int) -> MR:
        """An implicit ODP MR over this process's whole address space."""
        access = Access(access)
        if not access & Access.ON_DEMAND:
            raise einval("an implicit MR is an on-demand paging one")
        _check_mr_access(access)
        if pd.closed:
            raise VerbsError(errno.EINVAL, "PD is closed")
        key = self._new_key()
        mr = ImplicitMR(pd, 0, IMPLICIT_LENGTH, access, key, key, memoryview(b""))
        mr.maps = ProcessMaps()
        self._by_key[key] = mr
        pd.mrs.add(mr)
        return mr

    def reg_dm_mr(self, pd: PD, dm: DeviceMemory, offset: int, length: int,
                  access: int) -> MR:
        """An MR over ``length`` bytes of device memory from ``offset``: zero-based (iova 0
        is ``offset``), as ibv_reg_dm_mr requires."""
        if dm.closed:
            raise einval("device memory freed")
        if not access & Access.ZERO_BASED:
            raise einval("a device memory MR must be zero-based")
        if offset < 0 or length < 0 or offset + length > dm.length:
            raise einval(f"[{offset}, +{length}) outside {dm.length} bytes of device memory")
        mr = self.register(pd, dm.buf.addr + offset, length, access, owner=dm, iova=0)
        dm.mrs.add(mr)
        return mr

    # ------------------------------------------------------------ memory windows

    def alloc_mw(self, pd: PD, mw_type: int) -> MW:
        if mw_type not in (1, 2):
            raise einval(f"memory window type {mw_type}")
        if pd.closed:
            raise VerbsError(errno.EINVAL, "PD is closed")
        mw = MW(pd, mw_type, self._new_key(), valid=mw_type == 1)
        self._by_key[mw.rkey] = mw
        return mw

    def dealloc_mw(self, mw: MW) -> None:
        if self._by_key.get(mw.rkey) is mw:
            del self._by_key[mw.rkey]
        mw.unbind()
        mw.valid = False

    def bind_mw(self, qp, pd: PD, b: MWBind) -> MW:
        """Bind (or, with length 0, unbind) a window as rxe's rxe_bind_mw checks it;
        AccessError for a bind the spec forbids (the WR completes with MW_BIND_ERR)."""
        mw = self._by_key.get(b.mw_rkey)
        if not isinstance(mw, MW):
            raise AccessError(f"no memory window with rkey {b.mw_rkey:#x}")
        mr = None
        if b.length:
            mr = self._by_key.get(b.mr_lkey)
            if not isinstance(mr, MR) or not mr.valid:
                raise AccessError(f"no memory region with lkey {b.mr_lkey:#x}")
        if (b.rkey >> 8) != (mw.rkey >> 8):
            raise AccessError("the new rkey must keep the window's index")
        if mw.type == 1:
            if not mw.valid:
                raise AccessError("type 1 window not valid")
        else:
            if mw.valid:                                  # o10-37.2.30: invalidate first
                raise AccessError("type 2 window already bound")
            if pd is not mw.pd:                           # C10-72
                raise AccessError("the QP's PD is not the window's")
            if mr is None:                                # o10-37.2.40
                raise AccessError("type 2 bind of zero length")
        if mr is not None:
            if mr.pd is not mw.pd:
                raise AccessError("the MR's PD is not the window's")
            if not mr.access & Access.MW_BIND:            # C10-73
                raise AccessError("MR lacks MW_BIND")
            if b.access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) and \
                    not mr.access & Access.LOCAL_WRITE:   # C10-74
                raise AccessError("remote write/atomic window on an MR without LOCAL_WRITE")
            if b.addr < mr.addr or b.addr + b.length > mr.addr + mr.length:   # C10-75
                raise AccessError("window outside the MR")
        mw.unbind()
        del self._by_key[mw.rkey]
        mw.rkey = (mw.rkey & ~0xFF) | (b.rkey & 0xFF)
        self._by_key[mw.rkey] = mw
        mw.valid = True
        mw.addr, mw.length, mw.access = b.addr, b.length, int(b.access)
        if mr is not None:
            mw.mr = mr
            mr.num_mw += 1
        if mw.type == 2:
            mw.qp = qp
        return mw

    # ------------------------------------------------------------ lookups

    def lookup(self, key: int) -> MR | None:
        obj = self._by_key.get(key)
        return obj if isinstance(obj, MR) else None

    def remote(self, pd: PD, rkey: int, addr: int, length: int, need: Access,
               qp=None) -> memoryview:
        if length == 0:
            # IBA C9-88: a zero-length RDMA WRITE or READ carries no R_Key or VA to
            # check (rxe skips the check too); UCX flushes an RC QP with one, rkey 0
            return memoryview(bytearray())
        mr = self._by_key.get(rkey)
        if mr is None or mr.pd is not pd:
            raise AccessError(f"rkey {rkey:#x} unknown in this PD")
        if type(mr) is MW:
            return mr.remote_view(qp, addr, length, need)
        return mr.remote_view(addr, length, need)

    def remote_region(self, pd: PD, rkey: int, need: Access) -> MR | None:
        """The MR ``rkey`` names in ``pd`` if it is a valid one (not a window, not
        on-demand) that grants ``need``: every ``[addr, addr + length)`` within
        its bounds is then a range ``remote`` gives for it (a driver's kernel
        checks the range; ``responder.answer_target``).  Else None."""
        mr = self._by_key.get(rkey)
        if type(mr) is not MR or mr.pd is not pd or not mr.valid \
                or not int(mr.access) & int(need):
            return None
        return mr

    def region(self, pd: PD, rkey: int):
        """The MR or window ``rkey`` names in ``pd`` (a FLUSH of a whole region)."""
        mr = self._by_key.get(rkey)
        if mr is None or mr.pd is not pd:
            raise AccessError(f"rkey {rkey:#x} unknown in this PD")
        return mr

    def local(self, pd: PD, lkey: int, addr: int, length: int, *, write: bool) -> memoryview:
        mr = self._by_key.get(lkey)
        if mr is None or mr.pd is not pd or type(mr) is MW:
            raise AccessError(f"lkey {lkey:#x} unknown in this PD")
        return mr.local_view(addr, length, write=write)

    def invalidate(self, pd: PD, key: int) -> bool:
        """LOCAL_INV / SEND_WITH_INV of an MR's key or a type 2 window's (o10-37.2.26:
        never a type 1 window's)."""
        mr = self._by_key.get(key)
        if mr is None or mr.pd is not pd or not mr.valid:
            return False
        if type(mr) is MW:
            if mr.type == 1:
                return False
            mr.unbind()
        mr.valid = False
        return True
