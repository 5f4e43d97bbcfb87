"""A responder's queued answers survive the consumer's teardown of the QP.

A live driver may hold the ACK of a peer's request for its caller's next call
(``softnic.driver.nic``: the inline step), so the consumer can see the receive
completion before the ACK leaves.  If that next call moves the QP to ERR (as
``rdma_disconnect`` does first) or destroys it, the ACK must still go out: the
peer's requester is waiting on it, and it would otherwise retransmit to a QP
that no longer answers until retry_cnt (librdmacm's default 7: seven retries,
as on mlx5, not rxe's for ever) runs out, and fail a SEND that succeeded.  READ
responses, which read registered memory, are dropped.  If the ACK itself is
lost on the wire, that is what happens: RETRY EXCEEDED after the retries, never
a wait for ever.

Driven by hand here: B's output is taken only after B's consumer acted, which is
the order a held ACK has on a live device.
"""

from __future__ import annotations

import pytest

from softnic.core.cq import WCStatus
from softnic.core.enums import QPAttrMask, QPState
from softnic.core.qp import QPAttr, RecvWR
from softnic.wire.roce import Kind, decode

from enginekit import pair, read_wr, send_wr


def _to_err(dev, qp):
    dev.modify_qp(qp, QPAttr(qp_state=QPState.ERR), QPAttrMask.STATE)


def _deliver(src, dst, now):
    """Every datagram ``src`` has to send, handed to ``dst``; their decoded packets."""
    pkts = []
    for data, _ in src.datagrams_to_send(now):
        pkts.append(decode(data[:-4]))
        dst.receive_datagram(data, src.address, now)
    return pkts


@pytest.mark.parametrize("teardown", ["error", "destroy"])
def test_the_ack_of_a_completed_send_leaves_after_the_qp_is_torn_down(teardown):
    p = pair()
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    b.post_recv(eb.qp, RecvWR(9, [eb.sge(0, 64)]))
    a.post_send(ea.qp, send_wr(1, ea, 0, 16))
    now = p.fabric.now
    sent = _deliver(a, b, now)
    assert [x.info.kind for x in sent] == [Kind.SEND]
    # B's consumer sees its receive complete before B's output is taken ...
    wcs = b.poll_cq(eb.recv_cq, 4)
    assert [(w.wr_id, w.status) for w in wcs] == [(9, WCStatus.SUCCESS)]
    # ... and tears its QP down at once (rdma_disconnect: to ERR; or destroys it)
    if teardown == "error":
        _to_err(b, eb.qp)
    else:
        b.destroy_qp(eb.qp)
    acks = _deliver(b, a, now)
    assert [x.info.kind for x in acks] == [Kind.ACK], acks
    assert acks[0].bth.psn == sent[0].bth.psn
    wcs = a.poll_cq(ea.send_cq, 4)
    assert [(w.wr_id, w.status) for w in wcs] == [(1, WCStatus.SUCCESS)]
    assert a.get_timer() is None or not ea.qp.sq      # nothing left to retransmit


def test_read_responses_are_not_sent_by_a_qp_in_error():
    p = pair()
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    a.post_send(ea.qp, read_wr(1, ea, eb, 0, 64, 0))
    now = p.fabric.now
    sent = _deliver(a, b, now)
    assert [x.info.kind for x in sent] == [Kind.READ_REQUEST]
    _to_err(b, eb.qp)
    assert b.datagrams_to_send(now) == []


@pytest.mark.parametrize("teardown", ["error", "destroy"])
def test_a_lost_last_ack_ends_the_peers_send_after_retry_cnt_retries(teardown):
    """The ACK itself lost (the lossy teardown case): nothing is left to answer
    the requester's retransmissions, so its SEND ends, after retry_cnt retries
    (7, librdmacm's default), with RETRY EXCEEDED and its QP in ERR, as on
    mlx5; it never waits for ever.  The program that tore down saw its receive."""
    lost = []

    def drop_the_ack(pkt, raw):
        if pkt.info.kind == Kind.ACK and not lost:
            lost.append(pkt)
            return True
        return False

    p = pair(retry_cnt=7, drop_b=drop_the_ack)
    a, b, ea, eb = p.a, p.b, p.ea, p.eb
    b.post_recv(eb.qp, RecvWR(9, [eb.sge(0, 64)]))
    a.post_send(ea.qp, send_wr(1, ea, 0, 16))
    p.run_until(lambda: p.recv_wcs())
    assert [(w.wr_id, w.status) for w in p.recv_wcs()] == [(9, WCStatus.SUCCESS)]
    if teardown == "error":
        _to_err(b, eb.qp)
    else:
        b.destroy_qp(eb.qp)
    p.run(max_events=20_000)                     # idle: no retransmission goes on
    assert len(lost) == 1
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(1, WCStatus.RETRY_EXC_ERR)]
    sends = [x for _, x in p.packets("send", a) if x.info.kind == Kind.SEND]
    assert len(sends) == 1 + 7
    assert a.counters["retry_exceeded_err"] == 1
    assert ea.qp.state == QPState.ERR
