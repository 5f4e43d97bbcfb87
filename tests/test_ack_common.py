"""A plain ACK received, compiled (``softnic.accel``'s ``completer.c``) against
``completer.receive_common``; a READ RESPONSE ONLY or an ATOMIC ACKNOWLEDGE against
``receive_answer_common``.

Two requesters are made alike: a device with the kernel, an RC QP connected to a
peer's at a PSN near the wrap or not, one to four work requests posted and
started (SENDs, WRITEs, with an immediate or not, READs, an atomic; one to three
packets each; signaled or not), some acknowledged already, more posted and not
started.  An ACKNOWLEDGE arrives from the peer naming a PSN drawn around the
acknowledged one (stale, inside the oldest message, at its end, beyond it,
beyond what was sent), its AETH an ACK (with any credit count), an RNR NAK or a
NAK; as drawn, a byte of it changed (its ICRC then wrong), a pad count, the
MigReq or SE bit, FECN or BECN set, another P_Key, another QP, another peer, a
byte more; the QP in another state, with a congestion controller, under
selective repeat with a SACKed or a resent PSN remembered, a WQE behind the
oldest already done, the oldest given a status, the send index moved back,
retries taken since the last progress; the
send CQ armed (for solicited events only, or any), full, overflowed or mirrored
(the C face's view); the device checking no ICRCs.  One requester takes it by
the Python's ``receive_common`` (then, where that declines, the general path),
the other by the compiled one (then, where it declines, the same).  The compiled
one may take only what the Python's takes, and the SQ, the completer's and
requester's state, the QP's state and timer, the completions (every field), the
CQ's overflow, mirror and events, the counters, the device's ready QPs, timers
and async events must be the same.  The answers likewise,
with a READ of one or two packets or an ATOMIC the oldest WQE, the READ
response's payload as long as the READ or not, and the requester's memory
compared too.
"""

from __future__ import annotations

import random

import cffi
import pytest
from hypothesis import event, example, given, settings, strategies as st

from softnic import accel
from softnic.core import completer, dispatch
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import QPState, SendFlags, WCStatus, WROpcode as W
from softnic.core.output import ack_packet, atomic_ack_packet, read_response_only
from softnic.core.qp import SendWR
from softnic.experiments.rig import bring_up, endpoint
from softnic.wire.icrc import append_icrc

MTU = 1024
NOW = 5.0
_FFI = cffi.FFI()
_LENGTH = {W.ATOMIC_FETCH_AND_ADD: 8, W.ATOMIC_CMP_AND_SWP: 8}


@pytest.fixture(scope="module")
def compiled(compiled_with_kernel):
    """The fabric module set up as ``give_compiled`` sets it up, the kernel hooked in
    (conftest's ``compiled_with_kernel``)."""
    return compiled_with_kernel


def _world(seed: int, draw: dict):
    """The requester (a device with the kernel), its endpoint and its peer's address,
    its work posted, started and partly acknowledged, its QP and send CQ put in the
    drawn state."""
    rng = random.Random(seed)
    a = Device("a", "10.0.0.1", config=DeviceConfig(check_icrc=draw["check_icrc"],
                                                    cc="dcqcn" if draw["cc"] else "none",
                                                    selective_repeat=draw["sr"]))
    a.kernel = accel.load()
    b = Device("b", "10.0.0.2")
    ea = endpoint(a, buf_size=1 << 16, cq_depth=16)
    eb = endpoint(b, buf_size=1 << 16)
    bring_up(ea, eb, mtu=MTU, psn=draw["psn"], peer_psn=0)
    bring_up(eb, ea, mtu=MTU, psn=0, peer_psn=draw["psn"])
    ea.buf.view[:] = rng.randbytes(len(ea.buf.view))

    def post(i, op, npkts, signaled):
        n = _LENGTH.get(op, (npkts - 1) * MTU + rng.randint(1, MTU))
        a.post_send(ea.qp, SendWR(i, op, [ea.sge(0, n)], SendFlags.SIGNALED if signaled else 0,
                                  remote_addr=eb.buf.addr + (8 if op in _LENGTH else 0),
                                  rkey=eb.mr.rkey, imm_data=0x1234, compare_add=3))
    for i, w in enumerate(draw["wqes"]):
        post(i + 1, *w)
    a.datagram_runs(0.0)                    # started, their packets sent (and dropped)
    for i in range(draw["unstarted"]):
        post(100 + i, W.SEND, 1, True)
    qp = ea.qp
    sent = (qp.req.psn - qp.sq[0].first_psn) & 0xFFFFFF
    if min(draw["pre"], sent):              # some acknowledged already (the Python's)
        psn = (qp.sq[0].first_psn + min(draw["pre"], sent) - 1) & 0xFFFFFF
        a.receive_datagram(bytes(_ack(a, qp, psn, 0x1F, 0)), b.address, 0.0)
    cq = ea.send_cq
    how = draw["cq"]
    if how == "full":
        cq.depth = len(cq.entries)
    elif how == "overflowed":
        cq.overflowed = True
    elif how == "mirror":                   # (as the C face's: a cffi array)
        cq.mirror = _FFI.new("int32_t[2]")
        cq.mirrored()
    elif how in ("armed", "solicited"):
        cq.req_notify(how == "solicited")
    if draw["state"] is not None:
        qp.state = draw["state"]
    if draw["sacked"]:
        qp.comp.sacked_psn = qp.sq[0].last_psn if qp.sq else 0
    if draw["rexmitted"]:
        qp.comp.rexmitted = {(qp.comp.acked_psn + 1) & 0xFFFFFF: qp.req.max_sent_psn}
    if draw["behind_done"] and len(qp.sq) > 1:
        qp.sq[1].done, qp.sq[1].status = True, WCStatus.LOC_PROT_ERR
    if draw["status_set"] and qp.sq:
        qp.sq[0].status = WCStatus.REM_ACCESS_ERR
    if draw["send_idx_back"]:
        qp.req.send_idx = 0
    if draw["retried"]:                     # retries taken since the last progress
        qp.comp.retry_left, qp.comp.rnr_left = 2, 1
    return a, ea, b.address


def _ack(dev, qp, psn: int, syndrome: int, msn: int) -> bytearray:
    """The peer's ACKNOWLEDGE of ``psn`` for ``qp``, its ICRC as the peer sends it."""
    src_ip, sport = qp.dest
    return append_icrc(ack_packet(qp.qpn, psn, syndrome, msn), src_ip, dev.ip, sport, dev.port)


def _answer(dev, qp, kind: str, psn: int, syndrome: int, msn: int, length: int,
            seed: int) -> bytearray:
    """The peer's READ RESPONSE ONLY of ``length`` bytes, or ATOMIC ACKNOWLEDGE, of
    ``psn`` for ``qp``, its AETH's syndrome ``syndrome``, its ICRC as the peer sends it."""
    rng = random.Random(seed)
    if kind == "read":
        pkt = read_response_only(qp.qpn, psn, msn, rng.randbytes(max(0, length)))
    else:
        pkt = atomic_ack_packet(qp.qpn, psn, msn, rng.getrandbits(64))
    pkt[12] = syndrome
    src_ip, sport = qp.dest
    return append_icrc(pkt, src_ip, dev.ip, sport, dev.port)


def _arrival(draw: dict, dev, qp, src, seed: int = 0):
    """The drawn ACKNOWLEDGE (or READ RESPONSE ONLY, ATOMIC ACKNOWLEDGE) as it
    arrives: its PSN ``psn_off`` after the next one to be acknowledged (a READ
    response as long as the oldest WQE, give or take ``len_off``), then changed
    on the way as drawn."""
    psn = (qp.comp.acked_psn + 1 + draw["psn_off"]) & 0xFFFFFF
    kind = draw.get("kind", "ack")
    if kind == "ack":
        data = _ack(dev, qp, psn, draw["syndrome"], draw["msn"])
    else:
        length = (qp.sq[0].length if qp.sq else 8) + draw.get("len_off", 0)
        data = _answer(dev, qp, kind, psn, draw["syndrome"], draw["msn"], length, seed)
    how = draw["mutate"]
    if how == "flip":
        data[draw["at"] % len(data)] ^= 0x08
    elif how == "pad":
        data[1] |= 0x10
    elif how == "migreq":
        data[1] |= 0x40
    elif how == "se":
        data[1] |= 0x80
    elif how == "fecn":
        data[4] |= 0x80
    elif how == "becn":
        data[4] |= 0x40
    elif how == "pkey":
        data[3] ^= 1
    elif how == "qpn":
        data[7] ^= 1
    elif how == "long":
        data.append(0)
    if how in ("pad", "migreq", "se", "fecn", "becn", "pkey", "qpn", "long"):
        # a peer that sends such a packet: its ICRC good (FECN, BECN and the
        # resv8a byte are masked from it anyway)
        data[-4:] = append_icrc(bytearray(data[:-4]), src[0], dev.ip, src[1], dev.port)[-4:]
    if how == "peer":
        src = (src[0], src[1] + 1)
    return data, src


def _state(dev, ea) -> tuple:
    qp, cq = ea.qp, ea.send_cq
    comp, req = qp.comp, qp.req
    return (
        bytes(ea.buf.view),
        [(w.wr_id, w.done, w.status, w.first_psn, w.last_psn, w.next_pkt) for w in qp.sq],
        (comp.acked_psn, comp.retry_left, comp.rnr_left, comp.rnr_wait, comp.retry_pending,
         comp.rto_at, comp.rnr_at, comp.probe_at, comp.sacked_psn, dict(comp.rexmitted),
         list(comp.rexmit), comp.rto_shift),
        (req.send_idx, req.psn, req.max_sent_psn, req.rd_atomic, req.error),
        qp.state, qp.timer_at, sorted(qp.timer_times),
        (cq.overflowed, cq.armed, cq.events, None if cq.mirror is None else list(cq.mirror)),
        [(w.wr_id, w.status, w.opcode, w.qp_num, w.byte_len, w.imm_data, w.wc_flags, w.src_qp,
          w.invalidated_rkey, w.vendor_err, w.pkey_index, w.slid, w.sl, w.dlid_path_bits,
          w.solicited) for w in cq.entries],
        dev.cqes_posted,
        dict(dev.counters),
        [q.qpn for q in dev._ready],
        sorted((t, q.qpn) for t, _, q in dev._timers),
        [(e, getattr(o, "qpn", None)) for e, o in dev.events],
    )


_OPS = [(W.SEND, n, s) for n in (1, 2, 3) for s in (True, True, False)] \
    + [(W.RDMA_WRITE, n, s) for n in (1, 2, 3) for s in (True, True, False)] \
    + [(W.SEND_WITH_IMM, 1, True), (W.RDMA_WRITE_WITH_IMM, 2, True),
       (W.RDMA_READ, 1, True), (W.RDMA_READ, 2, True), (W.ATOMIC_FETCH_AND_ADD, 1, True)]

_draws = st.fixed_dictionaries({
    "check_icrc": st.sampled_from([True] * 9 + [False]),
    "cc": st.sampled_from([False] * 9 + [True]),
    "sr": st.sampled_from([False] * 9 + [True]),
    "psn": st.sampled_from([0, 0xFFFFFE, 0x7FFFFE]),
    "wqes": st.lists(st.sampled_from(_OPS), min_size=1, max_size=4),
    "unstarted": st.sampled_from([0, 0, 0, 1, 2]),
    "pre": st.sampled_from([0, 0, 0, 1, 2]),
    "psn_off": st.sampled_from([0, 0, 0, 1, 1, 1, 2, 2, 3, 4, 5, 8, 11, -1, -2, 0x800000]),
    "syndrome": st.sampled_from([0x1F] * 16 + [0x00, 0x0A, 0x23, 0x60, 0x61, 0x62, 0x63]),
    "msn": st.integers(0, 0xFFFFFF),
    "mutate": st.sampled_from([None] * 40 + ["flip", "pad", "migreq", "se", "fecn", "becn",
                                             "pkey", "qpn", "peer", "long"]),
    "at": st.integers(0, 19),
    "cq": st.sampled_from([None] * 6 + ["full", "overflowed", "mirror", "armed", "solicited"]),
    "state": st.sampled_from([None] * 16 + [QPState.SQD, QPState.ERR, QPState.RTR]),
    "sacked": st.sampled_from([False] * 9 + [True]),
    "rexmitted": st.sampled_from([False] * 9 + [True]),
    "behind_done": st.sampled_from([False] * 9 + [True]),
    "status_set": st.sampled_from([False] * 9 + [True]),
    "send_idx_back": st.sampled_from([False] * 9 + [True]),
    "retried": st.sampled_from([False, False, True]),
})


def _draw(**values) -> dict:
    """A clean draw: one signaled SEND of two packets, the ACK of its last, but ``values``."""
    d = dict(kind="ack", len_off=0, check_icrc=True, cc=False, sr=False, psn=0,
             wqes=[(W.SEND, 2, True)], unstarted=0,
             pre=0, psn_off=1, syndrome=0x1F, msn=1, mutate=None, at=0, cq=None, state=None,
             sacked=False, rexmitted=False, behind_done=False, status_set=False,
             send_idx_back=False, retried=False)
    d.update(values)
    return d


def _run(take, seed: int, draw: dict):
    """The world's requester after the drawn ACK: ``take``'s answer (a raised error's
    type), then, where it declined, the device's general handling."""
    dev, ea, src = _world(seed, draw)
    data, src = _arrival(draw, dev, ea.qp, src, seed)
    try:
        # (as Dispatch.receive_run routes it: by its opcode, to the edge of its kind)
        edge = dispatch._EDGES.get(data[0])
        took = edge in (dispatch._ack, dispatch._answer) and \
            (edge is dispatch._ack) == (draw.get("kind", "ack") == "ack") and \
            bool(take(dev, memoryview(data), src, NOW))
        if not took:
            dev.receive_datagram(bytes(data), src, NOW)
    except Exception as e:                    # (both must raise it alike)
        took = type(e).__name__
    return took, _state(dev, ea)


@settings(max_examples=1000, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), draw=_draws)
@example(seed=1, draw=_draw())
@example(seed=1, draw=_draw(psn=0xFFFFFE))                          # across the wrap
@example(seed=1, draw=_draw(psn_off=0))                             # inside the message
@example(seed=1, draw=_draw(wqes=[(W.SEND, 1, True), (W.RDMA_WRITE, 2, False),
                                  (W.SEND, 2, True)], psn_off=3))   # coalesced, beyond
@example(seed=1, draw=_draw(wqes=[(W.RDMA_WRITE, 1, False)], unstarted=1))
@example(seed=1, draw=_draw(cq="mirror"))
@example(seed=1, draw=_draw(cq="full"))
@example(seed=1, draw=_draw(mutate="flip", at=19))
@example(seed=1, draw=_draw(wqes=[(W.SEND, 1, True), (W.SEND, 1, True)], psn_off=0,
                            behind_done=True))
def test_the_compiled_ack_is_taken_as_the_python_takes_it(compiled, seed, draw):
    _taken_alike(completer.receive_common, compiled.receive_ack, seed, draw)


def _taken_alike(python, compiled_one, seed: int, draw: dict) -> None:
    """The drawn world and arrival taken by ``python`` and by ``compiled_one``: the
    same state after, and the compiled one took only what the Python's takes."""
    py = _run(python, seed, draw)
    c = _run(compiled_one, seed, draw)
    event(f"compiled took it: {c[0]}; the Python's: {py[0]}")
    assert c[1] == py[1]
    assert c[0] == py[0] or c[0] is False and py[0] is True, \
        "the compiled one took what the Python's declines"


_ANSWER_OPS = [(W.RDMA_READ, 1, True)] * 3 + [(W.RDMA_READ, 1, False), (W.RDMA_READ, 2, True),
                                              (W.ATOMIC_FETCH_AND_ADD, 1, True),
                                              (W.ATOMIC_CMP_AND_SWP, 1, True)]
_answer_draws = _draws.flatmap(lambda d: st.fixed_dictionaries({
    **{k: st.just(v) for k, v in d.items() if k not in ("wqes", "psn_off")},
    "kind": st.sampled_from(["read", "read", "read", "atomic"]),
    "wqes": st.tuples(st.sampled_from(_ANSWER_OPS), st.lists(st.sampled_from(_OPS),
                                                             max_size=2)).map(
        lambda t: [t[0], *t[1]]),
    "psn_off": st.sampled_from([0] * 12 + [1, -1, 2]),
    "len_off": st.sampled_from([0] * 8 + [-1, -1, 1, 4]),
}))


@settings(max_examples=1000, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), draw=_answer_draws)
@example(seed=1, draw=_draw(kind="read", wqes=[(W.RDMA_READ, 1, True)], psn_off=0))
@example(seed=1, draw=_draw(kind="atomic", wqes=[(W.ATOMIC_CMP_AND_SWP, 1, True),
                                                 (W.SEND, 1, True)], psn_off=0))
@example(seed=1, draw=_draw(kind="read", wqes=[(W.RDMA_READ, 1, True)], psn_off=0,
                            psn=0xFFFFFF, cq="mirror"))
@example(seed=1, draw=_draw(kind="read", wqes=[(W.RDMA_READ, 1, True)], psn_off=0,
                            mutate="flip", at=25))
@example(seed=1, draw=_draw(kind="read", wqes=[(W.RDMA_READ, 1, True)], psn_off=0,
                            len_off=-1))                            # shorter than the READ
def test_the_compiled_answer_is_taken_as_the_python_takes_it(compiled, seed, draw):
    """A READ RESPONSE ONLY or an ATOMIC ACKNOWLEDGE, compiled (``receive_answer``)
    against ``receive_answer_common``: the READ's memory too."""
    _taken_alike(completer.receive_answer_common, compiled.receive_answer, seed, draw)


def test_a_clean_ack_is_taken_by_the_compiled_one_without_the_python(compiled, record_calls):
    """The ACK of a SEND, of a WRITE inside its message, of three messages at once:
    each taken by the compiled one, none of the Python's steps called (those the
    Python's ``receive_common`` calls; it, ``_progress`` and ``complete`` the
    compiled one must find the module's own), the same state as the Python's."""
    calls = record_calls(completer, ["acknowledged", "_ack_before", "_finish", "_forward",
                                     "_inflight"])
    cases = [_draw(), _draw(psn=0xFFFFFE, psn_off=0, wqes=[(W.RDMA_WRITE, 3, True)]),
             _draw(wqes=[(W.SEND, 1, True), (W.RDMA_WRITE, 2, False), (W.SEND, 2, True)],
                   psn_off=4, cq="mirror")]
    for draw in cases:
        calls.clear()
        c = _run(compiled.receive_ack, 1, draw)
        assert c[0] is True and calls == [], draw
        assert c == _run(completer.receive_common, 1, draw)
    assert [w[0] for w in c[1][8]] == [1, 3]          # the signaled two completed


def _clean_ack():
    """A clean draw's requester (its device and endpoint), its ACK and its peer."""
    dev, ea, src = _world(1, _draw())
    data, src = _arrival(_draw(), dev, ea.qp, src)
    return dev, ea, data, src


def test_a_receive_common_put_in_the_modules_place_is_called(compiled, monkeypatch):
    seen = []
    monkeypatch.setattr(completer, "receive_common",
                        lambda *args: seen.append(len(args)) or False)
    dev, ea, data, src = _clean_ack()
    assert compiled.receive_ack(dev, memoryview(data), src, NOW) is False
    assert seen == [4] and ea.qp.sq[0].done is False


@pytest.mark.parametrize("name", ["_progress", "complete"])
def test_a_progress_or_complete_put_in_the_modules_place_leaves_the_ack_to_the_python(
        compiled, monkeypatch, name):
    """The compiled ACK runs ``_progress`` and ``complete`` inline: where either is
    not the module's own it declines, and the Python's path calls the stand-in."""
    seen = []
    real = getattr(completer, name)
    monkeypatch.setattr(completer, name, lambda *args: seen.append(name) or real(*args))
    dev, ea, data, src = _clean_ack()
    assert compiled.receive_ack(dev, memoryview(data), src, NOW) is False
    assert seen == [] and ea.qp.sq[0].done is False
    dev.receive_datagram(bytes(data), src, NOW)
    assert seen == [name] and not ea.qp.sq
