"""READs and ATOMICs answered by the compiled kernel, against the engine.

A READ request at the ePSN, or an ATOMIC, is answered by the kernel
(``sn_read_only`` for a READ of one packet, ``sn_read_run`` for a READ of more,
``sn_atomic_ack``; the live driver's
``sn_rx_answers`` receives it and sends the response without the interpreter
between them) under the conditions ``responder.answer_target`` states: the same
response bytes, the same memory, and, once the engine has accounted for it
(``responder.took_answers``), the same responder state as the engine's own
``receive_common`` -> ``answer`` -> ``_read`` or ``_atomic`` and its output.
Whatever the kernel does not take, it leaves untouched, for the engine.
Without a C compiler the kernel cannot be built and these tests skip, except in
CI (``CI`` set), which fails instead.
"""

from __future__ import annotations

import time

from hypothesis import given, note, settings, strategies as st

from softnic.core.device import Device
from softnic.core.enums import QPAttrMask, QPState, SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import QPAttr, RecvWR, SendWR
from softnic.core.responder import ANSWER_COMPARE_SWAP, ANSWER_READ, ANSWER_READ_RUN
from softnic.driver.config import DeviceSpec, RuntimeConfig
from softnic.driver import nic as nicmod
from softnic.driver.nic import NIC
from softnic.experiments.rig import bring_up, connect, endpoint
from softnic.transport.udp import UdpSocket
from softnic.wire.icrc import append_icrc
from softnic.wire.roce import BTH_FECN, BTH_SE, MSN_MASK, Opcode

from test_kernel import kernel



def _pair(k, mtu: int, size: int = 1 << 14):
    """A requester ``a`` and a responder ``b`` (the kernel attached), connected;
    ``b``'s buffer of ``size`` bytes holds a pattern."""
    a = Device("a", "10.0.0.1")
    b = Device("b", "10.0.0.2")
    a.kernel = b.kernel = k
    ea, eb = connect(a, b, mtu=mtu, timeout=10, endpoint_args={"buf_size": size})
    eb.buf.view[:size] = bytes(range(251)) * (size // 251) + bytes(range(size % 251))
    return a, b, ea, eb


def _request(a, ea, eb, length: int, off: int, rkey: int | None = None) -> bytes:
    """The READ request ``a`` sends for ``length`` bytes at ``eb.buf + off``."""
    a.post_send(ea.qp, SendWR(1, W.RDMA_READ, [ea.sge(0, max(length, 1))], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + off,
                              rkey=eb.mr.rkey if rkey is None else rkey))
    (data, _), = a.datagrams_to_send(0.0)
    return bytes(data)


def _state(b, eb):
    r = eb.qp.resp
    return (r.epsn, r.msn, list(r.resources), list(r.out), r.answer_hint,
            {k: v for k, v in b.counters.items() if v})


def _kernel_answer(k, b, data: bytes):
    """``data`` offered to the kernel's answer (``sn_read_only`` or ``sn_atomic_ack``,
    as ``b.answer_target()`` says): the response (accounted for by
    ``took_answers``) or None."""
    t = b.answer_target()
    if t is None:
        return None
    resp = k.ffi.new("uint8_t[5000]")
    orig = k.ffi.new("uint64_t[1]")
    aeth = t.syndrome | ((t.msn + 1) & MSN_MASK)
    if t.kind == ANSWER_READ:
        n = k.lib.sn_read_only(data, len(data), t.w0, t.qp.qpn, t.epsn, t.req_start, t.rkey,
                               t.length, t.lo, t.hi, k.ffi.from_buffer(t.mem), t.resp_w0,
                               t.dqpn, aeth, t.resp_start, resp)
    else:
        n = k.lib.sn_atomic_ack(data, len(data), t.w0, t.qp.qpn, t.epsn, t.req_start, t.rkey,
                                t.kind == ANSWER_COMPARE_SWAP, t.lo, t.hi,
                                k.ffi.from_buffer(t.mem, require_writable=True), t.resp_w0,
                                t.dqpn, aeth, t.resp_start, resp, orig)
    if not n:
        return None
    b.took_answers(t.qp, t.kind, 1, orig)
    return bytes(k.ffi.buffer(resp, n))


def _mutate(req: bytearray, mutation: str, flip, a, b) -> bytes:
    """``req`` as ``mutation`` alters it (a header field with the ICRC made good,
    or a bit flipped after it)."""
    if mutation in ("psn+1", "psn-1"):
        psn = (int.from_bytes(req[9:12], "big") + (1 if mutation == "psn+1" else -1)) \
            & 0xFFFFFF
        req[9:12] = psn.to_bytes(3, "big")
    elif mutation == "fecn":
        req[4] |= BTH_FECN >> 24
    elif mutation == "se":
        req[1] |= BTH_SE
    elif mutation == "qpn":
        req[7] ^= 1
    if mutation in ("psn+1", "psn-1", "fecn", "se", "qpn"):     # a well-formed packet
        req = append_icrc(req[:-4], a.ip, b.ip, a.port, b.port)
    elif mutation == "flip":
        req[flip[0] % len(req)] ^= 1 << flip[1]
    return bytes(req)


def _read_requests(pairs, data, mutation: str, length: int, size: int):
    """Each pair's READ of ``length`` bytes at an offset drawn in its buffer of
    ``size`` bytes (before it or past it, for those mutations), as ``mutation``
    alters it (``_mutate``): (the offset, the requests)."""
    off = data.draw(st.integers(0, size - length), label="offset")
    if mutation == "before":
        off = -data.draw(st.integers(1, 64), label="before by")
    elif mutation == "past":
        off = size - length + data.draw(st.integers(1, 64), label="past by")
    flip = (data.draw(st.integers(0, 43), label="flipped byte"),
            data.draw(st.integers(0, 7), label="bit")) if mutation == "flip" else None
    requests = []
    for a, b, ea, eb in pairs:
        rkey = eb.mr.rkey ^ 0x100 if mutation == "rkey" else None
        requests.append(_mutate(bytearray(_request(a, ea, eb, length, off, rkey)), mutation,
                                flip, a, b))
    return off, requests


def _both_ways(k, pairs, requests, mutation: str):
    """The second pair's request offered to the kernel (``_kernel_answer``), the
    first pair's to the engine: (the kernel's answer or None, what the engine
    sends).  An unaltered request the kernel must take."""
    (a1, b1, _, _), (_, b2, _, _) = pairs
    answer = _kernel_answer(k, b2, requests[1])
    b1.receive_datagram(requests[0], a1.address, 0.0)
    engine = [bytes(d) for d, _ in b1.datagrams_to_send(0.0)]
    if mutation == "none":
        assert answer is not None
    return answer, engine


def _again(pairs, requests) -> list[bytes]:
    """Each pair's request again, a duplicate: what each responder answers, which
    must be the same."""
    answers = []
    for (a, b, ea, eb), req in zip(pairs, requests):
        b.receive_datagram(req, a.address, 0.0)
        answers.append([bytes(d) for d, _ in b.datagrams_to_send(0.0)])
    assert answers[0] == answers[1]
    return answers[0]


MUTATIONS = ("none", "length", "rkey", "psn+1", "psn-1", "before", "past", "flip", "fecn",
             "se", "qpn")


@settings(max_examples=120, deadline=None)
@given(st.sampled_from([256, 1024, 4096]), st.integers(1, 4096), st.data())
def test_a_read_the_kernel_answers_is_the_engines_answer(mtu, first_len, data):
    """Two responders alike: one takes a READ through the engine, the other
    through ``sn_read_only`` and ``took_answers``.  Whatever the kernel takes, the
    response bytes and the responder's state are the engine's; it takes every
    READ at the ePSN of the last READ's R_Key and length within the MR; what it
    does not take it leaves untouched."""
    k = kernel()
    first_len = min(first_len, mtu)
    pairs = [_pair(k, mtu), _pair(k, mtu)]
    first_off = data.draw(st.integers(0, (1 << 14) - first_len), label="first offset")
    for a, b, ea, eb in pairs:      # the engine answers the first: the hint
        b.receive_datagram(_request(a, ea, eb, first_len, first_off), a.address, 0.0)
        b.datagrams_to_send(0.0)
        assert eb.qp.resp.answer_hint == (ANSWER_READ, eb.mr.rkey, first_len)
    mutation = data.draw(st.sampled_from(MUTATIONS), label="mutation")
    length = first_len
    if mutation == "length":
        length = data.draw(st.integers(1, mtu).filter(lambda n: n != first_len), label="length")
    off, requests = _read_requests(pairs, data, mutation, length, 1 << 14)
    # (alike but for the VA: each pair's buffer is its own)
    assert len(requests[0]) == len(requests[1]) == 32
    note(f"mtu {mtu}, first {first_len} at {first_off}, {mutation}: {length} at {off}")
    (a1, b1, ea1, eb1), (a2, b2, ea2, eb2) = pairs
    before = _state(b2, eb2)
    answer, engine = _both_ways(k, pairs, requests, mutation)
    if answer is None:
        assert _state(b2, eb2) == before            # untouched, for the engine
        return
    # taken: the engine answers it so too (a mutation it ignores, as a flipped
    # reserved bit of byte 4, which the ICRC masks, is taken by both)
    assert engine == [answer], mutation
    assert answer[0] == Opcode.RC_RDMA_READ_RESPONSE_ONLY
    assert answer[16:16 + length] == bytes(eb1.buf.view[off:off + length])
    assert _state(b2, eb2) == _state(b1, eb1)
    # a duplicate of it is the engine's to answer, from what took_answers remembered
    assert _again(pairs, requests) == [answer]


def _read_run(k, b, data: bytes, max_middles: int = 1024):
    """``data`` offered to ``sn_read_run`` as ``b.answer_target()`` says: the
    responses as the driver sends them (the FIRST, each MIDDLE gathered from its
    header and the memory it reads, the LAST), accounted for by
    ``took_answers``; or None."""
    t = b.answer_target()
    if t is None or t.kind != ANSWER_READ_RUN:
        return None
    ffi = k.ffi
    first = ffi.new(f"uint8_t[{t.mtu + 24}]")
    last = ffi.new(f"uint8_t[{t.mtu + 24}]")
    heads = ffi.new(f"uint8_t[{16 * max(max_middles, 1)}]")
    at = ffi.new("uint64_t[1]")
    n_last = k.lib.sn_read_run(data, len(data), t.w0, t.qp.qpn, t.epsn, t.req_start, t.rkey,
                               t.length, t.lo, t.hi, ffi.from_buffer(t.mem), t.mtu, t.resp_w0,
                               t.mid_w0, t.last_w0, t.dqpn,
                               t.syndrome | ((t.msn + 1) & MSN_MASK), t.resp_start,
                               t.mid_start, t.last_start, max_middles, first, heads, last, at)
    if not n_last:
        return None
    npkts = -(-t.length // t.mtu)
    mem = bytes(t.mem)
    out = [bytes(ffi.buffer(first, 16 + t.mtu + 4))]
    for i in range(npkts - 2):
        h = bytes(ffi.buffer(heads + 16 * i, 16))
        o = at[0] + (i + 1) * t.mtu
        out.append(h[:12] + mem[o:o + t.mtu] + h[12:])
    out.append(bytes(ffi.buffer(last, n_last)))
    b.took_answers(t.qp, t.kind, 1)
    return out


@settings(max_examples=120, deadline=None)
@given(st.sampled_from([256, 1024, 4096]), st.integers(2, 40), st.data())
def test_a_longer_read_the_kernel_answers_is_the_engines_answer(mtu, npkts, data):
    """A READ of more than one packet: one responder takes it through the engine
    (``receive_common`` -> ``_read``, then ``output._read_run``), the other through
    ``sn_read_run`` and ``took_answers`` (the driver gathering each MIDDLE from
    its header and the memory it reads).  Whatever the kernel takes, every
    response's bytes and the responder's state are the engine's; it takes every
    READ at the ePSN of the last READ's R_Key and length within the MR (with room
    for its MIDDLEs' headers); what it does not take it leaves untouched."""
    k = kernel()
    size = 1 << 18
    first_len = data.draw(st.integers((npkts - 1) * mtu + 1, npkts * mtu), label="length")
    pairs = [_pair(k, mtu, size), _pair(k, mtu, size)]
    pairs[1][1].tx_gather = True            # (a driver that gathers: answer_target's)
    first_off = data.draw(st.integers(0, size - first_len), label="first offset")
    for a, b, ea, eb in pairs:      # the engine answers the first: the hint
        b.receive_datagram(_request(a, ea, eb, first_len, first_off), a.address, 0.0)
        b.datagrams_to_send(0.0)
        assert eb.qp.resp.answer_hint == (ANSWER_READ_RUN, eb.mr.rkey, first_len)
    mutation = data.draw(st.sampled_from(MUTATIONS + ("no room",)), label="mutation")
    length = first_len
    if mutation == "length":
        length = data.draw(st.integers(1, min(2 * first_len, size))
                           .filter(lambda n: n != first_len), label="other length")
    off, requests = _read_requests(pairs, data, mutation, length, size)
    note(f"mtu {mtu}, first {first_len} at {first_off}, {mutation}: {length} at {off}")
    (a1, b1, ea1, eb1), (a2, b2, ea2, eb2) = pairs
    before = _state(b2, eb2)
    answer = _read_run(k, b2, requests[1], max(npkts - 3, 0) if mutation == "no room" else 1024)
    b1.receive_datagram(requests[0], a1.address, 0.0)
    engine = [bytes(d) for d, _ in b1.datagrams_to_send(0.0)]
    if mutation == "none":
        assert answer is not None
    elif mutation == "no room" and npkts > 2:
        assert answer is None                       # its MIDDLEs' headers would not fit
    if answer is None:
        assert _state(b2, eb2) == before            # untouched, for the engine
        return
    assert engine == answer, mutation
    npkts = -(-length // mtu)
    assert [d[0] for d in answer] == [Opcode.RC_RDMA_READ_RESPONSE_FIRST] \
        + [Opcode.RC_RDMA_READ_RESPONSE_MIDDLE] * (npkts - 2) + [Opcode.RC_RDMA_READ_RESPONSE_LAST]
    assert _state(b2, eb2) == _state(b1, eb1)
    # a duplicate of it is the engine's to answer, from what took_answers remembered
    assert _again(pairs, requests) == answer


def _atomic(a, ea, eb, op, off: int, add_swap: int, compare: int,
            rkey: int | None = None) -> bytes:
    a.post_send(ea.qp, SendWR(1, op, [ea.sge(0, 8)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + off,
                              rkey=eb.mr.rkey if rkey is None else rkey,
                              compare_add=add_swap if op == W.ATOMIC_FETCH_AND_ADD else compare,
                              swap=add_swap))
    (data, _), = a.datagrams_to_send(0.0)
    return bytes(data)


ATOMIC_MUTATIONS = ("none", "none", "other op", "rkey", "psn+1", "psn-1", "unaligned", "past",
                    "flip", "fecn", "se", "qpn")


@settings(max_examples=120, deadline=None)
@given(st.sampled_from([W.ATOMIC_FETCH_AND_ADD, W.ATOMIC_CMP_AND_SWP]), st.data())
def test_an_atomic_the_kernel_answers_is_the_engines_answer(op, data):
    """As for READs: two responders alike, one through the engine, one through
    ``sn_atomic_ack`` and ``took_answers``; the kernel takes every ATOMIC like
    the last (the same operation and R_Key) at the ePSN, aligned, within the
    MR, and whatever it takes, the response, the memory and the responder's
    state (the original value remembered for a duplicate) are the engine's."""
    k = kernel()
    pairs = [_pair(k, 1024), _pair(k, 1024)]
    u64 = st.integers(0, 2**64 - 1)
    first_off = data.draw(st.integers(0, 2047), label="first offset") * 8
    for a, b, ea, eb in pairs:      # the engine answers the first: the hint
        b.receive_datagram(_atomic(a, ea, eb, op, first_off, 5, 0), a.address, 0.0)
        b.datagrams_to_send(0.0)
        assert eb.qp.resp.answer_hint[1:] == (eb.mr.rkey, 8)
    mutation = data.draw(st.sampled_from(ATOMIC_MUTATIONS), label="mutation")
    this_op = op
    if mutation == "other op":
        this_op = W.ATOMIC_CMP_AND_SWP if op == W.ATOMIC_FETCH_AND_ADD else W.ATOMIC_FETCH_AND_ADD
    off = data.draw(st.integers(0, 2047), label="offset") * 8
    mis = data.draw(st.integers(1, 7), label="misaligned by") if mutation == "unaligned" else 0
    if mutation == "past":
        off = (1 << 14) + 8 * data.draw(st.integers(0, 8), label="past by")
    add_swap = data.draw(u64, label="add or swap")
    equal = data.draw(st.booleans(), label="compare equal")
    flip = (data.draw(st.integers(0, 43), label="flipped byte"),
            data.draw(st.integers(0, 7), label="bit")) if mutation == "flip" else None
    requests = []
    for a, b, ea, eb in pairs:
        cur = int.from_bytes(eb.buf.view[off:off + 8], "little") if off + 8 <= (1 << 14) else 0
        compare = cur if equal else cur ^ 1
        rkey = eb.mr.rkey ^ 0x100 if mutation == "rkey" else None
        req = bytearray(_atomic(a, ea, eb, this_op, off, add_swap, compare, rkey))
        if mis:                     # (the requester refuses to send it: a peer's packet)
            req[12:20] = (int.from_bytes(req[12:20], "big") + mis).to_bytes(8, "big")
            req = append_icrc(req[:-4], a.ip, b.ip, a.port, b.port)
        requests.append(_mutate(req, mutation, flip, a, b))
    note(f"{op.name} first at {first_off}, {mutation}: {this_op.name} at {off} + {mis}, "
         f"add/swap {add_swap:#x}, compare equal {equal}")
    (a1, b1, ea1, eb1), (a2, b2, ea2, eb2) = pairs
    before = _state(b2, eb2)
    memory = bytes(eb2.buf.view[:1 << 14])
    answer, engine = _both_ways(k, pairs, requests, mutation)
    if answer is None:
        assert _state(b2, eb2) == before and bytes(eb2.buf.view[:1 << 14]) == memory
        return
    assert engine == [answer] and answer[0] == Opcode.RC_ATOMIC_ACKNOWLEDGE, mutation
    assert bytes(eb2.buf.view[:1 << 14]) == bytes(eb1.buf.view[:1 << 14])
    assert _state(b2, eb2) == _state(b1, eb1)
    assert _again(pairs, requests) == [answer]              # a duplicate: not run again
    assert bytes(eb2.buf.view[:1 << 14]) == bytes(eb1.buf.view[:1 << 14])


def test_the_kernel_takes_only_what_answer_target_allows():
    """No target without a READ answered first, nor while a response waits to go
    out, nor once the QP is in error, nor for an MR deregistered meanwhile."""
    k = kernel()
    a, b, ea, eb = _pair(k, 1024)
    assert b.answer_target() is None
    b.receive_datagram(_request(a, ea, eb, 8, 0), a.address, 0.0)
    assert eb.qp.resp.out and b.answer_target() is None       # its response not yet sent
    assert b.answer_qp is eb.qp
    b.datagrams_to_send(0.0)
    t = b.answer_target()
    assert t is not None and (t.rkey, t.length, t.epsn) == (eb.mr.rkey, 8, eb.qp.resp.epsn)
    b.modify_qp(eb.qp, QPAttr(qp_state=QPState.SQD), QPAttrMask.STATE)
    assert b.answer_target() is not None                       # SQD still answers
    b.modify_qp(eb.qp, QPAttr(qp_state=QPState.ERR), QPAttrMask.STATE)
    assert b.answer_target() is None and b.answer_qp is None
    a, b, ea, eb = _pair(k, 1024)
    b.receive_datagram(_request(a, ea, eb, 8, 0), a.address, 0.0)
    b.datagrams_to_send(0.0)
    assert b.answer_target() is not None
    b.dereg_mr(eb.mr)
    assert b.answer_target() is None and b.answer_qp is None


def _live_pair(name: str, host: str):
    """A live NIC ``b`` (the kernel's answers on) and an engine device ``a`` on a
    UDP socket of its own, connected; READs of 8 bytes from ``a``."""
    tx = UdpSocket(host, 0)
    b = NIC(DeviceSpec(name, None, 0), RuntimeConfig(min_timer=2e-3))
    a = Device("a", host, tx.address[1])
    with b.lock:
        ea, eb = endpoint(a, buf_size=1 << 16), endpoint(b.dev, buf_size=1 << 16)
        bring_up(ea, eb, mtu=1024)
        bring_up(eb, ea, mtu=1024)
        eb.buf.view[:1 << 16] = bytes(range(251)) * (65536 // 251) + bytes(65536 % 251)
    return tx, a, b, ea, eb


def _round(tx, a, b, want: int) -> list[bytes]:
    """Send what ``a`` has to ``b``, step ``b`` (its progress thread kept out by
    the lock) and hand ``a`` the ``want`` datagrams ``b`` answers with."""
    sent = [bytes(d) for d, _ in a.datagrams_to_send(0.0)]
    for d in sent:
        tx.send(d, b.sock.address)
    return _answers(tx, a, b, want)


def _answers(tx, a, b, want: int) -> list[bytes]:
    """Step ``b`` (its progress thread kept out by the lock) on what was sent to it
    and hand ``a`` the ``want`` datagrams ``b`` answers with (fewer after 5 s)."""
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    with b.lock:
        time.sleep(0.02)
        b._step(0.0)
    while len(got) < want and time.monotonic() < deadline:
        for d, src in tx.recv_batch(64):
            got.append(bytes(d))
            a.receive_datagram(d, src, 0.0)
        if len(got) < want:
            tx.wait(0.05)
    return got


def test_the_live_driver_answers_reads_in_the_kernel():
    """A run of READs of 8 bytes to a live NIC: the first through the engine, the
    rest answered by ``sn_rx_answers`` (counted in ``rx_answers``), each
    completing with the bytes read; a duplicate is answered again by the engine
    from what the kernel's answers left remembered; a READ past the MR's end is
    the engine's to NAK (REMOTE ACCESS ERROR)."""
    kernel()
    tx, a, b, ea, eb = _live_pair("rdk0", "127.0.0.248")
    try:
        assert b._answers is not None
        wcs = []

        def read(i, off):
            a.post_send(ea.qp, SendWR(i, W.RDMA_READ, [ea.sge(8 * i, 8)], SendFlags.SIGNALED,
                                      remote_addr=eb.buf.addr + off, rkey=eb.mr.rkey))

        read(0, 100)
        assert len(_round(tx, a, b, 1)) == 1
        assert b.counters["rx_answers"] == 0
        for i in range(1, 17):          # (16: the requester's READs in flight at most)
            read(i, 1000 + 37 * i)
        requests = [bytes(d) for d, _ in a.datagrams_to_send(0.0)]
        assert len(requests) == 16
        for d in requests:
            tx.send(d, b.sock.address)
        got = _answers(tx, a, b, 16)
        assert len(got) == 16 and all(d[0] == Opcode.RC_RDMA_READ_RESPONSE_ONLY for d in got)
        assert b.counters["rx_answers"] == 16
        wcs += a.poll_cq(ea.send_cq, 64)
        assert [(w.wr_id, w.status) for w in wcs] == [(i, WCStatus.SUCCESS) for i in range(17)]
        for i in range(1, 17):
            assert bytes(ea.buf.view[8 * i:8 * i + 8]) == \
                bytes(eb.buf.view[1000 + 37 * i:1008 + 37 * i])
        # the last request again: a duplicate, answered by the engine from its resource
        tx.send(requests[-1], b.sock.address)
        with b.lock:
            time.sleep(0.02)
            b._step(0.0)
        again = []
        deadline = time.monotonic() + 5
        while not again and time.monotonic() < deadline:
            again = [bytes(d) for d, _ in tx.recv_batch(8)]
            tx.wait(0.05)
        assert again == [got[-1]] and b.counters["rx_answers"] == 16
        assert b.dev.answer_qp is None      # not one like the last: none offered until
        read(17, 2000)                      # the engine answers one again ...
        _round(tx, a, b, 1)
        read(18, 2008)                      # ... and then the next is the kernel's
        _round(tx, a, b, 1)
        assert b.counters["rx_answers"] == 17
        assert [(w.wr_id, w.status) for w in a.poll_cq(ea.send_cq, 8)] == \
            [(17, WCStatus.SUCCESS), (18, WCStatus.SUCCESS)]
        assert bytes(ea.buf.view[8 * 17:8 * 19]) == bytes(eb.buf.view[2000:2016])
        # past the MR's end: not the kernel's; the engine NAKs it
        read(30, (1 << 16) - 4)
        _round(tx, a, b, 1)
        wc, = a.poll_cq(ea.send_cq, 4)
        assert (wc.wr_id, wc.status) == (30, WCStatus.REM_ACCESS_ERR)
        assert b.counters["rx_answers"] == 17
    finally:
        b.close()
        tx.close()


def test_the_live_driver_answers_longer_reads_around_a_send_in_their_run():
    """READs of four packets to a live NIC, with a SEND of the same size as a READ
    request among them, sent as one GSO run (as a driver sends UCX's READs and
    the ATS between them): the first READ through the engine, the others
    answered by ``sn_rx_answers`` (``sn_read_run``) around the SEND, which the
    engine takes alone from the middle of the run; every READ completes with the
    bytes read, the SEND lands, and all complete in order.  A SEND alone in its
    datagram, small, leaves the kernel the READs after it; ``_ANSWER_MISSES``
    small datagrams with no READ do not."""
    kernel()
    tx, a, b, ea, eb = _live_pair("rdk4", "127.0.0.246")
    try:
        assert b._answers is not None and b.dev.tx_gather and tx.gso

        def read(i, off):
            a.post_send(ea.qp, SendWR(i, W.RDMA_READ, [ea.sge(4096 * i, 4000)],
                                      SendFlags.SIGNALED, remote_addr=eb.buf.addr + off,
                                      rkey=eb.mr.rkey))

        read(0, 100)
        assert len(_round(tx, a, b, 4)) == 4
        assert b.counters["rx_answers"] == 0
        with b.lock:
            b.dev.post_recv(eb.qp, RecvWR(7, [eb.sge(60000, 64)]))
        ea.buf.view[50000:50016] = b"sixteen bytes.!!"
        read(1, 5000)
        a.post_send(ea.qp, SendWR(9, W.SEND, [ea.sge(50000, 16)], SendFlags.SIGNALED))
        read(2, 9000)
        read(3, 13001)
        requests = [bytes(d) for d, _ in a.datagrams_to_send(0.0)]
        assert [len(d) for d in requests] == [32] * 4 and requests[1][0] == Opcode.RC_SEND_ONLY
        tx.send_batch([(d, b.sock.address) for d in requests])    # one GSO run
        got = _answers(tx, a, b, 13)
        # each READ's FIRST, MIDDLEs and LAST, and the SEND's ACK between them
        assert [d[0] for d in got] == [Opcode.RC_RDMA_READ_RESPONSE_FIRST] \
            + [Opcode.RC_RDMA_READ_RESPONSE_MIDDLE] * 2 + [Opcode.RC_RDMA_READ_RESPONSE_LAST] \
            + [Opcode.RC_ACKNOWLEDGE] + ([Opcode.RC_RDMA_READ_RESPONSE_FIRST]
                                         + [Opcode.RC_RDMA_READ_RESPONSE_MIDDLE] * 2
                                         + [Opcode.RC_RDMA_READ_RESPONSE_LAST]) * 2
        assert b.counters["rx_answers"] == 3
        wcs = a.poll_cq(ea.send_cq, 8)
        assert [(w.wr_id, w.status) for w in wcs] == \
            [(i, WCStatus.SUCCESS) for i in (0, 1, 9, 2, 3)]
        for i, off in ((0, 100), (1, 5000), (2, 9000), (3, 13001)):
            assert bytes(ea.buf.view[4096 * i:4096 * i + 4000]) == \
                bytes(eb.buf.view[off:off + 4000]), i
        with b.lock:
            wc, = b.dev.poll_cq(eb.recv_cq, 4)
        assert (wc.wr_id, wc.status, wc.byte_len) == (7, WCStatus.SUCCESS, 16)
        assert bytes(eb.buf.view[60000:60016]) == b"sixteen bytes.!!"
        # a SEND in a datagram of its own (small: an ACK's size, UCX's ATS) leaves
        # the kernel the QP, and the READs after it are the kernel's
        with b.lock:
            b.dev.post_recv(eb.qp, RecvWR(8, [eb.sge(61000, 64)]))
        a.post_send(ea.qp, SendWR(10, W.SEND, [ea.sge(50000, 16)], SendFlags.SIGNALED))
        assert [d[0] for d in _round(tx, a, b, 1)] == [Opcode.RC_ACKNOWLEDGE]
        assert b.dev.answer_qp is eb.qp
        read(4, 17000)
        read(5, 21000)
        assert len(_round(tx, a, b, 8)) == 8
        assert b.counters["rx_answers"] == 5
        assert [(w.wr_id, w.status) for w in a.poll_cq(ea.send_cq, 8)] == \
            [(10, WCStatus.SUCCESS), (4, WCStatus.SUCCESS), (5, WCStatus.SUCCESS)]
        assert bytes(ea.buf.view[4096 * 4:4096 * 4 + 4000]) == bytes(eb.buf.view[17000:21000])
        # small datagrams and no READ: after _ANSWER_MISSES calls that find one, the
        # kernel is offered none (a program streaming WRITEs receives ACKs alone)
        for _ in range(nicmod._ANSWER_MISSES):
            assert b.dev.answer_qp is eb.qp
            tx.send(bytes(20), b.sock.address)      # (a bad packet: counted, dropped)
            with b.lock:
                time.sleep(0.005)
                b._step(0.0)
        assert b.dev.answer_qp is None
    finally:
        b.close()
        tx.close()


def test_the_live_driver_answers_atomics_in_the_kernel():
    """FETCH_ADDs of 1 to one counter of a live NIC, a few in flight at a time:
    the first through the engine, the rest answered by ``sn_rx_answers``; each
    gets the value before it, and the counter ends at their number."""
    kernel()
    tx, a, b, ea, eb = _live_pair("rdk3", "127.0.0.247")
    try:
        eb.buf.view[64:72] = (1000).to_bytes(8, "little")
        n = 0
        for burst in (1, 4, 4, 4, 3):
            for i in range(burst):
                a.post_send(ea.qp, SendWR(n + i, W.ATOMIC_FETCH_AND_ADD, [ea.sge(8 * (n + i), 8)],
                                          SendFlags.SIGNALED, remote_addr=eb.buf.addr + 64,
                                          rkey=eb.mr.rkey, compare_add=1))
            assert len(_round(tx, a, b, burst)) == burst
            n += burst
        wcs = a.poll_cq(ea.send_cq, 64)
        assert [(w.wr_id, w.status) for w in wcs] == [(i, WCStatus.SUCCESS) for i in range(n)]
        assert [int.from_bytes(ea.buf.view[8 * i:8 * i + 8], "little") for i in range(n)] \
            == list(range(1000, 1000 + n))
        assert int.from_bytes(eb.buf.view[64:72], "little") == 1000 + n
        assert b.counters["rx_answers"] == n - 1
    finally:
        b.close()
        tx.close()


def test_softnic_rx_answers_0_leaves_every_request_to_the_engine(monkeypatch):
    kernel()
    import softnic.driver.nic as nic
    monkeypatch.setattr(nic, "RX_ANSWERS", False)
    b = NIC(DeviceSpec("rdk1", None, 0), RuntimeConfig(min_timer=2e-3))
    try:
        assert b._answers is None
    finally:
        b.close()


def test_no_kernel_answer_where_a_fault_model_must_see_every_response():
    kernel()
    from softnic.driver.faults import FaultModel
    b = NIC(DeviceSpec("rdk2", None, 0), RuntimeConfig(min_timer=2e-3,
                                                        faults=FaultModel.parse("loss=0.01")))
    try:
        assert b.injector is not None and b._answers is None
    finally:
        b.close()
