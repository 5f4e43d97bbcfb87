"""Collective algorithms over :meth:`Transport.exchange`.

All buffers are contiguous 1-D numpy arrays.  Every algorithm leaves the same
bits on every rank (reductions are applied pairwise with commutative ufuncs
or copied from the rank that owns the final value), which data-parallel
training relies on.
"""

from __future__ import annotations

import numpy as np

from .transport import Transport


def block_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous blocks covering ``count`` elements, sizes differing by at most one."""
    base, extra = divmod(count, n)
    out, start = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def ring_reduce_scatter(t: Transport, buf: np.ndarray, op, bounds) -> None:
    """In place: afterwards block ``rank`` of ``buf`` holds the reduction of that block."""
    n, r = t.world, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        sb, rb = bounds[(r - s - 1) % n], bounds[(r - s - 2) % n]
        t.exchange(sends=[(right, buf[sb[0]:sb[1]])], recvs=[(left, buf[rb[0]:rb[1]], op)])


def ring_allgather(t: Transport, buf: np.ndarray, bounds) -> None:
    """In place: block ``rank`` of ``buf`` is spread to every rank."""
    n, r = t.world, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        sb, rb = bounds[(r - s) % n], bounds[(r - s - 1) % n]
        t.exchange(sends=[(right, buf[sb[0]:sb[1]])], recvs=[(left, buf[rb[0]:rb[1]], None)])


def ring_allreduce(t: Transport, buf: np.ndarray, op) -> None:
    bounds = block_bounds(buf.size, t.world)
    ring_reduce_scatter(t, buf, op, bounds)
    ring_allgather(t, buf, bounds)


def recursive_doubling_allreduce(t: Transport, buf: np.ndarray, op) -> None:
    """log2(n) rounds of pairwise exchange; ranks beyond the largest power of two
    fold their data into a partner first and get the result back at the end."""
    n, r = t.world, t.rank
    p2 = 1 << (n.bit_length() - 1)
    rem = n - p2
    tmp = np.empty_like(buf)
    if r >= p2:
        t.exchange(sends=[(r - p2, buf)])
        t.exchange(recvs=[(r - p2, buf, None)])
        return
    if r < rem:
        t.exchange(recvs=[(r + p2, buf, op)])
    mask = 1
    while mask < p2:
        partner = r ^ mask
        t.exchange(sends=[(partner, buf)], recvs=[(partner, tmp, None)])
        op(buf, tmp, out=buf)
        mask <<= 1
    if r < rem:
        t.exchange(sends=[(r + p2, buf)])


def binomial_broadcast(t: Transport, buf: np.ndarray, root: int) -> None:
    n = t.world
    vrank = (t.rank - root) % n
    mask = 1
    while mask < n:
        if vrank < mask:
            if vrank + mask < n:
                t.exchange(sends=[((vrank + mask + root) % n, buf)])
        elif vrank < 2 * mask:
            t.exchange(recvs=[((vrank - mask + root) % n, buf, None)])
        mask <<= 1


def alltoall(t: Transport, send: np.ndarray, recv: np.ndarray) -> None:
    n, r = t.world, t.rank
    m = send.size // n
    recv[r * m:(r + 1) * m] = send[r * m:(r + 1) * m]
    peers = [p for p in range(n) if p != r]
    t.exchange(sends=[(p, send[p * m:(p + 1) * m]) for p in peers],
               recvs=[(p, recv[p * m:(p + 1) * m], None) for p in peers])


def dissemination_barrier(t: Transport) -> None:
    n, r = t.world, t.rank
    empty = np.zeros(0, np.uint8)
    k = 1
    while k < n:
        t.exchange(sends=[((r + k) % n, empty)], recvs=[((r - k) % n, empty, None)])
        k <<= 1
