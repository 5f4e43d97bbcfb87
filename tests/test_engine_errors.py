"""RC error paths: retry exhaustion, RNR, protection errors and flushing.

Every test drives two engine devices through the seeded virtual-time fabric
and checks what went on the wire (the fabric trace), the work completions on
both sides, the QP states, and that memory the peer must not reach is
byte-for-byte what it was before.
"""

from __future__ import annotations

import errno

import pytest

from softnic.core.completer import RTO_BACKOFF_MAX
from softnic.core.enums import Access, QPState, SendFlags, WCOpcode, WCStatus, WROpcode as W
from softnic.core.errors import VerbsError
from softnic.core.qp import RecvWR, SendWR
from softnic.driver.faults import FaultModel
from softnic.experiments.rig import ALL_ACCESS
from softnic.wire.icrc import append_icrc
from softnic.wire.roce import AethCode, Kind, NakCode, Opcode as O, encode

from enginekit import A_IP, B_IP, fill, pair, pattern, read, read_wr, send_wr, write_wr

RTO = 4.096e-6 * 2 ** 10          # timeout=10, the enginekit default (above the 1 ms floor)


def backoff(k: int) -> float:
    """When the ``k``-th of a row of timeouts without progress fires, from the
    first send: the RTO doubles each time, up to 2**RTO_BACKOFF_MAX times."""
    return sum(RTO * 2 ** min(j, RTO_BACKOFF_MAX) for j in range(k))


CUT = FaultModel(loss=1.0)
S = WCStatus


def naks(p, dev):
    """(PSN, syndrome code, value) of every ACK/NAK ``dev`` sent that is not a plain ACK."""
    return [(pkt.bth.psn, pkt.aeth.code, pkt.aeth.value) for _, pkt in p.packets("send", dev)
            if pkt.info.kind == Kind.ACK and pkt.aeth.code != AethCode.ACK]


def statuses(wcs):
    return [(w.wr_id, w.status) for w in wcs]


def requests_since(p, t, dev=None):
    """PSNs of the requests ``dev`` (A) sent from virtual time ``t`` on, in order."""
    return [pkt.bth.psn for when, pkt in p.packets("send", dev or p.a)
            if when >= t and pkt.info.is_request]


ACK = (AethCode.ACK << 5) | 0x1F
SEQ_NAK = (AethCode.NAK << 5) | NakCode.PSN_SEQUENCE_ERROR
RNR_NAK = (AethCode.RNR_NAK << 5) | 1                     # RNR timer code 1 (the 1 ms floor)


def respond(p, psn: int, syndrome: int, msn: int = 0) -> None:
    """Hand A a response from B's address, as B's responder would send it."""
    pkt = encode(O.RC_ACKNOWLEDGE, dest_qp=p.ea.qp.qpn, psn=psn, aeth=(syndrome, msn))
    p.a.receive_datagram(bytes(append_icrc(pkt, B_IP, A_IP, p.b.port, p.a.port)), p.b.address,
                         p.fabric.now)


def warm_up(p):
    """One WRITE through, so the failure under test is not a set-up problem."""
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, 64, 0))
    p.run_until(lambda: len(p.send_wcs()) == 1)
    assert p.send_wcs()[0].status == S.SUCCESS
    del p.send_wcs()[:]


# ------------------------------------------------------------------ transport retry


@pytest.mark.parametrize("retry_cnt", [0, 1, 3, 6, 7])
@pytest.mark.parametrize("direction", ["both", "a->b", "b->a"])
def test_link_cut_exhausts_retry_cnt_then_flushes(retry_cnt, direction):
    p = pair(seed=retry_cnt, retry_cnt=retry_cnt)
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    warm_up(p)
    if direction == "b->a":
        p.fabric.set_link(b.address, a.address, CUT, both_directions=False)
    else:
        p.fabric.set_link(a.address, b.address, CUT, both_directions=direction == "both")
    b.post_recv(eb.qp, RecvWR(77, [eb.sge(8192, 4096)]))
    t0 = p.fabric.now
    wrs = [write_wr(10, ea, eb, 0, 3000, 0),                # three packets at MTU 1024
           send_wr(11, ea, 0, 100),
           read_wr(12, ea, eb, 4096, 2000, 4096),
           write_wr(13, ea, eb, 0, 10, 0, flags=0),         # unsignaled: flushed all the same
           SendWR(14, W.ATOMIC_FETCH_AND_ADD, [ea.sge(16384, 8)], SendFlags.SIGNALED,
                  remote_addr=eb.buf.addr + 16384, rkey=eb.mr.rkey, compare_add=1)]
    for wr in wrs:
        a.post_send(ea.qp, wr)
    p.run(max_events=20_000)               # idle: nothing left to do once the QP failed

    wcs = p.send_wcs()
    assert statuses(wcs) == [(10, S.RETRY_EXC_ERR)] + [(i, S.WR_FLUSH_ERR) for i in range(11, 15)]
    assert [w.opcode for w in wcs] == [WCOpcode.RDMA_WRITE, WCOpcode.SEND, WCOpcode.RDMA_READ,
                                       WCOpcode.RDMA_WRITE, WCOpcode.FETCH_ADD]
    assert ea.qp.state == QPState.ERR
    assert a.counters["retry_exceeded_err"] == 1
    # retry_cnt retransmission timeouts, then the one that gives up
    assert a.counters["timeouts"] == retry_cnt + 1
    first_psn = next(pkt.bth.psn for t, pkt in p.packets("send", a) if t >= t0)
    sends_of_first = [t for t, pkt in p.packets("send", a)
                      if t >= t0 and pkt.bth.psn == first_psn and pkt.info.is_request]
    assert len(sends_of_first) == retry_cnt + 1
    for i, t in enumerate(sends_of_first):
        assert t == pytest.approx(t0 + backoff(i), abs=1e-9)
    assert p.fabric.now == pytest.approx(t0 + backoff(retry_cnt + 1), abs=1e-9)
    # the responder heard nothing wrong: it stays usable
    assert eb.qp.state == QPState.RTS
    assert a.get_timer() is None


def test_retry_cnt_7_is_seven_retries_and_the_seventh_may_still_succeed():
    """7 is a count, not infinity (IBA, mlx5; ibv_modify_qp(3) gives an infinite
    value to rnr_retry only): the link back just before the 7th retry leaves,
    that retry goes through."""
    p = pair(retry_cnt=7)
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    warm_up(p)
    p.fabric.set_link(a.address, b.address, CUT)
    data = pattern(3000, 5)
    fill(ea, 0, data)
    t0 = p.fabric.now
    a.post_send(ea.qp, write_wr(10, ea, eb, 0, 3000, 1000))
    p.fabric.run(until=t0 + backoff(7) - RTO / 2)
    assert p.send_wcs() == [] and ea.qp.state == QPState.RTS
    assert a.counters["timeouts"] == 6
    p.fabric.set_link(a.address, b.address, FaultModel.none())
    p.run_until(lambda: p.send_wcs())
    assert statuses(p.send_wcs()) == [(10, S.SUCCESS)]
    assert read(eb, 1000, 3000) == data
    first = requests_since(p, t0)[0]
    assert requests_since(p, t0).count(first) == 8          # the first sending and 7 retries
    assert a.counters["timeouts"] == 7
    assert a.counters["retry_exceeded_err"] == 0


def test_lost_packets_within_retry_budget_are_recovered():
    """retry_cnt=1 tolerates one loss of the same packet, not two."""
    lost = []

    def drop_first_write(pkt, raw):
        if pkt.info.kind == Kind.WRITE and pkt.bth.psn == 5 and len(lost) < 1:
            lost.append(pkt)
            return True
        return False

    p = pair(retry_cnt=1, drop_a=drop_first_write, psn_a=5)
    fill(p.ea, 0, pattern(100, 1))
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, 100, 0))
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS)]
    assert p.a.counters["timeouts"] == 1
    assert read(p.eb, 0, 100) == pattern(100, 1)


# ------------------------------------------------------------------ what a response acknowledges
#
# Requests from A are lost (the link A -> B cut); B's responses are handed to A
# by ``respond``, so each case names exactly the PSN a response carries.


def _silent_pair(**kw):
    p = pair(psn_a=100, **kw)
    p.fabric.set_link(p.a.address, p.b.address, CUT, both_directions=False)
    return p


def test_sequence_nak_acknowledges_every_psn_before_it():
    """A NAK naming PSN n acknowledges every PSN before n: the WRs it covers
    complete, and a later timeout resends from n, not from the oldest PSN sent."""
    p = _silent_pair()
    a, ea, eb = p.a, p.ea, p.eb
    a.post_send(ea.qp, write_wr(1, ea, eb, 0, 100, 0))                  # PSN 100
    a.post_send(ea.qp, write_wr(2, ea, eb, 0, 4000, 0))                 # PSNs 101..104
    p.fabric.run(until=p.fabric.now + RTO / 4)
    assert requests_since(p, 0) == [100, 101, 102, 103, 104]
    t1 = p.fabric.now
    respond(p, 103, SEQ_NAK)
    p.fabric.run(until=t1 + RTO / 4)
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS)]                   # acknowledged by the NAK
    assert requests_since(p, t1) == [103, 104]                           # go back to the NAK's PSN
    p.fabric.run(until=t1 + RTO + RTO / 4)                               # then the timer fires
    assert a.counters["timeouts"] == 1
    assert requests_since(p, t1) == [103, 104, 103, 104]                 # from 103, not 101
    respond(p, 104, ACK)
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS), (2, S.SUCCESS)]
    assert ea.qp.state == QPState.RTS


def test_rnr_nak_acknowledges_every_psn_before_it():
    """An RNR NAK on a WRITE with immediate's LAST packet: after the RNR timer only
    that packet is resent, and a timeout after it resends from it too."""
    p = _silent_pair(rnr_retry=3)
    a, ea, eb = p.a, p.ea, p.eb
    a.post_send(ea.qp, write_wr(1, ea, eb, 0, 2500, 0, opcode=W.RDMA_WRITE_WITH_IMM,
                                imm_data=5))                           # PSNs 100..102
    p.fabric.run(until=p.fabric.now + RTO / 4)
    t1 = p.fabric.now
    respond(p, 102, RNR_NAK)
    p.fabric.run(until=t1 + RTO / 4)
    assert requests_since(p, t1) == [102]                                # after the RNR timer
    p.fabric.run(until=t1 + RTO + RTO / 2)
    assert a.counters["timeouts"] == 1
    assert requests_since(p, t1) == [102, 102]                           # from 102, not 100
    respond(p, 102, ACK)
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS)]


@pytest.mark.parametrize("response", ["ack", "sequence_nak", "rnr_nak"])
def test_forward_progress_starts_the_retry_count_again(response):
    """retry_cnt counts retries since the last forward progress: a response that
    acknowledges new PSNs (an ACK, or a NAK naming a later PSN) gives the
    remaining PSNs retry_cnt retries of their own."""
    p = _silent_pair(retry_cnt=1, rnr_retry=7)
    a, ea, eb = p.a, p.ea, p.eb
    a.post_send(ea.qp, write_wr(1, ea, eb, 0, 4000, 0))                 # PSNs 100..103
    t0 = p.fabric.now
    p.fabric.run(until=t0 + RTO + RTO / 4)                               # the one retry
    assert a.counters["timeouts"] == 1
    assert requests_since(p, t0) == [100, 101, 102, 103] * 2
    t1 = p.fabric.now
    if response == "ack":
        respond(p, 101, ACK)
    else:
        respond(p, 102, SEQ_NAK if response == "sequence_nak" else RNR_NAK)
    p.run()
    # a retry of its own for 102 and 103, then the timeout that gives up
    assert a.counters["timeouts"] == 3
    assert a.counters["retry_exceeded_err"] == 1
    resent = requests_since(p, t1)
    assert resent == [102, 103] * (1 if response == "ack" else 2)
    assert statuses(p.send_wcs()) == [(1, S.RETRY_EXC_ERR)]
    assert ea.qp.state == QPState.ERR


def test_rnr_nak_that_acknowledges_new_psns_starts_a_new_rnr_series():
    """rnr_retry=1: one RNR retry per PSN.  An RNR NAK for the second SEND also
    acknowledges the first, so the second SEND has its own retry."""
    p = _silent_pair(rnr_retry=1)
    a, ea = p.a, p.ea
    a.post_send(ea.qp, send_wr(1, ea, 0, 10))                           # PSN 100
    a.post_send(ea.qp, send_wr(2, ea, 0, 10))                           # PSN 101
    p.fabric.run(until=p.fabric.now + RTO / 4)
    respond(p, 100, RNR_NAK)
    p.fabric.run(until=p.fabric.now + RTO / 4)
    t1 = p.fabric.now
    respond(p, 101, RNR_NAK)
    p.fabric.run(until=t1 + RTO / 4)
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS)]
    assert ea.qp.state == QPState.RTS
    assert requests_since(p, t1) == [101]                                # its own RNR retry
    respond(p, 101, RNR_NAK)
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS), (2, S.RNR_RETRY_EXC_ERR)]
    assert a.counters["rcvd_rnr_err"] == 3
    assert a.counters["retry_rnr_exceeded_err"] == 1
    assert ea.qp.state == QPState.ERR


@pytest.mark.parametrize("retry_cnt", [0, 7])
def test_selective_repeat_exhausts_retry_cnt_too(retry_cnt):
    """Selective repeat's timeouts count against retry_cnt as go-back-N's do (its
    loss probes do not); 7 ends as well."""
    from softnic.core.device import DeviceConfig
    p = pair(retry_cnt=retry_cnt, config=DeviceConfig(min_timer=1e-3, selective_repeat=True))
    a, ea, eb = p.a, p.ea, p.eb
    warm_up(p)
    p.fabric.set_link(a.address, p.b.address, CUT)
    a.post_send(ea.qp, write_wr(10, ea, eb, 0, 3000, 0))
    a.post_send(ea.qp, send_wr(11, ea, 0, 10))
    p.run(max_events=20_000)
    assert statuses(p.send_wcs()) == [(10, S.RETRY_EXC_ERR), (11, S.WR_FLUSH_ERR)]
    assert a.counters["timeouts"] == retry_cnt + 1
    assert a.counters["retry_exceeded_err"] == 1
    assert ea.qp.state == QPState.ERR


# ------------------------------------------------------------------ RNR


@pytest.mark.parametrize("op", [W.SEND, W.RDMA_WRITE_WITH_IMM])
@pytest.mark.parametrize("rnr_retry", [0, 1, 4, 6])
def test_no_receive_posted_exhausts_rnr_retry(rnr_retry, op):
    p = pair(rnr_retry=rnr_retry)
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    fill(ea, 0, pattern(100, 1))
    if op == W.SEND:
        a.post_send(ea.qp, send_wr(1, ea, 0, 100))
    else:                                  # the immediate needs a receive: RNR before any byte
        a.post_send(ea.qp, write_wr(1, ea, eb, 0, 100, 500, opcode=op, imm_data=1))
    a.post_send(ea.qp, write_wr(2, ea, eb, 0, 100, 0))
    snapshot = read(eb, 0, eb.buf.length)
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.RNR_RETRY_EXC_ERR), (2, S.WR_FLUSH_ERR)]
    assert a.counters["rcvd_rnr_err"] == rnr_retry + 1
    assert b.counters["send_rnr_err"] == rnr_retry + 1
    assert a.counters["retry_rnr_exceeded_err"] == 1
    rnr = [n for n in naks(p, b) if n[1] == AethCode.RNR_NAK]
    assert len(rnr) == rnr_retry + 1
    assert all(n[2] == 1 for n in rnr)                    # min_rnr_timer code from the rig
    sends = [pkt for _, pkt in p.packets("send", a) if pkt.bth.psn == wr_psn(p)]
    assert len(sends) == rnr_retry + 1
    assert ea.qp.state == QPState.ERR
    assert eb.qp.state == QPState.RTS
    assert read(eb, 0, eb.buf.length) == snapshot        # the WRITE behind it never ran


@pytest.mark.parametrize("op", [W.SEND_WITH_IMM, W.RDMA_WRITE_WITH_IMM])
def test_receive_posted_before_rnr_retries_run_out_lets_the_send_succeed(op):
    p = pair(rnr_retry=3)
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    data = pattern(2500, 9)
    fill(ea, 0, data)
    if op == W.SEND_WITH_IMM:
        a.post_send(ea.qp, send_wr(1, ea, 0, 2500, opcode=op, imm_data=0xABCD))
    else:                                  # three packets; the RNR comes on the last one
        a.post_send(ea.qp, write_wr(1, ea, eb, 0, 2500, 4096, opcode=op, imm_data=0xABCD))
    p.run_until(lambda: b.counters["send_rnr_err"] == 2)
    assert a.counters["rcvd_rnr_err"] <= 2
    b.post_recv(eb.qp, RecvWR(50, [eb.sge(4096, 4096)]))
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS)]
    (wc,) = p.recv_wcs()
    assert (wc.wr_id, wc.status, wc.byte_len, wc.imm_data) == (50, S.SUCCESS, 2500, 0xABCD)
    assert wc.opcode == (WCOpcode.RECV if op == W.SEND_WITH_IMM else WCOpcode.RECV_RDMA_WITH_IMM)
    assert read(eb, 4096, 2500) == data
    assert a.counters["rcvd_rnr_err"] == 2
    assert a.counters["retry_rnr_exceeded_err"] == 0


def test_rnr_retry_7_waits_forever_even_with_a_finite_retry_cnt():
    """RNR NAKs are responses: they must not count against retry_cnt."""
    p = pair(rnr_retry=7, retry_cnt=1)
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    a.post_send(ea.qp, send_wr(1, ea, 0, 100))
    p.fabric.run(until=p.fabric.now + 20 * RTO)
    assert p.send_wcs() == []
    assert ea.qp.state == QPState.RTS
    assert a.counters["rcvd_rnr_err"] > 20
    b.post_recv(eb.qp, RecvWR(50, [eb.sge(0, 4096)]))
    p.run_until(lambda: p.send_wcs())
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS)]
    assert [w.status for w in p.recv_wcs()] == [S.SUCCESS]


def test_rnr_wait_honours_the_rnr_timer():
    """The requester resends no earlier than the RNR NAK's timer says."""
    from softnic.core.enums import RNR_TIMER_SECONDS
    p = pair(rnr_retry=2, min_rnr_timer=20)
    a = p.a
    a.post_send(p.ea.qp, send_wr(1, p.ea, 0, 10))
    p.run()
    sends = [t for t, pkt in p.packets("send", a) if pkt.info.kind == Kind.SEND]
    gaps = [t1 - t0 for t0, t1 in zip(sends, sends[1:])]
    assert len(gaps) == 2
    assert all(g >= RNR_TIMER_SECONDS[20] for g in gaps)


# ------------------------------------------------------------------ protection


def _mr(dev, ep, offset, length, access):
    return dev.reg_mr(ep.pd, ep.buf.addr + offset, length, access)


NO_RW = Access.LOCAL_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
NO_RR = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC
NO_RA = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ


def _bad_wr(case, p):
    """The WR that must fail, for each protection case.  Returns (wr, nak, status)."""
    ea, eb, b = p.ea, p.eb, p.b
    size = eb.buf.length
    acc, inv = NakCode.REMOTE_ACCESS_ERROR, NakCode.INVALID_REQUEST
    RA, RI = S.REM_ACCESS_ERR, S.REM_INV_REQ_ERR
    bogus = eb.mr.rkey ^ 0x5A5A00
    fadd = lambda rkey, roff: SendWR(1, W.ATOMIC_FETCH_AND_ADD, [ea.sge(0, 8)],  # noqa: E731
                                     SendFlags.SIGNALED, remote_addr=eb.buf.addr + roff,
                                     rkey=rkey, compare_add=5)
    if case == "write_bad_rkey":
        return write_wr(1, ea, eb, 0, 100, 0, rkey=bogus), acc, RA
    if case == "read_bad_rkey":
        return read_wr(1, ea, eb, 0, 100, 0, rkey=bogus), acc, RA
    if case == "atomic_bad_rkey":
        return fadd(bogus, 0), acc, RA
    if case == "write_out_of_bounds":
        return write_wr(1, ea, eb, 0, 3000, size - 2000), acc, RA
    if case == "write_before_start":
        mr = _mr(b, eb, 4096, 4096, ALL_ACCESS)
        return write_wr(1, ea, eb, 0, 100, 4000, rkey=mr.rkey), acc, RA
    if case == "read_out_of_bounds":
        mr = _mr(b, eb, 4096, 4096, ALL_ACCESS)
        return read_wr(1, ea, eb, 0, 200, 8100, rkey=mr.rkey), acc, RA
    if case == "atomic_out_of_bounds":
        mr = _mr(b, eb, 4096, 4096, ALL_ACCESS)
        return fadd(mr.rkey, 8192), acc, RA
    if case == "mr_without_remote_write":
        mr = _mr(b, eb, 0, 8192, NO_RW)
        return write_wr(1, ea, eb, 0, 100, 0, rkey=mr.rkey), acc, RA
    if case == "mr_without_remote_read":
        mr = _mr(b, eb, 0, 8192, NO_RR)
        return read_wr(1, ea, eb, 0, 100, 0, rkey=mr.rkey), acc, RA
    if case == "mr_without_remote_atomic":
        mr = _mr(b, eb, 0, 8192, NO_RA)
        return fadd(mr.rkey, 0), acc, RA
    if case == "rkey_of_another_pd":
        other = b.alloc_pd()
        mr = b.reg_mr(other, eb.buf.addr, 8192, ALL_ACCESS)
        return write_wr(1, ea, eb, 0, 100, 0, rkey=mr.rkey), acc, RA
    if case == "deregistered_mr":
        mr = _mr(b, eb, 0, 8192, ALL_ACCESS)
        b.dereg_mr(mr)
        return write_wr(1, ea, eb, 0, 100, 0, rkey=mr.rkey), acc, RA
    if case == "qp_without_remote_write":
        return write_wr(1, ea, eb, 0, 100, 0), inv, RI
    if case == "qp_without_remote_read":
        return read_wr(1, ea, eb, 0, 100, 0), inv, RI
    if case == "qp_without_remote_atomic":
        return fadd(eb.mr.rkey, 0), inv, RI
    raise AssertionError(case)


_QP_ACCESS = {"qp_without_remote_write": Access.REMOTE_READ | Access.REMOTE_ATOMIC,
              "qp_without_remote_read": Access.REMOTE_WRITE | Access.REMOTE_ATOMIC,
              "qp_without_remote_atomic": Access.REMOTE_WRITE | Access.REMOTE_READ}

PROTECTION_CASES = ["write_bad_rkey", "read_bad_rkey", "atomic_bad_rkey", "write_out_of_bounds",
                    "write_before_start", "read_out_of_bounds", "atomic_out_of_bounds",
                    "mr_without_remote_write", "mr_without_remote_read",
                    "mr_without_remote_atomic", "rkey_of_another_pd", "deregistered_mr",
                    "qp_without_remote_write", "qp_without_remote_read",
                    "qp_without_remote_atomic"]


@pytest.mark.parametrize("case", PROTECTION_CASES)
def test_protection_error_naks_and_leaves_memory_untouched(case):
    kw = {}
    if case in _QP_ACCESS:
        kw["qp_access"] = _QP_ACCESS[case]
    p = pair(**kw)
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    fill(eb, 0, pattern(eb.buf.length, 3))
    fill(ea, 0, pattern(ea.buf.length, 4))
    wr, nak, status = _bad_wr(case, p)
    b.post_recv(eb.qp, RecvWR(90, [eb.sge(32768, 4096)]))
    b.post_recv(eb.qp, RecvWR(91, [eb.sge(36864, 4096)]))
    snap_b, snap_a = read(eb, 0, eb.buf.length), read(ea, 0, ea.buf.length)
    a.post_send(ea.qp, wr)
    a.post_send(ea.qp, write_wr(2, ea, eb, 0, 500, 100))      # would change B's memory
    a.post_send(ea.qp, send_wr(3, ea, 0, 100))                # would consume a receive
    a.post_send(ea.qp, read_wr(4, ea, eb, 1000, 100, 0))      # would change A's memory
    p.run()
    assert statuses(p.send_wcs()) == [(1, status), (2, S.WR_FLUSH_ERR), (3, S.WR_FLUSH_ERR),
                                      (4, S.WR_FLUSH_ERR)]
    assert naks(p, b) == [(wr_psn(p), AethCode.NAK, nak)]
    assert ea.qp.state == QPState.ERR
    assert eb.qp.state == QPState.ERR
    assert statuses(p.recv_wcs()) == [(90, S.WR_FLUSH_ERR), (91, S.WR_FLUSH_ERR)]
    assert read(eb, 0, eb.buf.length) == snap_b
    assert read(ea, 0, ea.buf.length) == snap_a
    # an ERR QP flushes what is posted later, on both sides
    a.post_send(ea.qp, send_wr(5, ea, 0, 10))
    b.post_recv(eb.qp, RecvWR(92, [eb.sge(0, 16)]))
    assert statuses(p.send_wcs())[-1] == (5, S.WR_FLUSH_ERR)
    assert statuses(p.recv_wcs())[-1] == (92, S.WR_FLUSH_ERR)


def wr_psn(p):
    """PSN of the first request A sent."""
    return next(pkt.bth.psn for _, pkt in p.packets("send", p.a) if pkt.info.is_request)


@pytest.mark.parametrize("case", ["unknown_lkey", "lkey_of_another_pd", "sge_out_of_bounds",
                                  "read_into_mr_without_local_write", "second_sge_bad"])
def test_bad_lkey_fails_locally_and_sends_nothing(case):
    p = pair()
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    fill(eb, 0, pattern(eb.buf.length, 1))
    snap_b = read(eb, 0, eb.buf.length)
    if case == "unknown_lkey":
        wr = SendWR(1, W.RDMA_WRITE, [(ea.buf.addr, 100, ea.mr.lkey ^ 0x7700)],
                    SendFlags.SIGNALED, remote_addr=eb.buf.addr, rkey=eb.mr.rkey)
    elif case == "lkey_of_another_pd":
        mr = a.reg_mr(a.alloc_pd(), ea.buf.addr, 4096, ALL_ACCESS)
        wr = SendWR(1, W.SEND, [(ea.buf.addr, 100, mr.lkey)], SendFlags.SIGNALED)
    elif case == "sge_out_of_bounds":
        mr = a.reg_mr(ea.pd, ea.buf.addr, 4096, ALL_ACCESS)
        wr = SendWR(1, W.SEND, [(ea.buf.addr + 4000, 200, mr.lkey)], SendFlags.SIGNALED)
    elif case == "read_into_mr_without_local_write":
        mr = a.reg_mr(ea.pd, ea.buf.addr, 4096, Access.REMOTE_READ)
        wr = SendWR(1, W.RDMA_READ, [(ea.buf.addr, 100, mr.lkey)], SendFlags.SIGNALED,
                    remote_addr=eb.buf.addr, rkey=eb.mr.rkey)
    else:
        wr = SendWR(1, W.RDMA_WRITE, [ea.sge(0, 10), (ea.buf.addr + 64, 10, 0xDEAD00)],
                    SendFlags.SIGNALED, remote_addr=eb.buf.addr, rkey=eb.mr.rkey)
    snap_a = read(ea, 0, ea.buf.length)
    a.post_send(ea.qp, wr)
    a.post_send(ea.qp, write_wr(2, ea, eb, 0, 100, 0))
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.LOC_PROT_ERR), (2, S.WR_FLUSH_ERR)]
    assert p.packets("send", a) == []                      # nothing went on the wire
    assert ea.qp.state == QPState.ERR
    assert eb.qp.state == QPState.RTS
    assert read(eb, 0, eb.buf.length) == snap_b
    assert read(ea, 0, ea.buf.length) == snap_a


def test_bad_lkey_behind_good_wrs_completes_them_first():
    p = pair()
    a, ea, eb = p.a, p.ea, p.eb
    a.post_send(ea.qp, write_wr(1, ea, eb, 0, 2000, 0))
    a.post_send(ea.qp, write_wr(2, ea, eb, 0, 100, 0, flags=0))
    a.post_send(ea.qp, SendWR(3, W.SEND, [(ea.buf.addr, 10, 0xBAD00)], SendFlags.SIGNALED))
    a.post_send(ea.qp, write_wr(4, ea, eb, 0, 100, 0))
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.SUCCESS), (3, S.LOC_PROT_ERR), (4, S.WR_FLUSH_ERR)]
    writes = [pkt for _, pkt in p.packets("send", a) if pkt.info.is_request]
    assert [pkt.info.kind for pkt in writes] == [Kind.WRITE] * 3


def test_receive_buffer_too_small():
    p = pair()
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    fill(eb, 0, pattern(eb.buf.length, 8))
    b.post_recv(eb.qp, RecvWR(40, [eb.sge(0, 100)]))
    b.post_recv(eb.qp, RecvWR(41, [eb.sge(4096, 4096)]))
    snap = read(eb, 0, eb.buf.length)
    a.post_send(ea.qp, send_wr(1, ea, 0, 101))
    a.post_send(ea.qp, send_wr(2, ea, 0, 50))
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.REM_INV_REQ_ERR), (2, S.WR_FLUSH_ERR)]
    assert statuses(p.recv_wcs()) == [(40, S.LOC_LEN_ERR), (41, S.WR_FLUSH_ERR)]
    assert naks(p, b) == [(wr_psn(p), AethCode.NAK, NakCode.INVALID_REQUEST)]
    assert ea.qp.state == eb.qp.state == QPState.ERR
    assert read(eb, 0, eb.buf.length) == snap


def test_receive_with_bad_lkey_is_a_remote_operational_error():
    p = pair()
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    b.post_recv(eb.qp, RecvWR(40, [(eb.buf.addr, 100, eb.mr.lkey ^ 0x1100)]))
    a.post_send(ea.qp, send_wr(1, ea, 0, 50))
    p.run()
    assert statuses(p.send_wcs()) == [(1, S.REM_OP_ERR)]
    assert statuses(p.recv_wcs()) == [(40, S.LOC_PROT_ERR)]
    assert naks(p, b) == [(wr_psn(p), AethCode.NAK, NakCode.REMOTE_OPERATIONAL_ERROR)]
    assert ea.qp.state == eb.qp.state == QPState.ERR


@pytest.mark.parametrize("opcode", [W.ATOMIC_FETCH_AND_ADD, W.ATOMIC_CMP_AND_SWP])
@pytest.mark.parametrize("misalign", [1, 4, 7])
def test_misaligned_atomic_is_refused_at_post_time(opcode, misalign):
    p = pair()
    wr = SendWR(1, opcode, [p.ea.sge(0, 8)], SendFlags.SIGNALED,
                remote_addr=p.eb.buf.addr + misalign, rkey=p.eb.mr.rkey)
    with pytest.raises(VerbsError) as e:
        p.a.post_send(p.ea.qp, wr)
    assert e.value.errno == errno.EINVAL
    p.run()
    assert p.packets("send") == [] and p.send_wcs() == []


@pytest.mark.parametrize("opcode", [O.RC_FETCH_ADD, O.RC_COMPARE_SWAP])
def test_injected_misaligned_atomic_gets_invalid_request_nak(opcode):
    p = pair()
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    fill(eb, 0, pattern(eb.buf.length, 6))
    b.post_recv(eb.qp, RecvWR(40, [eb.sge(0, 64)]))
    snap = read(eb, 0, eb.buf.length)
    epsn = b.query_qp(eb.qp)[0].rq_psn
    pkt = encode(opcode, dest_qp=eb.qp.qpn, psn=epsn, ackreq=True,
                 atomiceth=(eb.buf.addr + 4, eb.mr.rkey, 1, int.from_bytes(snap[4:12], "little")))
    b.receive_datagram(bytes(append_icrc(pkt, A_IP, B_IP, a.port, b.port)), a.address,
                       p.fabric.now)
    p.run()
    assert naks(p, b) == [(epsn, AethCode.NAK, NakCode.INVALID_REQUEST)]
    assert read(eb, 0, eb.buf.length) == snap
    assert eb.qp.state == QPState.ERR
    assert statuses(p.recv_wcs()) == [(40, S.WR_FLUSH_ERR)]
    # an aligned one built the same way is accepted: the packet itself is well formed
    q = pair()
    epsn = q.b.query_qp(q.eb.qp)[0].rq_psn
    pkt = encode(O.RC_FETCH_ADD, dest_qp=q.eb.qp.qpn, psn=epsn, ackreq=True,
                 atomiceth=(q.eb.buf.addr + 8, q.eb.mr.rkey, 1, 0))
    q.b.receive_datagram(bytes(append_icrc(pkt, A_IP, B_IP, q.a.port, q.b.port)), q.a.address,
                         q.fabric.now)
    q.run()
    assert naks(q, q.b) == []
    assert int.from_bytes(read(q.eb, 8, 8), "little") == 1
    assert q.eb.qp.state == QPState.RTS
