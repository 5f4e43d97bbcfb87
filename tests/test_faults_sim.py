"""Fault models (softnic.driver.faults) and the virtual-time fabric (softnic.transport.sim).

The fabric is driven with toy devices here, not the protocol engine.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softnic.driver.faults import COUNTER_NAMES, DEFAULT_QUEUE_BYTES, FaultInjector, FaultModel
from softnic.transport.sim import Fabric, TraceRecord

A = ("10.0.0.1", 4791)
B = ("10.0.0.2", 4791)
C = ("10.0.0.3", 4791)


def bit_distance(x: bytes, y: bytes) -> int:
    assert len(x) == len(y)
    return sum(bin(a ^ b).count("1") for a, b in zip(x, y))


def run_injector(model: FaultModel, n: int, seed: int = 1, size: int = 64, gap: float = 1e-3):
    """Send n datagrams ``gap`` apart; return the injector and, per datagram, its copies."""
    inj = FaultInjector(model, random.Random(seed))
    results = []
    for i in range(n):
        data = i.to_bytes(4, "big") + bytes(size - 4)
        results.append((i * gap, data, inj.apply(data, i * gap)))
    return inj, results


def loss_runs(lost: list[bool]) -> list[int]:
    runs, current = [], 0
    for x in lost:
        if x:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    if current:
        runs.append(current)
    return runs


# -- FaultModel ----------------------------------------------------------------


def test_none_is_default_and_prints_none():
    assert FaultModel.none() == FaultModel()
    assert FaultModel.none().is_none()
    assert str(FaultModel.none()) == "none"
    assert FaultModel.parse("none") == FaultModel.parse("") == FaultModel.parse("  ") == FaultModel.none()
    assert not FaultModel(jitter=1e-6).is_none()
    assert not FaultModel(rate_bps=1e9).is_none()


def test_times_print_in_the_unit_they_read_back_in():
    m = FaultModel.parse("reorder=0.005/20us,delay=2ms,jitter=1e-6")
    assert str(m) == "reorder=0.005/20us,delay=2ms,jitter=1us"
    assert FaultModel.parse(str(m)) == m
    odd = FaultModel(delay=1.5e-7)          # 150 * 1e-9 is not this float: the plain number
    assert str(odd) == "delay=1.5e-07" and FaultModel.parse(str(odd)) == odd


def test_parse_example_and_round_trip():
    m = FaultModel.parse("loss=0.02,dup=0.01,burst=0.01/0.3/0.8,rate=1e9,queue=65536,"
                         "reorder=0.05/1e-4,corrupt=0.001/3,delay=2e-5,jitter=1e-6")
    assert m == FaultModel(loss=0.02, duplicate=0.01, p_enter_bad=0.01, p_leave_bad=0.3,
                           loss_bad=0.8, rate_bps=1e9, queue_bytes=65536, reorder=0.05,
                           reorder_delay=1e-4, corrupt=0.001, corrupt_bits=3, delay=2e-5,
                           jitter=1e-6)
    assert FaultModel.parse(str(m)) == m


def test_parse_units_aliases_and_field_names():
    m = FaultModel.parse(" loss = 2% , delay=10us, jitter=1.5ms, rate=10Gbps, burst=0.1/0.5 ")
    assert m.loss == pytest.approx(0.02)
    assert m.delay == pytest.approx(10e-6)
    assert m.jitter == pytest.approx(1.5e-3)
    assert m.rate_bps == pytest.approx(10e9)
    assert (m.p_enter_bad, m.p_leave_bad, m.loss_bad) == (0.1, 0.5, 1.0)
    assert FaultModel.parse("rate=100M").rate_bps == pytest.approx(1e8)
    assert FaultModel.parse("delay=3ns").delay == pytest.approx(3e-9)
    assert FaultModel.parse("delay=2s").delay == 2.0
    assert FaultModel.parse("duplicate=0.5,reorder_delay=1e-3,reorder=0.1,corrupt_bits=4") == \
        FaultModel(duplicate=0.5, reorder=0.1, reorder_delay=1e-3, corrupt_bits=4)
    assert FaultModel.parse("corrupt=0.5") == FaultModel(corrupt=0.5, corrupt_bits=1)
    assert FaultModel.parse("queue=1e4").queue_bytes == 10000


def test_ints_are_stored_as_floats():
    m = FaultModel(loss=1, delay=2, rate_bps=1000)
    assert isinstance(m.loss, float) and isinstance(m.delay, float) and isinstance(m.rate_bps, float)
    assert str(m) == "loss=1.0,delay=2.0,rate=1000.0"


@pytest.mark.parametrize("kwargs, message", [
    ({"loss": 1.5}, "loss is a probability"),
    ({"loss": -0.01}, "loss is a probability"),
    ({"loss": math.nan}, "NaN"),
    ({"p_enter_bad": 2.0}, "p_enter_bad"),
    ({"p_leave_bad": -1.0}, "p_leave_bad"),
    ({"loss_bad": 1.01}, "loss_bad"),
    ({"duplicate": 7.0}, "duplicate"),
    ({"corrupt": -0.5}, "corrupt"),
    ({"delay": -1e-6}, "delay is a time"),
    ({"jitter": math.inf}, "jitter is a time"),
    ({"reorder": 0.1}, "needs reorder_delay > 0"),
    ({"reorder": 0.1, "reorder_delay": -1.0}, "reorder_delay"),
    ({"corrupt_bits": 0}, "corrupt_bits"),
    ({"corrupt_bits": 1.5}, "corrupt_bits"),
    ({"rate_bps": 0.0}, "rate_bps"),
    ({"rate_bps": -5.0}, "rate_bps"),
    ({"queue_bytes": -1}, "queue_bytes"),
])
def test_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FaultModel(**kwargs)


def test_validation_rejects_non_numbers():
    with pytest.raises(TypeError, match="loss must be a number"):
        FaultModel(loss="0.1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay must be a number"):
        FaultModel(delay=True)


@pytest.mark.parametrize("text, message", [
    ("loss", "not KEY=VALUE"),
    ("loss=", "not KEY=VALUE"),
    ("lose=0.1", "unknown fault spec key 'lose'"),
    ("loss=abc", "loss=abc"),
    ("loss=0.1,loss=0.2", "sets loss twice"),
    ("dup=0.1,duplicate=0.2", "sets duplicate twice"),
    ("burst=0.1", "P_ENTER_BAD/P_LEAVE_BAD/LOSS_BAD"),
    ("burst=0.1/0.2/0.3/0.4", "P_ENTER_BAD/P_LEAVE_BAD/LOSS_BAD"),
    ("corrupt=0.1/2.5", "not a whole number"),
    ("loss=1.5", "loss is a probability"),
    ("reorder=0.5", "needs reorder_delay"),
])
def test_parse_errors(text, message):
    with pytest.raises(ValueError, match=message):
        FaultModel.parse(text)


probability = st.floats(0.0, 1.0)
duration = st.floats(0.0, 10.0)


@st.composite
def fault_models(draw):
    reorder = draw(probability)
    reorder_delay = draw(st.floats(1e-9, 1.0) if reorder > 0 else duration)
    return FaultModel(
        loss=draw(probability), p_enter_bad=draw(probability), p_leave_bad=draw(probability),
        loss_bad=draw(probability), reorder=reorder, reorder_delay=reorder_delay,
        duplicate=draw(probability), corrupt=draw(probability),
        corrupt_bits=draw(st.integers(1, 64)), delay=draw(duration), jitter=draw(duration),
        rate_bps=draw(st.none() | st.floats(1.0, 1e12)),
        queue_bytes=draw(st.just(DEFAULT_QUEUE_BYTES) | st.integers(0, 1 << 30)),
    )


# Explicit example counts: these are cheap checks, and the deep profile's
# budget is meant for the engine's properties.
@settings(max_examples=500)
@given(fault_models())
def test_str_parse_round_trip(model):
    assert FaultModel.parse(str(model)) == model


@settings(max_examples=500)
@given(fault_models(), st.binary(max_size=64), st.integers(0, 2**32), st.floats(0.0, 1e3))
def test_apply_invariants(model, data, seed, now):
    inj = FaultInjector(model, random.Random(seed))
    copies = inj.apply(data, now)
    assert len(copies) <= 2
    extra = model.jitter + model.reorder_delay
    if model.rate_bps is not None:
        extra += len(data) * 8 / model.rate_bps
    for at, copy in copies:
        assert now + model.delay <= at <= now + model.delay + extra + 1e-9
        assert len(copy) == len(data)
        assert bit_distance(copy, data) <= model.corrupt_bits
    c = inj.counters
    assert set(c) == set(COUNTER_NAMES)
    assert c["sent"] == 1
    assert c["delivered"] == len(copies)
    dropped = c["dropped_loss"] + c["dropped_burst"] + c["dropped_queue"]
    assert c["delivered"] == 1 - dropped + c["duplicated"]


# -- FaultInjector ---------------------------------------------------------------


def test_none_model_passes_the_same_object_through():
    inj = FaultInjector(FaultModel.none(), random.Random(0))
    data = b"abc"
    assert inj.apply(data, 5.0) == [(5.0, data)]
    assert inj.apply(data, 5.0)[0][1] is data
    assert inj.counters["sent"] == inj.counters["delivered"] == 2


@pytest.mark.parametrize("p", [0.01, 0.1, 0.5])
def test_loss_rate_is_close_to_p(p):
    n = 20000
    inj, results = run_injector(FaultModel(loss=p), n)
    lost = sum(1 for _, _, copies in results if not copies)
    assert lost == inj.counters["dropped_loss"]
    assert inj.counters["dropped_burst"] == 0
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(lost / n - p) < 5 * sigma


def test_loss_one_drops_everything_and_zero_nothing():
    _, results = run_injector(FaultModel(loss=1.0), 500)
    assert all(copies == [] for _, _, copies in results)
    _, results = run_injector(FaultModel(jitter=1e-9), 500)
    assert all(len(copies) == 1 for _, _, copies in results)


def test_gilbert_elliott_makes_longer_loss_runs_than_iid_at_same_rate():
    n = 50000
    # Stationary P(bad) = 0.01 / (0.01 + 0.2) ~ 0.048; mean stay in bad = 5 datagrams.
    ge = FaultModel(p_enter_bad=0.01, p_leave_bad=0.2, loss_bad=1.0)
    ge_inj, ge_results = run_injector(ge, n, seed=7)
    ge_lost = [not copies for _, _, copies in ge_results]
    ge_rate = sum(ge_lost) / n
    assert ge_inj.counters["dropped_burst"] == sum(ge_lost)
    assert ge_inj.counters["dropped_loss"] == 0
    assert abs(ge_rate - 0.01 / 0.21) < 0.015

    iid_inj, iid_results = run_injector(FaultModel(loss=ge_rate), n, seed=7)
    iid_lost = [not copies for _, _, copies in iid_results]
    assert abs(sum(iid_lost) / n - ge_rate) < 0.01

    ge_runs, iid_runs = loss_runs(ge_lost), loss_runs(iid_lost)
    ge_mean = sum(ge_runs) / len(ge_runs)
    iid_mean = sum(iid_runs) / len(iid_runs)
    assert ge_mean > 3.5        # ~5 expected
    assert iid_mean < 1.2       # ~1/(1-p) ~ 1.05 expected
    assert max(ge_runs) > max(iid_runs)


def test_gilbert_elliott_good_state_uses_loss():
    # Bad state is lossless here, so every drop is a good-state loss.
    inj, results = run_injector(FaultModel(loss=0.2, p_enter_bad=0.5, p_leave_bad=0.5, loss_bad=0.0), 10000)
    assert inj.counters["dropped_burst"] == 0
    assert 0.08 < inj.counters["dropped_loss"] / 10000 < 0.12  # ~ 0.2 * P(good) = 0.1


def test_duplication_count_and_copies():
    n = 10000
    inj, results = run_injector(FaultModel(duplicate=0.2), n)
    doubled = [copies for _, _, copies in results if len(copies) == 2]
    assert len(doubled) == inj.counters["duplicated"]
    assert abs(len(doubled) / n - 0.2) < 0.02
    for (_, data, copies) in results:
        assert all(copy == data for _, copy in copies)
    assert inj.counters["delivered"] == n + len(doubled)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_corruption_flips_one_to_k_bits(k):
    n = 3000
    inj, results = run_injector(FaultModel(corrupt=0.3, corrupt_bits=k), n, size=32)
    flipped = [bit_distance(copy, data) for _, data, [(_, copy)] in results if copy != data]
    assert len(flipped) == inj.counters["corrupted"]
    assert abs(len(flipped) / n - 0.3) < 0.03
    assert all(1 <= d <= k for d in flipped)
    assert set(flipped) == set(range(1, k + 1))  # every count from 1 to k occurs


def test_corruption_handles_tiny_and_empty_datagrams():
    inj = FaultInjector(FaultModel(corrupt=1.0, corrupt_bits=64), random.Random(3))
    [(_, copy)] = inj.apply(b"\x00", 0.0)
    assert 1 <= bit_distance(copy, b"\x00") <= 8
    assert inj.apply(b"", 0.0) == [(0.0, b"")]
    assert inj.counters["corrupted"] == 1


def test_reorder_holds_back_by_reorder_delay():
    n = 4000
    model = FaultModel(reorder=0.25, reorder_delay=5e-3, delay=1e-3)
    inj, results = run_injector(model, n)
    held = 0
    for sent_at, _, [(at, _)] in results:
        if at == pytest.approx(sent_at + 6e-3):
            held += 1
        else:
            assert at == pytest.approx(sent_at + 1e-3)
    assert held == inj.counters["reordered"]
    assert abs(held / n - 0.25) < 0.03
    # Sent 1 ms apart, a held datagram is overtaken by the next five.
    arrivals = sorted((at, i) for i, (_, _, [(at, _)]) in enumerate(results))
    order = [i for _, i in arrivals]
    assert order != sorted(order)


def test_delay_and_jitter_bounds():
    model = FaultModel(delay=1e-3, jitter=2e-4)
    inj, results = run_injector(model, 5000)
    offsets = [at - sent for sent, _, [(at, _)] in results]
    assert all(1e-3 <= o < 1.2e-3 + 1e-12 for o in offsets)
    assert min(offsets) < 1e-3 + 1e-5 and max(offsets) > 1.2e-3 - 1e-5
    mean = sum(offsets) / len(offsets)
    assert abs(mean - 1.1e-3) < 5e-6


def test_rate_limit_spaces_packets_and_drops_beyond_queue():
    rate = 8e6  # one byte per microsecond
    inj = FaultInjector(FaultModel(rate_bps=rate, queue_bytes=5000), random.Random(0))
    out = [inj.apply(bytes(1000), 0.0) for _ in range(8)]
    # The first five fill the 5000-byte queue; the rest are tail-dropped.
    assert [len(o) for o in out] == [1, 1, 1, 1, 1, 0, 0, 0]
    times = [o[0][0] for o in out if o]
    assert times == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3, 5e-3])
    assert inj.counters["dropped_queue"] == 3
    assert inj.queued_bytes(0.0) == 5000
    # At 2.5 ms two have left: room for two more, which queue behind the rest.
    assert inj.queued_bytes(2.5e-3) == 3000
    assert inj.apply(bytes(1000), 2.5e-3)[0][0] == pytest.approx(6e-3)
    assert inj.apply(bytes(1000), 2.5e-3)[0][0] == pytest.approx(7e-3)
    assert inj.apply(bytes(1000), 2.5e-3) == []
    # Once idle, a datagram leaves after its own serialization time only.
    [(at, _)] = inj.apply(bytes(500), 1.0)
    assert at == pytest.approx(1.0 + 500e-6)


def test_rate_limit_spacing_depends_on_size_and_adds_delay():
    inj = FaultInjector(FaultModel(rate_bps=1e9, delay=1e-5), random.Random(0))
    sizes = [64, 1500, 4096, 256]
    times = [inj.apply(bytes(s), 0.0)[0][0] for s in sizes]
    expected, t = [], 0.0
    for s in sizes:
        t += s * 8 / 1e9
        expected.append(t + 1e-5)
    assert times == pytest.approx(expected, rel=1e-12)


def test_zero_queue_drops_whatever_arrives_while_busy():
    inj = FaultInjector(FaultModel(rate_bps=8e6, queue_bytes=0), random.Random(0))
    assert len(inj.apply(bytes(100), 0.0)) == 1   # idle link takes it
    assert inj.apply(bytes(100), 50e-6) == []      # still serializing the first
    assert len(inj.apply(bytes(100), 100e-6)) == 1


def test_injector_is_deterministic_and_uses_only_its_rng(monkeypatch):
    model = FaultModel.parse("loss=0.1,dup=0.1,corrupt=0.1/4,jitter=1e-5,reorder=0.1/1e-4,burst=0.01/0.3/0.8")
    _, first = run_injector(model, 2000, seed=42)

    def forbidden(*args, **kwargs):
        raise AssertionError("global random used")

    for name in ("random", "randint", "sample", "uniform", "choice", "getrandbits", "randrange"):
        monkeypatch.setattr(random, name, forbidden)
    _, second = run_injector(model, 2000, seed=42)
    assert first == second
    _, other = run_injector(model, 2000, seed=43)
    assert other != first


# -- Fabric: toy devices -------------------------------------------------------


class Toy:
    """A minimal device: an outbox the test fills, an inbox, one timer."""

    def __init__(self, address, *, echo=0, log=None):
        self.address = address
        self.outbox: list[tuple[bytes, tuple[str, int]]] = []
        self.inbox: list[tuple[float, bytes, tuple[str, int]]] = []
        self.fired: list[float] = []
        self.deadline: float | None = None
        self.echo = echo          # how many more datagrams to bounce back
        self.rearm_on_receive: float | None = None
        self.on_timer = None
        self.log = log

    def send(self, data, dst):
        self.outbox.append((data, dst))

    def receive_datagram(self, data, src, now):
        self.inbox.append((now, data, src))
        if self.log is not None:
            self.log.append(("rx", self.address, now))
        if self.echo:
            self.echo -= 1
            self.outbox.append((data, src))
        if self.rearm_on_receive is not None:
            self.deadline = now + self.rearm_on_receive

    def datagrams_to_send(self, now):
        out, self.outbox = self.outbox, []
        return out

    def get_timer(self):
        return self.deadline

    def handle_timer(self, now):
        assert self.deadline is not None and now >= self.deadline, "timer fired early or unarmed"
        self.fired.append(now)
        if self.log is not None:
            self.log.append(("timer", self.address, now))
        self.deadline = None
        if self.on_timer is not None:
            self.on_timer(self, now)


def make(seed=0, n=2, **kwargs):
    fabric = Fabric(seed, **kwargs)
    devices = [Toy(addr) for addr in (A, B, C)[:n]]
    for d in devices:
        fabric.attach(d)
    return fabric, devices


def test_ping_pong_timing_and_counters():
    fabric, (a, b) = make(default_delay=1e-5)
    a.echo = b.echo = 5
    a.send(b"ping", B)
    end = fabric.run()
    # a->b, then 5 echoes from b and 5 from a, alternating: 11 hops.
    assert end == pytest.approx(11e-5)
    assert [t for t, _, _ in b.inbox] == pytest.approx([1e-5, 3e-5, 5e-5, 7e-5, 9e-5, 11e-5])
    assert all(src == A for _, _, src in b.inbox)
    c = fabric.counters
    assert c["sent"] == c["delivered"] == c["received"] == 11
    assert fabric.link_counters(A, B)["sent"] == 6
    assert fabric.link_counters(B, A)["sent"] == 5
    assert fabric.events_processed == 11
    assert fabric.trace == []   # not asked for


def test_run_flushes_output_left_by_calls_between_runs():
    fabric, (a, b) = make()
    fabric.run()
    a.send(b"x", B)          # a verbs-like call outside run()
    a.deadline = 1.0
    fabric.run()
    assert [d for _, d, _ in b.inbox] == [b"x"]
    assert a.fired == [1.0]
    assert fabric.now == 1.0


def test_flush_sends_without_running():
    fabric, (a, b) = make()
    a.send(b"x", B)
    fabric.flush()
    assert b.inbox == []
    assert fabric.next_event_time() == pytest.approx(1e-6)
    fabric.run()
    assert len(b.inbox) == 1


def test_unknown_destination_is_counted_not_raised():
    fabric, (a, b) = make(trace=True)
    a.send(b"lost", ("10.9.9.9", 4791))
    a.send(b"here", B)
    fabric.run()
    assert fabric.counters["dropped_unknown"] == 1
    assert len(b.inbox) == 1
    assert TraceRecord(0.0, "drop", A, ("10.9.9.9", 4791), b"lost") in fabric.trace


def test_timer_rearmed_earlier_fires_once_at_new_deadline():
    fabric, (a, _) = make()
    a.deadline = 5.0
    fabric.flush()
    a.deadline = 3.0
    assert fabric.run() == 3.0
    assert a.fired == [3.0]


def test_timer_rearmed_later_does_not_fire_at_old_deadline():
    fabric, (a, _) = make()
    a.deadline = 3.0
    fabric.flush()
    a.deadline = 7.0
    assert fabric.run(until=5.0) == 5.0
    assert a.fired == []
    assert fabric.run() == 7.0
    assert a.fired == [7.0]


def test_cancelled_timer_never_fires_nor_moves_the_clock():
    fabric, (a, b) = make()
    a.deadline = 3.0
    fabric.flush()
    a.deadline = None
    a.send(b"x", B)
    assert fabric.run() == pytest.approx(1e-6)
    assert a.fired == []
    assert fabric.next_event_time() is None
    assert not fabric.pending()


def test_timer_moved_back_and_forth():
    fabric, (a, _) = make()
    for deadline in (4.0, 2.0, 6.0, 1.0, 9.0, 5.0):
        a.deadline = deadline
        fabric.flush()
    assert fabric.run() == 5.0
    assert a.fired == [5.0]
    assert fabric.events_processed == 1


def test_timer_rearmed_on_every_packet_fires_after_the_last():
    fabric, (a, b) = make(default_delay=1e-6)
    a.echo = b.echo = 50
    a.rearm_on_receive = b.rearm_on_receive = 1e-3
    a.send(b"p", B)
    fabric.run()
    assert b.fired == [pytest.approx(b.inbox[-1][0] + 1e-3)]
    assert a.fired == [pytest.approx(a.inbox[-1][0] + 1e-3)]
    assert fabric.events_processed == 101 + 2


def test_deadline_in_the_past_fires_now():
    fabric, (a, _) = make()
    a.deadline = 2.0
    fabric.run()
    a.deadline = 0.5       # already past
    assert fabric.run() == 2.0
    assert a.fired == [2.0, 2.0]


def test_timers_fire_in_time_order_and_ties_in_arming_order():
    log = []
    fabric = Fabric(0)
    devices = [Toy(addr, log=log) for addr in (A, B, C)]
    for d in devices:
        fabric.attach(d)
    devices[0].deadline, devices[1].deadline, devices[2].deadline = 3.0, 1.0, 2.0
    fabric.run()
    assert [(addr, t) for _, addr, t in log] == [(B, 1.0), (C, 2.0), (A, 3.0)]
    log.clear()
    for d in devices:
        d.deadline = 10.0
    fabric.run()
    assert [addr for _, addr, _ in log] == [A, B, C]


def test_ties_between_timers_and_deliveries_follow_scheduling_order():
    log = []
    fabric = Fabric(0, default_delay=5.0)
    a, b = Toy(A, log=log), Toy(B, log=log)
    fabric.attach(a)
    fabric.attach(b)
    a.deadline = 5.0
    fabric.flush()               # an entry at 5.0 ...
    a.deadline = 3.0
    b.send(b"x", A)              # ... a delivery due at 5.0 ...
    fabric.flush()

    def rearm(dev, now):
        if now < 5.0:
            dev.deadline = 5.0   # ... and a timer for 5.0 armed after the delivery was sent

    a.on_timer = rearm
    fabric.run(max_events=10)
    assert log == [("timer", A, 3.0), ("rx", A, 5.0), ("timer", A, 5.0)]


def test_moving_a_timer_later_does_not_grow_the_heap():
    fabric, (a, _) = make()
    for i in range(1000):
        a.deadline = 1.0 + i
        fabric.flush()
    assert len(fabric._heap) == 1
    assert fabric.run() == 1000.0
    assert a.fired == [1000.0]
    assert fabric.events_processed == 1


def test_timer_can_send_and_rearm():
    fabric, (a, b) = make()

    def tick(dev, now):
        dev.send(f"{now:.1f}".encode(), B)
        if now < 3.0:
            dev.deadline = now + 1.0

    a.on_timer = tick
    a.deadline = 1.0
    fabric.run()
    assert a.fired == [1.0, 2.0, 3.0]
    assert [d for _, d, _ in b.inbox] == [b"1.0", b"2.0", b"3.0"]
    assert [t for t, _, _ in b.inbox] == pytest.approx([1.0 + 1e-6, 2.0 + 1e-6, 3.0 + 1e-6])


def test_same_time_deliveries_keep_send_order():
    fabric, (a, b) = make()
    for i in range(100):
        a.send(bytes([i]), B)
    fabric.run()
    assert [d[0] for _, d, _ in b.inbox] == list(range(100))


def test_run_until_stops_before_later_events_and_resumes():
    fabric, (a, b) = make(default_delay=1.0)
    a.echo = b.echo = 10
    a.send(b"p", B)
    assert fabric.run(until=3.5) == 3.5
    assert len(b.inbox) + len(a.inbox) == 3
    assert fabric.run(until=3.5) == 3.5            # nothing due
    assert fabric.run(until=5.0) == 5.0            # the event at exactly 5.0 runs
    assert len(b.inbox) + len(a.inbox) == 5
    assert fabric.run() == 21.0
    assert fabric.run(until=30.0) == 30.0          # idle: the clock still moves to until
    assert fabric.run() == 30.0


def test_run_stop_and_max_events():
    fabric, (a, b) = make(default_delay=1.0)
    a.echo = b.echo = 100
    a.send(b"p", B)
    assert fabric.run(stop=lambda: len(a.inbox) == 3) == 6.0
    assert len(a.inbox) == 3 and len(b.inbox) == 3
    assert fabric.run(stop=lambda: True) == 6.0    # checked before the first event
    assert fabric.run(until=100.0, max_events=4) == 10.0
    assert fabric.events_processed == 10


def test_set_link_overrides_one_direction():
    fabric, (a, b) = make(default_delay=1e-6)
    fabric.set_link(A, B, FaultModel(loss=1.0), both_directions=False)
    fabric.set_link(B, A, delay=5e-3, both_directions=False)
    for i in range(10):
        a.send(b"x", B)
        b.send(b"y", A)
    fabric.run()
    assert b.inbox == []
    assert len(a.inbox) == 10 and all(t == pytest.approx(5e-3) for t, _, _ in a.inbox)
    assert fabric.link_counters(A, B)["dropped_loss"] == 10
    assert fabric.link_counters(B, A)["delivered"] == 10


def test_set_link_both_directions_and_default_faults():
    fabric, (a, b, c) = make(n=3, default_faults=FaultModel(loss=1.0))
    fabric.set_link(A, B, FaultModel.none())
    a.send(b"1", B)
    b.send(b"2", A)
    a.send(b"3", C)
    fabric.run()
    assert len(a.inbox) == len(b.inbox) == 1
    assert c.inbox == []


class EveryOther:
    """A test's own injector: drops odd-numbered datagrams, holds the rest 1 ms."""

    def __init__(self):
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)

    def apply(self, data, now):
        i = self.counters["sent"]
        self.counters["sent"] += 1
        if i % 2:
            self.counters["dropped_loss"] += 1
            return []
        self.counters["delivered"] += 1
        return [(now + 1e-3, data)]


@pytest.mark.parametrize("tracing", [False, True])
def test_set_injector_sees_every_datagram_of_one_direction(tracing):
    fabric, (a, b) = make(default_delay=1e-6, trace=tracing)
    custom = EveryOther()
    fabric.set_injector(A, B, custom)   # a perfect link by default: not skipped all the same
    for i in range(6):
        a.send(bytes([i]), B)
        b.send(bytes([i]), A)
    fabric.run()
    assert [d for _, d, _ in b.inbox] == [bytes([i]) for i in (0, 2, 4)]
    assert [t for t, _, _ in b.inbox] == pytest.approx([1e-3 + 1e-6] * 3)
    assert len(a.inbox) == 6                           # b -> a is untouched
    assert fabric.injector(A, B) is custom
    assert fabric.link_counters(A, B) == dict(custom.counters)
    assert custom.counters["sent"] == 6 and custom.counters["dropped_loss"] == 3
    c = fabric.counters
    assert (c["sent"], c["delivered"], c["dropped_loss"], c["received"]) == (12, 9, 3, 9)
    if tracing:
        assert [r.kind for r in fabric.trace].count("drop") == 3


def test_set_injector_before_the_link_exists_and_set_link_replaces_it():
    fabric, (a, b) = make()
    fabric.detach(B)
    custom = EveryOther()
    fabric.set_injector(A, B, custom)
    fabric.attach(b)
    a.send(b"0", B)
    a.send(b"1", B)
    fabric.run()
    assert [d for _, d, _ in b.inbox] == [b"0"]
    fabric.set_link(A, B, FaultModel.none(), both_directions=False)
    a.send(b"2", B)
    a.send(b"3", B)
    fabric.run()
    assert [d for _, d, _ in b.inbox] == [b"0", b"2", b"3"]
    assert fabric.injector(A, B) is not custom and custom.counters["sent"] == 2


def test_directions_get_different_random_streams():
    fabric, (a, b) = make(default_faults=FaultModel(loss=0.5))
    ab = fabric.injector(A, B).rng.random()
    ba = fabric.injector(B, A).rng.random()
    assert ab != ba


def test_default_rate_spaces_deliveries():
    fabric, (a, b) = make(default_delay=1e-6, default_rate_bps=8e9)  # one byte per ns
    for _ in range(4):
        a.send(bytes(1000), B)
    fabric.run()
    times = [t for t, _, _ in b.inbox]
    assert times == pytest.approx([1e-6 + k * 1e-6 for k in (1, 2, 3, 4)])


def test_link_model_rate_wins_over_default_rate():
    fabric, (a, b) = make(default_delay=0.0, default_rate_bps=8e9)
    fabric.set_link(A, B, FaultModel(rate_bps=8e6))
    a.send(bytes(1000), B)
    fabric.run()
    assert b.inbox[0][0] == pytest.approx(1e-3)


def test_reordering_on_the_fabric():
    fabric, (a, b) = make(default_faults=FaultModel(reorder=0.3, reorder_delay=1e-5))
    for i in range(200):
        a.send(i.to_bytes(2, "big"), B)
        fabric.run(until=fabric.now + 1e-6)
    fabric.run()
    order = [int.from_bytes(d, "big") for _, d, _ in b.inbox]
    assert sorted(order) == list(range(200))
    assert order != list(range(200))


def test_capture_hook_sees_every_delivery():
    class Capture:
        def __init__(self):
            self.records = []

        def record(self, datagram, src, dst, now):
            self.records.append((datagram, src, dst, now))

    cap = Capture()
    fabric, (a, b) = make(capture=cap, default_faults=FaultModel(loss=0.3, duplicate=0.2))
    a.echo = b.echo = 1000
    for i in range(20):
        a.send(bytes([i]), B)
    fabric.run(until=1.0)
    delivered = [(d, src, dst.address, t) for dst in (a, b) for t, d, src in dst.inbox]
    assert sorted(cap.records) == sorted(delivered)
    assert len(cap.records) == fabric.counters["received"] > 0


def test_trace_records_every_kind():
    model = FaultModel(loss=0.2, duplicate=0.2, corrupt=0.2, corrupt_bits=2)
    fabric, (a, b) = make(trace=True, default_faults=model)
    for i in range(200):
        a.send(i.to_bytes(4, "big"), B)
    fabric.run()
    kinds = {r.kind for r in fabric.trace}
    assert kinds == {"send", "drop", "deliver", "corrupt", "dup"}
    c = fabric.link_counters(A, B)
    count = lambda k: sum(r.kind == k for r in fabric.trace)  # noqa: E731
    assert count("send") == c["sent"] == 200
    assert count("drop") == c["dropped_loss"]
    assert count("dup") == c["duplicated"]
    assert count("corrupt") == c["corrupted"]
    assert count("deliver") == c["delivered"] == len(b.inbox)
    for r in fabric.trace:
        assert isinstance(r, TraceRecord) and r.src == A and r.dst == B


def test_detach_drops_in_flight_and_later_datagrams():
    fabric, (a, b) = make(default_delay=1.0)
    b.deadline = 0.5
    a.send(b"x", B)
    fabric.flush()
    assert fabric.detach(B) is b
    a.send(b"y", B)
    fabric.run()
    assert b.inbox == [] and b.fired == []
    assert fabric.counters["dropped_unknown"] == 2
    fabric.attach(b)
    a.send(b"z", B)
    fabric.run()
    assert [d for _, d, _ in b.inbox] == [b"z"]


def test_attach_twice_is_an_error():
    fabric, _ = make()
    with pytest.raises(ValueError, match="already attached"):
        fabric.attach(Toy(A))


def test_many_earlier_rearms_keep_the_heap_small():
    fabric, (a, _) = make()
    for i in range(20000):
        a.deadline = 1e6 - i
        fabric.flush()
    assert len(fabric._heap) < 10000
    fabric.run()
    assert a.fired == [1e6 - 19999]


LOSSY = FaultModel.parse("loss=0.05,dup=0.05,corrupt=0.05/3,jitter=2e-6,reorder=0.05/5e-6,burst=0.01/0.4/0.7")


def lossy_trace(seed: int) -> list[TraceRecord]:
    fabric, (a, b, c) = make(seed, n=3, trace=True, default_faults=LOSSY)
    a.echo, b.echo, c.echo = 300, 300, 300
    a.rearm_on_receive = 1e-4
    for i in range(30):
        a.send(i.to_bytes(4, "big"), B)
        c.send(i.to_bytes(4, "big"), A)
    fabric.run()
    return fabric.trace


def test_same_seed_same_trace_different_seed_different_trace():
    first = lossy_trace(11)
    assert len(first) > 200
    assert lossy_trace(11) == first
    assert lossy_trace(12) != first


def test_trace_does_not_depend_on_string_hash_randomization():
    script = textwrap.dedent("""
        import hashlib, sys
        sys.path.insert(0, sys.argv[1])
        from tests.test_faults_sim import lossy_trace
        print(hashlib.sha256(repr(lossy_trace(5)).encode()).hexdigest())
    """)
    root = str(Path(__file__).resolve().parent.parent)
    digests = set()
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        out = subprocess.run([sys.executable, "-c", script, root], env=env, check=True,
                             capture_output=True, text=True, cwd=root)
        digests.add(out.stdout.strip())
    digests.add(hashlib.sha256(repr(lossy_trace(5)).encode()).hexdigest())
    assert len(digests) == 1


def test_repr_names_only_what_differs_and_replays():
    m = FaultModel(loss=0.02, reorder=0.01, reorder_delay=1e-4, corrupt_bits=3)
    assert repr(m) == "FaultModel(loss=0.02, reorder=0.01, reorder_delay=0.0001, corrupt_bits=3)"
    assert eval(repr(m)) == m
    assert repr(FaultModel()) == "FaultModel()"
