"""The pyverbs API end to end over live softnic NICs on loopback.

Every operation runs between two devices of this process and between two QPs
of one device looping back to itself, over both transports: RoCEv2 over UDP
and iWARP over TCP (``transport=tcp``).  Where iWARP's semantics differ (no
atomics, no UD or UC, no Send with Immediate, no RNR, Sends and Writes complete
when handed to TCP) the test checks iWARP's behaviour instead.  Written
against the pyverbs API only, in the way rdma-core's own tests drive it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import verbs_api.enums as e
from verbs_api.addr import AH
from verbs_api.cq import CQ, CQEX, CompChannel, CqInitAttrEx
from verbs_api.device import Context, get_device_list
import softnic.driver.config as _config
import softnic.driver.nic as _nic
from verbs_api.mr import MR
from verbs_api.pyverbs_error import PyverbsError, PyverbsRDMAError
from verbs_api.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from verbs_api.srq import SRQ, SrqAttr, SrqInitAttr
from verbs_api.wr import SGE, RecvWR, SendWR

from verbskit import GRH_SIZE, REMOTE_ACCESS, UD_QKEY, Side, connect, poll

ROOT = Path(__file__).resolve().parent.parent
IMM = 0x12345678


@pytest.fixture(params=['udp', 'tcp'])
def transport(request):
    """The transport of every device for this test: UDP (the default) or TCP (iWARP)."""
    if request.param == 'tcp':
        env = {k: v for k, v in os.environ.items() if k.startswith('SOFTNIC_')}
        _nic.configure(_config.load({**env, 'SOFTNIC_TRANSPORT': 'tcp'}))
    yield request.param
    if request.param == 'tcp':
        _nic.configure(None)


def _iwarp(side) -> bool:
    dev = next(d for d in get_device_list() if d.name.decode() == side.ctx.name)
    return dev.transport_type == e.IBV_TRANSPORT_IWARP


def _rejected(fn, code=errno.EINVAL):
    with pytest.raises(PyverbsRDMAError) as ex:
        fn()
    assert ex.value.error_code == code
    return ex.value


def _state(side, qp=None):
    return (qp or side.qp).query(e.IBV_QP_STATE)[0].qp_state


def _wait_state(side, state, qp=None, timeout=10.0):
    deadline = time.monotonic() + timeout
    while _state(side, qp) != state:
        side.cq.poll()                         # drives progress
        assert time.monotonic() < deadline, f'QP not in state {state}'
        time.sleep(0.001)


def _landed(side, pred, timeout=10.0):
    """Drive ``side``'s progress until ``pred()``, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while not pred():
        side.cq.poll()
        assert time.monotonic() < deadline, 'data never landed'
        time.sleep(0.0005)


def _events(sides, n):
    """``n`` async events from the sides' contexts (each context once)."""
    got = []
    ctxs = list({id(s.ctx): s.ctx for s in sides}.values())
    deadline = time.monotonic() + 10
    while len(got) < n:
        assert time.monotonic() < deadline, f'{len(got)} of {n} async events: {got}'
        for ctx in ctxs:
            if len(got) < n and ctx._nic.dev.events:
                got.append(ctx.get_async_event().event_type)
        if len(got) < n:
            time.sleep(0.001)
            for s in sides:
                s.cq.poll()
    return sorted(got)


def _expect_remote_access_error(a, b, wr_id):
    """``wr_id`` on ``a`` touched ``b``'s memory without the right.  RoCE: the
    NAK fails that WR with REM_ACCESS_ERR.  iWARP: the WRITE completed when it
    went to TCP; ``b`` answers with a Terminate, raises an access-error event and
    goes to ERR, and ``a`` (fatal event) goes to ERR too."""
    wc = poll(a.cq)[0]
    assert wc.wr_id == wr_id
    if not _iwarp(a):
        assert wc.status == e.IBV_WC_REM_ACCESS_ERR
        assert _state(a) == e.IBV_QPS_ERR
        return
    assert wc.status == e.IBV_WC_SUCCESS
    _wait_state(a, e.IBV_QPS_ERR)
    _wait_state(b, e.IBV_QPS_ERR)
    assert _events([a, b], 2) == sorted([e.IBV_EVENT_QP_ACCESS_ERR, e.IBV_EVENT_QP_FATAL])
    assert b.ctx._nic.counters['terminate_sent'] == 1
    assert a.ctx._nic.counters['terminate_rcvd'] == 1


@pytest.fixture(params=['two-devices', 'loopback'])
def pair(request, transport):
    """Two connected RC sides: on softnic0 and softnic1, or both on softnic0."""
    if request.param == 'two-devices':
        a, b = Side('softnic0', msg_size=1 << 16), Side('softnic1', msg_size=1 << 16)
        yield a, b
        a.close()
        b.close()
    else:
        ctx = Context(name='softnic0')
        a = Side('softnic0', ctx=ctx, msg_size=1 << 16)
        b = Side('softnic0', ctx=ctx, msg_size=1 << 16)
        yield a, b
        ctx.close()


@pytest.fixture
def rc(pair):
    a, b = pair
    connect(a, b)
    return a, b


def _signaled(wr_id, opcode, sge, **kw):
    return SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge],
                  send_flags=e.IBV_SEND_SIGNALED, **kw)


def _ok(wc, opcode=None):
    assert wc.status == e.IBV_WC_SUCCESS, wc
    if opcode is not None:
        assert wc.opcode == opcode


@pytest.mark.parametrize('size', [1, 1024, 10000, 60000])
def test_rc_send_recv(rc, size):
    a, b = rc
    data = os.urandom(size)
    b.qp.post_recv(RecvWR(7, 1, [SGE(b.mr.buf, size, b.mr.lkey)]))
    a.mr.write(data, size)
    a.qp.post_send(_signaled(1, e.IBV_WR_SEND, SGE(a.mr.buf, size, a.mr.lkey)))
    _ok(poll(a.cq)[0], e.IBV_WC_SEND)
    wc = poll(b.cq)[0]
    _ok(wc, e.IBV_WC_RECV)
    assert wc.wr_id == 7 and wc.byte_len == size and wc.qp_num == b.qp.qp_num
    assert wc.src_qp == a.qp.qp_num and not wc.wc_flags & e.IBV_WC_WITH_IMM
    assert b.mr.read(size, 0) == data


def test_send_with_imm_gives_imm_in_network_order(rc):
    a, b = rc
    b.qp.post_recv(RecvWR(3, 1, [SGE(b.mr.buf, 100, b.mr.lkey)]))
    a.mr.write(b'imm', 3)
    wr = _signaled(4, e.IBV_WR_SEND_WITH_IMM, SGE(a.mr.buf, 3, a.mr.lkey))
    wr.imm_data = socket.htonl(IMM)
    if _iwarp(a):                              # RFC 5040/7306 have no Send with Immediate
        assert 'Immediate' in str(_rejected(lambda: a.qp.post_send(wr)))
        return
    a.qp.post_send(wr)
    _ok(poll(a.cq)[0], e.IBV_WC_SEND)
    wc = poll(b.cq)[0]
    _ok(wc, e.IBV_WC_RECV)
    assert wc.wc_flags & e.IBV_WC_WITH_IMM and socket.ntohl(wc.imm_data) == IMM
    assert wc.byte_len == 3 and b.mr.read(3, 0) == b'imm'


def test_rdma_write(rc):
    a, b = rc
    data = os.urandom(20000)
    a.mr.write(data, len(data))
    wr = _signaled(5, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, len(data), a.mr.lkey))
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf + 100)
    a.qp.post_send(wr)
    _ok(poll(a.cq)[0], e.IBV_WC_RDMA_WRITE)
    if _iwarp(a):           # the WRITE completed when handed to TCP: wait for it to land
        _landed(b, lambda: b.mr.read(len(data), 100) == data)
    assert b.mr.read(len(data), 100) == data
    assert b.cq.poll() == (0, [])                          # a WRITE consumes no receive


def test_rdma_write_with_imm(rc):
    a, b = rc
    b.qp.post_recv(RecvWR(11, 1, [SGE(b.mr.buf, 8, b.mr.lkey)]))
    a.mr.write(b'W' * 3000, 3000)
    wr = _signaled(6, e.IBV_WR_RDMA_WRITE_WITH_IMM, SGE(a.mr.buf, 3000, a.mr.lkey))
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf + 4096)
    wr.imm_data = socket.htonl(IMM)
    a.qp.post_send(wr)
    _ok(poll(a.cq)[0], e.IBV_WC_RDMA_WRITE)
    wc = poll(b.cq)[0]
    _ok(wc, e.IBV_WC_RECV_RDMA_WITH_IMM)
    assert wc.wr_id == 11 and socket.ntohl(wc.imm_data) == IMM and wc.byte_len == 3000
    assert b.mr.read(3000, 4096) == b'W' * 3000


def test_cq_wait_moves_the_device_in_the_waiting_thread():
    """``CQ.wait`` (softnic's, for the collectives): the caller's thread sleeps on the
    device and takes what arrives itself, as many datagrams per step as wait, until a
    completion is queued; the device's progress thread is left asleep.  An empty CQ
    waits out its timeout and answers False; a closed one is refused."""
    a, b = Side('softnic0', msg_size=1 << 16), Side('softnic1', msg_size=1 << 16)
    try:
        connect(a, b)
        before = b.ctx._nic.counters['progress_wake_datagram']
        for i in range(20):
            b.qp.post_recv(RecvWR(i, 1, [SGE(b.mr.buf, 8, b.mr.lkey)]))
            a.mr.write(bytes([i + 1]) * (1 << 16), 1 << 16)
            wr = _signaled(i, e.IBV_WR_RDMA_WRITE_WITH_IMM, SGE(a.mr.buf, 1 << 16, a.mr.lkey))
            wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
            wr.imm_data = i
            a.qp.post_send(wr)
            assert b.cq.wait(10.0)
            n, wcs = b.cq.poll(4)
            assert n == 1 and wcs[0].wr_id == i and wcs[0].imm_data == i, wcs
            _ok(wcs[0], e.IBV_WC_RECV_RDMA_WITH_IMM)
            assert b.mr.read(1 << 16, 0) == bytes([i + 1]) * (1 << 16)
            _ok(poll(a.cq)[0], e.IBV_WC_RDMA_WRITE)
        # 20 WRITEs of 64 datagrams each: taken by the waiting thread (1-2 wake-ups of
        # the progress thread in all), not the progress thread (a wait that slept and
        # polled leaves it one wake-up per WRITE, 21)
        woke = b.ctx._nic.counters['progress_wake_datagram'] - before
        assert woke < 10, woke
        t = time.monotonic()
        assert not b.cq.wait(0.05)
        assert time.monotonic() - t >= 0.05
    finally:
        a.close()
        b.close()
    with pytest.raises(PyverbsError):
        b.cq.wait(0.01)


def test_set_window_caps_the_packets_in_flight():
    """``QP.set_window`` (softnic's, for the collectives): with a window of one packet
    each packet of a WRITE waits for the ACK of the one before, so the sender gets an
    ACK per packet; with the default (128) one or two for the whole WRITE.  Out of
    range is EINVAL."""
    for window, acks in ((None, (1, 4)), (1, (16, 64))):
        a, b = Side('softnic0', msg_size=1 << 16), Side('softnic1', msg_size=1 << 16)
        try:
            if window is not None:
                a.qp.set_window(window)
            connect(a, b, mtu=e.IBV_MTU_4096)
            before = a.ctx._nic.counters['rcvd_pkts']
            a.mr.write(b'w' * (1 << 16), 1 << 16)
            wr = _signaled(1, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, 1 << 16, a.mr.lkey))
            wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
            a.qp.post_send(wr)
            _ok(poll(a.cq)[0], e.IBV_WC_RDMA_WRITE)
            assert b.mr.read(1 << 16, 0) == b'w' * (1 << 16)
            got = a.ctx._nic.counters['rcvd_pkts'] - before
            assert acks[0] <= got <= acks[1], (window, got)
            for bad in (0, 1 << 23):
                _rejected(lambda: a.qp.set_window(bad))
        finally:
            a.close()
            b.close()


def test_rdma_read(rc):
    a, b = rc
    data = os.urandom(30000)
    b.mr.write(data, len(data))
    wr = _signaled(8, e.IBV_WR_RDMA_READ, SGE(a.mr.buf + 8, len(data), a.mr.lkey))
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
    a.qp.post_send(wr)
    wc = poll(a.cq)[0]
    _ok(wc, e.IBV_WC_RDMA_READ)
    assert wc.byte_len == len(data) and a.mr.read(len(data), 8) == data


def test_atomics(rc):
    a, b = rc
    b.mr.write((100).to_bytes(8, sys.byteorder), 8, 64)
    fa = _signaled(1, e.IBV_WR_ATOMIC_FETCH_AND_ADD, SGE(a.mr.buf, 8, a.mr.lkey))
    fa.set_wr_atomic(b.mr.rkey, b.mr.buf + 64, 5)
    if _iwarp(a):                              # RFC 5040 has no atomics
        assert 'atomic' in str(_rejected(lambda: a.qp.post_send(fa)))
        assert _state(a) == e.IBV_QPS_RTS     # a refused post changes nothing
        return
    a.qp.post_send(fa)
    _ok(poll(a.cq)[0], e.IBV_WC_FETCH_ADD)
    assert int.from_bytes(a.mr.read(8, 0), sys.byteorder) == 100
    assert int.from_bytes(b.mr.read(8, 64), sys.byteorder) == 105
    cs = _signaled(2, e.IBV_WR_ATOMIC_CMP_AND_SWP, SGE(a.mr.buf + 8, 8, a.mr.lkey))
    cs.set_wr_atomic(b.mr.rkey, b.mr.buf + 64, 105, 7)
    a.qp.post_send(cs)
    _ok(poll(a.cq)[0], e.IBV_WC_COMP_SWAP)
    assert int.from_bytes(a.mr.read(8, 8), sys.byteorder) == 105
    assert int.from_bytes(b.mr.read(8, 64), sys.byteorder) == 7
    cs.set_wr_atomic(b.mr.rkey, b.mr.buf + 64, 999, 1)      # compare fails: no swap
    a.qp.post_send(cs)
    _ok(poll(a.cq)[0], e.IBV_WC_COMP_SWAP)
    assert int.from_bytes(b.mr.read(8, 64), sys.byteorder) == 7


def test_bad_rkey_is_a_remote_access_error(rc):
    a, b = rc
    wr = _signaled(9, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, 64, a.mr.lkey))
    wr.set_wr_rdma(b.mr.rkey ^ 0xFF00, b.mr.buf)
    a.qp.post_send(wr)
    _expect_remote_access_error(a, b, 9)


@pytest.mark.parametrize('fault', ['bad-rkey', 'out-of-bounds', 'no-remote-read'])
def test_rdma_read_refused_is_a_remote_access_error(pair, fault):
    """On both transports the READ itself fails with REM_ACCESS_ERR (iWARP: the
    responder's Terminate names the Read Request), and later WRs are flushed."""
    a, b = pair
    connect(a, b)
    wo = MR(b.pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    rkey, addr = {'bad-rkey': (b.mr.rkey ^ 0xFF00, b.mr.buf),
                  'out-of-bounds': (b.mr.rkey, b.mr.buf + b.mr.length - 16),
                  'no-remote-read': (wo.rkey, wo.buf)}[fault]
    wr = _signaled(12, e.IBV_WR_RDMA_READ, SGE(a.mr.buf, 64, a.mr.lkey))
    wr.set_wr_rdma(rkey, addr)
    a.qp.post_send(wr)
    wc = poll(a.cq)[0]
    assert wc.wr_id == 12 and wc.status == e.IBV_WC_REM_ACCESS_ERR
    _wait_state(a, e.IBV_QPS_ERR)
    a.qp.post_send(_signaled(13, e.IBV_WR_SEND, SGE(a.mr.buf, 8, a.mr.lkey)))
    wc = poll(a.cq)[0]
    assert wc.wr_id == 13 and wc.status == e.IBV_WC_WR_FLUSH_ERR
    if _iwarp(a):
        _wait_state(b, e.IBV_QPS_ERR)
        assert _events([a, b], 2) == sorted([e.IBV_EVENT_QP_ACCESS_ERR, e.IBV_EVENT_QP_FATAL])


def test_write_outside_the_mr_is_a_remote_access_error(rc):
    a, b = rc
    wr = _signaled(10, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, 64, a.mr.lkey))
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf + b.mr.length - 32)
    a.qp.post_send(wr)
    _expect_remote_access_error(a, b, 10)


def test_mr_without_remote_write_refuses_writes(pair):
    a, b = pair
    connect(a, b)
    ro = MR(b.pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)
    wr = _signaled(1, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, 16, a.mr.lkey))
    wr.set_wr_rdma(ro.rkey, ro.buf)
    a.qp.post_send(wr)
    _expect_remote_access_error(a, b, 1)


def test_chained_and_unsignaled_wrs(rc):
    a, b = rc
    for i in range(3):
        b.qp.post_recv(RecvWR(100 + i, 1, [SGE(b.mr.buf + 1000 * i, 1000, b.mr.lkey)]))
    for i in range(3):
        a.mr.write(bytes([65 + i]) * 10, 10, 10 * i)
    w3 = _signaled(3, e.IBV_WR_SEND, SGE(a.mr.buf + 20, 10, a.mr.lkey))
    w2 = SendWR(2, e.IBV_WR_SEND, 1, sg=[SGE(a.mr.buf + 10, 10, a.mr.lkey)], send_flags=0,
                next_wr=w3)
    w1 = SendWR(1, e.IBV_WR_SEND, 1, sg=[SGE(a.mr.buf, 10, a.mr.lkey)], send_flags=0,
                next_wr=w2)
    a.qp.post_send(w1)
    wcs = poll(a.cq)
    assert [w.wr_id for w in wcs] == [3]                   # only the signaled one completes
    got = poll(b.cq, 3)
    assert [w.wr_id for w in got] == [100, 101, 102]
    assert [b.mr.read(10, 1000 * i) for i in range(3)] == [b'A' * 10, b'B' * 10, b'C' * 10]


def test_two_sges_gather_and_scatter(rc):
    a, b = rc
    a.mr.write(b'0123456789', 10)
    b.qp.post_recv(RecvWR(1, 2, [SGE(b.mr.buf, 4, b.mr.lkey), SGE(b.mr.buf + 100, 8, b.mr.lkey)]))
    a.qp.post_send(SendWR(1, e.IBV_WR_SEND, 2, sg=[SGE(a.mr.buf, 3, a.mr.lkey),
                                                    SGE(a.mr.buf + 5, 5, a.mr.lkey)]))
    _ok(poll(a.cq)[0])
    assert poll(b.cq)[0].byte_len == 8
    assert b.mr.read(4, 0) + b.mr.read(4, 100) == b'01256789'


def test_srq_shared_by_two_qps(pair):
    a, b = pair
    srq = SRQ(b.pd, SrqInitAttr(SrqAttr(max_wr=16, max_sge=1)))
    for i in range(4):
        srq.post_recv(RecvWR(50 + i, 1, [SGE(b.mr.buf + 256 * i, 256, b.mr.lkey)]))
    b2 = QP(b.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=b.cq, rcq=b.cq, srq=srq,
                             cap=QPCap(8, 8)), QPAttr())
    b1 = QP(b.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=b.cq, rcq=b.cq, srq=srq,
                             cap=QPCap(8, 8)), QPAttr())
    a2 = QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=a.cq, rcq=a.cq, cap=QPCap(8, 8)),
            QPAttr())
    connect(a, b, qp_a=a.qp, qp_b=b1)
    connect(a, b, qp_a=a2, qp_b=b2)
    for i, qp in enumerate((a.qp, a2, a.qp, a2)):
        a.mr.write(bytes([48 + i]) * 20, 20, 20 * i)
        qp.post_send(_signaled(i, e.IBV_WR_SEND, SGE(a.mr.buf + 20 * i, 20, a.mr.lkey)))
    assert sorted(w.status for w in poll(a.cq, 4)) == [e.IBV_WC_SUCCESS] * 4
    wcs = poll(b.cq, 4)
    assert sorted(w.wr_id for w in wcs) == [50, 51, 52, 53]
    assert {w.qp_num for w in wcs} == {b1.qp_num, b2.qp_num}
    got = sorted(b.mr.read(20, 256 * (w.wr_id - 50)) for w in wcs)
    assert got == [bytes([48 + i]) * 20 for i in range(4)]


def test_srq_limit_event(pair):
    a, b = pair
    srq = SRQ(b.pd, SrqInitAttr(SrqAttr(max_wr=8, max_sge=1)))
    for i in range(3):
        srq.post_recv(RecvWR(i, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
    srq.modify(SrqAttr(srq_limit=3), e.IBV_SRQ_LIMIT)
    qp = QP(b.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=b.cq, rcq=b.cq, srq=srq,
                             cap=QPCap(4, 4)), QPAttr())
    connect(a, b, qp_b=qp)
    a.qp.post_send(_signaled(1, e.IBV_WR_SEND, SGE(a.mr.buf, 8, a.mr.lkey)))
    poll(b.cq)
    ev = b.ctx.get_async_event()
    assert ev.event_type == e.IBV_EVENT_SRQ_LIMIT_REACHED
    assert srq.query().srq_limit == 0


@pytest.mark.parametrize('where', ['two-devices', 'loopback'])
def test_ud_with_ah_and_grh(where):
    ctx = Context(name='softnic0')
    a = Side('softnic0', qp_type=e.IBV_QPT_UD, ctx=ctx)
    b = Side('softnic1' if where == 'two-devices' else 'softnic0', qp_type=e.IBV_QPT_UD,
             ctx=None if where == 'two-devices' else ctx)
    try:
        assert a.qp.qp_state == b.qp.qp_state == e.IBV_QPS_RTS
        ah = a.ah_to(b)
        size = 1000
        b.qp.post_recv(RecvWR(21, 1, [SGE(b.mr.buf, size + GRH_SIZE, b.mr.lkey)]))
        a.mr.write(b'u' * size, size)
        wr = _signaled(20, e.IBV_WR_SEND_WITH_IMM, SGE(a.mr.buf, size, a.mr.lkey))
        wr.imm_data = socket.htonl(IMM)
        wr.set_wr_ud(ah, b.qp.qp_num, UD_QKEY)
        a.qp.post_send(wr)
        _ok(poll(a.cq)[0], e.IBV_WC_SEND)
        wc = poll(b.cq)[0]
        _ok(wc, e.IBV_WC_RECV)
        assert wc.byte_len == size + GRH_SIZE and wc.wc_flags & e.IBV_WC_GRH
        assert wc.src_qp == a.qp.qp_num and socket.ntohl(wc.imm_data) == IMM
        assert b.mr.read(size, GRH_SIZE) == b'u' * size
        # the reply goes to the address the GRH names
        reply_ah = AH(b.pd, wc=wc, grh=b.mr.buf, port_num=1)
        a.qp.post_recv(RecvWR(22, 1, [SGE(a.mr.buf + 2048, 64 + GRH_SIZE, a.mr.lkey)]))
        b.mr.write(b'reply', 5, 3000)
        back = _signaled(23, e.IBV_WR_SEND, SGE(b.mr.buf + 3000, 5, b.mr.lkey))
        back.set_wr_ud(reply_ah, wc.src_qp, UD_QKEY)
        b.qp.post_send(back)
        _ok(poll(b.cq)[0])
        wc = poll(a.cq)[0]
        _ok(wc, e.IBV_WC_RECV)
        assert a.mr.read(5, 2048 + GRH_SIZE) == b'reply'
        # a wrong Q_Key is dropped silently, as on a real port
        wr.set_wr_ud(ah, b.qp.qp_num, UD_QKEY + 1)
        b.qp.post_recv(RecvWR(24, 1, [SGE(b.mr.buf, size + GRH_SIZE, b.mr.lkey)]))
        a.qp.post_send(wr)
        _ok(poll(a.cq)[0])
        time.sleep(0.05)
        assert b.cq.poll() == (0, [])
    finally:
        ctx.close()
        b.close()


def test_completion_events_single_threaded(rc):
    """One program owns both ends and sleeps in get_cq_event: no deadlock."""
    a, b = rc
    ch = CompChannel(b.ctx)
    cq = CQ(b.ctx, 16, None, ch, 0)
    qp = QP(b.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4)), QPAttr())
    a2 = QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=a.cq, rcq=a.cq, cap=QPCap(4, 4)),
            QPAttr())
    connect(a, b, qp_a=a2, qp_b=qp)
    for round_ in range(3):
        qp.post_recv(RecvWR(round_, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
        cq.req_notify()
        a2.post_send(_signaled(round_, e.IBV_WR_SEND, SGE(a.mr.buf, 16, a.mr.lkey)))
        ch.get_cq_event(cq)
        assert cq.num_events == 1
        cq.ack_events(1)
        n, wcs = cq.poll()
        assert n == 1 and wcs[0].wr_id == round_
        poll(a.cq)


def test_completion_event_wakes_another_thread(rc):
    a, b = rc
    ch = CompChannel(b.ctx)
    cq = CQ(b.ctx, 16, None, ch, 0)
    qp = QP(b.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4)), QPAttr())
    a2 = QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=a.cq, rcq=a.cq, cap=QPCap(4, 4)),
            QPAttr())
    connect(a, b, qp_a=a2, qp_b=qp)
    qp.post_recv(RecvWR(1, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
    cq.req_notify()
    woke = []
    t = threading.Thread(target=lambda: (ch.get_cq_event(cq), woke.append(cq.poll())))
    t.start()
    time.sleep(0.05)
    assert not woke
    a2.post_send(_signaled(1, e.IBV_WR_SEND, SGE(a.mr.buf, 16, a.mr.lkey)))
    t.join(10)
    assert woke and woke[0][0] == 1
    cq.ack_events(cq.num_events)


def test_solicited_only_events(rc):
    a, b = rc
    ch = CompChannel(b.ctx)
    cq = CQ(b.ctx, 16, None, ch, 0)
    qp = QP(b.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4)), QPAttr())
    a2 = QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=a.cq, rcq=a.cq, cap=QPCap(4, 4)),
            QPAttr())
    connect(a, b, qp_a=a2, qp_b=qp)
    for i in range(2):
        qp.post_recv(RecvWR(i, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
    cq.req_notify(solicited_only=True)
    a2.post_send(_signaled(0, e.IBV_WR_SEND, SGE(a.mr.buf, 8, a.mr.lkey)))
    poll(a.cq)
    assert poll(cq)[0].wr_id == 0
    woke = threading.Event()
    t = threading.Thread(target=lambda: (ch.get_cq_event(cq), woke.set()))
    t.start()
    time.sleep(0.1)
    assert not woke.is_set()                   # the unsolicited SEND raised no event...
    a2.post_send(SendWR(1, e.IBV_WR_SEND, 1, sg=[SGE(a.mr.buf, 8, a.mr.lkey)],
                        send_flags=e.IBV_SEND_SIGNALED | e.IBV_SEND_SOLICITED))
    t.join(10)
    assert woke.is_set()                       # ...the solicited one does
    cq.ack_events(1)
    assert [w.wr_id for w in poll(cq)] == [1]


def test_new_post_send_api_and_extended_cq(pair):
    a, b = pair
    cqex = CQEX(a.ctx, CqInitAttrEx(cqe=32))
    init = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cqex, rcq=cqex, cap=QPCap(8, 8), pd=a.pd,
                        comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                        send_ops_flags=e.IBV_QP_EX_WITH_SEND_WITH_IMM |
                        e.IBV_QP_EX_WITH_RDMA_WRITE)
    qp = QPEx(a.ctx, init, QPAttr())
    connect(a, b, qp_a=qp)
    b.qp.post_recv(RecvWR(1, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
    a.mr.write(b'ex-send', 7)
    iwarp = _iwarp(a)
    qp.wr_start()
    qp.wr_id = 0x123
    qp.wr_flags = e.IBV_SEND_SIGNALED
    if iwarp:                                  # no Send with Immediate on iWARP
        qp.wr_send()
    else:
        qp.wr_send_imm(IMM)
    qp.wr_set_sge(SGE(a.mr.buf, 7, a.mr.lkey))
    qp.wr_id = 0x124
    qp.wr_rdma_write(b.mr.rkey, b.mr.buf + 512)
    qp.wr_set_sge(SGE(a.mr.buf, 7, a.mr.lkey))
    qp.wr_complete()
    deadline = time.monotonic() + 10
    while cqex.start_poll(None) != 0:
        assert time.monotonic() < deadline
    ids = [cqex.wr_id]
    assert cqex.status == e.IBV_WC_SUCCESS
    while len(ids) < 2:
        if cqex.poll_next() == 0:
            ids.append(cqex.wr_id)
        assert time.monotonic() < deadline
    cqex.end_poll()
    assert ids == [0x123, 0x124]
    wc = poll(b.cq)[0]
    assert iwarp or socket.ntohl(wc.imm_data) == IMM
    assert b.mr.read(7, 0) == b'ex-send'
    assert b.mr.read(7, 512) == b'ex-send'


def test_many_messages_in_flight(rc):
    a, b = rc
    n = 48
    for i in range(n):
        b.qp.post_recv(RecvWR(i, 1, [SGE(b.mr.buf + 1024 * i, 1024, b.mr.lkey)]))
    a.mr.write(os.urandom(1 << 16), 1 << 16)
    for i in range(n):
        a.qp.post_send(_signaled(i, e.IBV_WR_SEND, SGE(a.mr.buf + 1024 * i, 1024, a.mr.lkey)))
    assert [w.wr_id for w in poll(a.cq, n)] == list(range(n))
    assert [w.wr_id for w in poll(b.cq, n)] == list(range(n))
    assert b.mr.read(1024 * n, 0) == a.mr.read(1024 * n, 0)


def test_rnr_without_receive_then_recovery(rc):
    a, b = rc
    a.mr.write(b'late', 4)
    a.qp.post_send(_signaled(1, e.IBV_WR_SEND, SGE(a.mr.buf, 4, a.mr.lkey)))
    if _iwarp(a):
        # iWARP has no RNR: a Send with no receive posted is fatal (RFC 5041 7.2):
        # the receiver sends a Terminate (no buffer) and both QPs go to ERR.
        _ok(poll(a.cq)[0])
        _wait_state(b, e.IBV_QPS_ERR)
        _wait_state(a, e.IBV_QPS_ERR)
        assert _events([a, b], 2) == [e.IBV_EVENT_QP_FATAL] * 2
        b.qp.post_recv(RecvWR(2, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
        assert poll(b.cq)[0].status == e.IBV_WC_WR_FLUSH_ERR
        return
    time.sleep(0.05)                                   # the responder answers RNR NAKs
    assert a.cq.poll() == (0, [])
    b.qp.post_recv(RecvWR(2, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
    _ok(poll(a.cq)[0])
    assert poll(b.cq)[0].byte_len == 4 and b.mr.read(4, 0) == b'late'


PYVERBS_PROGRAM = '''
import socket
import pyverbs.enums as e
from pyverbs.device import Context, get_device_list
from pyverbs.pd import PD
from pyverbs.mr import MR
from pyverbs.cq import CQ
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.wr import SGE, SendWR, RecvWR
from pyverbs.pyverbs_error import PyverbsRDMAError

names = [d.name.decode() for d in get_device_list()]
res = []
for name in names[:2]:
    ctx = Context(name=name)
    pd = PD(ctx)
    cq = CQ(ctx, 100, None, None, 0)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    init = QPAttr()
    init.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(10, 10)), init)
    res.append((ctx, pd, cq, mr, qp))
for (ctx, pd, cq, mr, qp), (pctx, _, _, _, pqp) in ((res[0], res[1]), (res[1], res[0])):
    attr = QPAttr()
    attr.dest_qp_num = pqp.qp_num
    attr.ah_attr = AHAttr(port_num=1, is_global=1,
                          gr=GlobalRoute(dgid=pctx.query_gid(1, 0), sgid_index=0))
    attr.timeout, attr.retry_cnt, attr.rnr_retry = 14, 7, 7
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
    attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
    qp.to_rts(attr)
a, b = res
b[4].post_recv(RecvWR(sg=[SGE(b[3].buf, 64, b[3].lkey)], num_sge=1))
a[3].write('hello pyverbs', 13)
if get_device_list()[0].transport_type == e.IBV_TRANSPORT_IWARP:   # no Send with Immediate
    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                sg=[SGE(a[3].buf, 13, a[3].lkey)])
    wr.set_wr_rdma(b[3].rkey, b[3].buf)
else:
    wr = SendWR(opcode=e.IBV_WR_SEND_WITH_IMM, num_sge=1, sg=[SGE(a[3].buf, 13, a[3].lkey)])
wr.imm_data = socket.htonl(1234)
a[4].post_send(wr, None)
for cq in (a[2], b[2]):
    n = 0
    while n == 0:
        n, wcs = cq.poll()
    assert wcs[0].status == e.IBV_WC_SUCCESS, wcs[0]
assert socket.ntohl(wcs[0].imm_data) == 1234
print(b[3].read(13, 0).decode(), socket.ntohl(wcs[0].imm_data))
'''


@pytest.mark.compat('pyverbs-softnic')
@pytest.mark.parametrize('transport', ['udp', 'tcp'])
def test_unmodified_pyverbs_program_under_softnic_exec(tmp_path, transport):
    prog = tmp_path / 'app.py'
    prog.write_text(textwrap.dedent(PYVERBS_PROGRAM))
    env = {k: v for k, v in os.environ.items() if not k.startswith('SOFTNIC_')}
    env['PYTHONPATH'] = str(ROOT)
    flags = ['--transport', 'tcp'] if transport == 'tcp' else []
    out = subprocess.run([sys.executable, '-m', 'softnic.cli', 'exec', *flags, sys.executable,
                          str(prog)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ['hello', 'pyverbs', '1234']


def test_uc_write_and_send(pair):
    a, b = pair
    attr = QPAttr()
    attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE      # UC: WRITE needs it, from INIT on
    if _iwarp(a):                                         # iWARP has only RC
        _rejected(lambda: QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_UC, scq=a.cq, rcq=a.cq,
                                              cap=QPCap(8, 8)), attr), errno.EOPNOTSUPP)
        _rejected(lambda: QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=a.cq, rcq=a.cq,
                                              cap=QPCap(8, 8)), attr), errno.EOPNOTSUPP)
        return
    ua = QP(a.pd, QPInitAttr(qp_type=e.IBV_QPT_UC, scq=a.cq, rcq=a.cq, cap=QPCap(8, 8)), attr)
    ub = QP(b.pd, QPInitAttr(qp_type=e.IBV_QPT_UC, scq=b.cq, rcq=b.cq, cap=QPCap(8, 8)), attr)
    connect(a, b, qp_a=ua, qp_b=ub)
    a.mr.write(b'uc' * 2000, 4000)
    wr = _signaled(1, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, 4000, a.mr.lkey))
    wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
    ua.post_send(wr)
    ub.post_recv(RecvWR(2, 1, [SGE(b.mr.buf + 8192, 64, b.mr.lkey)]))
    ua.post_send(_signaled(3, e.IBV_WR_SEND, SGE(a.mr.buf, 10, a.mr.lkey)))
    assert [w.wr_id for w in poll(a.cq, 2)] == [1, 3]
    _ok(poll(b.cq)[0], e.IBV_WC_RECV)
    assert b.mr.read(4000, 0) == b'uc' * 2000 and b.mr.read(10, 8192) == b'uc' * 5


def test_send_with_invalidate(rc):
    a, b = rc
    target = MR(b.pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    b.qp.post_recv(RecvWR(1, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
    wr = _signaled(2, e.IBV_WR_SEND_WITH_INV, SGE(a.mr.buf, 8, a.mr.lkey))
    wr.imm_data = target.rkey                  # the union: the rkey to invalidate, host order
    a.qp.post_send(wr)
    _ok(poll(a.cq)[0], e.IBV_WC_SEND)
    wc = poll(b.cq)[0]
    _ok(wc, e.IBV_WC_RECV)
    assert wc.wc_flags & e.IBV_WC_WITH_INV and wc.imm_data == target.rkey
    late = _signaled(3, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, 8, a.mr.lkey))
    late.set_wr_rdma(target.rkey, target.buf)
    a.qp.post_send(late)
    _expect_remote_access_error(a, b, 3)


def test_inline_send(rc):
    a, b = rc
    b.qp.post_recv(RecvWR(1, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
    a.mr.write(b'inline!', 7)
    wr = SendWR(1, e.IBV_WR_SEND, 1, sg=[SGE(a.mr.buf, 7, a.mr.lkey)],
                send_flags=e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE)
    a.qp.post_send(wr)
    a.mr.write(b'changed', 7)                  # inline data was copied when posted
    _ok(poll(a.cq)[0])
    poll(b.cq)
    assert b.mr.read(7, 0) == b'inline!'
    big = SendWR(2, e.IBV_WR_SEND, 1, sg=[SGE(a.mr.buf, 1000, a.mr.lkey)],
                 send_flags=e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE)
    with pytest.raises(PyverbsRDMAError) as ex:
        a.qp.post_send(big)                    # above max_inline_data
    assert ex.value.error_code == errno.EINVAL


def test_sq_drain_event(rc):
    a, b = rc
    attr = QPAttr(qp_state=e.IBV_QPS_SQD)
    attr.en_sqd_async_notify = 1
    a.qp.modify(attr, e.IBV_QP_STATE | e.IBV_QP_EN_SQD_ASYNC_NOTIFY)
    assert a.qp.qp_state == e.IBV_QPS_SQD
    assert a.ctx.get_async_event().event_type == e.IBV_EVENT_SQ_DRAINED
    a.qp.modify(QPAttr(qp_state=e.IBV_QPS_RTS), e.IBV_QP_STATE)
    b.qp.post_recv(RecvWR(1, 1, [SGE(b.mr.buf, 64, b.mr.lkey)]))
    a.qp.post_send(_signaled(1, e.IBV_WR_SEND, SGE(a.mr.buf, 8, a.mr.lkey)))
    _ok(poll(a.cq)[0])


def test_ud_message_above_the_mtu_is_refused():
    with Context(name='softnic0') as ctx:
        s = Side('softnic0', qp_type=e.IBV_QPT_UD, ctx=ctx, msg_size=8192)
        wr = _signaled(1, e.IBV_WR_SEND, SGE(s.mr.buf, 4097, s.mr.lkey))
        wr.set_wr_ud(s.ah_to(s), s.qp.qp_num, UD_QKEY)
        with pytest.raises(PyverbsRDMAError) as ex:
            s.qp.post_send(wr)
        assert ex.value.error_code == errno.EINVAL


def test_closing_the_context_wakes_a_blocked_get_cq_event():
    keep = Context(name='softnic0')            # keeps the NIC open: only the channel goes
    ctx = Context(name='softnic0')
    ch = CompChannel(ctx)
    cq = CQ(ctx, 4, None, ch, 0)
    cq.req_notify()
    errors = []

    def wait():
        try:
            ch.get_cq_event(cq)
        except PyverbsRDMAError as ex:
            errors.append(ex)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    ctx.close()
    t.join(10)
    keep.close()
    assert not t.is_alive() and errors


PEER_PROGRAM = '''
import json, socket, sys
import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.mr import MR
from pyverbs.cq import CQ
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.wr import SGE, SendWR, RecvWR

role, dev = sys.argv[1], sys.argv[2]
ctx = Context(name=dev)
pd = PD(ctx)
cq = CQ(ctx, 64)
mr = MR(pd, 1 << 16, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
        e.IBV_ACCESS_REMOTE_READ)
attr = QPAttr()
attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(16, 16)), attr)
print(json.dumps({'qpn': qp.qp_num, 'gid': str(ctx.query_gid(1, 0)), 'rkey': mr.rkey,
                  'addr': mr.buf}), flush=True)
peer = json.loads(sys.stdin.readline())
attr.dest_qp_num = peer['qpn']
attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=GID(peer['gid'])))
attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 1
attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
qp.to_rts(attr)

def wait(n=1):
    got = []
    while len(got) < n:
        got += cq.poll(n - len(got))[1]
    assert all(w.status == e.IBV_WC_SUCCESS for w in got), [str(w) for w in got]
    return got

if role == 'server':
    qp.post_recv(RecvWR(1, 1, [SGE(mr.buf, 1024, mr.lkey)]))
    print('ready', flush=True)
    wc = wait()[0]                      # the client's WRITE_WITH_IMM
    data = mr.read(wc.byte_len, 4096)
    print(json.dumps({'imm': socket.ntohl(wc.imm_data), 'data': data.decode()}), flush=True)
    sys.stdin.readline()                # the client read back what it wrote
else:
    sys.stdin.readline()                # the server posted its receive
    mr.write('over two processes', 18)
    wr = SendWR(1, e.IBV_WR_RDMA_WRITE_WITH_IMM, 1, sg=[SGE(mr.buf, 18, mr.lkey)])
    wr.set_wr_rdma(peer['rkey'], peer['addr'] + 4096)
    wr.imm_data = socket.htonl(77)
    qp.post_send(wr)
    wait()
    rd = SendWR(2, e.IBV_WR_RDMA_READ, 1, sg=[SGE(mr.buf + 100, 18, mr.lkey)])
    rd.set_wr_rdma(peer['rkey'], peer['addr'] + 4096)
    qp.post_send(rd)
    wait()
    print(json.dumps({'read': mr.read(18, 100).decode()}), flush=True)
ctx.close()
'''


def run_peers(cmds: dict, cwd, env, check_server_info=None) -> None:
    """Start the PEER_PROGRAM server and client (``cmds`` role -> argv), pass each the
    other's QPN/GID/rkey, let them talk, and check what both report.  A watchdog
    kills a hung peer so the test fails instead of hanging."""
    procs = {role: subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE) for role, cmd in cmds.items()}
    watchdog = threading.Timer(60, lambda: [p.kill() for p in procs.values()])
    watchdog.start()
    try:
        s, c = procs['server'], procs['client']
        s_info, c_info = s.stdout.readline(), c.stdout.readline()
        if check_server_info is not None:
            check_server_info(json.loads(s_info))
        s.stdin.write(c_info)
        s.stdin.flush()
        c.stdin.write(s_info)
        c.stdin.flush()
        assert s.stdout.readline().strip() == 'ready'
        c.stdin.write('go\n')
        c.stdin.flush()
        got = json.loads(s.stdout.readline())
        assert got == {'imm': 77, 'data': 'over two processes'}
        assert json.loads(c.stdout.readline()) == {'read': 'over two processes'}
        s.stdin.write('done\n')
        s.stdin.flush()
        assert s.wait(30) == 0 and c.wait(30) == 0
    finally:
        watchdog.cancel()
        for p in procs.values():
            if p.poll() is None:
                p.kill()


@pytest.mark.compat('pyverbs-softnic')
@pytest.mark.parametrize('transport', ['udp', 'tcp'])
def test_two_processes_exchange_addresses_and_talk(tmp_path, transport):
    prog = tmp_path / 'peer.py'
    prog.write_text(PEER_PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith('SOFTNIC_')}
    env['PYTHONPATH'] = str(ROOT)
    env['SOFTNIC_TRANSPORT'] = transport
    cmd = [sys.executable, '-m', 'softnic.cli', 'exec', sys.executable, str(prog)]
    run_peers({role: cmd + [role, dev] for role, dev in (('server', 'softnic0'),
                                                         ('client', 'softnic1'))},
              tmp_path, env)


@pytest.mark.parametrize('mtu', [e.IBV_MTU_256, e.IBV_MTU_512, e.IBV_MTU_1024, e.IBV_MTU_2048,
                                 e.IBV_MTU_4096])
def test_every_path_mtu_with_1mib_messages(mtu):
    """1 MiB WRITE, READ back, and a SEND, at each path MTU: byte for byte."""
    size = 1 << 20
    a, b = Side('softnic0', msg_size=2 * size), Side('softnic1', msg_size=2 * size)
    try:
        connect(a, b, mtu=mtu, timeout=14)
        data = os.urandom(size)
        a.mr.write(data, size)
        wr = _signaled(1, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, size, a.mr.lkey))
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
        a.qp.post_send(wr)
        _ok(poll(a.cq, timeout=60)[0], e.IBV_WC_RDMA_WRITE)
        assert b.mr.read(size, 0) == data
        wr = _signaled(2, e.IBV_WR_RDMA_READ, SGE(a.mr.buf + size, size, a.mr.lkey))
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
        a.qp.post_send(wr)
        _ok(poll(a.cq, timeout=60)[0], e.IBV_WC_RDMA_READ)
        assert a.mr.read(size, size) == data
        b.qp.post_recv(RecvWR(7, 1, [SGE(b.mr.buf + size, size, b.mr.lkey)]))
        a.qp.post_send(_signaled(3, e.IBV_WR_SEND, SGE(a.mr.buf, size, a.mr.lkey)))
        _ok(poll(a.cq, timeout=60)[0], e.IBV_WC_SEND)
        wc = poll(b.cq, timeout=60)[0]
        _ok(wc, e.IBV_WC_RECV)
        assert wc.byte_len == size and b.mr.read(size, size) == data
    finally:
        a.close()
        b.close()


def test_1mib_messages_over_tcp(transport):
    """1 MiB WRITE, READ back and SEND over iWARP (MPA segments of 16 KiB)."""
    if transport != 'tcp':
        return                                 # the UDP transport: every path MTU above
    size = 1 << 20
    a, b = Side('softnic0', msg_size=2 * size), Side('softnic1', msg_size=2 * size)
    try:
        assert _iwarp(a) and _iwarp(b)
        connect(a, b)
        data = os.urandom(size)
        a.mr.write(data, size)
        wr = _signaled(1, e.IBV_WR_RDMA_WRITE, SGE(a.mr.buf, size, a.mr.lkey))
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
        a.qp.post_send(wr)
        wr = _signaled(2, e.IBV_WR_RDMA_READ, SGE(a.mr.buf + size, size, a.mr.lkey))
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
        a.qp.post_send(wr)                     # TCP keeps order: the READ sees the WRITE
        b.qp.post_recv(RecvWR(7, 1, [SGE(b.mr.buf + size, size, b.mr.lkey)]))
        a.qp.post_send(_signaled(3, e.IBV_WR_SEND, SGE(a.mr.buf, size, a.mr.lkey)))
        wcs = poll(a.cq, 3, timeout=60)
        assert [(w.wr_id, w.status) for w in wcs] == [(1, 0), (2, 0), (3, 0)]
        assert a.mr.read(size, size) == data
        wc = poll(b.cq, timeout=60)[0]
        _ok(wc, e.IBV_WC_RECV)
        assert wc.byte_len == size and b.mr.read(size, size) == data
    finally:
        a.close()
        b.close()


def test_flush_through_the_new_post_send_api(pair):
    """QPEx.wr_flush (pyverbs' signature, rdma-core's test_qp_ex_rc_flush): after an RDMA
    WRITE, a FLUSH of its range and one of the whole region complete as IBV_WC_FLUSH; a
    persistent FLUSH of memory without FLUSH_PERSISTENT is a remote access error
    (test_qp_ex_rc_flush_type_violate), and no MR may ask for FLUSH_PERSISTENT (no
    persistent memory: EINVAL, as rxe over ordinary pages)."""
    a, b = pair
    if _iwarp(a):
        init = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=a.cq, rcq=a.cq, cap=QPCap(8, 8),
                            pd=a.pd, comp_mask=e.IBV_QP_INIT_ATTR_PD |
                            e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                            send_ops_flags=e.IBV_QP_EX_WITH_FLUSH)
        qp = QPEx(a.ctx, init, QPAttr())
        qp.wr_start()
        qp.wr_flush(b.mr.rkey, b.mr.buf, 8, e.IBV_FLUSH_GLOBAL, e.IBV_FLUSH_RANGE)
        _rejected(qp.wr_complete)                       # RoCE's, not iWARP's
        return
    with pytest.raises(PyverbsRDMAError) as ex:
        MR(b.pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_FLUSH_PERSISTENT)
    assert ex.value.error_code == errno.EINVAL
    target = MR(b.pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                e.IBV_ACCESS_FLUSH_GLOBAL)
    init = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=a.cq, rcq=a.cq, cap=QPCap(8, 8), pd=a.pd,
                        comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                        send_ops_flags=e.IBV_QP_EX_WITH_FLUSH | e.IBV_QP_EX_WITH_RDMA_WRITE)
    qp = QPEx(a.ctx, init, QPAttr())
    flush_access = e.IBV_ACCESS_FLUSH_GLOBAL | e.IBV_ACCESS_FLUSH_PERSISTENT
    connect(a, b, qp_a=qp)
    attr = QPAttr()
    attr.qp_access_flags = REMOTE_ACCESS | flush_access     # RTS to RTS: FLUSH allowed
    b.qp.modify(attr, e.IBV_QP_ACCESS_FLAGS)
    a.mr.write(b'flushed!', 8)
    steps = [(1, e.IBV_FLUSH_GLOBAL, e.IBV_FLUSH_RANGE, 8),
             (2, e.IBV_FLUSH_GLOBAL, e.IBV_FLUSH_MR, 12_345_678)]
    qp.wr_start()
    qp.wr_id, qp.wr_flags = 0, e.IBV_SEND_SIGNALED
    qp.wr_rdma_write(target.rkey, target.buf)
    qp.wr_set_sge(SGE(a.mr.buf, 8, a.mr.lkey))
    for wr_id, ptype, level, length in steps:
        qp.wr_id = wr_id
        qp.wr_flush(target.rkey, target.buf, length, ptype, level)
    qp.wr_complete()
    wcs = poll(a.cq, 3)
    assert [(w.wr_id, w.status, w.opcode) for w in wcs] == [
        (0, e.IBV_WC_SUCCESS, e.IBV_WC_RDMA_WRITE), (1, e.IBV_WC_SUCCESS, e.IBV_WC_FLUSH),
        (2, e.IBV_WC_SUCCESS, e.IBV_WC_FLUSH)]
    assert target.read(8, 0) == b'flushed!'
    qp.wr_start()
    qp.wr_id = 3
    qp.wr_flush(target.rkey, target.buf, 8, e.IBV_FLUSH_PERSISTENT, e.IBV_FLUSH_RANGE)
    qp.wr_complete()
    assert poll(a.cq)[0].status == e.IBV_WC_REM_ACCESS_ERR
    target.close()
