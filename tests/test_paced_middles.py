"""The requester's paced MIDDLEs compiled (``softnic.accel``'s ``requester.c``)
against ``requester.generate``.

Two worlds are made alike: two devices, an RC (or UC) QP between them with a
controller that records every call and may change its rate as it is told of a
packet, a send queue of WRITEs and SENDs of several packets (some gathered from
two SGEs, once or packet by packet), the first WQE started.  Then both get the same random steps: the
state ``generate`` reads set to drawn values (the next packet, the window and
what it has acknowledged (and holds, for selective repeat), the highest PSN sent, the AckReq count and cadence,
the controller's rate and window, the bytes in flight, the pacer's times, the
record of what was sent, a resend owed, an RNR wait, the QP's state, selective
repeat), and ``generate`` called, the Python one in one world and the compiled
one (``sn_generate``, what the compiled drain calls) in the other.  The packets,
every call to the controller and to the device's ``rto``, the counters and every
field of the QP, its WQEs and its pacer must be the same after every step.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import example, given, settings, strategies as st

import congestion
from congestion.base import Controller
from softnic import accel
from softnic.core import completer, output, requester
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import QPState, QPType, SendFlags, WROpcode as W
from softnic.core.qp import SendWR
from softnic.experiments.rig import connect

MTU = 1024


class _Told(Controller):
    """A controller whose rate and window the steps set; it records what it is
    told of each packet and, when told, may move its rate (as DCQCN's byte
    counter does)."""
    name = "told"
    PARAMS: dict = {}

    def __init__(self, flow, **params):
        super().__init__(flow)
        self.log: list = []
        self.rate = None
        self.window = None
        self.moves: list = []           # rates to take, one per packet told of

    def on_packet_sent(self, *, now, nbytes, psn, retransmit):
        self.log.append(("sent", now, nbytes, psn, retransmit))
        if self.moves:
            self.rate = self.moves.pop(0)


@pytest.fixture(autouse=True, scope="module")
def _registered():
    congestion.CONTROLLERS["told"] = _Told
    yield
    del congestion.CONTROLLERS["told"]


@pytest.fixture(scope="module")
def compiled_generate():
    """``requester.c``'s ``generate``, set up as the compiled drain sets it up;
    fails under CI where it cannot be had."""
    m = accel.fabric_loop()
    if m is None:
        reason = accel.fabric_error or "not built"
        if os.environ.get("CI") == "true":
            pytest.fail(f"no compiled requester under CI: {reason}")
        pytest.skip(f"no compiled requester here: {reason}")
    m.device_methods(Device, completer, requester, output)
    return m.generate


def _world(seed: int):
    rng = random.Random(seed)
    config = DeviceConfig(cc="told", min_timer=rng.choice([1e-6, 5e-6, 100e-6, 1e-3]),
                          ack_every=rng.choice([None, None, 1, 3, 16]),
                          fast_path=rng.random() < 0.9)
    a = Device("a", "10.0.0.1", config=config)
    b = Device("b", "10.0.0.2", config=config)
    ea, eb = connect(a, b, qp_type=rng.choice([QPType.RC, QPType.RC, QPType.RC, QPType.UC]),
                     mtu=MTU, timeout=rng.choice([8, 14]), psn_a=rng.choice([0, 0xFFFFF0]),
                     endpoint_args=dict(buf_size=1 << 18))
    ea.buf.view[:] = rng.randbytes(len(ea.buf.view))
    log = ea.qp.cc.log
    rto = a.rto

    def logged_rto(qp):
        t = rto(qp)
        log.append(("rto", t))
        return t
    a.rto = logged_rto
    for i in range(rng.randrange(1, 4)):
        # a long message of two SGEs (beyond GATHER_ONCE_MAX: each packet gathered
        # from the pieces), or a few packets of one or two (gathered once)
        big = rng.random() < 0.2
        size = MTU * (rng.randrange(66, 80) if big else rng.randrange(3, 9)) \
            - rng.choice([0, 0, 100])
        off = rng.randrange(0, 1 << 14)
        if big or rng.random() < 0.3:
            cut = rng.randrange(1, size)
            sges = [ea.sge(off, cut), ea.sge(off + 100_000, size - cut)]
        else:
            sges = [ea.sge(off, size)]
        op = rng.choice([W.RDMA_WRITE, W.RDMA_WRITE, W.SEND, W.RDMA_WRITE_WITH_IMM])
        # (a remote address and key alike in both worlds: nothing here reaches the peer)
        a.post_send(ea.qp, SendWR(i, op, sges, SendFlags.SIGNALED, remote_addr=0x10000 * (i + 1),
                                  rkey=0x1234, imm_data=7))
    qp = ea.qp
    qp.cc.rate = 1e9                     # the first WQE started: its FIRST sent, then held
    requester.generate(a, qp, 0.0, [])
    return a, qp


def _state(dev, qp) -> tuple:
    req, comp, ccs, cc = qp.req, qp.comp, qp.ccs, qp.cc
    return (
        (req.send_idx, req.psn, req.max_sent_psn, req.rd_atomic, req.pkts_since_ackreq,
         req.error),
        (comp.acked_psn, comp.sacked_psn, comp.rnr_wait, list(comp.rexmit)),
        (ccs.next_tx, ccs.pace_at, dict(ccs.sent), ccs.inflight),
        (cc.rate, cc.window, list(cc.log)),
        [(w.first_psn, w.last_psn, w.next_pkt, w.npkts, w.done) for w in qp.sq],
        (qp.state, qp.window, qp.selective_repeat),
        dict(dev.counters),
    )


def _apply(step: dict, dev, qp, now: float) -> None:
    """Set what ``generate`` reads to the step's values (the same in both worlds)."""
    req, comp, ccs, cc = qp.req, qp.comp, qp.ccs, qp.cc
    w = qp.sq[req.send_idx] if req.send_idx < len(qp.sq) else None
    if w is not None and w.first_psn is not None and step["next_pkt"] is not None:
        w.next_pkt = min(step["next_pkt"], w.npkts - 1)
    if w is not None and w.first_psn is not None:
        base = w.first_psn
        comp.acked_psn = (base + step["acked"]) & 0xFFFFFF
        req.max_sent_psn = (base + step["max_sent"]) & 0xFFFFFF
        comp.sacked_psn = None if step["sacked"] is None else (base + step["sacked"]) & 0xFFFFFF
        w.done = step["done"]
    req.error = step["error"]
    qp.window = step["window"]
    req.pkts_since_ackreq = step["since_ackreq"]
    cc.rate = step["rate"]
    cc.window = step["cc_window"]
    cc.moves = list(step["moves"])
    ccs.inflight = step["inflight"]
    ccs.next_tx = now + step["next_tx"]
    ccs.pace_at = {"none": None, "next": ccs.next_tx, "other": now + 1e-6}[step["pace_at"]]
    if w is not None and w.first_psn is not None:
        for k in step["sent"]:
            ccs.sent[(w.first_psn + k) & 0xFFFFFF] = (now - 1e-6, 1100, False)
    comp.rexmit.clear()
    if step["rexmit"] and qp.sq and qp.sq[0].first_psn is not None:
        comp.rexmit.append(qp.sq[0].first_psn)
    comp.rnr_wait = step["rnr_wait"]
    qp.state = step["state"]
    qp.selective_repeat = step["sr"]


_steps = st.fixed_dictionaries({
    "next_pkt": st.one_of(st.none(), st.integers(1, 8), st.integers(1, 80)),
    "acked": st.integers(-3, 8),
    "max_sent": st.integers(-2, 9),
    "window": st.sampled_from([1, 2, 4, 8, 128]),
    "since_ackreq": st.integers(0, 20),
    "rate": st.sampled_from([None, 1e8, 1e9, 5e9, 25e9, 1e12]),
    "cc_window": st.sampled_from([None, None, 1000, 5000, 1e9]),
    "moves": st.lists(st.sampled_from([None, 1e9, 1e13]), max_size=3),
    "inflight": st.sampled_from([0, 500, 4000, 10 ** 7]),
    "next_tx": st.sampled_from([-1e-6, 0.0, 0.0, 2e-6]),
    "pace_at": st.sampled_from(["none", "none", "next", "other"]),
    "sent": st.lists(st.integers(0, 8), max_size=3),
    "rexmit": st.sampled_from([False, False, False, True]),
    "sacked": st.one_of(st.none(), st.none(), st.integers(-2, 8)),
    "done": st.sampled_from([False] * 9 + [True]),
    "error": st.sampled_from([False] * 9 + [True]),
    "rnr_wait": st.sampled_from([False, False, False, True]),
    "state": st.sampled_from([QPState.RTS, QPState.RTS, QPState.RTS, QPState.SQD,
                              QPState.ERR]),
    "sr": st.sampled_from([False, False, False, True]),
})


def _step(**values) -> dict:
    """A step written out: nothing held, nothing owed, but ``values``."""
    step = dict(next_pkt=None, acked=0, max_sent=0, window=128, since_ackreq=0, rate=None,
                cc_window=None, moves=[], inflight=0, next_tx=-1e-6, pace_at="none", sent=[],
                rexmit=False, sacked=None, done=False, error=False, rnr_wait=False,
                state=QPState.RTS, sr=False)
    step.update(values)
    return step


def _same(got, want, where: str) -> None:
    """got == want, or a short account of the first difference (pytest's own
    account of two long lists of packets takes minutes)."""
    if got == want:
        return
    if len(got) != len(want):
        raise AssertionError(f"{where}: {len(got)} items, the Python's {len(want)}")
    i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    raise AssertionError(f"{where}: item {i} is {got[i]!r:.300}, the Python's {want[i]!r:.300}")


@settings(max_examples=600, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), steps=st.lists(_steps, min_size=1, max_size=8))
# (seed 2: an RC QP, three WQEs, the first of eight packets)
# selective repeat: the PSNs the responder holds open the window go-back-N keeps shut
@example(seed=2, steps=[_step(next_pkt=4, max_sent=9, window=1, sacked=3, sr=True)])
# HELD: the WQE up next is done, so the pacer holds nothing and the next WQE starts
@example(seed=2, steps=[_step(next_pkt=2, rate=1e9, next_tx=2e-6, pace_at="next", done=True)])
def test_the_compiled_paced_middles_take_every_step_as_the_python(compiled_generate, seed,
                                                                   steps):
    py, cc = _world(seed), _world(seed)
    assert _state(*cc) == _state(*py)
    now = 1e-3
    for k, step in enumerate(steps):
        outs = []
        for (dev, qp), gen in ((py, requester.generate), (cc, compiled_generate)):
            _apply(step, dev, qp, now)
            out: list = []
            gen(dev, qp, now, out)
            outs.append([(bytes(p), d) for p, d in out])
        _same(outs[1], outs[0], f"step {k}, packets")
        _same(_state(*cc), _state(*py), f"step {k}, state")
        now += 1e-6


def test_a_generate_put_in_the_modules_place_is_called(compiled_generate, monkeypatch):
    """A stand-in for ``requester.generate`` (a test's, a tracer's) is what the
    compiled one calls, for the case it would run itself too."""
    dev, qp = _world(1)
    qp.cc.rate = None
    calls = []
    monkeypatch.setattr(requester, "generate", lambda *a: calls.append(a))
    out: list = []
    compiled_generate(dev, qp, 1.0, out)
    assert calls == [(dev, qp, 1.0, out)] and out == []


def test_a_paced_write_leaves_as_middles_from_the_compiled_path(compiled_generate,
                                                                 monkeypatch):
    """Not a vacuous property: the compiled path sends a WQE's MIDDLEs itself, and
    only its LAST goes through the Python's ``_send_packet`` (this fails if
    ``sn_generate`` always hands over to the Python)."""
    dev, qp = _world(3)
    w = qp.sq[0]
    qp.cc.rate = None                   # nothing holds the WQE
    by_python = []
    real = requester._send_packet
    monkeypatch.setattr(requester, "_send_packet", lambda d, q, wqe, *a: (
        by_python.append(wqe.next_pkt) if wqe is w else None, real(d, q, wqe, *a))[1])
    out: list = []
    compiled_generate(dev, qp, 1.0, out)
    psns = {(w.first_psn + i) & 0xFFFFFF for i in range(1, w.npkts - 1)}
    mids = [p for p, _ in out if int.from_bytes(p[9:12], "big") in psns]
    assert w.npkts > 2 and len(mids) == w.npkts - 2
    assert all(p[0] == requester._MIDDLE[w.opcode] for p in mids)
    assert by_python == [w.npkts - 1] and w.next_pkt == w.npkts
