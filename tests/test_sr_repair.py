"""Selective repeat repairs a lost resend, a lost NAK and a lost tail packet
without waiting out the retransmission timer, and reaches the same memory and
completions as a lossless run."""

from __future__ import annotations

import pytest

from softnic.core.device import DeviceConfig
from softnic.core.enums import WCStatus as S
from softnic.driver.faults import FaultModel
from softnic.wire.psn import psn_add, psn_distance
from softnic.wire.roce import AethCode, Kind

from enginekit import fill, pair, pattern, read, write_wr

MTU = 256
N = 20000                          # 79 packets of one WRITE
SR = DeviceConfig(min_timer=1e-3, selective_repeat=True)


def _drop_psn(psn_of, times):
    """Drop request packets whose offset from the first PSN is a key of ``times``,
    each as many times as its value says."""
    left = dict(times)

    def drop(pkt, raw):
        if not pkt.info.is_request:
            return False
        k = psn_of(pkt.bth.psn)
        if left.get(k, 0) > 0:
            left[k] -= 1
            return True
        return False
    return drop


def _run(drop_a=None, drop_b=None, seed=1, writes=1):
    box = {}
    p = pair(seed=seed, mtu=MTU, config=SR, drop_a=lambda pk, raw: box["a"](pk, raw),
             drop_b=lambda pk, raw: box["b"](pk, raw))
    first = p.ea.qp.req.psn
    box["a"] = drop_a(lambda psn: psn_distance(psn, first)) if drop_a else (lambda pk, raw: False)
    box["b"] = drop_b or (lambda pk, raw: False)
    data = pattern(N, seed)
    fill(p.ea, 0, data)
    for i in range(writes):
        p.a.post_send(p.ea.qp, write_wr(i + 1, p.ea, p.eb, 0, N, 0))
    p.run_until(lambda: len(p.send_wcs()) == writes, limit=5)
    t = p.fabric.now
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == \
        [(i + 1, S.SUCCESS) for i in range(writes)]
    assert read(p.eb, 0, N) == data
    return p, t


def test_lost_resend_is_resent_when_a_later_packet_arrives():
    p, t = _run(drop_a=lambda off: _drop_psn(off, {10: 2}), writes=2)
    assert p.a.counters["rexmit_lost"] >= 1
    assert p.a.counters["timeouts"] == 0
    assert t < p.a.rto(p.ea.qp)


def test_lost_nak_is_named_again():
    naks = []

    def drop_nak(pkt, raw):
        if pkt.info.kind == Kind.ACK and pkt.aeth.code == AethCode.NAK and not naks:
            naks.append(pkt)
            return True
        return False
    p, t = _run(drop_a=lambda off: _drop_psn(off, {5: 1}), drop_b=drop_nak, writes=2)
    assert naks
    assert p.a.counters["timeouts"] == 0
    assert t < p.a.rto(p.ea.qp)


def test_lost_tail_is_probed_before_the_timeout():
    p, t = _run(drop_a=lambda off: _drop_psn(off, {78: 1}))    # the LAST packet
    assert p.a.counters["loss_probes"] >= 1
    assert p.a.counters["timeouts"] == 0
    assert p.a.probe_interval(p.ea.qp) <= t < p.a.rto(p.ea.qp)


def test_lost_probe_falls_back_to_the_timeout():
    # The first probe resends the oldest unacknowledged PSN (a duplicate, whose
    # ACK is progress) and the LAST; once that resend is lost too, the second
    # probe is the LAST alone, and when it is lost the timeout resends it.
    p, t = _run(drop_a=lambda off: _drop_psn(off, {78: 3}))
    assert p.a.counters["loss_probes"] == 2
    assert p.a.counters["timeouts"] == 1


def test_no_probe_without_loss():
    p, _ = _run(writes=3)
    assert p.a.counters["loss_probes"] == 0
    assert p.a.counters["timeouts"] == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_loss_reorder_duplication_same_result(seed):
    """Under random faults the repairs reach the lossless memory and completions
    (spurious resends on reordering are duplicates the responder drops)."""
    p = pair(seed=seed, mtu=MTU, config=SR,
             faults=FaultModel(loss=0.03, duplicate=0.02, reorder=0.03, reorder_delay=30e-6),
             endpoint_args=dict(buf_size=1 << 17))
    data = pattern(3 * N, seed)
    fill(p.ea, 0, data)
    for i in range(3):
        p.a.post_send(p.ea.qp, write_wr(i + 1, p.ea, p.eb, i * N, N, 65536 + i * N))
    p.run_until(lambda: len(p.send_wcs()) == 3, limit=30)
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(i + 1, S.SUCCESS) for i in range(3)]
    assert read(p.eb, 65536, 3 * N) == data
    assert p.b.query_qp(p.eb.qp)[0].rq_psn == psn_add(p.ea.qp.attr.sq_psn, 3 * 79)


@pytest.mark.parametrize("overlap", [False, True])
def test_later_write_placed_beyond_a_hole(monkeypatch, overlap):
    """Packets of the WRITE after the one with the hole land at once, whether or
    not their target overlaps bytes still to come; where it does, the hole's
    resend skips them, so the later WRITE's bytes win as in order
    (tests/test_sr_later_wins.py has more)."""
    from softnic.core import responder
    placed = []
    real = responder.hold

    def hold(dev, qp, psn, ackreq, item):
        if type(item) is responder.PlacedWrite:
            placed.append(psn_distance(psn, p.ea.qp.attr.sq_psn))
        return real(dev, qp, psn, ackreq, item)
    monkeypatch.setattr(responder, "hold", hold)
    box = {}
    p = pair(seed=1, mtu=MTU, config=SR, drop_a=lambda pk, raw: box["a"](pk, raw),
             endpoint_args=dict(buf_size=1 << 17))
    first = p.ea.qp.req.psn
    box["a"] = _drop_psn(lambda psn: psn_distance(psn, first), {10: 1})
    a, b = pattern(N, 1), pattern(N, 2)
    fill(p.ea, 0, a)
    fill(p.ea, N, b)
    second = 10000 if overlap else 65536
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, N, 0))
    p.a.post_send(p.ea.qp, write_wr(2, p.ea, p.eb, N, N, second))
    p.run_until(lambda: len(p.send_wcs()) == 2, limit=5)
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(1, S.SUCCESS), (2, S.SUCCESS)]
    if overlap:
        assert read(p.eb, 0, second) == a[:second]
        assert read(p.eb, second, N) == b
    else:
        assert read(p.eb, 0, N) == a
        assert read(p.eb, second, N) == b
    assert [k for k in placed if k > 79]              # the second WRITE's MIDDLEs
    assert [k for k in placed if 10 < k < 79]         # the first WRITE's own


def test_a_resent_packet_already_held_names_the_hole_again():
    """A probe or timeout resends the oldest unacknowledged PSN and the newest
    sent.  When every answer to the oldest one's resend is lost and the NAKs that
    named the hole were lost too, the newest one, already held, is the only
    packet that can tell the requester: the responder answers it with a NAK
    naming the hole again (an earlier one may be lost), which also acknowledges
    everything below the hole.  Without that answer the requester runs out of
    retries on a QP whose every packet but one arrived."""
    box = {}
    p = pair(seed=1, mtu=MTU, config=SR, drop_a=lambda pk, raw: box["a"](pk, raw),
             drop_b=lambda pk, raw: box["b"](pk, raw))
    first = p.ea.qp.req.psn
    off = lambda psn: psn_distance(psn, first)    # noqa: E731
    box["a"] = _drop_psn(off, {6: 1})
    dropped = {"nak": 0, "ack": 0}

    def drop_b(pkt, raw):
        if pkt.info.kind != Kind.ACK:
            return False
        if pkt.aeth.code == AethCode.ACK and off(pkt.bth.psn) < 6:
            dropped["ack"] += 1                   # every answer below the hole
            return True
        if pkt.aeth.code == AethCode.NAK and not (p.a.counters["loss_probes"]
                                                  or p.a.counters["timeouts"]):
            dropped["nak"] += 1                   # the hole's NAKs, until the requester probes
            return True
        return False
    box["b"] = drop_b
    data = pattern(N, 1)
    fill(p.ea, 0, data)
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, N, 0))
    p.run_until(lambda: len(p.send_wcs()) == 1, limit=5)
    assert dropped["nak"] and dropped["ack"]
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(1, S.SUCCESS)]
    assert read(p.eb, 0, N) == data
    assert p.a.counters["retry_exceeded_err"] == 0
