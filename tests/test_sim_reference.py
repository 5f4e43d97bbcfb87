"""The fabric's event loop (``Fabric.run``) against a straightforward one.

``Fabric.run`` is written for speed: the driver rule inlined, a datagram's way
out through a clean link or a NIC's queue taken without ``Fabric._send``, a
timer entry checked as it is popped, a switch port's deliveries kept out of the
heap behind the first.  ``ReferenceFabric.run`` below is
the plain reading of the module's docstring: settle the heap's top
(``next_event_time``), pop one event, hand it to its switch port or device,
then apply the driver rule through the public ``flush``.  The same workload on
both must give the same run: every delivery (time, ends, bytes, ECN mark, INT
records), the same event counts and the experiment's whole result.  ``Fabric.run``
has two loops, the compiled one (``softnic.accel``'s ``fabric.c``) and the Python
one it is checked against (``Fabric._run_python``): each test runs both
(``fast_fabric``).
"""

from __future__ import annotations

from heapq import heappop, heappush

import pytest

try:
    from softnic.experiments import bottleneck as ex, cluster
except ImportError:                  # the layout before experiments left softnic/cli
    from softnic.cli import cluster, experiments as ex
from softnic import accel
from softnic.core import device as core_device
from softnic.core.output import Output
from softnic.core.timers import Timers
from softnic.transport import sim
from softnic.wire.datagram import Datagram
from softnic.wire.roce import BTH_LEN, OPCODES


class Deliveries:
    """A capture hook: every delivery with what travels beside its bytes.  A
    RETH's virtual address is the target buffer's real address, which differs
    between two runs in one process: it is kept as zeros, and so is the ICRC
    over it."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def record(self, data, src, dst, now) -> None:
        extra = (data.ecn, data.hops, data.echo) if type(data) is Datagram else None
        raw = bytes(data)
        info = OPCODES.get(raw[0])
        if info is not None and info.reth and info.qp_type == "RC":
            raw = raw[:BTH_LEN] + bytes(8) + raw[BTH_LEN + 8:-4] + bytes(4)   # and the ICRC
        self.seen.append((now, src, dst, raw, extra))


class ReferenceFabric(sim.Fabric):
    """``Fabric`` with an event loop that takes no shortcut."""

    def run(self, until=None, *, stop=None, max_events=None, flush=True) -> float:
        if flush:
            self.flush()
        if stop is not None and stop():
            return self._now
        processed = 0
        stopped = False
        while processed != max_events:
            at = self.next_event_time()      # stale and moved timer entries settled
            if at is None or (until is not None and at > until):
                break
            at, seq, port, data, src = heappop(self._heap)
            if isinstance(port, sim._SwitchHop):
                self.hops_processed += 1
                sender = self._ports.get(src)
                res = port.queue.arrive(data, at, sender is not None and sender.ect, src)
                if res is not None:
                    heappush(self._heap, (res[0] + port.delay, self._next_seq(), port.dst,
                                          res[1], src))
                continue
            if not isinstance(port, sim._Port):          # a leaf-spine's port or switch
                self.hops_processed += 1
                port.event(at, data, src)
                continue
            self._now = at
            processed += 1
            if data is None:                 # the port's live timer entry, due
                port.entry_seq = -1
                port.armed = None
                port.device.handle_timer(at)
            elif port.attached:
                self._received += 1
                if self.capture is not None:
                    self.capture.record(data, src, port.address, at)
                if type(data) is Datagram:
                    port.device.receive_datagram(
                        data, src, at, data.ecn, data.echo if data.echo is not None else data.hops)
                else:
                    port.device.receive_datagram(data, src, at)
            else:
                self._dropped_unknown += 1
                if stop is not None and stop():
                    stopped = True
                    break
                continue
            self.flush([port.address])       # the driver rule
            if stop is not None and stop():
                stopped = True
                break
        self.events_processed += processed
        if until is not None and not stopped and processed != max_events and until > self._now:
            self._now = until
        return self._now


class PythonLoopFabric(sim.Fabric):
    """``Fabric`` running its Python loop, not the compiled one."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.compiled = False


@pytest.fixture(params=["compiled", "python"])
def fast_fabric(request, monkeypatch):
    """``Fabric`` with the loop named: the compiled one (the Python loop made to
    fail, so a run that fell back to it cannot pass), or the Python one."""
    if request.param == "python":
        return PythonLoopFabric
    if sim.compiled_loop() is None:
        pytest.fail(f"no compiled fabric loop: {accel.fabric_error}")

    def no_python_loop(self, *a):
        raise AssertionError("the Python loop ran")
    monkeypatch.setattr(sim.Fabric, "_run_python", no_python_loop)
    return sim.Fabric


def _without_wall(res: dict) -> dict:
    res.pop("wall_s", None)
    res.get("summary", {}).pop("wall_s", None)
    return res


def _run_on(monkeypatch, module, fabric_cls, experiment) -> tuple:
    """``experiment()`` with ``module``'s fabrics made as ``fabric_cls`` with a
    ``Deliveries`` capture: its result, the deliveries and the fabric's counts."""
    made = []

    def build(seed, *a, **k):
        made.append(fabric_cls(seed, *a, capture=Deliveries(), **k))
        return made[-1]
    monkeypatch.setattr(module, "Fabric", build)
    res = _without_wall(experiment())
    fabric = made[-1]
    return res, fabric.capture.seen, (fabric.events_processed, fabric.hops_processed,
                                      fabric.counters)


def _incast(monkeypatch, fabric_cls, **kw) -> tuple[dict, list, tuple]:
    return _run_on(monkeypatch, ex, fabric_cls, lambda: ex.incast(ex.IncastConfig(**kw)))


@pytest.mark.parametrize("kw", [
    dict(cc="dcqcn", buffer=96_000),             # RED marks, CNPs, tail drops and go-back-N
    dict(cc="dcqcn", kmin=2_000, kmax=30_000, pmax=0.2, duration=0.004),   # marks by chance
    dict(cc="hpcc"),                             # INT stamped and echoed
    dict(cc="dcqcn", pfc=True),                  # the leaf-spine's ports, PAUSE and RESUME
    dict(cc="none", selective_repeat=True, buffer=64_000),
], ids=["dcqcn-drops", "dcqcn-red", "hpcc-int", "dcqcn-pfc", "none-sr-drops"])
def test_the_fast_loop_runs_an_incast_as_the_reference_loop(monkeypatch, fast_fabric, kw):
    cfg = {"senders": 4, "duration": 0.002, **kw}
    fast = _incast(monkeypatch, fast_fabric, **cfg)
    ref = _incast(monkeypatch, ReferenceFabric, **cfg)
    res, seen, counts = fast
    # the workload reaches what it is meant to exercise
    assert counts[0] > 1000 and counts[1] > 1000
    summary = res["summary"]
    if kw.get("buffer"):
        assert summary["switch_drops"] > 0
    if kw["cc"] == "dcqcn" and not kw.get("pfc"):
        assert summary["ecn_marked"] > 0
    if kw["cc"] == "hpcc":
        assert any(extra is not None and extra[1] for *_, extra in seen)
    assert seen == ref[1]
    assert counts == ref[2]
    assert res == ref[0]


def test_the_fast_loop_runs_a_lossy_link_as_the_reference_loop(monkeypatch, fast_fabric):
    """Direct links with loss and a rate: the fault injector's path."""
    def run(fabric_cls):
        return _run_on(monkeypatch, ex, fabric_cls, lambda: ex.goodput_under_loss(
            0.05, False, total=1 << 20, msg=256 << 10))
    fast, ref = run(fast_fabric), run(ReferenceFabric)
    assert fast[0]["ok"] and fast[0]["retransmitted_pkts"] > 0
    assert fast == ref


@pytest.mark.parametrize("mode", ["lossless", "lossy"])
def test_the_fast_loop_runs_a_three_leaf_fabric_as_the_reference_loop(monkeypatch, fast_fabric, mode):
    """The PFC victim study: three leaves under a spine, PAUSE spreading (lossless)
    or tail drops (lossy) on the leaf-spine's ports."""
    def run(fabric_cls):
        return _run_on(monkeypatch, cluster, fabric_cls, lambda: cluster.victim(
            cluster.VictimConfig(mode=mode, duration=0.5e-3)))
    fast, ref = run(fast_fabric), run(ReferenceFabric)
    assert fast[2][1] > 1000
    if mode == "lossless":
        assert fast[0]["summary"]["pause_frames"] > 0
    assert fast == ref


def test_the_fast_loop_runs_collectives_as_the_reference_loop(monkeypatch, fast_fabric):
    """Ranks of softnic.collectives in virtual time (the fabric run until a rank's
    completion, ``stop``) on four leaves and two spines, ECMP, lossy, DCQCN."""
    def run(fabric_cls):
        return _run_on(monkeypatch, cluster, fabric_cls, lambda: cluster.run(
            cluster.ClusterConfig(hosts=8, hosts_per_leaf=2, size=64 << 10, mode="lossy",
                                  cc="dcqcn")))
    fast, ref = run(fast_fabric), run(ReferenceFabric)
    assert fast[0]["summary"]["finished"] and fast[2][0] + fast[2][1] > 1000
    assert fast == ref


class ReferenceSampling(ex._IncastRun):
    """The incast's per-bin sampling one flow at a time, as written before it was
    batched: a call per flow, completions polled through the device's verbs."""

    def _sample(self, t) -> None:
        for flow in self.flows:
            self._sample_flow(t, *flow)

    def _sample_flow(self, t, dev, ea, eb, fs, posted) -> None:
        cfg = self.cfg
        wcs = dev.poll_cq(ea.send_cq, 64)
        if wcs:
            ok = sum(wc.status == ex.WCStatus.SUCCESS for wc in wcs)
            self.errors += len(wcs) - ok
            fs.completed_bytes += ok * cfg.msg
            if ok and t + cfg.bin < cfg.duration:
                self._post(dev, ea, eb, ok)
        qp = ea.qp
        if posted[0]:
            fs.goodput_gbps.append(ex.psn_diff(qp.comp.acked_psn, posted[1]) * cfg.mtu * 8
                                   / cfg.bin / 1e9)
            fs.inflight_kb.append(ex.psn_diff(qp.req.max_sent_psn, qp.comp.acked_psn) * cfg.mtu / 1e3)
        else:
            fs.goodput_gbps.append(0.0)
            fs.inflight_kb.append(0.0)
        posted[1] = qp.comp.acked_psn
        tx = self.port.tx_by_src.get(dev.address, 0)
        fs.tput_gbps.append((tx - self.prev_tx.get(dev.address, 0)) * 8 / cfg.bin / 1e9)
        self.prev_tx[dev.address] = tx
        cc = qp.cc if posted[0] else None
        fs.rate_gbps.append(None if cc is None or cc.rate is None else cc.rate / 1e9)
        fs.window_kb.append(None if cc is None or cc.window is None else cc.window / 1e3)


@pytest.mark.parametrize("kw", [
    dict(cc="dcqcn", late_join=1e-3),            # a flow that starts late: zeros, then rates
    dict(cc="hpcc", msg=64 << 10),               # windows, and many completions reposted
    dict(cc="none", buffer=64_000),              # no controller; drops and resends
], ids=["dcqcn-late", "hpcc", "none-drops"])
def test_the_incast_samples_every_flow_as_one_flow_at_a_time(monkeypatch, kw):
    """The incast's driver samples all flows in one loop per bin: every series and
    figure is what sampling each flow on its own gives."""
    cfg = ex.IncastConfig(senders=4, duration=0.002, **kw)
    fast = _without_wall(ex.incast(cfg))
    monkeypatch.setattr(ex, "_IncastRun", ReferenceSampling)
    ref = _without_wall(ex.incast(cfg))
    flows = fast["flows"]
    assert sum(f["completed_bytes"] for f in flows) >= 4 * cfg.msg    # reposts happened
    if cfg.late_join is not None:              # no rate until it starts, then DCQCN's
        assert flows[-1]["rate_gbps"][0] is None and flows[-1]["rate_gbps"][-1] is not None
    if cfg.cc == "hpcc":
        assert all(w is not None for w in flows[0]["window_kb"])
    assert fast == ref


class _Burst:
    """A device that sends ``n`` datagrams of ``size`` bytes to ``peer`` at once
    when its timer (at 0) fires, and keeps what it receives."""

    ect = False

    def __init__(self, address, peer=None, n=0, size=1000):
        self.address, self.peer, self.n, self.size = address, peer, n, size
        self.at = 0.0 if n else None
        self.out, self.got = [], []

    def receive_datagram(self, data, src, now, ecn=0, telemetry=None):
        self.got.append((now, src, bytes(data)))

    def datagrams_to_send(self, now):
        out, self.out = self.out, []
        return out

    def get_timer(self):
        return self.at

    def handle_timer(self, now):
        self.at = None
        self.out = [(bytes([i % 256]) * self.size, self.peer) for i in range(self.n)]


def test_a_receiver_detached_with_datagrams_queued_toward_it(fast_fabric):
    """Two senders burst into one switch port; the receiver leaves while the port
    still holds their datagrams, and another device takes its address: all that
    was on the way is dropped (the new device gets none of it), as the reference
    loop has it."""
    def run(cls):
        fabric = cls(3, capture=Deliveries())
        sw = fabric.add_switch("sw", buffer_bytes=None)
        recv = ("10.9.0.1", 4791)
        devs = [_Burst(recv), _Burst(("10.9.0.2", 4791), recv, 40),
                _Burst(("10.9.0.3", 4791), recv, 40)]
        for d in devs:
            fabric.attach(d)
            fabric.connect(d.address, sw, rate_bps=10e9, delay=1e-6)
        fabric.run(until=20e-6)              # the port drains 80 datagrams over 66 us
        fabric.detach(recv)
        fabric.run(until=30e-6)
        fabric.attach(late := _Burst(recv))
        fabric.run()
        return devs[0].got, late.got, fabric.capture.seen, fabric.counters
    fast, ref = run(fast_fabric), run(ReferenceFabric)
    got, late_got, seen, counters = fast
    assert got and not late_got and counters["dropped_unknown"] == 80 - len(got)
    assert fast == ref


class _Pinger(_Burst):
    """A device that answers every datagram with one of its own, and whose timer
    each delivery moves earlier than its last (a timer entry left stale in the
    heap each time), back to a late one as it fires."""

    def __init__(self, address, peer, start=False):
        super().__init__(address, peer)
        self.at = 0.0 if start else None
        self.got, self.fired = 0, 0

    def receive_datagram(self, data, src, now, ecn=0, telemetry=None):
        self.got += 1
        self.at = now + 1e-7 * (1 + self.got % 3)
        self.out.append((data, self.peer))

    def handle_timer(self, now):
        self.fired += 1
        self.at = now + 1.0
        if self.fired == 1 and not self.got:
            self.out.append((b"ping" * 10, self.peer))


def test_stale_timer_entries_are_dropped_and_the_heap_compacted(fast_fabric):
    """Two devices ping-pong over a direct link, each delivery moving the
    receiver's timer earlier: more than ``_COMPACT_MIN_STALE`` stale entries, the
    heap compacted, and runs cut by ``max_events``, ``until`` and ``stop``: the
    same deliveries, timer firings and counts as the reference loop."""
    def run(cls):
        fabric = cls(5, capture=Deliveries())
        a, b = ("10.8.0.1", 4791), ("10.8.0.2", 4791)
        devs = [_Pinger(a, b, start=True), _Pinger(b, a)]
        for d in devs:
            fabric.attach(d)
        compacted = []
        real = fabric._compact
        fabric._compact = lambda: (compacted.append(fabric._stale), real())
        fabric.run(max_events=1001)
        steps = [fabric.now]
        fabric.run(until=fabric.now + 2e-3)
        steps.append(fabric.now)
        fabric.run(stop=lambda: devs[1].got >= 6000)
        steps.append(fabric.now)
        return ([(d.got, d.fired) for d in devs], steps, compacted, fabric._stale,
                fabric.events_processed, fabric.counters, fabric.capture.seen[-50:])
    fast, ref = run(fast_fabric), run(ReferenceFabric)
    assert devs_ok(fast)
    assert fast[:2] == ref[:2] and fast[4:] == ref[4:]


def devs_ok(res) -> bool:
    (_, _), (got_b, _) = res[0]
    return got_b >= 6000 and bool(res[2]) and all(n > sim._COMPACT_MIN_STALE for n in res[2])


def test_datagrams_due_at_one_time_come_in_the_order_they_were_sent(fast_fabric):
    """Three senders burst to one receiver over direct links of one delay: each
    burst's datagrams, and the bursts, are due at the same times, and come in
    the order they were made (the heap's ties go by ``seq``)."""
    def run(cls):
        fabric = cls(9, default_delay=2e-6)
        recv = ("10.7.0.1", 4791)
        senders = [_Burst((f"10.7.0.{i}", 4791), recv, 30, size=40 + i) for i in (2, 3, 4)]
        fabric.attach(sink := _Burst(recv))
        for d in senders:
            fabric.attach(d)
        fabric.run()
        return sink.got
    got = run(fast_fabric)
    assert len(got) == 90 and len({t for t, *_ in got}) == 1
    assert got == run(ReferenceFabric)


class _TupleSender(_Burst):
    """A ``_Burst`` whose output is a tuple of lists, not a list of tuples."""

    def datagrams_to_send(self, now):
        return tuple([data, dst] for data, dst in super().datagrams_to_send(now))


def test_a_device_may_give_its_output_as_any_iterable_of_pairs(fast_fabric):
    """The device interface's ``datagrams_to_send`` is iterated as pairs: a tuple
    of two-item lists is taken as a list of tuples is, and three items are an
    error, in either loop."""
    fabric = fast_fabric(2)
    recv = ("10.6.0.1", 4791)
    fabric.attach(sink := _Burst(recv))
    fabric.attach(_TupleSender(("10.6.0.2", 4791), recv, 5))
    fabric.run()
    assert [d for _, _, d in sink.got] == [bytes([i]) * 1000 for i in range(5)]

    class Triples(_Burst):
        def datagrams_to_send(self, now):
            return [(d, dst, 0) for d, dst in super().datagrams_to_send(now)]
    fabric.attach(Triples(("10.6.0.3", 4791), recv, 1))
    with pytest.raises(ValueError):
        fabric.run()


def test_a_fabric_counter_of_its_own_and_a_device_that_raises(fast_fabric):
    """The heap's ``seq`` from any callable the fabric is given (not only its
    ``itertools.count``), and a device's exception raised out of ``run`` as it
    was raised: that run's events are not added to ``events_processed``, the
    datagram being delivered is gone, and the next ``run`` delivers the rest."""
    calls = []

    def run(cls):
        fabric = cls(4)
        count = iter(range(1, 10 ** 6))

        def next_seq():
            calls.append(None)
            return next(count)
        fabric._next_seq = next_seq
        recv = ("10.5.0.1", 4791)
        fabric.attach(sink := _Burst(recv))
        fabric.attach(_Burst(("10.5.0.2", 4791), recv, 4))

        def fail_second(data, src, now, ecn=0, telemetry=None):
            if len(sink.got) == 1:
                sink.got.append("raised")
                raise RuntimeError("the device failed")
            sink.got.append((now, src, bytes(data)))
        sink.receive_datagram = fail_second
        with pytest.raises(RuntimeError, match="the device failed"):
            fabric.run()
        events = fabric.events_processed
        fabric.run()
        return sink.got, events, fabric.events_processed, fabric.counters
    fast = run(fast_fabric)
    assert len(calls) > 4
    got, events, after, _ = fast
    assert got[1] == "raised" and len(got) == 4 and events == 0 and after > 0
    assert fast == run(ReferenceFabric)


class _Fields(_Burst):
    """An ECN-capable sender of a burst whose datagrams differ in what travels
    beside their bytes: plain bytes, a Datagram with an ECN codepoint, one with
    INT records (``hops``), one with an ``echo``; and a receiver that keeps each
    as it arrives (its type, bytes and fields, and the ECN the fabric gives)."""

    ect = True

    def handle_timer(self, now):
        super().handle_timer(now)
        kinds = (lambda b: b, lambda b: Datagram(b, ecn=2),
                 lambda b: Datagram(b, ecn=1, hops=("a-hop",)),
                 lambda b: Datagram(b, ecn=2, echo=("an-echo",), hops=("h1", "h2")))
        self.out = [(kinds[i % 4](d), dst) for i, (d, dst) in enumerate(self.out)]

    def receive_datagram(self, data, src, now, ecn=0, telemetry=None):
        self.got.append((now, type(data).__name__, bytes(data), getattr(data, "ecn", None),
                         getattr(data, "hops", None), getattr(data, "echo", None), ecn,
                         hash(data) == hash(bytes(data)), len(data)))


def test_a_marked_datagram_keeps_its_bytes_and_fields(fast_fabric):
    """A switch port that RED marks (above Kmax every time, by chance between
    Kmin and Kmax) makes a CE copy of each datagram it marks: the same bytes,
    hops and echo in either loop, plain bytes made a Datagram."""
    def run(cls):
        fabric = cls(8)
        sw = fabric.add_switch("sw", buffer_bytes=None, red=sim.RED(2_000, 20_000, 0.5))
        recv = ("10.4.0.1", 4791)
        fabric.attach(sink := _Fields(recv))
        fabric.connect(recv, sw, rate_bps=10e9, delay=1e-6)
        for i in (2, 3):
            fabric.attach(d := _Fields((f"10.4.0.{i}", 4791), recv, 40, size=500 + i))
            fabric.connect(d.address, sw, rate_bps=10e9, delay=1e-6)
        fabric.run()
        return sink.got, fabric.counters, sw.port(recv).counters
    got, _, port = fast = run(fast_fabric)
    marked = [g for g in got if g[3] == 3]
    assert len(got) == 80 and 0 < port["marked"] == len(marked) < 80
    assert {g[1] for g in marked} == {"Datagram"}
    assert {g[4] for g in marked} == {None, ("a-hop",), ("h1", "h2")}
    assert ("an-echo",) in {g[5] for g in marked}
    assert all(g[7] for g in got)                   # hashed as their bytes are
    assert fast == run(ReferenceFabric)


def test_a_class_changed_between_runs_is_read_as_changed(fast_fabric, monkeypatch):
    """The compiled loop keeps where a class's slots are; a class changed after a
    run (here ``EgressQueue.red``, first a RED that never marks, made a property
    that marks everything) is read
    as Python reads it in the next run, in either loop."""
    def run(cls):
        fabric = cls(6)
        sw = fabric.add_switch("sw", buffer_bytes=None, red=sim.RED(10 ** 8, 10 ** 9))
        recv = ("10.3.0.1", 4791)
        fabric.attach(sink := _Fields(recv))
        fabric.connect(recv, sw, rate_bps=10e9, delay=1e-6)
        fabric.attach(d := _Fields(("10.3.0.2", 4791), recv, 20, size=700))
        fabric.connect(d.address, sw, rate_bps=40e9, delay=1e-6)    # a queue toward recv
        fabric.run()
        before = sum(g[3] == 3 for g in sink.got)
        with monkeypatch.context() as m:
            m.setattr(sim.EgressQueue, "red", property(lambda q: sim.RED(0, 1, 1.0)))
            d.at = fabric.now
            fabric.run()
        return before, sum(g[3] == 3 for g in sink.got[20:]), len(sink.got)
    fast = run(fast_fabric)
    assert fast == (0, 19, 40)        # all marked but the first (an empty queue)
    assert fast == run(ReferenceFabric)


def test_hosts_that_join_a_switch_after_talking_directly_then_cross_it(fast_fabric):
    """Two hosts exchange datagrams over their direct link (made when first
    used), then both join a switch: what they send next crosses the switch's
    port (queued, counted there), in either loop, as the reference loop has it."""
    def run(cls):
        fabric = cls(7)
        a, b = ("10.2.0.1", 4791), ("10.2.0.2", 4791)
        fabric.attach(sink := _Burst(a))
        fabric.attach(src := _Burst(b, a, 5, size=300))
        fabric.run()
        direct = len(sink.got)
        sw = fabric.add_switch("sw", buffer_bytes=None)
        fabric.connect(b, sw, rate_bps=1e9, delay=1e-6)
        fabric.connect(a, sw, rate_bps=1e9, delay=1e-6)
        src.at = fabric.now
        fabric.run()
        return direct, len(sink.got), dict(sw.port(a).counters), sink.got
    fast = run(fast_fabric)
    assert fast[:2] == (5, 10) and fast[2]["enqueued"] == 5
    assert fast == run(ReferenceFabric)


class PythonDevice(core_device.Device):
    """A device running the Python timers and drain (``core.timers.Timers``' and
    ``core.output.Output``'s own methods), whatever ``softnic.accel.give_compiled``
    made its class's."""

    arm = Timers.arm
    get_timer = Timers.get_timer
    handle_timer = Timers.handle_timer
    datagrams_to_send = Output.datagrams_to_send
    _outgoing = Output._outgoing


@pytest.mark.parametrize("kw", [
    dict(cc="dcqcn", buffer=96_000),
    dict(cc="hpcc"),
    dict(cc="none", selective_repeat=True, buffer=64_000),
], ids=["dcqcn-drops", "hpcc-int", "none-sr-drops"])
def test_the_compiled_timers_and_drain_run_an_incast_as_the_python(monkeypatch, kw):
    """The same incast with every device on the compiled timers and drain
    (``timers.c``, ``output.c``, as a fabric gives them) and on the Python's: the
    same deliveries, counts and result, and the compiled ones did run."""
    cfg = {"senders": 4, "duration": 0.002, **kw}
    compiled = _incast(monkeypatch, sim.Fabric, **cfg)
    for name in ("arm", "get_timer", "handle_timer", "datagrams_to_send", "_outgoing"):
        assert type(vars(core_device.Device)[name]).__name__ == "method_descriptor", name
    devices = []

    def made(*a, **k):
        devices.append(PythonDevice(*a, **k))
        return devices[-1]
    monkeypatch.setattr(ex, "Device", made)
    python = _incast(monkeypatch, sim.Fabric, **cfg)
    assert devices and type(devices[0]).datagrams_to_send is Output.datagrams_to_send
    assert compiled[1] == python[1]
    assert compiled[2] == python[2]
    assert compiled[0] == python[0]
