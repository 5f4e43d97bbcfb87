"""Selective repeat beyond a hole, in the compiled kernel, against Python.

With selective repeat the responder places the packets of a WRITE that arrive
beyond a missing PSN at once (``responder._hold_placed_write``, the rule's home:
``sr_place.place_beyond`` and ``hold``).  ``responder._middles_beyond`` takes a
run of such MIDDLEs in the kernel (``sn_rx_middles``) where every one is
written whole (``sr_place.plain_run``) and records them as ``place_beyond``
would (``sr_place.record_run``).  Here a receiver with it and one whose kernel
leaves every packet beyond a hole to Python get the same datagrams (cut, lost,
repeated, swapped, corrupted by a seeded network) and must end the same: wire
bytes, completions, memory, counters, the ranges remembered.  Skips without a
compiler, except in CI (as tests/test_kernel.py).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, note, settings, strategies as st

from softnic.core import responder
from softnic.core.enums import SendFlags, WROpcode as W
from softnic.core.qp import SendWR
from softnic.core.requester import Run

from test_kernel import Counting, _exchange, _side, kernel


class Beyond:
    """``responder._middles_beyond`` counting the packets it takes, or (``off``)
    taking none: every packet beyond a hole goes through ``_hold_placed_write``."""

    def __init__(self, off: bool = False):
        self.off = off
        self.taken = 0
        self.real = responder._middles_beyond

    def __call__(self, *args):
        if self.off:
            return 0
        k = self.real(*args)
        self.taken += k
        return k


def _run(mp, seed, sizes, mtu, window, off: bool, faults: bool = True):
    beyond = Beyond(off)
    mp.setattr(responder, "_middles_beyond", beyond)
    r = _exchange(seed, sizes, mtu, window, True, Counting(kernel()), faults)
    return r, beyond




@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(1, 40000), min_size=1, max_size=6),
       st.sampled_from([256, 1024, 4096]), st.sampled_from([8, 32, 128]))
def test_the_kernel_beyond_a_hole_is_python_beyond_a_hole(seed, sizes, mtu, window):
    note(f"replay: _exchange({seed}, {sizes}, {mtu}, {window}, True, kernel)")
    with pytest.MonkeyPatch.context() as mp:
        fast, _ = _run(mp, seed, sizes, mtu, window, off=False)
        slow, _ = _run(mp, seed, sizes, mtu, window, off=True)
    for key in ("wire", "wcs", "memory", "counters_a", "counters_b", "qp"):
        assert fast[key] == slow[key], f"{key} differs beyond a hole (seed {seed})"


def test_many_seeds_take_packets_beyond_a_hole_in_the_kernel():
    """Over a set of seeded lossy runs of long WRITEs to overlapping targets,
    the kernel takes packets beyond holes (the test above compares something),
    and every run ends as Python's."""
    taken = 0
    with pytest.MonkeyPatch.context() as mp:
        for seed in range(12):
            rng = random.Random(seed)
            sizes = [rng.randrange(8000, 40000) for _ in range(4)]
            fast, beyond = _run(mp, seed, sizes, 1024, 32, off=False)
            slow, _ = _run(mp, seed, sizes, 1024, 32, off=True)
            for key in ("wire", "wcs", "memory", "counters_a", "counters_b", "qp"):
                assert fast[key] == slow[key], f"{key} differs (seed {seed})"
            taken += beyond.taken
    assert taken > 20


def _lose_one(mtu: int, sizes: list[int], lost: int, same_target: bool, off: bool, mp,
              order=None):
    """WRITEs of ``sizes`` (each from its own source bytes; ``same_target``: all
    to one address) sent as runs; the packet ``lost`` (counting all packets) is
    dropped once, then resent; ``order`` rearranges the first flush's runs (a
    list of packet lists).  Returns the target memory, the completions and
    how many packets the kernel took beyond the hole."""
    beyond = Beyond(off)
    mp.setattr(responder, "_middles_beyond", beyond)
    a, b, ea, eb = _side(Counting(kernel()), mtu, 128, True)
    total = sum(sizes)
    src = bytes(random.Random(5).getrandbits(8) for _ in range(total))
    ea.buf.view[0:total] = src
    o = 0
    for i, n in enumerate(sizes):
        a.post_send(ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(o, n)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr + (0 if same_target else o),
                                  rkey=eb.mr.rkey))
        o += n
    now, k, wcs, held = 0.0, 0, [], None
    for _ in range(200):
        runs = []
        for item in a.datagram_runs(now):
            seg = item.seg if type(item) is Run else len(item[0])
            buf = bytes(item[0])
            pkts = [buf[p:p + seg] for p in range(0, len(buf), seg)]
            if lost is not None and k <= lost < k + len(pkts):
                del pkts[lost - k]
                k += 1
                lost = None
            k += len(pkts)
            runs.append(pkts)
        if order is not None and runs:
            runs, order = order(runs), None
        for pkts in runs:
            if pkts:
                b.receive_run(b"".join(pkts), len(pkts[0]) if len(pkts) > 1 else 0,
                              a.address, now)
        if held is None:        # beyond the hole: what is held and the ranges placed
            pl = eb.qp.sr.placed
            base = eb.buf.addr
            held = (sorted(eb.qp.sr.ooo), None if pl is None else
                    ([x - base for x in pl.starts], [x - base for x in pl.ends],
                     list(pl.psns)))
        for data, _ in b.datagrams_to_send(now):
            a.receive_datagram(data, b.address, now)
        wcs += [(w.wr_id, int(w.status)) for w in a.poll_cq(ea.send_cq, 64)]
        if len(wcs) == len(sizes):
            break
        now += 0.002
        for d in (a, b):
            t = d.get_timer()
            if t is not None and t <= now:
                d.handle_timer(now)
    return bytes(eb.buf.view[0:total]), wcs, beyond.taken, src, dict(b.counters), held


def test_a_lost_middle_the_rest_is_placed_by_the_kernel_and_every_byte_arrives():
    with pytest.MonkeyPatch.context() as mp:
        mem, wcs, taken, src, c, held = _lose_one(1024, [20 * 1024] * 3, 3, False, False, mp)
        ref = _lose_one(1024, [20 * 1024] * 3, 3, False, True, mp)
    assert wcs == [(0, 0), (1, 0), (2, 0)]
    assert mem == src
    assert c["out_of_seq_request"] > 20 and taken > 20     # most of the 56 beyond it
    assert (mem, wcs) == ref[:2] and c == ref[4] and held == ref[5]


def test_later_writes_to_the_same_bytes_win_when_the_hole_fills():
    """Three WRITEs to one buffer, a MIDDLE of the first lost: the second's and
    third's packets are placed beyond the hole over each other, the first's
    resent packet fills it without overwriting them: the buffer ends with the
    third WRITE's bytes, as in PSN order."""
    n = 16 * 1024
    with pytest.MonkeyPatch.context() as mp:
        mem, wcs, taken, src, c, held = _lose_one(1024, [n] * 3, 2, True, False, mp)
        ref = _lose_one(1024, [n] * 3, 2, True, True, mp)
    assert wcs == [(0, 0), (1, 0), (2, 0)]
    assert mem[:n] == src[2 * n:3 * n]
    assert taken > 10
    assert (mem, wcs) == ref[:2] and c == ref[4] and held == ref[5]


def test_older_middles_beyond_a_hole_do_not_overwrite_newer_ones():
    """Two WRITEs to one buffer; the first's third packet lost, and its later
    MIDDLEs delayed behind the whole second WRITE (placed beyond the hole over
    the same bytes): they are older, so they are not written over the second's
    bytes (``plain_run`` leaves them to ``place_beyond``, which skips them).
    The buffer ends with the second WRITE's bytes, as in PSN order."""
    n = 16 * 1024

    def late(runs):         # FIRST1, run1 (PSN 1, 3..16), FIRST2, run2
        first1, run1, first2, run2 = runs
        return [first1, run1[:1], first2, run2, run1[1:]]
    with pytest.MonkeyPatch.context() as mp:
        mem, wcs, taken, src, c, held = _lose_one(1024, [n] * 2, 2, True, False, mp, late)
        ref = _lose_one(1024, [n] * 2, 2, True, True, mp, late)
    assert wcs == [(0, 0), (1, 0)]
    assert mem[:n] == src[n:2 * n]
    assert taken > 5
    assert (mem, wcs) == ref[:2] and c == ref[4] and held == ref[5]
