"""The device's timer heap (``core.timers.Timers``): QPs fire in the order that a
heap entry pushed at every arming would give (deadline, then the order of
arming), while a deadline that moves away and back is not pushed again.

The reference is that plain heap, written here: each arming that changes a QP's
deadline pushes ``(deadline, seq, qp)``; an entry fires if it is still its QP's
deadline when it reaches the top.  Both are driven by the same random arming and
clock, with deadlines drawn from a few values so that ties and returns are
common; what the completer does at a timeout is replaced by a record of it.
"""

from __future__ import annotations

from heapq import heappop, heappush
from types import SimpleNamespace
from unittest import mock

from hypothesis import given, strategies as st

from softnic.core import completer
from softnic.core.timers import Timers


def _qp(name: str):
    comp = SimpleNamespace(rto_at=None, probe_at=None, rnr_at=None, rnr_wait=False)
    return SimpleNamespace(name=name, comp=comp, cc=None, ccs=None, closed=False,
                           timer_at=None, timer_times=set())


class _Host(Timers):
    """The parts of a device ``Timers`` reads."""

    def __init__(self) -> None:
        self._timers = []
        self._tseq = 0
        self.gsi = None
        self._ready = {}


class _Reference:
    """A heap entry per arming (the rule ``Timers`` keeps with fewer entries)."""

    def __init__(self) -> None:
        self.heap = []
        self.seq = 0

    def arm(self, qp) -> None:
        t = qp.comp.rto_at
        if t == qp.timer_at:
            return
        qp.timer_at = t
        if t is not None:
            self.seq += 1
            heappush(self.heap, (t, self.seq, qp))

    def get_timer(self):
        h = self.heap
        while h:
            t, _, qp = h[0]
            if qp.timer_at == t:
                return t
            heappop(h)
        return None

    def handle_timer(self, now: float, fired: list) -> None:
        h = self.heap
        while h and h[0][0] <= now:
            t, _, qp = heappop(h)
            if qp.timer_at != t:
                continue
            qp.timer_at = None
            fired.append((qp.name, now))
            qp.comp.rto_at = None
            self.arm(qp)


_ops = st.lists(st.one_of(
    st.tuples(st.just("arm"), st.integers(0, 3), st.sampled_from([None, 1.0, 1.5, 2.0, 3.0])),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.5, 1.0]), st.none())),
    max_size=60)


@given(_ops)
def test_qps_fire_as_a_push_per_arming_orders_them(ops):
    host, ref = _Host(), _Reference()
    mine = [_qp(f"q{i}") for i in range(4)]
    theirs = [_qp(f"q{i}") for i in range(4)]
    fired_mine: list = []
    fired_ref: list = []

    def on_timeout(dev, qp, now):
        fired_mine.append((qp.name, now))
        qp.comp.rto_at = None

    now = 0.0
    with mock.patch.object(completer, "on_timeout", on_timeout):
        for op, a, b in ops:
            if op == "arm":
                for qp in (mine[a], theirs[a]):
                    qp.comp.rto_at = None if b is None else now + b
                host.arm(mine[a])
                ref.arm(theirs[a])
            else:
                now += a
                host.handle_timer(now)
                ref.handle_timer(now, fired_ref)
            assert host.get_timer() == ref.get_timer()
            assert fired_mine == fired_ref
            # at most one entry of a QP per deadline time
            keys = [(id(qp), t) for t, _, qp in host._timers]
            assert len(keys) == len(set(keys))
            for qp in mine:
                assert qp.timer_times == {t for t, _, q in host._timers if q is qp}


def test_a_paced_qp_keeps_a_small_heap():
    """A deadline that returns (the retransmission timeout behind each pacing
    deadline) is not pushed again: the heap holds one entry per distinct time."""
    host = _Host()
    qp = _qp("q")
    qp.comp.rto_at = 5000.0
    host.arm(qp)
    fired = []

    def on_timeout(dev, qp, now):
        fired.append(now)
        qp.comp.probe_at = None

    with mock.patch.object(completer, "on_timeout", on_timeout):
        for k in range(1, 1001):
            qp.comp.probe_at = float(k)      # (stands for a pacing deadline: fires, is gone)
            host.arm(qp)
            host.handle_timer(float(k))
            qp.comp.probe_at = None
            host.arm(qp)
    assert fired == [float(k) for k in range(1, 1001)]
    assert host.get_timer() == 5000.0
    assert len(host._timers) == 1
