"""A SEND received in one run, compiled (``softnic.accel``'s ``responder.c``) against
``responder.receive_send_run``.

Two receivers are made alike: a device with the kernel, an RC QP connected to a
sender's, receives posted (on the QP, or on an SRQ; of one SGE, or two; long
enough or not); a plain ACK queued or not; a hole's bookkeeping left over or
not.  The sender (asking for ACKs every few packets, or at its default)
builds a SEND (plain, with an immediate, with an
invalidation of a key the receiver has or has not) of two to twelve packets as
one run, and the run is handed to both receivers, as drawn: whole, cut short, with
a packet's byte changed (its ICRC then wrong), to another QP, from another
peer, with FECN set, at another PSN, with no receive posted, with a message
under way, with a packet held out of order, the QP in another state, the
device checking no ICRCs; the receive CQ armed (for solicited events only, or
any), full, mirrored (the C face's view of it) or none of these; the receives'
MR without local write, invalidated or deregistered.  One receiver takes it by
the Python's ``receive_send_run``, the other by the compiled one (its receive's
target and a plain SEND's completion compiled too: ``recv_target``'s and
``_last``'s cases).  The count taken, the receive memory, the responder's
state, its queued ACKs, the completions (every field, solicited or not), the
counters, the CQ's events, overflow and mirror, and the device's ready QPs
must be the same.
"""

from __future__ import annotations

import random
import sys

import cffi
import pytest
from hypothesis import example, given, settings, strategies as st

from softnic import accel
from softnic.core import cq as cq_module, device as device_module, responder
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import Access, QPState, SendFlags, WROpcode as W
from softnic.core.qp import RecvWR, SendWR
from softnic.core.requester import Run
from softnic.experiments.rig import bring_up, endpoint

MTU = 1024
_FFI = cffi.FFI()


@pytest.fixture(scope="module")
def compiled(compiled_with_kernel):
    """The fabric module with ``receive_send_run`` set up and the kernel hooked in, as
    ``give_compiled`` sets them up (conftest's ``compiled_with_kernel``)."""
    return compiled_with_kernel


def _pair(rng, draw: dict, sender: Device, size: int):
    """``sender`` and a receiver with the kernel, an RC QP each, connected at
    ``draw["psn"]`` (MTU 1024), the receiver's on an SRQ if drawn, its receives
    posted as drawn for a SEND of ``size`` bytes (``posted`` of them, of one SGE or
    two, ``room`` bytes more or less than the SEND), checking ICRCs as drawn; the
    sender's memory random.  The sender has posted the SEND (plain, with an
    immediate, with an invalidation of a key the receiver has or has not;
    solicited as drawn).  Returns the receiver and both endpoints."""
    b = Device("b", "10.0.0.2", config=DeviceConfig(check_icrc=draw["check_icrc"]))
    b.kernel = accel.load()
    srq = b.create_srq(b.alloc_pd(), 64, 2) if draw["srq"] else None
    ea = endpoint(sender, buf_size=1 << 16)
    eb = endpoint(b, buf_size=1 << 16, srq=srq, pd=srq.pd if srq is not None else None)
    bring_up(ea, eb, mtu=MTU, psn=draw["psn"], peer_psn=0)
    bring_up(eb, ea, mtu=MTU, psn=0, peer_psn=draw["psn"])
    ea.buf.view[:] = rng.randbytes(len(ea.buf.view))
    for i in range(draw["posted"]):
        room = max(0, size + draw["room"])
        if draw["two_sges"]:
            sges = [eb.sge(0, room // 2), eb.sge(20000, room - room // 2)]
        else:
            sges = [eb.sge(100 * i, room)]
        wr = RecvWR(10 + i, sges)
        if srq is not None:
            b.post_srq_recv(srq, wr)
        else:
            b.post_recv(eb.qp, wr)
    inv = eb.mr.rkey if draw["inv_known"] else 0x777
    sender.post_send(ea.qp, SendWR(1, draw["op"], [ea.sge(0, size)], SendFlags.SIGNALED
                                   | (SendFlags.SOLICITED if draw["se"] else 0),
                                   imm_data=0xABCD, invalidate_rkey=inv))
    return b, ea, eb


def _world(seed: int, draw: dict):
    """The sender's run (its bytes and segment size) and the receiver's world."""
    rng = random.Random(seed)
    a = Device("a", "10.0.0.1", config=DeviceConfig(ack_every=draw["ack_every"]))
    a.kernel = accel.load()
    b, ea, eb = _pair(rng, draw, a, (draw["npkts"] - 1) * MTU + draw["tail"])
    out = a.datagram_runs(0.0)
    run = next(item for item in out if type(item) is Run)
    data = bytearray(run.buf)
    seg = run.seg
    _receiver_as_drawn(draw, eb)
    return b, eb.qp, eb, data, seg, a.address


def _receiver_as_drawn(draw: dict, eb) -> None:
    """The receiving QP of endpoint ``eb`` put in the drawn state: another QP state,
    a message under way, a packet held out of order, its receive CQ armed, full or
    mirrored (the C face's view of it), a plain ACK queued, a hole's bookkeeping
    left over; the receives' MR without local write, invalidated or deregistered."""
    qp = eb.qp
    mr = draw.get("mr")
    if mr == "no_write":
        eb.mr.access = Access(int(eb.mr.access) & ~int(Access.LOCAL_WRITE))
    elif mr == "invalid":
        eb.mr.valid = False
    elif mr == "gone":
        eb.dev.dereg_mr(eb.mr)
    cq = draw.get("cq")
    if cq == "full":
        eb.recv_cq.depth = len(eb.recv_cq.entries)
    elif cq == "mirror":                        # (as the C face's: a cffi array)
        eb.recv_cq.mirror = _FFI.new("int32_t[2]")
    if draw["state"] is not None:
        qp.state = draw["state"]
    if draw["under_way"]:
        qp.resp.kind = responder._SEND_KIND
    if draw["ooo"]:
        qp.sr.ooo[5] = object()
    if draw["arm"] is not None:
        eb.recv_cq.req_notify(draw["arm"])     # (True: solicited events only)
    if draw["acked"]:                           # a plain ACK queued, not yet sent
        qp.resp.out.append((0xFFFFFF, responder.ACK_CREDITS, 0))
    if draw["stale_sr"]:                        # a hole's bookkeeping left over
        qp.sr.scan, qp.sr.naked = 7, {9}


def _mutate(draw: dict, data: bytearray, seg: int, src):
    """The run as it arrives: cut, a byte changed, another QP or PSN, FECN.  (A LAST
    longer than an MTU cannot end a run: no datagram of a run is longer than its
    first, a FIRST of one MTU.)"""
    n = len(data)
    if draw["cut"]:
        data = data[:max(seg + 1, n - draw["cut"] * seg)]
    if draw["flip"] is not None:
        at = draw["flip"] % len(data)
        data[at] ^= 0x40
    if draw["qpn"]:
        data[5:8] = (int.from_bytes(data[5:8], "big") + draw["qpn"]).to_bytes(3, "big")
    if draw["psn_off"]:
        data[9:12] = ((int.from_bytes(data[9:12], "big") + draw["psn_off"]) & 0xFFFFFF) \
            .to_bytes(3, "big")
    if draw["fecn"]:
        data[4] |= 0x80
    if draw["peer"]:
        src = (src[0], src[1] + 1)
    return data, src


def _state(dev, qp, eb) -> tuple:
    resp = qp.resp
    cq = eb.recv_cq
    seen = (cq.overflowed, None if cq.mirror is None else list(cq.mirror), dev.cqes_posted,
            [(w.qp_num, w.src_qp, w.solicited) for w in cq.entries])
    wcs = dev.poll_cq(eb.recv_cq, 64) if not cq.overflowed else []
    return (
        seen,
        (resp.epsn, resp.msn, resp.off, resp.kind, resp.nak_sent,
         None if resp.wqe is None else resp.wqe.wr_id),
        list(resp.out),
        [(w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags, w.invalidated_rkey)
         for w in wcs],
        len(qp.rq) if qp.srq is None else len(qp.srq.queue),
        qp.state,
        dict(dev.counters),
        [q.qpn for q in dev._ready],
        bytes(eb.buf.view[:24000]),
        dev.stream_qp is qp,
        eb.recv_cq.events,
        (qp.sr.scan, sorted(qp.sr.naked)),
    )


#: what a SEND's receiver and its arrival are drawn from (here and in
#: test_send_only: the receives posted, the SEND's kind, the QP's state, what
#: changed on the way)
RECEIVER_DRAWS = {
    "check_icrc": st.sampled_from([True] * 9 + [False]),
    "srq": st.sampled_from([False, False, True]),
    "posted": st.sampled_from([0, 1, 1, 1, 2]),
    "two_sges": st.sampled_from([False] * 7 + [True]),
    "op": st.sampled_from([W.SEND, W.SEND, W.SEND_WITH_IMM, W.SEND_WITH_INV]),
    "inv_known": st.booleans(),
    "se": st.booleans(),
    "state": st.sampled_from([None] * 6 + [QPState.RTR, QPState.ERR, QPState.SQD]),
    "under_way": st.sampled_from([False] * 9 + [True]),
    "ooo": st.sampled_from([False] * 9 + [True]),
    "qpn": st.sampled_from([0] * 9 + [1]),
    "psn_off": st.sampled_from([0] * 9 + [1]),
    "fecn": st.sampled_from([False] * 9 + [True]),
    "peer": st.sampled_from([False] * 9 + [True]),
    "arm": st.sampled_from([None, None, False, True]),
    "acked": st.sampled_from([False, False, True]),
    "stale_sr": st.sampled_from([False] * 5 + [True]),
    "mr": st.sampled_from([None] * 6 + ["no_write", "invalid", "gone"]),
    "cq": st.sampled_from([None] * 5 + ["full", "mirror"]),
}

_draws = st.fixed_dictionaries({
    **RECEIVER_DRAWS,
    "psn": st.sampled_from([0, 0xFFFFFE]),
    "npkts": st.integers(2, 12),
    "tail": st.sampled_from([1, 3, 4, 100, MTU - 4, MTU - 1, MTU]),
    "room": st.sampled_from([0, 0, 64, -1, -MTU]),
    "cut": st.sampled_from([0, 0, 0, 1, 2]),
    "flip": st.one_of(st.none(), st.none(), st.none(), st.integers(0, 20000)),
    "ack_every": st.sampled_from([None, None, 1, 2, 3, 5]),
})


def _draw(**values) -> dict:
    """A clean draw: a plain SEND of three packets into one receive, but ``values``."""
    d = dict(check_icrc=True, srq=False, psn=0, npkts=3, tail=100, posted=1, room=0,
             two_sges=False, op=W.SEND, inv_known=True, se=False, state=None,
             under_way=False, ooo=False, cut=0, flip=None, qpn=0, psn_off=0, fecn=False,
             peer=False, arm=None, ack_every=None, acked=False, stale_sr=False)
    d.update(values)
    return d


@settings(max_examples=600, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), draw=_draws)
@example(seed=1, draw=_draw())
@example(seed=1, draw=_draw(op=W.SEND_WITH_INV, inv_known=True, tail=MTU - 1))
# a FIRST and a LAST, no MIDDLE: the LAST clears what a hole left
@example(seed=1, draw=_draw(npkts=2, stale_sr=True))
# MIDDLEs that ask for ACKs, after a plain ACK queued: each replaces the one before
@example(seed=1, draw=_draw(npkts=6, ack_every=2, acked=True))
# the receive's MR refusing it, the CQ full, the CQ mirrored for a solicited SEND
@example(seed=1, draw=_draw(mr="no_write"))
@example(seed=1, draw=_draw(mr="invalid"))
@example(seed=1, draw=_draw(mr="gone"))
@example(seed=1, draw=_draw(cq="full"))
@example(seed=1, draw=_draw(cq="mirror", se=True))
def test_the_compiled_receive_takes_every_run_as_the_python(compiled, seed, draw):
    results = []
    for take in (responder.receive_send_run, compiled.receive_send_run):
        dev, qp, eb, data, seg, src = _world(seed, draw)
        data, src = _mutate(draw, data, seg, src)
        k = take(dev, memoryview(data), 0, seg, src)
        results.append((k, _state(dev, qp, eb)))
    assert results[1] == results[0]


def test_a_clean_run_is_taken_whole_by_the_compiled_receive(compiled, record_calls):
    """Not a vacuous property: the compiled receive takes a clean SEND of three
    packets itself, its checks and its accounting (the Python's ``_common_qp`` and
    ``_first_taken``, which ``receive_send_run`` and ``took_send_run`` call, are not
    called), and its receive completes with every byte.  (The same run through the
    Python's calls both: the counting works.)"""
    called = record_calls(responder, ("_common_qp", "_first_taken"))
    for take, want in ((compiled.receive_send_run, []),
                       (responder.receive_send_run, ["_common_qp", "_first_taken"])):
        called.clear()
        dev, qp, eb, data, seg, src = _world(3, _draw())
        assert take(dev, memoryview(data), 0, seg, src) == 3
        assert called == want
        (wc,) = dev.poll_cq(eb.recv_cq, 4)
        assert wc.byte_len == 2 * MTU + 100 and wc.wr_id == 10


def _python_calls(fn, *args) -> tuple:
    """``fn(*args)``, and the names of the functions of ``responder``, ``cq`` and
    ``device`` that ran meanwhile, and ``WC.__init__`` (the dataclass's, made from a
    string) if it did (``sys.setprofile``: nothing is put in their place)."""
    names: list = []
    own = (responder.__file__, cq_module.__file__, device_module.__file__)
    wc_init = cq_module.WC.__init__.__code__

    def seen(frame, event, arg):
        if event == "call" and frame.f_code is wc_init:
            names.append("WC.__init__")
        elif event == "call" and frame.f_code.co_filename in own:
            names.append(frame.f_code.co_name)
    sys.setprofile(seen)
    try:
        got = fn(*args)
    finally:
        sys.setprofile(None)
    return got, names


def test_a_plain_sends_receive_completes_in_the_compiled_receive(compiled):
    """Not vacuous either: the compiled receive finds a plain SEND's target and
    completes its receive itself (``recv_target``, ``_last``, ``_send_done``,
    ``recv_done``, ``Device.post_cqe``, ``CQ.push`` and ``WC.__init__`` do not
    run), where the Python's runs them all, and the completion is the same.  Where
    the CQ is armed, the completion is the Python's to make (an event to raise)."""
    names = ("recv_target", "_last", "_send_done", "recv_done", "post_cqe", "push",
             "WC.__init__")
    wcs = []
    for take, arm, want in ((compiled.receive_send_run, None, set()),
                            (responder.receive_send_run, None, set(names)),
                            (compiled.receive_send_run, False, set(names) - {"recv_target"})):
        dev, qp, eb, data, seg, src = _world(3, _draw(se=True, arm=arm))
        k, ran = _python_calls(take, dev, memoryview(data), 0, seg, src)
        assert k == 3
        assert set(ran) & set(names) == want
        (wc,) = dev.poll_cq(eb.recv_cq, 4)
        wcs.append((wc.wr_id, wc.status, wc.opcode, wc.qp_num, wc.byte_len, wc.imm_data,
                    wc.wc_flags, wc.src_qp, wc.solicited))
    assert wcs[0] == wcs[1] == wcs[2] and wcs[0][4] == 2 * MTU + 100 and wcs[0][8]


@pytest.mark.parametrize("name", ["recv_target", "_last"])
def test_a_receives_target_or_completion_put_in_the_modules_place_is_called(
        compiled, monkeypatch, name):
    """A stand-in for ``responder.recv_target`` or ``responder._last`` (a test's, a
    tracer's) is what the compiled receive calls, not its own case of it."""
    dev, qp, eb, data, seg, src = _world(3, _draw())
    real, calls = getattr(responder, name), []
    monkeypatch.setattr(responder, name, lambda *a: calls.append(a[0]) or real(*a))
    assert compiled.receive_send_run(dev, memoryview(data), 0, seg, src) == 3
    assert calls == [dev]
    (wc,) = dev.poll_cq(eb.recv_cq, 4)
    assert wc.byte_len == 2 * MTU + 100


def test_a_mark_ready_put_in_devices_place_is_called(compiled, monkeypatch):
    """The compiled receive marks the QP ready (its ACK to send) in the device's
    ``_ready`` itself only where the device's class has ``Device.mark_ready``; a
    stand-in put in its place is called, once, with the QP."""
    dev, qp, eb, data, seg, src = _world(3, _draw())
    dev._ready.clear()
    assert compiled.receive_send_run(dev, memoryview(data), 0, seg, src) == 3
    assert list(dev._ready) == [qp]
    dev, qp, eb, data, seg, src = _world(3, _draw())
    dev._ready.clear()
    calls = []
    monkeypatch.setattr(device_module.Device, "mark_ready", lambda d, q: calls.append(q))
    assert compiled.receive_send_run(dev, memoryview(data), 0, seg, src) == 3
    assert calls == [qp] and not dev._ready


def test_the_icrc_starts_kept_in_c_are_told_apart_by_address(compiled):
    """A sender's compiled runs keep the ICRC starts they ask for in C
    (``objects.h`` ``start_known``), by their numbers and the address each goes
    to: two receivers at two addresses, whose QPs have the same number, each get
    SENDs of the same size from one sender, and each finds every packet's ICRC
    good (with a start found by the numbers alone, every packet the second
    receiver got failed its check)."""
    class Sender(Device):
        pass
    a = Sender("a", "10.0.0.1")
    a.kernel = accel.load()
    a.tx_gather = True                          # (the runs requester.c's bulk_run leaves)
    assert accel.give_compiled(a)
    ends = []
    for ip in ("10.0.0.2", "10.0.0.3"):
        b = Device(ip, ip)
        ea, eb = endpoint(a, buf_size=1 << 16), endpoint(b, buf_size=1 << 16)
        bring_up(ea, eb, mtu=MTU)
        bring_up(eb, ea, mtu=MTU)
        b.post_recv(eb.qp, RecvWR(7, [eb.sge(0, 8 * MTU)]))
        ends.append((b, ea, eb))
    assert ends[0][2].qp.qpn == ends[1][2].qp.qpn
    for round_ in range(2):                     # (the second: every start already kept)
        for b, ea, eb in ends:
            a.post_send(ea.qp, SendWR(round_, W.SEND, [ea.sge(0, 6 * MTU - 5)],
                                      SendFlags.SIGNALED))
            for data, dest in a.datagrams_to_send(0.0):
                assert dest == b.address
                b.receive_datagram(bytes(data), a.address, 0.0)
            if round_ == 0:
                b.post_recv(eb.qp, RecvWR(8, [eb.sge(0, 8 * MTU)]))
    for b, ea, eb in ends:
        assert b.counters["rcvd_icrc_err"] == 0
        assert [(w.wr_id, w.byte_len) for w in b.poll_cq(eb.recv_cq, 4)] == \
            [(7, 6 * MTU - 5), (8, 6 * MTU - 5)]


def test_a_receive_send_run_put_in_the_modules_place_is_called(compiled, monkeypatch):
    """A stand-in for ``responder.receive_send_run`` (a test's, a tracer's) is what
    the compiled one calls."""
    dev, qp, eb, data, seg, src = _world(3, _draw())
    calls = []
    monkeypatch.setattr(responder, "receive_send_run", lambda *a: calls.append(a) or 0)
    assert compiled.receive_send_run(dev, data, 0, seg, src) == 0
    assert len(calls) == 1 and calls[0][0] is dev and calls[0][2:] == (0, seg, src)


@pytest.mark.parametrize("how", ["python", "compiled", "device"])
def test_a_run_ending_in_a_datagram_too_short_for_a_bth_is_counted_and_dropped(compiled, how):
    """A run whose last datagram is one byte that reads as a SEND's LAST (a peer's
    broken datagram that GRO put at the end of a run): the FIRST before it is taken,
    the byte is counted and dropped, nothing is raised (``receive_send_run`` read
    the LAST's flags past the end of the run)."""
    dev, qp, eb, data, seg, src = _world(1, _draw(npkts=2))
    data = bytearray(data[:seg]) + bytes([2])       # the FIRST, then RC_SEND_LAST's opcode
    if how == "device":
        dev.receive_run(memoryview(data), seg, src, 0.0)
    else:
        take = responder.receive_send_run if how == "python" else compiled.receive_send_run
        assert take(dev, memoryview(data), 0, seg, src) == 1
        dev.receive_datagram(bytes(data[seg:]), src, 0.0)
    assert dev.counters["rcvd_pkts"] == 2 and dev.counters["rcvd_icrc_err"] == 1
    assert qp.resp.epsn == 1 and qp.resp.kind is responder._SEND_KIND
