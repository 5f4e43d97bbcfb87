"""An uncontrolled QP's gathered runs compiled (``softnic.accel``'s ``requester.c``,
``bulk_runs``) against ``requester.generate``.

Two worlds are made alike: two devices, an RC QP between them (sometimes UC, or
with selective repeat; sometimes a device whose driver does not gather, or that
has no kernel, or no fast paths: the Python's in both worlds), no controller, a
send queue of SENDs (plain, with an immediate, with an invalidation) and WRITEs
(plain, with an immediate) of one to several packets, their LASTs of every
length (one whose ImmDt or IETH leaves it no room in an MTU leaves alone), from
one SGE or two, some with a key the device does not know or beyond its MR, some
solicited, fenced or inline, a READ or an atomic among them.  Then both get the same random steps: the state
``generate`` reads set to drawn values (the window and what it has
acknowledged, the highest PSN sent, the AckReq count and cadence, a resend owed,
an RNR wait, the QP's state), and ``generate`` called, the Python one in one
world and the compiled one (``sn_generate``, what the compiled drain calls) in
the other.  The packets (each run laid end to end, and whether it is a gathered
run), the counters and every field of the QP and its WQEs must be the same after
every step.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings, strategies as st

from softnic import accel
from softnic.core import requester
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import QPState, QPType, SendFlags, WROpcode as W
from softnic.core.qp import SendWR
from softnic.experiments.rig import connect
from softnic.wire.icrc import append_icrc
from test_paced_middles import _same


@pytest.fixture(scope="module")
def compiled_generate(compiled_with_kernel):
    """``requester.c``'s ``generate``, the kernel's builders hooked in as a NIC's
    ``give_compiled`` hooks them (conftest's ``compiled_with_kernel``)."""
    return compiled_with_kernel.generate


_OPS = [W.SEND, W.SEND, W.SEND_WITH_IMM, W.RDMA_WRITE, W.RDMA_WRITE_WITH_IMM,
        W.SEND_WITH_INV, W.RDMA_READ, W.ATOMIC_FETCH_AND_ADD]


def _world(seed: int):
    rng = random.Random(seed)
    mtu = rng.choice([256, 1024, 4096])
    config = DeviceConfig(ack_every=rng.choice([None, None, 1, 3, 16]),
                          fast_path=rng.random() < 0.9)
    a = Device("a", "10.0.0.1", config=config)
    b = Device("b", "10.0.0.2", config=config)
    ea, eb = connect(a, b, qp_type=rng.choice([QPType.RC] * 6 + [QPType.UC]), mtu=mtu,
                     psn_a=rng.choice([0, 0, 0xFFFFF0]), endpoint_args=dict(buf_size=1 << 17))
    ea.buf.view[:] = rng.randbytes(len(ea.buf.view))
    a.kernel = accel.load() if rng.random() < 0.9 else None
    a.tx_gather = rng.random() < 0.85
    ea.qp.selective_repeat = rng.random() < 0.1
    uc = ea.qp.qp_type is QPType.UC
    for i in range(rng.randrange(1, 6)):
        op = rng.choice(_OPS[:5] if uc else _OPS)      # (UC: SENDs and WRITEs, no IETH)
        if op is W.ATOMIC_FETCH_AND_ADD:
            size = 8
        else:
            npkts = rng.choice([1, 2, 2, 3, 5, 9])
            # the LAST's length: any, or close to a whole MTU (an ImmDt or IETH then
            # leaves it no room)
            size = (npkts - 1) * mtu + rng.choice([1, 3, 61, mtu - 3, mtu - 1, mtu,
                                                   rng.randrange(1, mtu + 1)])
        off = rng.randrange(0, 1 << 14)
        if rng.random() < 0.25 and size > 1:
            cut = rng.randrange(1, size)
            sges = [ea.sge(off, cut), ea.sge(off + 50_000, size - cut)]
        else:
            sges = [ea.sge(off, size)]
        if rng.random() < 0.05:
            sges[0] = (sges[0][0], sges[0][1], 0xBAD)       # a key the device does not know
        elif rng.random() < 0.04 and op is not W.ATOMIC_FETCH_AND_ADD:   # beyond its MR's end
            sges[0] = ea.sge(len(ea.buf.view) - 8, sges[0][1] + 8)
        flags = SendFlags.SIGNALED | (SendFlags.SOLICITED if rng.random() < 0.5 else 0)
        if rng.random() < 0.15:
            flags |= SendFlags.FENCE        # (behind a READ or an atomic: it waits)
        if rng.random() < 0.1 and size <= 64 and op not in (W.RDMA_READ,
                                                             W.ATOMIC_FETCH_AND_ADD):
            flags |= SendFlags.INLINE
        a.post_send(ea.qp, SendWR(i, op, sges, flags, remote_addr=0x10000 * (i + 1),
                                  rkey=0x1234, imm_data=rng.randrange(1 << 32),
                                  invalidate_rkey=rng.randrange(1 << 32)))
    # the memory changed after the posts: an inline WQE carries what it held at its
    # post, any other what it holds when it starts
    ea.buf.view[:] = rng.randbytes(len(ea.buf.view))
    return a, ea.qp


def _state(dev, qp) -> tuple:
    req, comp = qp.req, qp.comp
    return (
        (req.send_idx, req.psn, req.max_sent_psn, req.rd_atomic, req.pkts_since_ackreq,
         req.error),
        (comp.acked_psn, comp.rnr_wait, list(comp.rexmit)),
        [(w.first_psn, w.last_psn, w.next_pkt, w.npkts, w.done, w.status) for w in qp.sq],
        (qp.state, qp.window),
        dict(dev.counters),
    )


def _items(dev, out: list) -> list:
    """What leaves, comparable: a run as its packets laid end to end (and whether
    it is a gathered one), a packet as its bytes with its ICRC (as ``_sealed``
    appends it: the compiled path gives a request of one packet ``Sealed``, ICRC
    included)."""
    res = []
    for item in out:
        if type(item) is requester.Run and (item.count > 1 or type(item.buf) is requester.Gather):
            buf = item.buf
            gathered = type(buf) is requester.Gather
            data = bytes(buf.flatten() if gathered else buf)
            res.append(("run", data, item.dest, item.seg, item.count, gathered))
        elif type(item) is requester.Run:         # one datagram (its seg: at least its length)
            assert item.seg >= len(item.buf)
            res.append(("packet", bytes(item.buf), item.dest))
        elif type(item) is requester.Sealed:
            res.append(("packet", bytes(item.pkt), item.dest))
        else:
            pkt, dest = item
            sealed = bytes(append_icrc(bytearray(pkt), dev.ip, dest[0], dev.port, dest[1])
                           if dev.config.icrc else bytes(pkt) + bytes(4))
            res.append(("packet", sealed, dest))
    return res


def _apply(step: dict, qp) -> None:
    """Set what ``generate`` reads to the step's values (the same in both worlds)."""
    req, comp = qp.req, qp.comp
    base = (req.psn - step["behind"]) & 0xFFFFFF    # the acknowledged PSN, behind the next
    comp.acked_psn = (base - 1) & 0xFFFFFF
    if step["resent"]:
        req.max_sent_psn = (req.max_sent_psn + step["resent"]) & 0xFFFFFF
    qp.window = step["window"]
    req.pkts_since_ackreq = step["since_ackreq"]
    comp.rexmit.clear()
    if step["rexmit"] and qp.sq and qp.sq[0].first_psn is not None:
        comp.rexmit.append(qp.sq[0].first_psn)
    comp.rnr_wait = step["rnr_wait"]
    qp.state = step["state"]


_steps = st.fixed_dictionaries({
    "behind": st.integers(0, 12),
    "resent": st.sampled_from([0, 0, 0, 1, 3]),
    "window": st.sampled_from([1, 2, 3, 8, 128]),
    "since_ackreq": st.integers(0, 20),
    "rexmit": st.sampled_from([False] * 7 + [True]),
    "rnr_wait": st.sampled_from([False] * 7 + [True]),
    "state": st.sampled_from([QPState.RTS] * 6 + [QPState.SQD, QPState.ERR]),
})


def _step(**values) -> dict:
    """A step written out: the window open, nothing owed, but ``values``."""
    step = dict(behind=0, resent=0, window=128, since_ackreq=0, rexmit=False,
                rnr_wait=False, state=QPState.RTS)
    step.update(values)
    return step


@settings(max_examples=500, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), steps=st.lists(_steps, min_size=1, max_size=8))
@example(seed=4, steps=[_step(), _step(window=2), _step(behind=1)])
# a fenced WQE behind an outstanding READ or atomic waits
@example(seed=17113, steps=[_step(window=1), _step(window=1)])
# an inline SEND: what its memory held at the post
@example(seed=162, steps=[_step()])
def test_the_compiled_runs_take_every_step_as_the_python(compiled_generate, seed, steps):
    py, cc = _world(seed), _world(seed)
    assert _state(*cc) == _state(*py)
    for k, step in enumerate(steps):
        outs = []
        for (dev, qp), gen in ((py, requester.generate), (cc, compiled_generate)):
            _apply(step, qp)
            out: list = []
            gen(dev, qp, 1.0, out)
            outs.append(_items(dev, out))
        _same(outs[1], outs[0], f"step {k}, packets")
        _same(_state(*cc), _state(*py), f"step {k}, state")


def _gathering():
    """A device whose driver gathers, with the kernel, and its endpoint of an RC QP
    connected at MTU 1024 to another device's."""
    config = DeviceConfig()
    a, b = Device("a", "10.0.0.1", config=config), Device("b", "10.0.0.2", config=config)
    ea, _ = connect(a, b, mtu=1024, endpoint_args=dict(buf_size=1 << 16))
    a.kernel = accel.load()
    a.tx_gather = True
    return a, ea


def _send_world():
    """A device that gathers, with the kernel: an RC QP and three SENDs of three
    packets (the last one short), posted, none started."""
    a, ea = _gathering()
    for i in range(3):
        a.post_send(ea.qp, SendWR(i, W.SEND, [ea.sge(4096 * i, 2100)], SendFlags.SIGNALED))
    return a, ea.qp


def test_sends_leave_as_runs_from_the_compiled_path(compiled_generate, record_calls):
    """Not a vacuous property: the compiled path builds a SEND's whole run itself
    (FIRST, MIDDLE and LAST gathered), and no Python builder of runs or packets
    is called (this fails if ``sn_generate`` hands every case to the Python)."""
    dev, qp = _send_world()
    called = record_calls(requester, ("_bulk_run", "_bulk", "middle_run", "_run_last",
                                      "_send_packet"))
    out: list = []
    compiled_generate(dev, qp, 1.0, out)
    assert called == []
    assert [type(r) for r in out] == [requester.Run] * 3
    assert all(type(r.buf) is requester.Gather and r.count == 3 and r.buf.count == 2
               and r.buf.last is not None for r in out)
    assert [w.next_pkt for w in qp.sq] == [3, 3, 3] and qp.req.send_idx == 3


def test_start_is_the_pythons_called_from_the_compiled_path(compiled_generate, monkeypatch):
    """START stays ``start``'s (and ``_may_start``'s): the compiled path calls them,
    looked up in the module at each call (and the Python's walk, which would call
    them too, does not run: ``_bulk_run`` is not called)."""
    dev, qp = _send_world()
    calls = []
    monkeypatch.setattr(requester, "_bulk_run", lambda *a: calls.append("_bulk_run"))
    real_may, real_start = requester._may_start, requester.start
    monkeypatch.setattr(requester, "_may_start",
                        lambda q, w, rc: (calls.append(("may", w.wr_id)), real_may(q, w, rc))[1])
    monkeypatch.setattr(requester, "start",
                        lambda d, q, w: (calls.append(("start", w.wr_id)), real_start(d, q, w))[1])
    compiled_generate(dev, qp, 1.0, [])
    assert calls == [("may", 0), ("start", 0), ("may", 1), ("start", 1), ("may", 2),
                     ("start", 2)]


def test_one_packet_requests_leave_from_the_compiled_path(compiled_generate, record_calls):
    """Not a vacuous property either: a request of one packet of each kind the
    compiled path packs (SEND, SEND with an immediate or an invalidation, WRITE
    and WRITE with an immediate of an MTU at most, a READ of several responses,
    both atomics) leaves ``Sealed``, ICRC included, built with no
    Python builder called, its bytes those the Python's ``_pack_only`` and
    ``append_icrc`` give (this fails if ``sn_generate`` hands them to the Python)."""
    ops = [(W.SEND, 100), (W.SEND_WITH_IMM, 0), (W.SEND_WITH_INV, 1024), (W.RDMA_WRITE, 7),
           (W.RDMA_WRITE_WITH_IMM, 64), (W.RDMA_READ, 5000), (W.ATOMIC_FETCH_AND_ADD, 8),
           (W.ATOMIC_CMP_AND_SWP, 8)]

    def world():
        a, ea = _gathering()
        ea.buf.view[:] = random.Random(7).randbytes(len(ea.buf.view))
        for i, (op, size) in enumerate(ops):
            a.post_send(ea.qp, SendWR(i, op, [ea.sge(4096 * i, size)],
                                      SendFlags.SIGNALED | SendFlags.SOLICITED,
                                      remote_addr=0xFFFF_0000_0000_0000 + 8 * i, rkey=0x8765_4321,
                                      imm_data=0xA0B0C0D0 + i, invalidate_rkey=0x1357 + i,
                                      compare_add=0x1111_2222_3333_4444 + i,
                                      swap=0x5555_6666_7777_8888 + i))
        return a, ea.qp

    py_dev, py_qp = world()
    want: list = []
    requester.generate(py_dev, py_qp, 1.0, want)
    dev, qp = world()
    called = record_calls(requester, ("_send_packet", "_build", "_pack_only", "_build_rc",
                                      "_bulk_run"))
    out: list = []
    compiled_generate(dev, qp, 1.0, out)
    assert called == []
    assert [type(r) for r in out] == [requester.Sealed] * 8
    assert _items(dev, out) == _items(py_dev, want)
    assert [(w.next_pkt, w.npkts) for w in qp.sq] == [(w.next_pkt, w.npkts) for w in py_qp.sq]
    assert qp.sq[5].npkts == 5 and qp.req.send_idx == 8
    assert _state(dev, qp) == _state(py_dev, py_qp)
