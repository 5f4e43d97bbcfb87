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


def _ring_steps(t: Transport, buf, bounds, op, reduce_steps: bool, gather_steps: bool):
    """The sends and receives of a ring's steps: n - 1 reduce-scatter steps (block
    ``r - s - 1`` goes right, block ``r - s - 2`` comes from the left and is reduced in)
    and/or n - 1 allgather steps (block ``r - s`` goes right, ``r - s - 1`` is copied in).
    Each step sends the block the step before received."""
    n, r = t.world, t.rank
    blk = [buf[lo:hi] for lo, hi in bounds]
    sends, recvs = [], []
    if reduce_steps:
        for s in range(n - 1):
            sends.append(blk[(r - s - 1) % n])
            recvs.append((blk[(r - s - 2) % n], op))
    if gather_steps:
        for s in range(n - 1):
            sends.append(blk[(r - s) % n])
            recvs.append((blk[(r - s - 1) % n], None))
    return sends, recvs


def ring_reduce_scatter(t: Transport, buf: np.ndarray, op, bounds) -> None:
    """In place: afterwards block ``rank`` of ``buf`` holds the reduction of that block."""
    t.ring(*_ring_steps(t, buf, bounds, op, True, False))


def ring_allgather(t: Transport, buf: np.ndarray, bounds) -> None:
    """In place: block ``rank`` of ``buf`` is spread to every rank."""
    t.ring(*_ring_steps(t, buf, bounds, None, False, True))


def ring_allreduce(t: Transport, buf: np.ndarray, op) -> None:
    """Reduce-scatter then allgather, 2(n - 1) steps pipelined as one stream: the
    allgather's first chunk leaves as soon as the reduce-scatter's last one is in."""
    t.ring(*_ring_steps(t, buf, block_bounds(buf.size, t.world), op, True, True))


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


def halving_doubling_allreduce(t: Transport, buf: np.ndarray, op) -> None:
    """Rabenseifner's allreduce: a reduce-scatter by recursive halving (round ``k``
    exchanges half of what is left with the rank ``2**k`` away, each reducing the half
    it keeps, straight from the slot into ``buf``), then an allgather by recursive
    doubling; 2 log2(n) rounds, each rank sending ``2(n-1)/n`` of the buffer, as the
    ring does in ``2(n-1)`` steps.  Ranks beyond the largest power of two fold in first
    and get the result last, as in recursive doubling.  Every block is reduced by its
    owner alone and copied to the others, so every rank ends with the same bits."""
    n, r = t.world, t.rank
    p2 = 1 << (n.bit_length() - 1)
    rem = n - p2
    if r >= p2:
        t.exchange(sends=[(r - p2, buf)])
        t.exchange(recvs=[(r - p2, buf, None)])
        return
    if r < rem:
        t.exchange(recvs=[(r + p2, buf, op)])
    bounds = block_bounds(buf.size, p2)

    def span(b0: int, w: int) -> np.ndarray:
        return buf[bounds[b0][0]:bounds[b0 + w - 1][1]]

    b0, mask = 0, p2 >> 1
    while mask:                         # reduce-scatter: keep the half holding block r
        partner = r ^ mask
        lo, hi = (b0 + mask, b0) if r & mask else (b0, b0 + mask)
        t.exchange(sends=[(partner, span(hi, mask))], recvs=[(partner, span(lo, mask), op)])
        b0, mask = lo, mask >> 1
    mask = 1
    while mask < p2:                    # allgather: block r's range doubles each round
        partner = r ^ mask
        mine, theirs = (r // mask) * mask, (partner // mask) * mask
        t.exchange(sends=[(partner, span(mine, mask))],
                   recvs=[(partner, span(theirs, mask), None)])
        mask <<= 1
    if r < rem:
        t.exchange(sends=[(r + p2, buf)])


def binomial_reduce(t: Transport, buf: np.ndarray, op, root: int) -> None:
    """A binomial tree toward ``root``: at round ``k`` a rank whose bit ``k`` is set (in
    rank order from the root) sends what it holds to the rank ``2**k`` below and is done;
    the one below reduces it in.  Afterwards ``buf`` on ``root`` holds the reduction."""
    n = t.world
    vrank = (t.rank - root) % n
    mask = 1
    while mask < n:
        if vrank & mask:
            t.exchange(sends=[((vrank - mask + root) % n, buf)])
            return
        if vrank + mask < n:
            t.exchange(recvs=[((vrank + mask + root) % n, buf, op)])
        mask <<= 1


def tree_allreduce(t: Transport, buf: np.ndarray, op) -> None:
    """A binomial-tree reduce to rank 0, then a binomial broadcast back: 2 log2(n)
    rounds of whole buffers (no pipelining across rounds); every rank gets rank 0's
    bits."""
    binomial_reduce(t, buf, op, 0)
    binomial_broadcast(t, buf, 0)


#: a pipelined tree's segment (bytes): small enough that a 64-rank tree's depth is a
#: small part of a few-MiB buffer's segments, large enough that each is many chunks
TREE_SEGMENT = 512 << 10


def pipelined_tree_allreduce(t: Transport, buf: np.ndarray, op,
                             segment: int = TREE_SEGMENT) -> None:
    """The binomial tree's reduce to rank 0 and broadcast back, pipelined segment by
    segment instead of whole buffers, the broadcast of a segment starting as soon as
    rank 0 has reduced it: with ``S`` segments, rank 0's ``H`` = log2(n) children
    and a tree ``D`` deep, ``S + H + D`` steps of one segment rather than ``2H``
    rounds of the whole buffer, rank 0 receiving and sending at once.

    Reduce: rank ``v`` is child ``k`` of its parent ``v - 2**k`` (``k`` its lowest
    set bit) and sends segment ``j - k`` up at step ``j``; from its own child ``m`` it
    receives segment ``j - m`` (distinct segments in one step, and each segment is
    whole before it goes up: ``m < k``).  Broadcast: a rank ``d`` levels below rank 0
    receives segment ``j - H - d + 1`` at step ``j`` and passes segment ``j - H - d``
    down (segments the reduce no longer touches: ``k <= H - 1 < H + d - 1``).  Every
    rank ends with rank 0's bits."""
    n, r = t.world, t.rank
    nseg = max(1, -(-buf.nbytes // max(1, segment)))
    segs = [buf[lo:hi] for lo, hi in block_bounds(buf.size, nseg) if hi > lo]
    nseg = len(segs)
    if n == 1 or not nseg:
        return

    def seg(k):
        return segs[k] if 0 <= k < nseg else None

    top = (n - 1).bit_length()                    # rank 0's children: 1, 2, 4, ...
    lag = (r & -r).bit_length() - 1 if r else top
    parent = r - (r & -r) if r else None
    children = [(r + (1 << m), m) for m in range(lag) if r + (1 << m) < n]
    depth = bin(r).count("1")
    for j in range(nseg + top + depth):
        sends, recvs = [], []
        if parent is not None:
            up, got = seg(j - lag), seg(j - top - depth + 1)
            if up is not None:
                sends.append((parent, up))
            if got is not None:
                recvs.append((parent, got, None))
        for c, m in children:
            part = seg(j - m)
            if part is not None:
                recvs.append((c, part, op))
        down = seg(j - top - depth)
        if down is not None:
            sends.extend((c, down) for c, _ in children)
        if sends or recvs:
            t.exchange(sends=sends, recvs=recvs)


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


def chain_broadcast(t: Transport, buf: np.ndarray, root: int) -> None:
    """A pipeline root -> root+1 -> ... -> root-1: each chunk goes on to the next rank
    as soon as it has come in, so every link carries the buffer once, all at the same
    time (for large buffers; the binomial tree's log2(n) rounds win on small ones)."""
    n, r = t.world, t.rank
    vrank = (r - root) % n
    left, right = (r - 1) % n, (r + 1) % n
    if vrank == 0:
        t.exchange(sends=[(right, buf)])
    elif vrank == n - 1:
        t.exchange(recvs=[(left, buf, None)])
    else:
        t.chain(left, right, [(buf, None)], [buf], lag=0)


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
