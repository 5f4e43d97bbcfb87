"""The retransmission timer under a stretched round trip: it backs off while
timeouts repeat without progress, a selective-repeat timeout resends the oldest
PSN and one probe rather than a window, and a round trip that outlasts the RTO
for a while (a loaded host, a long queue) does not multiply the traffic.

The stretched round trip is a stall: datagrams sent on a link while it lasts
arrive when it ends, in order, as when a receiving process is descheduled.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st

from softnic.core.completer import RTO_BACKOFF_MAX
from softnic.core.device import DeviceConfig
from softnic.core.enums import WCStatus as S
from softnic.driver.faults import COUNTER_NAMES, FaultModel
from softnic.wire.psn import psn_distance

from enginekit import fill, pair, pattern, read, write_wr

RTO = 4.096e-6 * 2 ** 10          # timeout=10, the enginekit default
MTU = 1024
CUT = FaultModel(loss=1.0)


def config(sr: bool) -> DeviceConfig:
    return DeviceConfig(min_timer=1e-3, selective_repeat=sr)


def backoff(k: int) -> float:
    """Time from the first send to the ``k``-th timeout of a row without progress."""
    return sum(RTO * 2 ** min(j, RTO_BACKOFF_MAX) for j in range(k))


class Stall:
    """A link injector: datagrams sent during [start, end) arrive at ``end``,
    the rest at once, all in the order sent; each is lost with ``loss``."""

    def __init__(self, start: float, end: float, loss: float = 0.0, seed: int = 0):
        self.start, self.end, self.loss = start, end, loss
        self.rng = random.Random(seed)
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.last = 0.0

    def apply(self, data, now):
        self.counters["sent"] += 1
        if self.loss and self.rng.random() < self.loss:
            self.counters["dropped_loss"] += 1
            return []
        self.counters["delivered"] += 1
        t = self.end if self.start <= now < self.end else now
        self.last = t = max(t, self.last)
        return [(t, data)]


def stalled(p, start: float, end: float, *, loss: float = 0.0, seed: int = 0,
            both: bool = True) -> list[Stall]:
    out = []
    for src, dst in ((p.a, p.b), (p.b, p.a))[:2 if both else 1]:
        s = Stall(start, end, loss, seed * 2 + len(out))
        p.fabric.set_injector(src.address, dst.address, s)
        out.append(s)
    return out


def post_writes(p, n: int, size: int):
    data = pattern(n * size, n)
    fill(p.ea, 0, data)
    for i in range(n):
        p.a.post_send(p.ea.qp, write_wr(i + 1, p.ea, p.eb, i * size, size, i * size))
    return data


def requests_at(p, t: float) -> list[int]:
    """PSNs (relative to the first) of the request packets device a sent at time ``t``."""
    first = p.ea.qp.attr.sq_psn
    return [psn_distance(pkt.bth.psn, first) for when, pkt in p.packets("send", p.a)
            if when == pytest.approx(t, abs=1e-12) and pkt.info.is_request]


@pytest.mark.parametrize("sr", [True, False], ids=["selective-repeat", "go-back-N"])
def test_stall_longer_than_the_rto_does_not_multiply_traffic(sr):
    """A round trip stretched to ~10 RTOs with a full window in flight: a few
    timeouts (backed off), each resending two packets (selective repeat) or the
    window (go-back-N), not one window per RTO."""
    n, size = 8, 16 * MTU                     # 128 packets, the window
    p = pair(mtu=MTU, config=config(sr), endpoint_args=dict(buf_size=n * size))
    t0 = p.fabric.now
    stall = 10 * RTO
    stalled(p, t0, t0 + stall)
    data = post_writes(p, n, size)
    p.run_until(lambda: len(p.send_wcs()) == n, limit=5)
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == [(i + 1, S.SUCCESS) for i in range(n)]
    assert read(p.eb, 0, n * size) == data
    c = p.a.counters
    fired = sum(1 for k in range(1, 20) if backoff(k) < stall)
    assert c["timeouts"] == fired                # 3: at 1, 3 and 7 RTOs
    if sr:
        assert c["retransmitted_pkts"] <= 2 * c["timeouts"] + 2 * c["loss_probes"]
    else:
        assert c["retransmitted_pkts"] <= c["timeouts"] * n * size // MTU
    assert c["retransmitted_pkts"] < n * size // MTU * 4


def test_backoff_grows_while_nothing_arrives_and_resets_on_progress():
    p = pair(mtu=MTU, config=config(True))
    qp = p.ea.qp
    p.fabric.set_link(p.a.address, p.b.address, CUT, both_directions=False)
    fill(p.ea, 0, pattern(100, 1))
    p.a.post_send(qp, write_wr(1, p.ea, p.eb, 0, 100, 0))
    t0 = p.fabric.now
    k = RTO_BACKOFF_MAX + 3
    p.fabric.run(until=t0 + backoff(k) + RTO / 2)
    sends = [t for t, pkt in p.packets("send", p.a) if t >= t0 and pkt.info.is_request]
    # the first send, then one resend at each timeout; the loss probe (the
    # packet once more an eighth of an RTO after each) aside
    probes = p.a.counters["loss_probes"]
    assert p.a.counters["timeouts"] == k
    assert len(sends) == 1 + k + probes
    at_timeouts = [t for t in sends if any(t == pytest.approx(t0 + backoff(i), abs=1e-9)
                                           for i in range(k + 1))]
    assert len(at_timeouts) == k + 1
    gaps = [b - a for a, b in zip(at_timeouts, at_timeouts[1:])]
    assert gaps[1] == pytest.approx(2 * gaps[0]) and gaps[2] == pytest.approx(4 * gaps[0])
    assert gaps[-1] == pytest.approx(gaps[-2])                  # the cap
    assert p.a.rto(qp) == pytest.approx(RTO * 2 ** RTO_BACKOFF_MAX)
    # progress: the backoff ends, and the next loss waits one base RTO
    p.fabric.set_link(p.a.address, p.b.address, FaultModel.none(), both_directions=False)
    p.run_until(lambda: len(p.send_wcs()) == 1)
    assert p.send_wcs()[0].status == S.SUCCESS
    assert p.a.rto(qp) == pytest.approx(RTO)
    p.fabric.set_link(p.a.address, p.b.address, CUT, both_directions=False)
    p.a.post_send(qp, write_wr(2, p.ea, p.eb, 0, 100, 0))
    t1 = p.fabric.now
    c = p.a.counters["timeouts"]
    p.fabric.run(until=t1 + RTO * 1.5)
    assert p.a.counters["timeouts"] == c + 1
    assert requests_at(p, t1 + RTO) == [1]


def test_backoff_resets_on_progress_between_timeouts():
    """A timeout after progress waits one base RTO, however far the previous
    row of timeouts had backed off."""
    p = pair(mtu=MTU, config=config(True))
    qp = p.ea.qp
    for i in range(3):
        p.fabric.set_link(p.a.address, p.b.address, CUT, both_directions=False)
        p.a.post_send(qp, write_wr(i + 1, p.ea, p.eb, 0, 100, 0))
        t = p.fabric.now
        c0 = p.a.counters["timeouts"]
        p.fabric.run(until=t + backoff(i + 1) + RTO / 2)    # i + 1 timeouts in a row
        assert p.a.counters["timeouts"] == c0 + i + 1
        assert requests_at(p, t + RTO) == [i]               # the first at one base RTO
        assert p.a.rto(qp) == pytest.approx(RTO * 2 ** min(i + 1, RTO_BACKOFF_MAX))
        p.fabric.set_link(p.a.address, p.b.address, FaultModel.none(), both_directions=False)
        p.run_until(lambda: len(p.send_wcs()) == i + 1)
        assert p.a.rto(qp) == pytest.approx(RTO)


@pytest.mark.parametrize("sr", [True, False], ids=["selective-repeat", "go-back-N"])
def test_timeout_resends_the_oldest_psn_and_a_probe(sr):
    """The responses to a window are lost: selective repeat's timeout resends the
    oldest unacknowledged PSN and the newest one sent (the probe); go-back-N
    keeps its semantics and resends everything from the oldest."""
    n, size = 4, 8 * MTU
    p = pair(mtu=MTU, config=config(sr))
    t0 = p.fabric.now
    p.fabric.set_link(p.b.address, p.a.address, CUT, both_directions=False)
    data = post_writes(p, n, size)
    p.fabric.run(until=t0 + RTO * 1.5)
    assert p.a.counters["timeouts"] == 1
    assert requests_at(p, t0 + RTO) == ([0, n * 8 - 1] if sr else list(range(n * 8)))
    p.fabric.set_link(p.b.address, p.a.address, FaultModel.none(), both_directions=False)
    p.run_until(lambda: len(p.send_wcs()) == n)
    assert [w.status for w in p.send_wcs()] == [S.SUCCESS] * n
    assert read(p.eb, 0, n * size) == data


@pytest.mark.parametrize("probe_lost", [False, True])
def test_lost_tail_is_named_after_a_probe(probe_lost):
    """The last ten packets sent are lost: the loss probe (or, when it is lost
    too, the timeout) resends the newest PSN, which reaches the responder beyond
    the lost tail; it names the missing PSNs and they are resent at once, not
    one per probe interval."""
    n, size = 4, 8 * MTU
    lost = set(range(22, 32))
    resends = []

    def drop(pkt, raw):
        if not pkt.info.is_request:
            return False
        k = psn_distance(pkt.bth.psn, first)
        if k in lost:
            lost.discard(k)
            return True
        if p.a.counters["retransmitted_pkts"] and len(resends) < 2:
            resends.append(k)              # the probe's two packets
            return probe_lost
        return False
    p = pair(mtu=MTU, config=config(True), drop_a=lambda pk, raw: drop(pk, raw))
    first = p.ea.qp.req.psn
    data = post_writes(p, n, size)
    p.run_until(lambda: len(p.send_wcs()) == n)
    assert [w.status for w in p.send_wcs()] == [S.SUCCESS] * n
    assert read(p.eb, 0, n * size) == data
    assert not lost and resends[1] == 31
    c = p.a.counters
    assert c["loss_probes"] == 1
    assert c["timeouts"] == probe_lost
    # the ten lost packets and the probe's two (and the timeout's two)
    assert c["retransmitted_pkts"] <= 10 + 2 + 2 * probe_lost
    t = p.fabric.now
    if probe_lost:
        assert t < RTO + p.a.probe_interval(p.ea.qp)
    else:
        assert t < 2 * p.a.probe_interval(p.ea.qp) + 1e-4


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sr=st.booleans(), seed=st.integers(0, 2 ** 16), loss=st.sampled_from([0.0, 0.01, 0.03]),
       start=st.floats(0, 2e-3), length=st.floats(0, 30 * RTO),
       writes=st.integers(1, 12), kib=st.integers(1, 32))
def test_random_stall_and_loss_complete_with_bounded_resends(sr, seed, loss, start, length,
                                                              writes, kib):
    """Random stalls (up to 30 RTOs) and losses: the WRITEs complete with the
    right memory, the timeouts a stall causes are about log2 of its length, and
    selective repeat resends little more than what was lost."""
    size = kib * 1024
    p = pair(seed=seed, mtu=MTU, config=config(sr), trace=False,
             endpoint_args=dict(buf_size=writes * size))
    t0 = p.fabric.now
    links = stalled(p, t0 + start, t0 + start + length, loss=loss, seed=seed)
    data = post_writes(p, writes, size)
    p.run_until(lambda: len(p.send_wcs()) == writes, limit=60)
    note(f"seed={seed} counters={dict(p.a.counters)}")
    assert [(w.wr_id, w.status) for w in p.send_wcs()] == \
        [(i + 1, S.SUCCESS) for i in range(writes)]
    assert read(p.eb, 0, writes * size) == data
    c = p.a.counters
    dropped = sum(s.counters["dropped_loss"] for s in links)
    in_flight = min(writes * kib, 128)
    stall_timeouts = sum(1 for k in range(1, 40) if backoff(k) < length + RTO)
    assert c["timeouts"] <= stall_timeouts + 2 * dropped
    if sr:
        assert c["retransmitted_pkts"] <= 2 * c["timeouts"] + 2 * c["loss_probes"] + 3 * dropped
    else:
        assert c["retransmitted_pkts"] <= (c["timeouts"] + dropped) * in_flight
