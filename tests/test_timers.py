"""The device's timer heap (``core.timers.Timers``): QPs fire in the order that a
heap entry pushed at every arming would give (deadline, then the order of
arming), while a deadline that moves away and back is not pushed again.

The reference is that plain heap, written here: each arming that changes a QP's
deadline pushes ``(deadline, seq, qp)``; an entry fires if it is still its QP's
deadline when it reaches the top.  Both are driven by the same random arming and
clock, with deadlines drawn from a few values so that ties and returns are
common; what the completer does at a timeout is replaced by a record of it.
Each runs on the Python ``Timers`` and on the compiled ones (``softnic.accel``'s
``timers.c``, which ``give_compiled`` makes a device class's).

Then the compiled timers against the Python, everything they read and call in
play: retransmission, probe and RNR deadlines, a controller's pacing deadline
and its own timer, QPs made ready and drained, closed QPs and the CM agent's
timer.  Two devices get the same random steps; every call either makes to the
completer, a controller, the device or the agent is logged, and the logs, the
answers, the heaps and the QPs' state must be the same after every step.

Last, the compiled drain (``output.c``: ``Output.datagrams_to_send``, ``_outgoing``
and ``_requests``) against the Python's, the same way, over QPs of every kind.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from heapq import heappop, heappush
from types import SimpleNamespace
from unittest import mock

import pytest
from hypothesis import example, given, settings, strategies as st

from softnic import accel
from softnic.core import completer, requester
from softnic.core.enums import QPState, QPType
from softnic.core.output import Output
from softnic.core.timers import Timers


class _QP:
    """A QP's stand-in: the fields ``Timers`` reads; hashable by identity, as a QP
    (the device's ready QPs are a dict of them)."""

    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)


def _qp(name: str):
    comp = SimpleNamespace(rto_at=None, probe_at=None, rnr_at=None, rnr_wait=False)
    return _QP(name=name, comp=comp, cc=None, ccs=None, closed=False,
               timer_at=None, timer_times=set())


class _Host(Timers):
    """The parts of a device ``Timers`` reads."""

    def __init__(self) -> None:
        self._timers = []
        self._tseq = 0
        self.gsi = None
        self._ready = {}


def _compiled(host) -> None:
    """Give ``host`` the compiled timers; fail where they cannot be had."""
    if not accel.give_compiled(host):
        reason = accel.fabric_error or "not given"
        if os.environ.get("CI") == "true":
            pytest.fail(f"no compiled timers under CI: {reason}")
        pytest.skip(f"no compiled timers here: {reason}")


@pytest.fixture(autouse=True, scope="module")
def _built():
    """The compiled module built (or found) before any property's examples are
    timed: a first build takes seconds."""
    accel.fabric_loop()


class _CompiledHost(_Host):
    """``_Host`` whose class is given the compiled timers (``give_compiled`` gives
    them to a class, so the Python's stay ``_Host``'s)."""


def _make(impl: str) -> _Host:
    """A ``_Host`` with the timers named: "python" or "compiled"."""
    if impl == "python":
        return _Host()
    host = _CompiledHost()
    _compiled(host)
    return host


IMPLS = pytest.mark.parametrize("impl", ["python", "compiled"])


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


@IMPLS
@given(ops=_ops)
def test_qps_fire_as_a_push_per_arming_orders_them(impl, ops):
    host, ref = _make(impl), _Reference()
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


@IMPLS
def test_a_paced_qp_keeps_a_small_heap(impl):
    """A deadline that returns (the retransmission timeout behind each pacing
    deadline) is not pushed again: the heap holds one entry per distinct time."""
    host = _make(impl)
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


# --------------------------------------------------------- compiled against Python

class _Controller:
    """A controller's stand-in: its own timer at ``at``, which ``on_timer`` moves
    ``period`` on (None: gone)."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.at, self.period = name, log, None, None

    def next_timer(self):
        self.log.append(("next_timer", self.name))
        return self.at

    def on_timer(self, now: float) -> None:
        self.log.append(("on_timer", self.name, now))
        self.at = None if self.period is None else now + self.period


class _Agent:
    """The CM agent's stand-in (``dev.gsi``): one deadline."""

    def __init__(self, log: list) -> None:
        self.log, self.at = log, None

    def get_timer(self):
        self.log.append(("gsi.get_timer",))
        return self.at

    def handle_timer(self, now: float) -> None:
        self.log.append(("gsi.handle_timer", now))
        self.at = None


class _Device(_Host):
    """``_Host`` with what ``handle_timer`` calls on its device."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log
        self.busy: set = set()          # QPs whose drain would send something

    def drain_idle(self, qp, now: float) -> bool:
        self.log.append(("drain_idle", qp.name, now))
        return qp.name not in self.busy


class _CompiledDevice(_Device):
    """``_Device`` whose class is given the compiled timers."""


def _world(impl: str):
    log: list = []
    dev = _Device(log) if impl == "python" else _CompiledDevice(log)
    if impl == "compiled":
        _compiled(dev)
    qps = []
    for i in range(3):
        qp = _qp(f"q{i}")
        if i:                           # q1 and q2 have a controller and pacing
            qp.cc = _Controller(qp.name, log)
            qp.ccs = SimpleNamespace(pace_at=None)
        qp.rearm = i == 1               # q1's timeout arms it again
        qps.append(qp)
    qps[2].comp.rto_at = 100.0          # (a later deadline: the arming left to a drain is seen)
    return log, dev, qps


def _on_timeout(dev, qp, now):
    """The completer's stand-in: what came due is cleared; some QPs arm again
    from inside it, as the completer does."""
    dev.log.append(("on_timeout", qp.name, now))
    c = qp.comp
    if c.rto_at is not None and c.rto_at <= now:
        c.rto_at = None
    c.probe_at = None
    c.rnr_wait = False
    c.rnr_at = None
    if qp.rearm:
        dev.arm(qp)


def _state(dev, qps) -> tuple:
    def part(o, names):
        return None if o is None else tuple(getattr(o, n) for n in names)
    return (
        [(t, s, qp.name) for t, s, qp in dev._timers],
        [qp.name for qp in dev._ready],
        None if dev.gsi is None else dev.gsi.at,
        [(qp.timer_at, sorted(qp.timer_times), qp.closed,
          part(qp.comp, ("rto_at", "probe_at", "rnr_at", "rnr_wait")),
          part(qp.ccs, ("pace_at",)), part(qp.cc, ("at", "period"))) for qp in qps],
    )


_delta = st.sampled_from([None, 0.0, 0.5, 1.0, 2.0])
_qpi = st.integers(0, 2)
_steps = st.lists(st.one_of(
    # a deadline set, then (as the engine does) the QP armed, or not
    st.tuples(st.just("set"), _qpi,
              st.sampled_from(["pace_at", "cc_at", "rto_at", "probe_at", "rnr_at", "cc_period"]),
              _delta, st.booleans()),
    st.tuples(st.just("busy"), _qpi, st.booleans()),
    st.tuples(st.just("arm"), _qpi),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.5, 1.0, 1.5])),
    st.tuples(st.just("get")),
    st.tuples(st.just("ready"), _qpi),
    st.tuples(st.just("drain")),
    st.tuples(st.just("close"), _qpi),
    st.tuples(st.just("agent"), _delta)),
    max_size=60)


def _step(step, now, log, dev, qps):
    op = step[0]
    if op == "set":
        _, i, field, d, arm = step
        qp = qps[i]
        v = None if d is None else now + d
        if field == "pace_at":
            if qp.ccs is not None:
                qp.ccs.pace_at = v
        elif field == "cc_at":
            if qp.cc is not None:
                qp.cc.at = v
        elif field == "cc_period":
            if qp.cc is not None:
                qp.cc.period = None if d is None else d + 0.25
        else:
            setattr(qp.comp, field, v)
            if field == "rnr_at":       # (an RNR wait is both, as the completer sets it)
                qp.comp.rnr_wait = v is not None
        if arm:
            dev.arm(qp)
    elif op == "busy":
        _, i, b = step
        if b:
            dev.busy.add(qps[i].name)
        else:
            dev.busy.discard(qps[i].name)
    elif op == "arm":
        dev.arm(qps[step[1]])
    elif op == "tick":
        now += step[1]
        dev.handle_timer(now)
    elif op == "get":
        log.append(("get_timer", dev.get_timer()))
    elif op == "ready":
        dev._ready[qps[step[1]]] = None
    elif op == "drain":                 # as Output._outgoing takes them: each armed
        for qp in list(dev._ready):
            del dev._ready[qp]
            if qp.cc is not None:
                dev.arm(qp)
    elif op == "close":
        qps[step[1]].closed = True
    elif op == "agent":
        if dev.gsi is None:
            dev.gsi = _Agent(log)
        dev.gsi.at = None if step[1] is None else now + step[1]
    return now


@settings(max_examples=1000, deadline=None)     # (the rarer mixes need many; ~10 s)
@given(steps=_steps)
# and the mixes that random steps reach rarely, always:
@example(steps=[("set", 1, "pace_at", 0.5, True), ("set", 1, "cc_at", 0.5, True),
                ("tick", 1.0)])                 # pacing and controller due at once
@example(steps=[("set", 2, "pace_at", 0.5, True), ("tick", 1.0), ("get",)])  # left to the drain
@example(steps=[("set", 0, "rto_at", 0.5, True), ("close", 0), ("tick", 1.0)])  # closed: not fired
@example(steps=[("set", 0, "rto_at", 1.0, True), ("close", 0), ("get",),
                ("arm", 0)])                    # closed: its entry dropped, its deadline kept
@example(steps=[("set", 1, "cc_at", 0.5, True), ("busy", 1, True), ("tick", 1.0),
                ("drain",)])                    # a controller's timer, the drain busy
@example(steps=[("agent", 0.5), ("set", 0, "rto_at", 1.0, True), ("get",), ("tick", 0.5),
                ("get",)])                      # the CM agent's timer first
def test_the_compiled_timers_take_every_step_as_the_python(steps):
    py, cc = _world("python"), _world("compiled")
    now = 0.0
    with mock.patch.object(completer, "on_timeout", _on_timeout):
        for k, step in enumerate(steps):
            t_py = _step(step, now, *py)
            t_cc = _step(step, now, *cc)
            assert t_py == t_cc
            now = t_py
            assert cc[0] == py[0], (k, step)                    # every call, in order
            assert _state(*cc[1:]) == _state(*py[1:]), (k, step)


def test_the_compiled_timers_are_given_only_where_timers_are_timers_own():
    """A device class that overrides a timer method keeps its own (as iWARP's
    does); a class given them has them as its methods (not its devices'
    attributes), and so have its subclasses; each device keeps its own state."""
    class Own(_Host):
        def get_timer(self):
            return None
    assert not accel.give_compiled(Own())
    assert Own.arm is Timers.arm

    class Given(_Host):
        pass

    class Sub(Given):
        pass
    host = Given()
    host._tseq = 41
    _compiled(host)
    assert type(host) is Given and Given.arm is not Timers.arm and _Host.arm is Timers.arm
    assert type(vars(Given)["handle_timer"]).__name__ == "method_descriptor"
    assert "arm" not in vars(host)
    qp = _qp("q")
    qp.comp.rto_at = 1.0
    host.arm(qp)                        # its seqs go on from the device's
    assert host._timers == [(1.0, 42, qp)] and host._ctimers.seq == 42
    other = Sub()
    assert accel.give_compiled(other) and Sub.arm is Given.arm

    class Overrides(Given):             # (as iWARP's device, a subclass of one given them)
        def get_timer(self):
            return None
    assert not accel.give_compiled(Overrides())

    armed = []

    class OwnArm(Given):                # the compiled timers call a subclass's own arm
        def arm(self, qp):
            armed.append(qp.name)
            Timers.arm(self, qp)
    assert not accel.give_compiled(OwnArm())
    h = OwnArm()
    q = _qp("q3")
    q.comp.rto_at = 1.0
    h.arm(q)

    def on_timeout(dev, qp, now):
        qp.comp.rto_at = None
    with mock.patch.object(completer, "on_timeout", on_timeout):
        h.handle_timer(1.0)             # fires q3, then arms it: through OwnArm.arm
    assert armed == ["q3", "q3"] and q.timer_at is None
    qp2 = _qp("q2")
    qp2.comp.rto_at = 2.0
    other.arm(qp2)                      # a heap and seqs of its own
    assert other._timers == [(2.0, 1, qp2)] and host._timers == [(1.0, 42, qp)]


# ------------------------------------------------ the drain, compiled against Python

class _Drain(Output, Timers):
    """What ``Output``'s drain reads and calls on a device, with the Python timers
    and drain; what a packet is (the requester's ``generate``, the responder's
    ``_responses``, the completer's ``complete``, sealing) is a record of it."""

    def __init__(self, log: list, icrc: bool) -> None:
        self._timers = []
        self._tseq = 0
        self.gsi = None
        self._ready = {}
        self._cnps = []
        self.log = log
        self.config = SimpleNamespace(icrc=icrc, min_timer=0.0)
        self.counters = Counter({"sent_pkts": 0, "np_cnp_sent": 0})
        self.fast = True

    def _responses(self, qp, out) -> None:
        self.log.append(("responses", qp.name, len(out)))
        while qp.resp.out:
            out.append((bytearray(qp.resp.out.popleft()), ("10.0.0.9", 4791)))

    def _sealed(self, out, flat) -> list:
        self.log.append(("sealed", len(out), flat))
        return [(bytes(p), d) for p, d in out]

    def rto(self, qp) -> float:
        self.log.append(("rto", qp.name))
        return 1.0

    def probe_interval(self, qp) -> float:
        self.log.append(("probe_interval", qp.name))
        return 0.25


class _CompiledDrain(_Drain):
    """``_Drain`` whose class is given the compiled timers and drain."""


def _generate(dev, qp, now, out):
    """The requester's stand-in: the packets its plan says, from the send index on."""
    dev.log.append(("generate", qp.name, now, len(out)))
    for _ in range(qp.plan):
        out.append((bytearray(b"pkt-" + qp.name.encode()), ("10.0.0.9", 4791)))
    qp.req.send_idx = len(qp.sq)
    qp.comp.rexmit = False


def _complete(dev, qp):
    dev.log.append(("complete", qp.name))
    while qp.sq and qp.sq[0].done:
        qp.sq.popleft()


class _DrainAgent:
    """A CM agent's face to the drain: MADs it has to send (``pending``, a question
    either drain may ask more than once) and hands over (``datagrams``, logged)."""

    def __init__(self, log: list) -> None:
        self.log = log
        self._out: list = []

    @property
    def pending(self) -> bool:
        return bool(self._out)

    def datagrams(self) -> list:
        self.log.append(("mads", len(self._out)))
        out, self._out = self._out, []
        return out

    def get_timer(self):
        return None                     # (no deadline: the timers' own test has them)


def _drain_world(impl: str, seed: int):
    import random
    rng = random.Random(seed)
    log: list = []
    dev = (_Drain if impl == "python" else _CompiledDrain)(log, icrc=rng.random() < 0.3)
    if impl == "compiled":
        _compiled(dev)
    qps = []
    for i in range(4):
        qp = _qp(f"q{i}")
        qp.state = rng.choice([QPState.RTS, QPState.RTS, QPState.SQD, QPState.RTR])
        qp.qp_type = rng.choice([QPType.RC, QPType.RC, QPType.UC])
        qp.attr = SimpleNamespace(timeout=rng.choice([0, 14, 14]))
        qp.selective_repeat = rng.random() < 0.5
        qp.sq = deque(SimpleNamespace(done=rng.random() < 0.3) for _ in range(rng.randrange(3)))
        qp.req = SimpleNamespace(send_idx=rng.randrange(len(qp.sq) + 1))
        qp.comp.rexmit = rng.random() < 0.2
        qp.comp.rto_at = rng.choice([None, None, None, 5.0])
        qp.resp = SimpleNamespace(out=deque(b"ack" for _ in range(rng.randrange(2))))
        qp.plan = rng.randrange(3)
        qp.closed = rng.random() < 0.1
        qp.rearm = False
        if rng.random() < 0.5:
            qp.cc = _Controller(qp.name, log)
            qp.ccs = SimpleNamespace(pace_at=None)
        qps.append(qp)
    if rng.random() < 0.5:
        dev.gsi = _DrainAgent(log)      # (a NIC's device: a CM agent, mostly with nothing to send)
    return log, dev, qps


def _drain_state(dev, qps, res) -> tuple:
    return (res, [(t, s, qp.name) for t, s, qp in dev._timers], [q.name for q in dev._ready],
            dict(dev.counters),
            [(qp.timer_at, qp.comp.rto_at, qp.comp.probe_at, qp.req.send_idx, len(qp.sq),
              len(qp.resp.out)) for qp in qps])


@settings(max_examples=1000, deadline=None)
@given(seed=st.integers(0, 2**32 - 1),
       picks=st.lists(st.tuples(st.sampled_from(["ready", "drain", "runs", "tick", "mad"]),
                                st.integers(0, 3)), max_size=12))
def test_the_compiled_drain_takes_every_step_as_the_python(seed, picks):
    """QPs of every kind (sending or not, closed, RC or UC, with a timeout or
    not, selective repeat, controlled, with completions due, with answers owed)
    on a device with a CM agent (MADs to send or none) or without,
    made ready and drained by ``datagrams_to_send`` (one packet, or several for
    ``_sealed``) and ``_outgoing`` (a driver's ``datagram_runs``), on the Python
    drain and on the compiled one: every call, every answer, the heaps, the
    counters and the QPs' state the same after each step."""
    py, cc = _drain_world("python", seed), _drain_world("compiled", seed)
    now = 0.0
    with mock.patch.object(requester, "generate", _generate), \
            mock.patch.object(completer, "complete", _complete), \
            mock.patch.object(completer, "on_timeout", _on_timeout):
        for k, (op, i) in enumerate(picks):
            results = []
            for log, dev, qps in (py, cc):
                if op == "ready":
                    dev._ready[qps[i]] = None
                    res = None
                elif op == "mad":
                    if dev.gsi is not None:
                        dev.gsi._out.append((bytearray(b"mad"), ("10.0.0.9", 4791)))
                    res = None
                elif op == "drain":
                    res = dev.datagrams_to_send(now)
                elif op == "runs":
                    res = dev.datagram_runs(now)
                else:
                    res = dev.handle_timer(now + 0.5)
                results.append(_drain_state(dev, qps, res))
            now += 0.5 if op == "tick" else 0.0
            assert cc[0] == py[0], (k, op, i)
            assert results[1] == results[0], (k, op, i)
