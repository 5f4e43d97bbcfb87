"""Raw memory helpers (``pyverbs.mem_alloc``): real allocations of this process.

Addresses are plain ints, as pyverbs gives them; the memory comes from libc
(``posix_memalign``, ``malloc``, ``mmap``) and is released with ``free`` /
``munmap``.  Reads and writes go straight to the address, like pyverbs'
memcpy: the caller answers for the address being valid.
"""

from __future__ import annotations

import ctypes
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.posix_memalign.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t)
_libc.posix_memalign.restype = ctypes.c_int
_libc.malloc.argtypes = (ctypes.c_size_t,)
_libc.malloc.restype = ctypes.c_void_p
_libc.free.argtypes = (ctypes.c_void_p,)
_libc.free.restype = None
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long)
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.munmap.restype = ctypes.c_int
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.madvise.restype = ctypes.c_int

_MAP_FAILED = ctypes.c_void_p(-1).value

# protection bits for mmap/mprotect (Linux values)
PROT_NONE_ = 0x0
PROT_READ_ = 0x1
PROT_WRITE_ = 0x2
PROT_EXEC_ = 0x4

# flag bits for mmap (Linux values)
MAP_SHARED_ = 0x01
MAP_PRIVATE_ = 0x02
MAP_FIXED_ = 0x10
MAP_ANONYMOUS_ = 0x20
MAP_GROWSDOWN_ = 0x100
MAP_LOCKED_ = 0x2000
MAP_NORESERVE_ = 0x4000
MAP_POPULATE_ = 0x8000
MAP_STACK_ = 0x20000
MAP_HUGETLB_ = 0x40000


def mmap(addr=0, length=100, prot=PROT_READ_ | PROT_WRITE_, flags=MAP_PRIVATE_ | MAP_ANONYMOUS_,
         fd=0, offset=0):
    """mmap(2); returns the mapped address."""
    ptr = _libc.mmap(addr or None, length, prot, flags, fd, offset)
    if ptr is None or ptr == _MAP_FAILED:
        raise MemoryError('Failed to mmap memory')
    return ptr


MADV_DONTNEED = 4          # (Linux value)


def madvise(addr, length, flags=MADV_DONTNEED):
    """madvise(2) (rdma-core 64's tests drop an ODP MR's pages with it to make the NIC
    fault them in again; softnic reaches the memory through the mapping in any case)."""
    if _libc.madvise(addr, length, flags):
        from .pyverbs_error import PyverbsRDMAError
        raise PyverbsRDMAError('Failed to madvise memory', ctypes.get_errno())


def munmap(addr, length):
    if _libc.munmap(addr, length):
        raise MemoryError('Failed to munmap requested memory')


def malloc(size):
    ptr = _libc.malloc(size)
    if not ptr:
        raise MemoryError('Failed to allocate memory')
    return ptr


def posix_memalign(size, alignment=8):
    """posix_memalign(3), zero-filled; returns an address that is a multiple of alignment."""
    ptr = ctypes.c_void_p()
    ret = _libc.posix_memalign(ctypes.byref(ptr), alignment, size)
    if ret:
        raise MemoryError(f'Failed to allocate memory ({ret})')
    if size:
        ctypes.memset(ptr.value, 0, size)
    return ptr.value or 0


def free(ptr):
    _libc.free(ptr or None)


def writebe32(addr, val, offset=0):
    """Store ``val`` big-endian at ``addr`` + 4 * ``offset``."""
    ctypes.memmove(addr + 4 * offset, (val & 0xFFFFFFFF).to_bytes(4, 'big'), 4)


def writebe64(addr, val, offset=0):
    """Store ``val`` big-endian at ``addr`` + 8 * ``offset``."""
    ctypes.memmove(addr + 8 * offset, (val & 0xFFFFFFFFFFFFFFFF).to_bytes(8, 'big'), 8)


def write(addr, data, length, offset=0):
    """Copy ``length`` bytes of ``data`` (bytes or str) to ``addr`` + ``offset``."""
    if isinstance(data, str):
        data = data.encode()
    data = bytes(data[:length])
    ctypes.memmove(addr + offset, data, len(data))


def read32(addr, offset=0):
    """The host-order 32-bit value at ``addr`` + 4 * ``offset``."""
    return int.from_bytes(ctypes.string_at(addr + 4 * offset, 4), sys.byteorder)


def read64(addr, offset=0):
    """The host-order 64-bit value at ``addr`` + 8 * ``offset``."""
    return int.from_bytes(ctypes.string_at(addr + 8 * offset, 8), sys.byteorder)


def read(addr, length, offset=0):
    """``length`` bytes from ``addr`` + ``offset``."""
    return ctypes.string_at(addr + offset, length)
