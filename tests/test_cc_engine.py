"""Congestion control inside the engine and the simulated switch.

A recording controller (registered for these tests only) checks what the
engine hands controllers (bytes, RTT samples, losses, CNPs, INT) and that the
engine obeys what controllers ask for (pacing rate, window).  The switch's
egress queue is checked against its formulas.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

import congestion
from congestion.base import Controller, Hop
from congestion.params import Param
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import SendWR
from softnic.driver.faults import FaultModel
from softnic.experiments.rig import connect
from softnic.transport.sim import RED, WIRE_OVERHEAD, EgressQueue, Fabric
from softnic.wire.datagram import CE, Datagram
from softnic.wire.icrc import check_icrc
from softnic.wire.roce import Kind, Opcode as O, decode


class Recorder(Controller):
    """Fixed rate and/or window; records every hook call."""
    name = "recorder"
    PARAMS = {"cnp_every_mark": Param(0, "int", "ask for a CNP on every CE mark", "test", lo=0,
                                      hi=1)}

    def __init__(self, flow, *, rate=None, window=None, cnp_every_mark=False):
        super().__init__(flow)
        self.rate = rate
        self.window = window
        self.cnp_every_mark = cnp_every_mark
        self.sent = []        # (now, nbytes, psn, retransmit)
        self.acks = []        # (now, acked_bytes, rtt, telemetry)
        self.losses = []
        self.cnps = []
        self.marks = []

    def on_packet_sent(self, *, now, nbytes, psn, retransmit):
        self.sent.append((now, nbytes, psn, retransmit))

    def on_ack(self, *, now, acked_bytes, rtt, telemetry):
        self.acks.append((now, acked_bytes, rtt, telemetry))

    def on_loss(self, *, now, kind):
        self.losses.append((now, kind))

    def on_cnp(self, *, now):
        self.cnps.append(now)

    def on_ecn(self, *, now):
        self.marks.append(now)
        return self.cnp_every_mark


@pytest.fixture(autouse=True)
def recorder_registered(monkeypatch):
    monkeypatch.setitem(congestion.CONTROLLERS, "recorder", Recorder)


def _pair(cc="recorder", *, fabric=None, switch=None, rate=None, faults=None, ecn=None,
          mtu=1024, delay=1e-6, **cfg):
    config = DeviceConfig(cc=cc, ecn=ecn, min_timer=100e-6, **cfg)
    a = Device("a", "10.0.0.1", config=config)
    b = Device("b", "10.0.0.2", config=config)
    fabric = fabric or Fabric(7, default_delay=delay, default_faults=faults or FaultModel.none())
    fabric.attach(a)
    fabric.attach(b)
    if switch is not None:
        fabric.connect(a.address, switch, rate_bps=rate, delay=delay)
        fabric.connect(b.address, switch, rate_bps=rate, delay=delay)
    ea, eb = connect(a, b, mtu=mtu, timeout=8, endpoint_args=dict(buf_size=1 << 20))
    return fabric, a, b, ea, eb


def _write(a, ea, eb, n, size, signaled_last=True):
    for i in range(n):
        a.post_send(ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(0, size)],
                                  SendFlags.SIGNALED if (i == n - 1 or not signaled_last) else 0,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))


def _run_until_done(fabric, a, ea, n_wc=1, until=10.0, check=None):
    got = []

    def stop():
        if check is not None:
            check()
        got.extend(a.poll_cq(ea.send_cq, 16))
        return len(got) >= n_wc

    fabric.run(until=until, stop=stop)
    assert len(got) == n_wc and all(w.status == WCStatus.SUCCESS for w in got), got
    return got


def test_rate_paces_packets_at_the_controllers_rate():
    rate = 2e9
    fabric, a, b, ea, eb = _pair("recorder", mtu=1024)
    ea.qp.cc.rate = rate
    fabric.tracing = True
    _write(a, ea, eb, 1, 256 << 10)
    _run_until_done(fabric, a, ea)
    sends = [r for r in fabric.trace if r.kind == "send" and r.src == a.address]
    assert len(sends) == 256
    # each packet leaves (its bytes + IP/UDP headers) * 8 / rate after the one before
    for prev, cur in zip(sends, sends[1:]):
        gap = cur.time - prev.time
        assert gap == pytest.approx((len(prev.data) + WIRE_OVERHEAD) * 8 / rate, rel=1e-6)
    # and the controller heard of each one, with those sizes
    cc = ea.qp.cc
    assert [s[1] for s in cc.sent] == [len(s.data) + WIRE_OVERHEAD for s in sends]


def test_a_paced_qp_whose_timer_fired_keeps_its_deadline_whichever_a_driver_reads_first():
    """``handle_timer`` leaves the arming of a paced QP it made ready to the drain
    after its next packet; a driver that reads the timer before draining still
    finds the QP's deadline (the retransmission timeout), and both orders give
    the same packet and the same next deadline."""
    seen = []
    for drain_first in (True, False):
        fabric, a, b, ea, eb = _pair("recorder", mtu=1024)
        qp = ea.qp
        qp.cc.rate = 1e9
        _write(a, ea, eb, 1, 8 << 10)
        now = fabric.now
        assert len(a.datagrams_to_send(now)) == 1       # the pacer holds the second
        pace = a.get_timer()
        assert pace == qp.ccs.pace_at and pace > now
        a.handle_timer(pace)
        if not drain_first:
            assert a.get_timer() == qp.comp.rto_at > pace
        out = a.datagrams_to_send(pace)
        t = a.get_timer()
        assert len(out) == 1 and t == qp.ccs.pace_at > pace
        seen.append((out[0][0], t - now, qp.comp.rto_at - now))
    assert seen[0] == seen[1]


class TimedRecorder(Recorder):
    """A ``Recorder`` with a timer of its own, due every ``period`` from ``first`` on."""
    name = "timedrec"

    def __init__(self, flow, **kw):
        super().__init__(flow, **kw)
        self.timer = None
        self.period = None
        self.fired = []

    def next_timer(self):
        return self.timer

    def on_timer(self, *, now):
        self.fired.append(now)
        self.timer = now + self.period


def test_a_controller_timer_while_the_pacer_holds_the_qp_leaves_the_drain_nothing(monkeypatch):
    """A controller's own timer that fires while the QP's pacer holds its next
    packet does not make the QP ready (``generate`` would stop at HELD): the
    device has no output until the pacing time; with the fast paths off it walks
    the chain to the pacer instead.  The same packets leave at the same times."""
    monkeypatch.setitem(congestion.CONTROLLERS, "timedrec", TimedRecorder)
    seen = []
    for fast in (True, False):
        fabric, a, b, ea, eb = _pair("timedrec", mtu=1024, fast_path=fast)
        cc = ea.qp.cc
        cc.rate = 1e9
        _write(a, ea, eb, 1, 4 << 10)
        now = fabric.now
        sent = [a.datagrams_to_send(now)]
        pace = ea.qp.ccs.pace_at
        cc.timer, cc.period = now + (pace - now) / 4, (pace - now) / 3
        a.arm(ea.qp)
        times = []
        while len(sent) < 4:                    # the WRITE's four packets
            t = a.get_timer()
            a.handle_timer(t)
            if t < pace and cc.fired and cc.fired[-1] == t:
                assert a.has_output is not fast
            out = a.datagrams_to_send(t)
            if out:
                sent.append(out)
                pace = ea.qp.ccs.pace_at or t
                times.append(t)
        assert len(cc.fired) >= 4
        pkts = [decode(d[:-4]) for o in sent for d, _ in o]
        seen.append(([(p.bth.opcode, p.bth.psn, p.bth.ackreq, bytes(p.payload)) for p in pkts],
                     times, cc.fired))
    assert seen[0] == seen[1] and len(seen[0][0]) == 4


@pytest.mark.parametrize("clocked", [False, True])
def test_a_window_below_one_packet_is_clocked_by_its_acks_where_the_controller_asks(clocked):
    """A window below one packet lets one packet out at a time.  By the rate alone
    the next leaves (its bytes) * 8 / rate after the last was sent, or at the ACK
    if that comes later; a controller whose window is clocked by ACKs
    (``ack_clocked``, HPCC's) has it leave (the acknowledged packet's bytes -
    window) * 8 / rate after the ACK."""
    rate, window = 1e9, 300.0
    fabric, a, b, ea, eb = _pair("recorder", mtu=1024, delay=2e-6, ack_every=1)
    cc = ea.qp.cc
    cc.rate, cc.window, cc.ack_clocked = rate, window, clocked
    fabric.tracing = True
    _write(a, ea, eb, 1, 8 << 10)
    _run_until_done(fabric, a, ea)
    sends = [r for r in fabric.trace if r.kind == "send" and r.src == a.address]
    assert len(sends) == 8 and len(cc.acks) == 8
    for i in range(1, 8):
        size = len(sends[i - 1].data) + WIRE_OVERHEAD
        acked_at = cc.acks[i - 1][0]
        assert acked_at > sends[i - 1].time      # one packet in flight at a time
        if clocked:
            want = acked_at + (size - window) * 8 / rate
        else:
            want = max(sends[i - 1].time + size * 8 / rate, acked_at)
        assert sends[i].time == pytest.approx(want, rel=1e-9, abs=1e-12), i


def test_no_controller_sends_back_to_back():
    fabric, a, b, ea, eb = _pair("none")
    assert ea.qp.cc is None
    fabric.tracing = True
    _write(a, ea, eb, 1, 64 << 10)
    _run_until_done(fabric, a, ea)
    sends = [r for r in fabric.trace if r.kind == "send" and r.src == a.address]
    assert len({r.time for r in sends}) == 1          # one burst at one instant


def test_window_caps_bytes_in_flight_and_acks_release_it():
    fabric, a, b, ea, eb = _pair("recorder", delay=20e-6, ack_every=1)
    window = 5 * (1024 + 50)
    ea.qp.cc.window = window
    peak = [0]

    def check():
        peak[0] = max(peak[0], ea.qp.ccs.inflight)
        assert ea.qp.ccs.inflight <= window + 1024 + 60

    _write(a, ea, eb, 4, 64 << 10)
    _run_until_done(fabric, a, ea, check=check)
    cc = ea.qp.cc
    assert peak[0] > window - 1100              # the window was used...
    assert ea.qp.ccs.inflight == 0               # ...and every byte came back acknowledged
    assert sum(x[1] for x in cc.acks) == sum(s[1] for s in cc.sent)


def test_rtt_samples_measure_the_path():
    delay = 50e-6
    fabric, a, b, ea, eb = _pair("recorder", delay=delay, ack_every=1)
    _write(a, ea, eb, 1, 8 << 10)
    _run_until_done(fabric, a, ea)
    rtts = [x[2] for x in ea.qp.cc.acks if x[2] is not None]
    assert rtts and all(r == pytest.approx(2 * delay, rel=1e-6) for r in rtts)


def test_losses_reach_the_controller_as_naks_and_timeouts():
    fabric, a, b, ea, eb = _pair("recorder", faults=FaultModel(loss=0.05))
    _write(a, ea, eb, 8, 64 << 10)
    _run_until_done(fabric, a, ea)
    kinds = {k for _, k in ea.qp.cc.losses}
    assert "nak" in kinds
    assert a.counters["rcvd_seq_err"] == sum(1 for _, k in ea.qp.cc.losses if k == "nak")
    assert a.counters["timeouts"] == sum(1 for _, k in ea.qp.cc.losses if k == "timeout")
    # resent packets are flagged, and give no RTT sample (Karn)
    assert any(s[3] for s in ea.qp.cc.sent)


def _switched(cc, *, red, int_telemetry=False, ecn=None, rate=10e9):
    fabric = Fabric(3)
    sw = fabric.add_switch("sw", buffer_bytes=4 << 20, red=red, int_telemetry=int_telemetry)
    return _pair(cc, fabric=fabric, switch=sw, rate=rate, ecn=ecn, ack_every=1) + (sw,)


def test_ecn_marks_become_cnps_that_reach_the_sender():
    fabric, a, b, ea, eb, sw = _switched("recorder:cnp_every_mark=1", red=RED(0, 1, 1.0),
                                         ecn=True)
    # two senders' worth of load is not needed: kmax=1 byte marks anything that queues
    _write(a, ea, eb, 2, 128 << 10)
    _run_until_done(fabric, a, ea)
    port = sw.port(b.address)
    marks = b.counters["np_ecn_marked_roce_packets"]
    assert marks == port.counters["marked"] > 0
    assert len(eb.qp.cc.marks) == marks
    assert b.counters["np_cnp_sent"] == marks       # this controller asks for one per mark
    assert a.counters["rp_cnp_handled"] == len(ea.qp.cc.cnps) == marks


def test_packets_not_ecn_capable_are_never_marked():
    fabric, a, b, ea, eb, sw = _switched("recorder:cnp_every_mark=1", red=RED(0, 1, 1.0),
                                         ecn=False)
    _write(a, ea, eb, 2, 128 << 10)
    _run_until_done(fabric, a, ea)
    assert sw.port(b.address).counters["marked"] == 0
    assert b.counters["np_ecn_marked_roce_packets"] == 0 and not ea.qp.cc.cnps


def test_cnp_on_the_wire_is_opcode_0x81_to_the_requesters_qp():
    fabric, a, b, ea, eb, sw = _switched("recorder:cnp_every_mark=1", red=RED(0, 1, 1.0),
                                         ecn=True)
    fabric.tracing = True
    _write(a, ea, eb, 1, 64 << 10)
    _run_until_done(fabric, a, ea)
    cnps = []
    for r in fabric.trace:
        if r.kind == "deliver" and r.src == b.address:
            pkt = decode(memoryview(bytes(r.data))[:-4])
            if pkt.info.kind == Kind.CNP:
                assert check_icrc(bytes(r.data), b.ip, a.ip, b.port, a.port)
                cnps.append(pkt)
    assert cnps and all(p.bth.opcode == O.CNP and p.bth.dest_qp == ea.qp.qpn for p in cnps)


def test_int_telemetry_is_echoed_to_the_sender():
    rate = 10e9
    fabric, a, b, ea, eb, sw = _switched("recorder", red=None, int_telemetry=True, rate=rate)
    _write(a, ea, eb, 1, 256 << 10)
    _run_until_done(fabric, a, ea)
    tels = [x[3] for x in ea.qp.cc.acks if x[3] is not None]
    assert tels
    for tel in tels:
        assert len(tel) == 1 and isinstance(tel[0], Hop)
        assert tel[0].rate_bps == rate and tel[0].qlen >= 0
    tx = [t[0].tx_bytes for t in tels]
    assert tx == sorted(tx) and tx[-1] <= sw.port(b.address).tx_bytes


def test_bad_controller_specs_are_clear_errors():
    with pytest.raises(ValueError, match="bogus"):
        Device("x", "10.0.0.9", config=DeviceConfig(cc="bogus"))
    dev = Device("x", "10.0.0.9")
    ea = connect(dev, Device("y", "10.0.0.10"))[0]
    with pytest.raises(ValueError):
        dev.set_qp_transport(ea.qp, cc="recorder:nonsense=1")


# ---------------------------------------------------------------- the switch queue


def test_egress_queue_serves_fifo_at_its_rate_and_drops_when_full():
    q = EgressQueue("q", 8e9, buffer_bytes=3 * (1000 + WIRE_OVERHEAD))
    pkt = bytes(1000)
    t_pkt = (1000 + WIRE_OVERHEAD) * 8 / 8e9
    deps = [q.arrive(pkt, 0.0) for _ in range(4)]
    assert [d[0] for d in deps[:3]] == pytest.approx([t_pkt, 2 * t_pkt, 3 * t_pkt])
    assert deps[3] is None and q.counters["dropped"] == 1
    assert q.qlen(0.0) == pytest.approx(3 * (1000 + WIRE_OVERHEAD))
    assert q.qlen(1.5 * t_pkt) == pytest.approx(1.5 * (1000 + WIRE_OVERHEAD))
    assert q.arrive(pkt, 1.5 * t_pkt)[0] == pytest.approx(4 * t_pkt)   # room again


def test_int_qlen_counts_the_buffer_not_the_datagram_on_the_wire():
    # HPCC's qlen is the buffer's occupancy: a datagram being sent has left it
    size = 1000 + WIRE_OVERHEAD
    t_pkt = size * 8 / 8e9
    q = EgressQueue("q", 8e9, int_telemetry=True, sample_every=0)

    def stamp(now):
        depart, d = q.arrive(bytes(1000), now)
        (hop,) = d.hops
        assert hop.ts == depart and hop.tx_bytes == q.tx_bytes
        return hop.qlen

    assert stamp(0.0) == 0                  # A: an idle port
    assert stamp(0.5 * t_pkt) == 0          # B: only A, half sent, is ahead
    assert stamp(0.6 * t_pkt) == size       # C: B waits
    assert stamp(1.2 * t_pkt) == size       # D: A gone, B on the wire, C waits
    assert stamp(1.9 * t_pkt) == 2 * size   # E: B on the wire, C and D wait
    assert stamp(10 * t_pkt) == 0           # drained
    # the figures the buffer is judged by still count the bytes yet to leave
    assert q.counters["max_qlen"] == int(2.1 * size)    # at E: 0.1 of B, C, D


def test_red_marks_with_the_configured_probability():
    red = RED(kmin=10_000, kmax=110_000, pmax=0.2)
    assert red.probability(5_000) == 0 and red.probability(200_000) == 1
    assert red.probability(60_000) == pytest.approx(0.1)
    seed = random.randrange(1 << 30)
    print("seed", seed)
    q = EgressQueue("q", 1e9, red=red, rng=random.Random(seed))
    q.busy_until = 60_000 * 8 / 1e9             # 60 KB queued at t=0
    marked = 0
    n = 4000
    for _ in range(n):
        q.busy_until = 60_000 * 8 / 1e9          # hold the queue at 60 KB
        _, d = q.arrive(bytes(100), 0.0, ect=True)
        marked += type(d) is Datagram and d.ecn == CE
    assert 0.07 < marked / n < 0.13              # p = 0.1; 6 sigma is about 0.028


def test_red_and_buffer_validate():
    with pytest.raises(ValueError):
        RED(kmin=10, kmax=5)
    with pytest.raises(ValueError):
        RED(pmax=0)
    with pytest.raises(ValueError):
        EgressQueue("q", 0)


def test_a_paced_read_missing_its_last_response_times_out_and_completes():
    # The READ request is the only packet sent; its responses move the ACK past
    # the request's PSN.  With the last response lost, the retransmission timer
    # must still fire (nothing held by the pacer) and re-issue the READ.
    from softnic.testing.droplist import DropList
    fabric, a, b, ea, eb = _pair("recorder", mtu=1024)
    ea.qp.cc.rate = 10e9
    eb.buf.view[:16384] = bytes(range(256)) * 64
    DropList({15}).install(fabric, b.address, a.address)      # the 16th response
    a.post_send(ea.qp, SendWR(1, W.RDMA_READ, [ea.sge(0, 16384)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    _run_until_done(fabric, a, ea, until=1.0)
    assert a.counters["timeouts"] >= 1
    assert bytes(ea.buf.view[:16384]) == bytes(eb.buf.view[:16384])


@given(st.data())
def test_packets_presumed_lost_leave_the_in_flight_count_as_the_plain_rule_has_it(data):
    """``requester.cc_lost_from`` walks the PSNs from the first presumed lost to
    the highest sent when that range is short: the same entries leave ``sent``
    and the same bytes ``inflight`` as the plain rule (every entry at or after
    that PSN), across the PSN space's wrap."""
    from types import SimpleNamespace
    from softnic.core import requester
    from softnic.wire.psn import PSN_MASK, psn_diff
    acked = data.draw(st.integers(0, PSN_MASK), label="acked")
    span = data.draw(st.integers(0, 300), label="span")        # PSNs sent beyond acked
    max_sent = (acked + span) & PSN_MASK
    kept = data.draw(st.sets(st.integers(1, span), max_size=300) if span else st.just(set()),
                     label="in sent")
    if span and data.draw(st.booleans(), label="the highest sent not yet lost"):
        kept.add(span)
    sent = {(acked + k) & PSN_MASK: (0.0, data.draw(st.integers(60, 4200)), False)
            for k in sorted(kept)}
    offsets = st.integers(-3, span + 3)
    if kept:                                    # often a PSN that was sent
        offsets = st.sampled_from(sorted(kept)) | offsets
    psn = (acked + data.draw(offsets, label="lost from")) & PSN_MASK
    ccs = SimpleNamespace(sent=dict(sent), inflight=sum(e[1] for e in sent.values()) + 7)
    qp = SimpleNamespace(ccs=ccs, req=SimpleNamespace(max_sent_psn=max_sent))
    requester.cc_lost_from(qp, psn)
    lost = {p for p in sent if psn_diff(p, psn) >= 0}
    assert ccs.sent == {p: e for p, e in sent.items() if p not in lost}
    assert ccs.inflight == 7 + sum(e[1] for p, e in sent.items() if p not in lost)


@given(st.data())
def test_an_ack_takes_what_it_covers_out_of_flight_as_the_plain_rule_has_it(data):
    """``requester.cc_acked`` takes the PSNs the cumulative ACK moved over out of
    the record of what was sent: the same entries, bytes, and RTT sample (the
    newest original packet acknowledged) as walking every entry, across the PSN
    space's wrap."""
    from types import SimpleNamespace
    from softnic.core import requester
    from softnic.wire.psn import PSN_MASK, psn_diff
    before = data.draw(st.integers(0, PSN_MASK), label="acked before")
    span = data.draw(st.integers(1, 300), label="span")
    kept = data.draw(st.sets(st.integers(1, span), max_size=300), label="in sent")
    sent = {(before + k) & PSN_MASK: (k * 1e-6, data.draw(st.integers(60, 4200)),
                                      data.draw(st.booleans()))
            for k in sorted(kept)}
    acked = (before + data.draw(st.integers(1, span), label="acked now")) & PSN_MASK
    got = []
    ccs = SimpleNamespace(sent=dict(sent), inflight=sum(e[1] for e in sent.values()),
                          rx_telemetry=None)
    qp = SimpleNamespace(ccs=ccs, comp=SimpleNamespace(acked_psn=acked),
                         cc=SimpleNamespace(on_ack=lambda **kw: got.append(kw),
                                            ack_clocked=False))
    requester.cc_acked(qp, before, now=1.0)
    done = [p for p in sent if psn_diff(p, acked) <= 0]
    originals = [p for p in done if not sent[p][2]]
    assert ccs.sent == {p: e for p, e in sent.items() if p not in done}
    assert got == [dict(now=1.0, acked_bytes=sum(sent[p][1] for p in done),
                        rtt=1.0 - sent[originals[-1]][0] if originals else None,
                        telemetry=None)]
    assert ccs.inflight == sum(e[1] for e in ccs.sent.values())
