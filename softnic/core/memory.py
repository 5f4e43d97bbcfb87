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
from dataclasses import dataclass, field

from .enums import Access
from .errors import VerbsError, einval

PAGE = mmap.PAGESIZE


class AccessError(Exception):
    """A key, bounds or permission check failed (becomes a NAK / WC status)."""


def view_at(addr: int, length: int) -> memoryview:
    """A writable byte view of ``length`` bytes of this process at ``addr``."""
    if length == 0:
        return memoryview(bytearray(0))
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


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

    def _check(self, addr: int, length: int) -> int:
        if not self.valid:
            raise AccessError("memory region invalidated")
        off = addr - self.addr
        if off < 0 or length < 0 or off + length > self.length:
            raise AccessError(f"[{addr:#x}, +{length}) outside MR [{self.addr:#x}, +{self.length})")
        return off

    def local_view(self, addr: int, length: int, *, write: bool) -> memoryview:
        if write and not self.access & Access.LOCAL_WRITE:
            raise AccessError("MR lacks LOCAL_WRITE")
        off = self._check(addr, length)
        return self.view[off:off + length]

    def remote_view(self, addr: int, length: int, need: Access) -> memoryview:
        if not int(self.access) & int(need):
            raise AccessError(f"MR lacks {need!r}")
        off = self._check(addr, length)
        return self.view[off:off + length]


class KeyTable:
    """lkey/rkey allocation: an index in the high 24 bits and a key byte that
    changes on every reuse of the index, as hardware does, so a stale key misses."""

    def __init__(self):
        self._by_key: dict[int, MR] = {}
        self._next_index = 1
        self._key_byte = 0

    def register(self, pd: PD, addr: int, length: int, access: int, owner=None) -> MR:
        access = Access(access)
        if length < 0 or addr < 0:
            raise einval("negative address or length")
        # IBA o10-37: remote write or atomic needs local write.
        if access & (Access.REMOTE_WRITE | Access.REMOTE_ATOMIC) and not access & Access.LOCAL_WRITE:
            raise einval("REMOTE_WRITE/REMOTE_ATOMIC require LOCAL_WRITE")
        if pd.closed:
            raise VerbsError(errno.EINVAL, "PD is closed")
        self._key_byte = (self._key_byte + 0x11) & 0xFF
        key = (self._next_index << 8) | self._key_byte
        self._next_index = (self._next_index + 1) & 0xFFFFFF or 1
        mr = MR(pd, addr, length, access, key, key, view_at(addr, length), owner=owner)
        self._by_key[key] = mr
        pd.mrs.add(mr)
        return mr

    def deregister(self, mr: MR) -> None:
        self._by_key.pop(mr.lkey, None)
        mr.pd.mrs.discard(mr)
        mr.valid = False
        mr.view = memoryview(b"")
        mr.owner = None

    def lookup(self, key: int) -> MR | None:
        return self._by_key.get(key)

    def remote(self, pd: PD, rkey: int, addr: int, length: int, need: Access) -> memoryview:
        if length == 0:
            # IBA C9-88: a zero-length RDMA WRITE or READ carries no R_Key or VA to
            # check (rxe skips the check too); UCX flushes an RC QP with one, rkey 0
            return memoryview(bytearray())
        mr = self._by_key.get(rkey)
        if mr is None or mr.pd is not pd:
            raise AccessError(f"rkey {rkey:#x} unknown in this PD")
        return mr.remote_view(addr, length, need)

    def local(self, pd: PD, lkey: int, addr: int, length: int, *, write: bool) -> memoryview:
        mr = self._by_key.get(lkey)
        if mr is None or mr.pd is not pd:
            raise AccessError(f"lkey {lkey:#x} unknown in this PD")
        return mr.local_view(addr, length, write=write)

    def invalidate(self, pd: PD, key: int) -> bool:
        mr = self._by_key.get(key)
        if mr is None or mr.pd is not pd or not mr.valid:
            return False
        mr.valid = False
        return True
