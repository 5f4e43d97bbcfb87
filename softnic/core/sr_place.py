"""Selective repeat: WRITE bytes placed beyond a hole.

With selective repeat the responder holds packets that arrive beyond a missing
PSN (``responder.hold``).  A WRITE packet among them whose target is already
checked (``responder.chain_writes``) is placed at once (``place_beyond``), and
the bytes a newer PSN placed are remembered (``Placed``) so that older packets,
placed when the hole fills (``place_in_order``), skip them: the memory ends as
if every packet had been placed in PSN order (later bytes win).
"""

from __future__ import annotations

from bisect import bisect_right

from ..wire.psn import psn_add, psn_diff
from .memory import view_span


class Placed:
    """The bytes placed beyond a hole, as sorted disjoint address ranges
    ``[starts[i], ends[i])``, each with the PSN that wrote it last.  A range
    whose PSN is below the expected PSN is stale (accounted for in order)."""

    __slots__ = ("starts", "ends", "psns")

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.psns: list[int] = []

    def clear(self) -> None:
        self.starts.clear()
        self.ends.clear()
        self.psns.clear()

    def prune(self, epsn: int) -> None:
        keep = [i for i, q in enumerate(self.psns) if psn_diff(q, epsn) >= 0]
        if len(keep) != len(self.psns):
            self.starts = [self.starts[i] for i in keep]
            self.ends = [self.ends[i] for i in keep]
            self.psns = [self.psns[i] for i in keep]


def place_beyond(qp, psn: int, view, off: int, data, addr: int) -> None:
    """Write the WRITE packet ``psn``'s ``data`` at ``view[off:]`` (``addr`` is the
    address of ``view[0]``) beyond a hole: bytes a newer PSN already placed are
    skipped (later bytes win, as in order), and what it writes is remembered."""
    n = len(data)
    if not n:
        return
    pl = qp.sr.placed
    if pl is None:
        pl = qp.sr.placed = Placed()
    elif not qp.sr.ooo:
        pl.clear()          # a new hole: nothing placed before it is beyond one
    starts, ends, psns = pl.starts, pl.ends, pl.psns
    s = addr + off
    e = s + n
    i = bisect_right(ends, s)
    if i == len(starts) or starts[i] >= e:
        view[off:off + n] = data
        starts.insert(i, s)
        ends.insert(i, e)
        psns.insert(i, psn)
        return
    epsn = qp.resp.epsn
    if starts[i] == s and ends[i] == e:
        # the common case (WRITEs of one size to one buffer): the same bytes as
        # one earlier packet; newer only if not yet accounted for in order
        q = psns[i]
        if psn_diff(q, psn) > 0 and psn_diff(q, epsn) >= 0:
            return
        view[off:off + n] = data
        psns[i] = psn
        return
    ns: list[int] = []
    ne: list[int] = []
    np: list[int] = []
    cur = s
    tail = None
    j = i
    while j < len(starts) and starts[j] < e:
        ss, ee, q = starts[j], ends[j], psns[j]
        if ss < s:
            ns.append(ss)
            ne.append(s)
            np.append(q)
        if ee > e:
            tail = (e, ee, q)
        if psn_diff(q, psn) > 0 and psn_diff(q, epsn) >= 0:
            lo = ss if ss > s else s
            if cur < lo:
                view[cur - addr:lo - addr] = data[cur - s:lo - s]
                ns.append(cur)
                ne.append(lo)
                np.append(psn)
            cur = ee if ee < e else e
            ns.append(lo)
            ne.append(cur)
            np.append(q)
        j += 1
    if cur < e:
        view[cur - addr:e - addr] = data[cur - s:]
        ns.append(cur)
        ne.append(e)
        np.append(psn)
    if tail is not None:
        ns.append(tail[0])
        ne.append(tail[1])
        np.append(tail[2])
    starts[i:j] = ns
    ends[i:j] = ne
    psns[i:j] = np


def plain_run(qp, s: int, psn: int, k: int, mtu: int) -> int:
    """Of ``k`` WRITE packets beyond a hole, PSNs from ``psn`` on, ``mtu`` bytes
    each from address ``s`` on, how many (from the first) ``place_beyond`` would
    write whole: none of their bytes was placed by a newer PSN not yet accounted
    for (a stale or older range is overwritten, as ``place_beyond`` does)."""
    sr = qp.sr
    pl = sr.placed
    if pl is None or not pl.starts or not sr.ooo or k <= 0:
        return k
    starts, ends, psns = pl.starts, pl.ends, pl.psns
    epsn = qp.resp.epsn
    e = s + k * mtu
    j = bisect_right(ends, s)
    while j < len(starts) and starts[j] < e:
        q = psns[j]
        i = (starts[j] - s) // mtu if starts[j] > s else 0     # the first it overlaps
        if psn_diff(q, psn_add(psn, i)) > 0 and psn_diff(q, epsn) >= 0:
            return i
        j += 1
    return k


def record_run(qp, s: int, psn: int, k: int, mtu: int) -> None:
    """Remember ``k`` packets placed beyond a hole (``plain_run`` of them: each
    written whole), PSNs from ``psn`` on, ``mtu`` bytes each from address ``s``
    on: the ranges ``place_beyond`` leaves after each in turn (what they
    overlapped is theirs now; what sticks out either side keeps its PSN)."""
    pl = qp.sr.placed
    if pl is None:
        pl = qp.sr.placed = Placed()
    elif not qp.sr.ooo:
        pl.clear()
    starts, ends, psns = pl.starts, pl.ends, pl.psns
    e = s + k * mtu
    i = bisect_right(ends, s)
    j = i
    while j < len(starts) and starts[j] < e:
        j += 1
    ns = list(range(s, e, mtu))
    ne = list(range(s + mtu, e + 1, mtu))
    np = [psn_add(psn, t) for t in range(k)]
    if j > i:
        if starts[i] < s:
            ns.insert(0, starts[i])
            ne.insert(0, s)
            np.insert(0, psns[i])
        if ends[j - 1] > e:
            ns.append(e)
            ne.append(ends[j - 1])
            np.append(psns[j - 1])
    starts[i:j] = ns
    ends[i:j] = ne
    psns[i:j] = np


def place_in_order(qp, view, off: int, data) -> None:
    """Write the expected PSN's WRITE data at ``view[off:]``, skipping the bytes
    that packets beyond a hole (newer PSNs) already placed."""
    n = len(data)
    sr = qp.sr
    pl = sr.placed
    if pl is None or not pl.starts or not sr.ooo or not n:
        # (with nothing held, every placed range is accounted for: none is newer)
        view[off:off + n] = data
        return
    span = view_span(view)
    if span is None:            # (no address, so nothing beyond a hole was placed in it)
        view[off:off + n] = data
        return
    starts, ends, psns = pl.starts, pl.ends, pl.psns
    addr = span[0]
    s = addr + off
    e = s + n
    epsn = qp.resp.epsn
    cur = s
    j = bisect_right(ends, s)
    while j < len(starts) and starts[j] < e:
        if psn_diff(psns[j], epsn) > 0:
            lo = starts[j] if starts[j] > s else s
            if cur < lo:
                view[cur - addr:lo - addr] = data[cur - s:lo - s]
            hi = ends[j] if ends[j] < e else e
            if hi > cur:
                cur = hi
        j += 1
    if cur < e:
        view[cur - addr:e - addr] = data[cur - s:]


def prune(qp) -> None:
    """Forget the WRITEs of ``qp.sr.writes`` already received in full and the
    placed ranges already accounted for (PSNs below the expected one)."""
    chain = qp.sr.writes
    epsn = qp.resp.epsn
    k = 0
    while k < len(chain) and psn_diff(chain[k][3], epsn) <= 0:
        k += 1
    if k:
        del chain[:k]
    pl = qp.sr.placed
    if pl is not None and pl.starts:
        pl.prune(epsn)
