"""Congestion controllers, each driven alone by a fake clock.

Expected values are computed here from the published formulas, step by step,
not read back from the controller.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import congestion
from congestion import CONTROLLERS, Controller, FlowInfo, create, from_spec, parse_spec
from congestion.dcqcn import DCQCN
from congestion.params import markdown_table, parse_value

LINE = 100e9
FLOW = FlowInfo(line_rate_bps=LINE, mtu=4096, base_rtt=10e-6)
US = 1e-6


class FakeClock:
    """Virtual time that drives one controller's timer the way the engine does."""

    def __init__(self, cc: Controller, now: float = 0.0) -> None:
        self.cc = cc
        self.now = now
        self.fired: list[float] = []

    def advance_to(self, t: float) -> None:
        """Fire every timer due by ``t`` at its own time, then stop at ``t``.

        ``t`` is usually written as ``k * 55 * US``, a float a hair off the
        controller's own sum, so "due by t" allows a picosecond.
        """
        assert t >= self.now
        while (due := self.cc.next_timer()) is not None and due <= t + 1e-12:
            assert due >= self.now - 1e-12, "a timer was asked for in the past"
            self.now = max(due, self.now)
            self.fired.append(due)
            self.cc.on_timer(now=due)
        self.now = t


# ---------------------------------------------------------------- registry --

def test_registry_is_explicit_and_names_match():
    assert set(CONTROLLERS) >= {"none", "dcqcn"}
    assert CONTROLLERS["none"] is Controller
    for name, cls in CONTROLLERS.items():
        assert cls.name == name
        assert isinstance(create(name, FLOW), cls)


def test_none_never_limits_and_takes_no_parameters():
    cc = create("none", FLOW)
    cc.on_cnp(now=0.0)
    cc.on_loss(now=0.0, kind="timeout")
    assert (cc.rate, cc.window, cc.next_timer()) == (None, None, None)
    assert cc.on_ecn(now=0.0) is False
    with pytest.raises(ValueError, match="g"):
        create("none", FLOW, g=0.5)


def test_unknown_controller_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        create("cubic", FLOW)
    for name in CONTROLLERS:
        assert name in str(err.value)
    assert "cubic" in str(err.value)


def test_parse_spec_plain_name():
    assert parse_spec("dcqcn") == ("dcqcn", {})
    assert parse_spec("  none ") == ("none", {})


def test_parse_spec_units():
    name, params = parse_spec("dcqcn:g=0.00390625,t_inc=55us,rai=40Mbps")
    assert name == "dcqcn"
    assert params == {"g": 1 / 256, "t_inc": 55e-6, "rai": 40e6}
    _, params = parse_spec("dcqcn: byte_counter = 10MiB , t_alpha=0.1ms, rhai=1Gbps, min_rate=5Kbps")
    assert params == {"byte_counter": 10 * 1024 * 1024, "t_alpha": 100e-6,
                      "rhai": 1e9, "min_rate": 5e3}
    _, params = parse_spec("dcqcn:byte_counter=64KB,cnp_interval=1500ns,t_dec=2s")
    assert params == {"byte_counter": 64_000, "cnp_interval": 1.5e-6, "t_dec": 2.0}
    _, params = parse_spec("dcqcn:byte_counter=1000,t_inc=0.001,rai=1e6")   # bare: base units
    assert params == {"byte_counter": 1000, "t_inc": 1e-3, "rai": 1e6}


@pytest.mark.parametrize("spec, words", [
    ("", ["no controller name"]),
    (":g=0.5", ["no controller name"]),
    ("dcqcn:", ["nothing after"]),
    ("dcqcn:g", ["key=value", "'g'"]),
    ("dcqcn:g=", ["key=value"]),
    ("dcqcn:=0.5", ["key=value"]),
    ("dcqcn:g=0.5,", ["key=value"]),
    ("dcqcn:g=0.5,g=0.25", ["twice", "'g'"]),
    ("dcqcn:bogus=1", ["bogus", "t_inc"]),
    ("reno:g=1", ["reno", "dcqcn"]),
    ("dcqcn:t_inc=5Mbps", ["t_inc", "Mbps", "time"]),
    ("dcqcn:rai=55us", ["rai", "rate"]),
    ("dcqcn:byte_counter=1.5B", ["byte_counter", "whole"]),
    ("dcqcn:f=2.5", ["f", "integer"]),
    ("dcqcn:g=2", ["g", "<= 1"]),
    ("dcqcn:g=fast", ["g", "not a number"]),
    ("dcqcn:t_inc=-1us", ["t_inc", "> 0"]),
])
def test_parse_spec_rejects(spec, words):
    with pytest.raises(ValueError) as err:
        parse_spec(spec)
    for word in words:
        assert word in str(err.value)


def test_parse_spec_needs_text():
    with pytest.raises(ValueError):
        parse_spec(None)


def test_from_spec_builds_the_controller():
    cc = from_spec("dcqcn:alpha_init=0.5,min_rate=1Gbps", FLOW)
    assert isinstance(cc, DCQCN)
    assert cc.alpha == 0.5 and cc.params["min_rate"] == 1e9


def test_create_accepts_unit_text():
    cc = create("dcqcn", FLOW, t_inc="300us", rai="5Mbps")
    assert cc.params["t_inc"] == 300e-6 and cc.params["rai"] == 5e6


_TIME_TEXT = st.sampled_from(["ns", "us", "ms", "s"])


@given(st.integers(1, 10**6), _TIME_TEXT, st.integers(1, 10**6),
       st.sampled_from(["bps", "Kbps", "Mbps", "Gbps"]),
       st.integers(1, 10**4), st.sampled_from(["B", "KB", "KiB", "MB", "MiB"]))
def test_parse_spec_units_property(t, tu, r, ru, b, bu):
    scale_t = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[tu]
    scale_r = {"bps": 1, "Kbps": 1e3, "Mbps": 1e6, "Gbps": 1e9}[ru]
    scale_b = {"B": 1, "KB": 1000, "KiB": 1024, "MB": 10**6, "MiB": 2**20}[bu]
    _, params = parse_spec(f"dcqcn:t_inc={t}{tu},rai={r}{ru},byte_counter={b}{bu}")
    assert math.isclose(params["t_inc"], t * scale_t, rel_tol=1e-15)
    assert params["rai"] == r * scale_r
    assert params["byte_counter"] == b * scale_b


@given(st.text(max_size=30))
def test_parse_value_only_raises_value_error(text):
    for kind in ("float", "int", "time", "rate", "size"):
        try:
            parse_value(kind, text)
        except ValueError:
            pass


# ------------------------------------------------------- parameter checks --

def _bad_values(param):
    """Values outside a parameter's declared range, plus ones of the wrong type."""
    bad = [True, "fast", float("nan"), float("inf"), [1]]
    if param.lo is not None:
        bad.append(param.lo if param.lo_open else param.lo - 1)
    if param.hi is not None:
        bad.append(param.hi if param.hi_open else param.hi + 1)
    if param.kind in ("int", "size"):
        bad.append(2.5)
    if not param.none_ok:
        bad.append(None)
    return bad


_ALL_PARAMS = [(name, key, p) for name, cls in sorted(CONTROLLERS.items())
               for key, p in getattr(cls, "PARAMS", {}).items()]


@pytest.mark.parametrize("name, key, param", _ALL_PARAMS,
                         ids=[f"{n}.{k}" for n, k, _ in _ALL_PARAMS])
def test_every_parameter_validates(name, key, param):
    create(name, FLOW, **{key: param.default})       # the default itself is valid
    for value in _bad_values(param):
        with pytest.raises(ValueError, match=rf"\b{key}\b"):
            create(name, FLOW, **{key: value})


@pytest.mark.parametrize("name", sorted(set(CONTROLLERS) - {"none"}))
def test_unknown_parameter_and_bad_flow(name):
    with pytest.raises(ValueError, match="bogus"):
        create(name, FLOW, bogus=1)
    for field in ("line_rate_bps", "mtu", "base_rtt"):
        for value in (0, -1, float("nan")):
            flow = FlowInfo(**{**FLOW.__dict__, field: value})
            with pytest.raises(ValueError, match=field):
                create(name, flow)
    for value in (0, -1, 2.5, True, "16"):
        flow = FlowInfo(**{**FLOW.__dict__, "expected_flows": value})
        with pytest.raises(ValueError, match="expected_flows"):
            create(name, flow)
    create(name, FlowInfo(**{**FLOW.__dict__, "expected_flows": 3}))


def test_dcqcn_min_rate_above_line_rate():
    with pytest.raises(ValueError, match="min_rate"):
        create("dcqcn", FLOW, min_rate=200e9)


# ------------------------------------------------------------------ DCQCN --

G = 1 / 256


def test_dcqcn_defaults_from_the_paper_and_nic():
    p = create("dcqcn", FLOW).params
    assert p == {"g": 1 / 256, "alpha_init": 1.0, "t_alpha": 55e-6, "t_inc": 55e-6,
                 "byte_counter": 10_000_000, "f": 5, "rai": 40e6, "rhai": 100e6,
                 "min_rate": 1e6, "t_dec": 4e-6, "cnp_interval": 50e-6}


def test_dcqcn_starts_at_line_rate_with_no_timer():
    cc = create("dcqcn", FLOW)
    assert cc.rate == LINE and cc.window is None and cc.next_timer() is None
    cc.on_packet_sent(now=0.0, nbytes=20_000_000, psn=0, retransmit=False)
    assert cc.rate == LINE and cc.next_timer() is None


def test_dcqcn_np_sends_at_most_one_cnp_per_interval():
    cc = create("dcqcn", FLOW)
    marks = [0.0, 1 * US, 49.999 * US, 50 * US, 60 * US, 99 * US, 100 * US, 250 * US]
    assert [cc.on_ecn(now=t) for t in marks] == [True, False, False, True, False, False,
                                                 True, True]
    every = create("dcqcn", FLOW, cnp_interval=0)
    assert all(every.on_ecn(now=0.0) for _ in range(3))
    slow = create("dcqcn", FLOW, cnp_interval="1ms")
    assert [slow.on_ecn(now=t) for t in (0.0, 999 * US, 1000 * US)] == [True, False, True]


def test_dcqcn_cnp_cuts_by_the_formula():
    cc = create("dcqcn", FLOW, alpha_init=0.5)
    cc.on_cnp(now=0.0)
    assert cc.target_rate == LINE
    assert cc.rate == pytest.approx(LINE * (1 - 0.5 / 2))
    alpha1 = (1 - G) * 0.5 + G
    assert cc.alpha == pytest.approx(alpha1)
    rc1 = cc.rate
    cc.on_cnp(now=10 * US)                          # after t_dec: a second full reaction
    assert cc.target_rate == rc1
    assert cc.rate == pytest.approx(rc1 * (1 - alpha1 / 2))
    assert cc.alpha == pytest.approx((1 - G) * alpha1 + G)
    assert cc.state()["cuts"] == 2


def test_dcqcn_cnps_within_t_dec_merge_into_one_cut():
    cc = create("dcqcn", FLOW)                      # t_dec = 4 us
    clock = FakeClock(cc)
    cc.on_cnp(now=0.0)
    rc1, alpha1 = cc.rate, cc.alpha
    clock.advance_to(1 * US)
    cc.on_cnp(now=1 * US)
    cc.on_cnp(now=2 * US)
    assert (cc.rate, cc.alpha, cc.cuts) == (rc1, alpha1, 1)   # nothing yet
    assert cc.next_timer() == pytest.approx(4 * US)
    clock.advance_to(3.9 * US)
    assert cc.rate == rc1
    clock.advance_to(4 * US)
    assert clock.fired[-1] == pytest.approx(4 * US)
    assert cc.cuts == 2 and cc.cnps == 3
    assert cc.rate == pytest.approx(rc1 * (1 - alpha1 / 2))


def test_dcqcn_t_dec_zero_reacts_to_every_cnp():
    cc = create("dcqcn", FLOW, t_dec=0, alpha_init=1.0)
    for _ in range(3):
        cc.on_cnp(now=0.0)
    assert cc.cuts == 3
    assert cc.rate == pytest.approx(LINE / 8)      # alpha stays 1: three halvings


def test_dcqcn_rate_never_below_min_rate():
    cc = create("dcqcn", FLOW, t_dec=0, min_rate="2Gbps")
    for i in range(20):
        cc.on_cnp(now=i * US)
    assert cc.rate == 2e9 and cc.target_rate == 2e9


def test_dcqcn_alpha_decays_once_per_quiet_interval():
    cc = create("dcqcn", FLOW, alpha_init=0.5, t_inc="1s")   # keep increases out of the way
    clock = FakeClock(cc)
    cc.on_cnp(now=0.0)
    alpha1 = (1 - G) * 0.5 + G
    clock.advance_to(54.9 * US)
    assert cc.alpha == pytest.approx(alpha1)       # not before K
    clock.advance_to(55 * US)
    assert cc.alpha == pytest.approx(alpha1 * (1 - G))
    clock.advance_to(164 * US)
    assert cc.alpha == pytest.approx(alpha1 * (1 - G) ** 2)
    assert clock.fired == pytest.approx([55 * US, 110 * US])
    # a CNP restarts the quiet interval
    cc.on_cnp(now=150 * US)
    alpha2 = (1 - G) * alpha1 * (1 - G) ** 2 + G
    assert cc.alpha == pytest.approx(alpha2)
    clock.advance_to(204 * US)
    assert cc.alpha == pytest.approx(alpha2)
    clock.advance_to(205 * US)
    assert cc.alpha == pytest.approx(alpha2 * (1 - G))


def test_dcqcn_increase_timer_fast_recovery_then_additive():
    rai = 40e6
    cc = create("dcqcn", FLOW, t_alpha="1s")        # F = 5, T = 55 us
    clock = FakeClock(cc)
    cc.on_cnp(now=0.0)
    rt, rc = LINE, LINE / 2
    assert (cc.target_rate, cc.rate) == (rt, rc)
    for k in range(1, 9):
        clock.advance_to((k * 55 - 0.01) * US)
        assert cc.t_events == k - 1 and cc.rate == pytest.approx(rc)   # not before k T
        clock.advance_to(k * 55 * US)
        if k > 5:                                    # timer count past F: additive
            rt = min(LINE, rt + rai)
        rc = min(LINE, (rt + rc) / 2)
        assert cc.target_rate == pytest.approx(rt)
        assert cc.rate == pytest.approx(rc), k
        assert cc.t_events == k and cc.bc_events == 0
    assert clock.fired == pytest.approx([k * 55 * US for k in range(1, 9)])
    assert cc.stage() == "additive"


def test_dcqcn_byte_counter_fires_every_b_bytes():
    cc = create("dcqcn", FLOW, t_inc="1s", byte_counter="1MB", t_dec=0)
    cc.on_cnp(now=0.0)
    cc.on_cnp(now=0.0)
    rt, rc = cc.target_rate, cc.rate
    cc.on_packet_sent(now=1 * US, nbytes=999_999, psn=0, retransmit=False)
    assert (cc.bc_events, cc.rate) == (0, rc)       # one byte short
    cc.on_packet_sent(now=2 * US, nbytes=1, psn=1, retransmit=False)
    assert cc.bc_events == 1
    assert cc.rate == pytest.approx((rt + rc) / 2)
    cc.on_packet_sent(now=3 * US, nbytes=2_500_000, psn=2, retransmit=False)
    assert cc.bc_events == 3                         # 2.5 MB more: two more events
    cc.on_cnp(now=4 * US)                            # a cut resets the counter
    assert cc.bc_events == 0
    cc.on_packet_sent(now=5 * US, nbytes=999_999, psn=3, retransmit=False)
    assert cc.bc_events == 0


def test_dcqcn_hyper_increase_needs_both_counters_past_f():
    rai, rhai, f = 40e6, 100e6, 2
    cc = create("dcqcn", FLOW, f=f, t_inc="10us", byte_counter="1MB", t_dec=0)
    clock = FakeClock(cc)
    cc.on_cnp(now=0.0)
    cc.on_cnp(now=0.0)
    cc.on_cnp(now=0.0)
    rt, rc = cc.target_rate, cc.rate
    t = 0.0

    def timer_event():
        nonlocal t
        t += 10 * US
        clock.advance_to(t)

    def byte_event():
        cc.on_packet_sent(now=t, nbytes=1_000_000, psn=0, retransmit=False)

    # counts after each event (T, BC): (1,0) (2,0) (3,0) (3,1) (3,2) (3,3) (3,4) (4,4) (5,4);
    # F = 2: fast recovery while max <= 2, additive while min <= 2, then i = min - 2
    steps = [(timer_event, "fr"), (timer_event, "fr"), (timer_event, "ai"),
             (byte_event, "ai"), (byte_event, "ai"), (byte_event, "hai1"),
             (byte_event, "hai1"), (timer_event, "hai2"), (timer_event, "hai2")]
    for event, stage in steps:
        event()
        if stage == "ai":
            rt = rt + rai
        elif stage.startswith("hai"):
            rt = rt + int(stage[3:]) * rhai
        rc = (rt + rc) / 2
        assert cc.target_rate == pytest.approx(rt), stage
        assert cc.rate == pytest.approx(rc), stage
    assert (cc.t_events, cc.bc_events) == (5, 4)
    assert cc.stage() == "hyper"


def test_dcqcn_recovers_to_line_rate_and_stops_its_timers():
    cc = create("dcqcn", FLOW)
    clock = FakeClock(cc)
    cc.on_cnp(now=0.0)
    rates = []
    t = 0.0
    while cc.next_timer() is not None and t < 1.0:
        t = cc.next_timer()
        clock.advance_to(t)
        rates.append(cc.rate)
        assert cc.rate <= LINE and cc.target_rate <= LINE
    assert cc.rate == LINE and cc.target_rate == LINE
    assert rates == sorted(rates)                    # never drops without a CNP
    assert cc.next_timer() is None and cc.stage() == "idle"


def test_dcqcn_alpha_decay_over_idle_time_is_applied_at_the_next_cnp():
    cc = create("dcqcn", FLOW, alpha_init=0.5)
    clock = FakeClock(cc)
    cc.on_cnp(now=0.0)
    alpha1 = (1 - G) * 0.5 + G
    while cc.next_timer() is not None:
        clock.advance_to(cc.next_timer())
    assert cc.rate == LINE
    t = 0.01 + 7 * US                                # well after recovery
    cc.on_cnp(now=t)
    decays = math.floor(t / (55 * US))
    alpha_before = alpha1 * (1 - G) ** decays
    assert cc.rate == pytest.approx(LINE * (1 - alpha_before / 2))
    assert cc.alpha == pytest.approx((1 - G) * alpha_before + G)


_EVENTS = st.lists(st.tuples(st.sampled_from(["cnp", "send", "wait", "ecn"]),
                             st.floats(0, 200e-6), st.integers(1, 4_000_000)),
                   max_size=60)


@given(_EVENTS, st.integers(1, 6), st.sampled_from([0, 4e-6, 30e-6]))
def test_dcqcn_invariants(events, f, t_dec):
    cc = create("dcqcn", FLOW, f=f, t_dec=t_dec, byte_counter=1_000_000, min_rate=1e8)
    clock = FakeClock(cc)
    for kind, dt, nbytes in events:
        clock.advance_to(clock.now + dt)
        if kind == "cnp":
            cc.on_cnp(now=clock.now)
        elif kind == "send":
            cc.on_packet_sent(now=clock.now, nbytes=nbytes, psn=0, retransmit=False)
        elif kind == "ecn":
            cc.on_ecn(now=clock.now)
        assert 1e8 <= cc.rate <= cc.target_rate <= LINE
        assert 0 <= cc.alpha <= 1
        nt = cc.next_timer()
        assert nt is None or nt > clock.now            # nothing due is left unfired


# ----------------------------------------------------------------- TIMELY --

def _timely(**params):
    # one rate update per 4096-byte ACK unless a test says otherwise
    params.setdefault("segment", 4096)
    return create("timely", FLOW, **params)


def test_timely_defaults():
    cc = create("timely", FLOW)
    assert cc.params == {"alpha": 0.875, "beta": 0.8, "delta": None, "t_low": 50e-6,
                         "t_high": 500e-6, "hai_n": 5, "min_rtt": None, "min_rate": None,
                         "init_rate": None, "segment": 16384}
    assert cc.rate == LINE and cc.window is None and cc.min_rtt == FLOW.base_rtt
    assert cc.next_timer() is None
    # the paper's 10 Mbit/s at its 10 Gbit/s, scaled to the line rate (TIMELY
    # authors' snippet; HPCC's ns-3 run.py); HPCC's ns-3 floor of 1 Gbit/s
    assert cc.delta == pytest.approx(LINE / 1000) and cc.min_rate == 1e9


@pytest.mark.parametrize("line, delta, floor", [(10e9, 10e6, 1e9), (25e9, 25e6, 1e9),
                                                (100e9, 100e6, 1e9), (0.5e9, 0.5e6, 0.5e9)])
def test_timely_delta_and_floor_follow_the_line_rate(line, delta, floor):
    cc = create("timely", FlowInfo(line_rate_bps=line, mtu=4096, base_rtt=10e-6))
    assert cc.delta == pytest.approx(delta) and cc.min_rate == floor
    given = create("timely", FlowInfo(line_rate_bps=line, mtu=4096, base_rtt=10e-6),
                   delta="3Mbps", min_rate="0.1Gbps")
    assert given.delta == 3e6 and given.min_rate == 0.1e9


def test_timely_first_sample_is_only_a_reference():
    cc = _timely(init_rate="10Gbps")
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=20e-6, telemetry=None)
    assert cc.rate == 10e9 and cc.prev_rtt == 20e-6


def test_timely_below_t_low_adds_delta():
    cc = _timely(init_rate="10Gbps")
    for i, rtt in enumerate([20e-6, 30e-6, 45e-6]):     # rising, but all below T_low
        cc.on_ack(now=i * US, acked_bytes=4096, rtt=rtt, telemetry=None)
    assert cc.rate == pytest.approx(10e9 + 2 * 100e6)  # delta: 100 Gbit/s / 1000


def test_timely_above_t_high_cuts_by_the_formula():
    cc = _timely(init_rate="10Gbps")
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=100e-6, telemetry=None)
    cc.on_ack(now=1 * US, acked_bytes=4096, rtt=800e-6, telemetry=None)
    assert cc.rate == pytest.approx(10e9 * (1 - 0.8 * (1 - 500e-6 / 800e-6)))


def test_timely_positive_gradient_cuts_by_the_formula():
    cc = _timely(init_rate="10Gbps", min_rtt="20us")
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=100e-6, telemetry=None)
    cc.on_ack(now=1 * US, acked_bytes=4096, rtt=104e-6, telemetry=None)
    diff1 = 0.875 * 4e-6                               # EWMA from 0
    rate1 = 10e9 * (1 - 0.8 * diff1 / 20e-6)
    assert cc.gradient == pytest.approx(diff1 / 20e-6)
    assert cc.rate == pytest.approx(rate1)
    cc.on_ack(now=2 * US, acked_bytes=4096, rtt=105e-6, telemetry=None)
    diff2 = (1 - 0.875) * diff1 + 0.875 * 1e-6
    assert cc.rate == pytest.approx(rate1 * (1 - 0.8 * diff2 / 20e-6))


def test_timely_gradient_above_one_cuts_by_the_unbounded_formula():
    # the paper's 1 - beta * gradient, not capped at a gradient of 1
    cc = _timely(init_rate="10Gbps", min_rtt="20us")
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=100e-6, telemetry=None)
    cc.on_ack(now=1 * US, acked_bytes=4096, rtt=125e-6, telemetry=None)
    g = 0.875 * 25e-6 / 20e-6                          # 1.09: above 1, below 1/beta
    assert cc.gradient == pytest.approx(g)
    assert cc.rate == pytest.approx(10e9 * (1 - 0.8 * g))     # 1.25 Gbit/s, not 2


def test_timely_gradient_past_one_over_beta_stops_at_min_rate():
    # the factor goes below zero: it stops at zero, the rate at min_rate (HPCC's ns-3)
    cc = _timely(init_rate="10Gbps", min_rtt="20us", min_rate="1.5Gbps")
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=100e-6, telemetry=None)
    cc.on_ack(now=1 * US, acked_bytes=4096, rtt=160e-6, telemetry=None)
    assert 1 - 0.8 * cc.gradient < 0
    assert cc.rate == 1.5e9                            # not 10 Gbit/s x (1 - beta)


def test_timely_hyper_active_increase_after_n_negative_gradients():
    cc = _timely(init_rate="10Gbps")
    rtts = [400e-6 - 10e-6 * k for k in range(8)]      # falling, between T_low and T_high
    expected = 10e9
    for k, rtt in enumerate(rtts):
        cc.on_ack(now=k * US, acked_bytes=4096, rtt=rtt, telemetry=None)
        if k >= 1:                                     # the k-th negative gradient
            expected += (5 if k >= 5 else 1) * 100e6
        assert cc.rate == pytest.approx(expected), k
    cc.on_ack(now=9 * US, acked_bytes=4096, rtt=rtts[-1] + 50e-6, telemetry=None)
    assert cc.neg_events == 0                          # a rise ends the streak
    assert cc.rate < expected


@pytest.mark.parametrize("params, floor", [({}, 1e9), ({"min_rate": "10Mbps"}, 10e6)])
def test_timely_recovers_to_line_rate_and_floors_at_min_rate(params, floor):
    cc = _timely(init_rate="1Gbps", delta="1Gbps", **params)
    for k in range(200):
        cc.on_ack(now=k * US, acked_bytes=4096, rtt=15e-6, telemetry=None)
    assert cc.rate == LINE
    for k in range(200, 260):
        cc.on_ack(now=k * US, acked_bytes=4096, rtt=10.0, telemetry=None)
    assert cc.rate == floor


def test_timely_updates_once_per_segment_with_its_newest_rtt():
    cc = _timely(init_rate="10Gbps", segment="16KiB")
    cc.on_ack(now=0.0, acked_bytes=16384, rtt=20e-6, telemetry=None)   # the reference
    assert cc.prev_rtt == 20e-6
    for k in range(1, 4):                   # 12 KiB more: not a whole segment yet
        cc.on_ack(now=k * US, acked_bytes=4096, rtt=900e-6, telemetry=None)
        assert cc.rate == 10e9 and cc.prev_rtt == 20e-6
    cc.on_ack(now=4 * US, acked_bytes=4096, rtt=30e-6, telemetry=None)
    # one update, from the newest sample (30 us < T_low: add delta), not four cuts
    assert cc.prev_rtt == 30e-6 and cc.rate == pytest.approx(10e9 + 100e6)


def test_timely_ignores_acks_without_sample_and_rejects_bad_samples():
    cc = _timely(init_rate="10Gbps")
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=None, telemetry=None)
    assert cc.prev_rtt is None and cc.rate == 10e9
    for bad in (-1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="RTT"):
            cc.on_ack(now=0.0, acked_bytes=4096, rtt=bad, telemetry=None)


def test_timely_cross_parameter_checks():
    with pytest.raises(ValueError, match="t_low"):
        _timely(t_low="500us", t_high="500us")
    with pytest.raises(ValueError, match="init_rate"):
        _timely(init_rate="200Gbps")
    with pytest.raises(ValueError, match="init_rate"):
        _timely(init_rate="0.5Gbps")                    # below the 1 Gbit/s floor
    _timely(init_rate="0.5Gbps", min_rate="0.5Gbps")
    with pytest.raises(ValueError, match="min_rate"):
        _timely(min_rate="101Gbps")


@given(st.lists(st.floats(0, 2e-3), max_size=80))
def test_timely_rate_stays_in_bounds(rtts):
    cc = _timely()
    for k, rtt in enumerate(rtts):
        cc.on_ack(now=k * US, acked_bytes=4096, rtt=rtt, telemetry=None)
        assert 1e9 <= cc.rate <= LINE


# ------------------------------------------------------------------ Swift --

BDP_PKTS = LINE * FLOW.base_rtt / 8 / FLOW.mtu        # ~30.5 packets


def _swift(**params):
    return create("swift", FLOW, **params)


def _fs(cwnd, fs_range=20e-6, lo=0.1, hi=100.0):
    a = fs_range / (1 / math.sqrt(lo) - 1 / math.sqrt(hi))
    b = -a / math.sqrt(hi)
    return min(max(a / math.sqrt(cwnd) + b, 0.0), fs_range)


def test_swift_defaults_and_start():
    cc = _swift()
    assert cc.params["ai"] == 1.0 and cc.params["beta"] == 0.8
    assert cc.params["max_mdf"] == 0.5 and cc.params["retx_reset"] == 5
    assert cc.cwnd == pytest.approx(BDP_PKTS)
    assert cc.window == pytest.approx(BDP_PKTS * 4096) and cc.rate is None
    assert cc.max_cwnd == pytest.approx(4 * BDP_PKTS)
    assert cc.base_target == pytest.approx(FLOW.base_rtt + 10e-6)


def test_swift_target_delay_scales_with_flow_and_hops():
    cc = _swift(init_cwnd=4.0)
    base = FLOW.base_rtt + 10e-6
    assert cc.target_delay() == pytest.approx(base + _fs(4.0))
    assert cc.target_delay(hops=3) == pytest.approx(base + 3e-6 + _fs(4.0))
    assert _swift(init_cwnd=100.0).target_delay() == pytest.approx(base)       # no scaling
    assert _swift(init_cwnd=0.05).target_delay() == pytest.approx(base + 20e-6)  # capped
    fixed = _swift(base_target="30us", fs_range=0, hop_scale=0, init_cwnd=0.5)
    assert fixed.target_delay(hops=5) == 30e-6


def test_swift_additive_increase_below_target():
    cc = _swift(init_cwnd=10.0)
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=12e-6, telemetry=None)
    assert cc.cwnd == pytest.approx(10.0 + 1.0 / 10.0)
    cc.on_ack(now=1 * US, acked_bytes=2 * 4096, rtt=12e-6, telemetry=None)
    assert cc.cwnd == pytest.approx(10.1 + 2.0 / 10.1)


def test_swift_decrease_by_the_formula_at_most_once_per_rtt():
    cc = _swift(init_cwnd=20.0)
    target = cc.target_delay()
    delay = target + 8e-6
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=delay, telemetry=None)
    cwnd1 = 20.0 * max(1 - 0.8 * (delay - target) / delay, 0.5)
    assert cc.cwnd == pytest.approx(cwnd1)
    cc.on_ack(now=delay * 0.99, acked_bytes=4096, rtt=delay, telemetry=None)
    assert cc.cwnd == pytest.approx(cwnd1)               # within one RTT: no second cut
    cc.on_ack(now=delay, acked_bytes=4096, rtt=delay, telemetry=None)
    target2 = FLOW.base_rtt + 10e-6 + _fs(cwnd1)
    assert cc.cwnd == pytest.approx(cwnd1 * max(1 - 0.8 * (delay - target2) / delay, 0.5))
    assert cc.decreases == 2


def test_swift_decrease_bounded_by_max_mdf():
    cc = _swift(init_cwnd=20.0, max_mdf=0.3)
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=5e-3, telemetry=None)
    assert cc.cwnd == pytest.approx(20.0 * 0.7)


def test_swift_below_one_packet_paces():
    cc = _swift(init_cwnd=0.5)
    assert cc.window == 4096
    assert cc.rate == pytest.approx(0.5 * 4096 * 8 / FLOW.base_rtt)
    cc.on_ack(now=0.0, acked_bytes=1024, rtt=15e-6, telemetry=None)    # below target
    assert cc.cwnd == pytest.approx(0.5 + 1024 / 4096)                 # ai * acked
    assert cc.rate == pytest.approx(0.75 * 4096 * 8 / 15e-6)
    cc.on_ack(now=1 * US, acked_bytes=1024, rtt=15e-6, telemetry=None)
    assert cc.cwnd == pytest.approx(1.0) and cc.rate is None and cc.window == 4096


def test_swift_losses():
    cc = _swift(init_cwnd=16.0)
    cc.on_loss(now=0.0, kind="nak")
    assert cc.cwnd == pytest.approx(8.0)
    cc.on_loss(now=1 * US, kind="nak")                  # same RTT: no second cut
    assert cc.cwnd == pytest.approx(8.0)
    cc.on_loss(now=FLOW.base_rtt, kind="timeout")
    assert cc.cwnd == pytest.approx(4.0)
    for k in range(3):                                  # timeouts 2..4: once per RTT
        cc.on_loss(now=FLOW.base_rtt * (2 + k) + k * 1e-9, kind="timeout")
    assert cc.cwnd == pytest.approx(0.5)
    cc.on_loss(now=FLOW.base_rtt * 5.5, kind="timeout")  # the 5th in a row
    assert cc.cwnd == 0.001
    assert cc.rate == pytest.approx(0.001 * 4096 * 8 / FLOW.base_rtt)
    with pytest.raises(ValueError, match="kind"):
        cc.on_loss(now=1.0, kind="ecn")


def test_swift_ack_resets_the_timeout_count():
    cc = _swift(init_cwnd=16.0, retx_reset=2)
    cc.on_loss(now=0.0, kind="timeout")
    cc.on_ack(now=1 * US, acked_bytes=4096, rtt=None, telemetry=None)
    cc.on_loss(now=1.0, kind="timeout")
    assert cc.cwnd == pytest.approx(16.0 / 4)           # two ordinary cuts, no reset


def test_swift_recovers_to_max_cwnd_without_congestion():
    cc = _swift(init_cwnd=1.0)
    for k in range(2000):
        cc.on_ack(now=k * US, acked_bytes=16 * 4096, rtt=11e-6, telemetry=None)
    assert cc.cwnd == pytest.approx(4 * BDP_PKTS)


def test_swift_cross_parameter_checks():
    with pytest.raises(ValueError, match="fs_min_cwnd"):
        _swift(fs_min_cwnd=100.0, fs_max_cwnd=10.0)
    with pytest.raises(ValueError, match="init_cwnd"):
        _swift(init_cwnd=1000.0)
    with pytest.raises(ValueError, match="min_cwnd"):
        _swift(min_cwnd=5.0, max_cwnd=2.0)
    with pytest.raises(ValueError, match="RTT"):
        _swift().on_ack(now=0.0, acked_bytes=1, rtt=-1.0, telemetry=None)


@given(st.lists(st.tuples(st.sampled_from(["ack", "nak", "timeout"]),
                          st.floats(0, 1e-3), st.integers(0, 65536)), max_size=80))
def test_swift_invariants(events):
    cc = _swift()
    now = 0.0
    for kind, rtt, nbytes in events:
        now += 1e-6
        if kind == "ack":
            cc.on_ack(now=now, acked_bytes=nbytes, rtt=rtt, telemetry=None)
        else:
            cc.on_loss(now=now, kind=kind)
        assert 0.001 <= cc.cwnd <= cc.max_cwnd
        assert cc.window >= 4096
        assert (cc.rate is None) == (cc.cwnd >= 1)


# ------------------------------------------------------------------- HPCC --

T = FLOW.base_rtt
W_INIT = LINE * T / 8                                 # 125 000 bytes
B = LINE / 8                                          # bytes/s of a 100G hop


def _hpcc(**params):
    return create("hpcc", FLOW, **params)


def _hop(qlen, tx_bytes, ts, rate=LINE):
    return congestion.Hop(qlen=qlen, tx_bytes=tx_bytes, ts=ts, rate_bps=rate)


def test_hpcc_defaults_and_start():
    cc = _hpcc()
    assert cc.params["eta"] == 0.95 and cc.params["max_stage"] == 5
    assert cc.window == pytest.approx(W_INIT) and cc.rate == pytest.approx(LINE)
    assert cc.w_ai == pytest.approx(W_INIT * 0.05 / 100)
    assert cc.next_timer() is None


def test_hpcc_n_is_the_specs_else_the_fabrics_else_100():
    """W_AI = W_init (1 - eta) / N (the paper's section 3.3), N the flows expected
    to share the bottleneck: the spec's, else the flow's (what the fabric knows),
    else 100; W_AI given outright wins over any N."""
    told = FlowInfo(**{**FLOW.__dict__, "expected_flows": 16})
    for flow, params, n in ((FLOW, {}, 100), (told, {}, 16),
                            (told, {"expected_flows": 40}, 40), (FLOW, {"expected_flows": 8}, 8)):
        cc = create("hpcc", flow, **params)
        assert cc.n == n and cc.w_ai == pytest.approx(W_INIT * 0.05 / n)
    assert create("hpcc", told, w_ai=80).w_ai == 80
    assert create("hpcc", told, eta=0.9).w_ai == pytest.approx(W_INIT * 0.1 / 16)


def test_hpcc_first_ack_only_records_the_hops():
    cc = _hpcc()
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=T, telemetry=(_hop(50_000, 0, 0.0),))
    assert cc.window == pytest.approx(W_INIT) and cc.u == 0.0


def test_hpcc_overload_cuts_the_window_by_the_formula():
    eta, w_ai = 0.95, W_INIT * 0.05 / 100
    cc = _hpcc()
    cc.on_packet_sent(now=0.0, nbytes=1_000_000, psn=0, retransmit=False)
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=T, telemetry=(_hop(50_000, 0, 0.0),))
    # one T later the hop sent at line rate and still holds 60 KB
    sent = B * T
    cc.on_ack(now=T, acked_bytes=4096, rtt=T, telemetry=(_hop(60_000, sent, T),))
    u = 50_000 / (B * T) + (sent / T) / B              # min(qlen) / (B T) + txRate / B
    assert cc.u == pytest.approx(u)                     # tau = T: the EWMA takes u whole
    w = W_INIT / (u / eta) + w_ai
    assert cc.window == pytest.approx(w) and cc.wc == pytest.approx(w)
    assert cc.rate == pytest.approx(w * 8 / T)
    assert cc.inc_stage == 0 and cc.last_update_seq == 1_000_000


def test_hpcc_reference_window_moves_once_per_rtt():
    eta, w_ai = 0.95, W_INIT * 0.05 / 100
    cc = _hpcc()
    cc.on_packet_sent(now=0.0, nbytes=100_000, psn=0, retransmit=False)
    cc.on_packet_sent(now=0.0, nbytes=50_000, psn=1, retransmit=True)     # not new data
    tx, ts = 0.0, 0.0
    cc.on_ack(now=0.0, acked_bytes=4096, rtt=T, telemetry=(_hop(20_000, tx, ts),))
    u = 20_000 / (B * T) + 2.0                           # twice line rate arriving
    big_u = 0.0

    def ack(acked):
        nonlocal tx, ts, big_u
        tx, ts = tx + 2 * B * T / 2, ts + T / 2
        cc.on_ack(now=ts, acked_bytes=acked, rtt=T, telemetry=(_hop(20_000, tx, ts),))
        big_u = 0.5 * big_u + 0.5 * u                     # tau = T/2
        assert cc.u == pytest.approx(big_u)

    ack(4096)                                            # first measurement: updates Wc
    wc = W_INIT / (big_u / eta) + w_ai
    assert cc.wc == pytest.approx(wc) and cc.window == pytest.approx(wc)
    assert cc.last_update_seq == 100_000
    ack(4096)                                            # still inside this RTT
    assert cc.wc == pytest.approx(wc)
    assert cc.window == pytest.approx(wc / (big_u / eta) + w_ai)
    ack(100_000)                                         # acknowledges past 100 000 bytes
    wc = wc / (big_u / eta) + w_ai
    assert cc.wc == pytest.approx(wc) and cc.window == pytest.approx(wc)


def test_hpcc_queue_term_uses_the_smaller_of_two_samples():
    cc = _hpcc()
    cc.on_ack(now=0.0, acked_bytes=1, rtt=T, telemetry=(_hop(0, 0, 0.0),))
    cc.on_ack(now=T, acked_bytes=1, rtt=T, telemetry=(_hop(90_000, B * T * 0.5, T),))
    assert cc.u == pytest.approx(0.5)                    # the queue that just formed is ignored


def test_hpcc_takes_the_most_loaded_hop_and_its_interval():
    cc = _hpcc()
    first = (_hop(0, 0, 0.0), _hop(10_000, 0, 0.0, rate=25e9))
    cc.on_ack(now=0.0, acked_bytes=1, rtt=T, telemetry=first)
    b2 = 25e9 / 8
    second = (_hop(0, B * 5e-6 * 0.5, 5e-6), _hop(10_000, b2 * 2e-6, 2e-6, rate=25e9))
    cc.on_ack(now=T, acked_bytes=1, rtt=T, telemetry=second)
    u1 = 0.5
    u2 = 10_000 / (b2 * T) + 1.0
    assert u2 > u1
    assert cc.u == pytest.approx((2e-6 / T) * u2)        # tau of hop 2, EWMA from 0


def test_hpcc_additive_stages_then_multiplicative_increase():
    eta, w_ai = 0.95, 1000
    cc = _hpcc(w_ai="1000B", max_stage=2)
    sent, ts, tx = 0, 0.0, 0.0
    cc.on_ack(now=0.0, acked_bytes=1, rtt=T, telemetry=(_hop(0, 0, 0.0),))

    def rtt_round(load, qlen=0):
        nonlocal sent, ts, tx
        sent += 10_000
        cc.on_packet_sent(now=ts, nbytes=10_000, psn=0, retransmit=False)
        ts += T
        tx += load * B * T
        cc.on_ack(now=ts, acked_bytes=10_000, rtt=T, telemetry=(_hop(qlen, tx, ts),))

    rtt_round(2.0, qlen=0)                               # overload: a cut
    wc = W_INIT / (2.0 / eta) + w_ai
    assert cc.wc == pytest.approx(wc)
    for stage in (1, 2):                                 # underload: additive, per RTT
        rtt_round(0.5)
        wc += w_ai
        assert cc.wc == pytest.approx(wc) and cc.inc_stage == stage
    rtt_round(0.5)                                       # incStage reached max_stage
    wc = min(W_INIT, wc / (0.5 / eta) + w_ai)
    assert cc.wc == pytest.approx(wc) and cc.inc_stage == 0


def test_hpcc_additive_increase_is_per_rtt_of_time():
    """W_AI is the paper's increase per RTT.  A flow whose ACKs pass
    lastUpdateSeq 1.5 RTTs apart gains one W_AI per update, as Algorithm 1
    writes it; one whose window is below a packet, paced at W / T, sends a
    packet (and so updates Wc) only every few RTTs, and gains W_AI for each
    whole RTT (the latest sample, at least T) since Wc was last set: as much per
    unit time as the first, not in proportion to its rate."""
    eta, w_ai = 0.95, 1000

    def run(every, rounds, rtt=T):
        cc = _hpcc(w_ai="1000B", max_stage=10**6)        # additive stages only
        cc.on_ack(now=0.0, acked_bytes=1, rtt=T, telemetry=(_hop(0, 0, 0.0),))
        ts, tx = 0.0, 0.0
        for k, load in enumerate([2.0] + [0.5] * rounds):
            cc.on_packet_sent(now=ts, nbytes=4096, psn=k, retransmit=False)
            ts += every
            tx += load * B * every
            cc.on_ack(now=ts, acked_bytes=4096, rtt=rtt, telemetry=(_hop(0, tx, ts),))
            if k == 0:                                   # the first update: a cut
                wc0 = W_INIT / (2.0 / eta) + w_ai
                assert cc.wc == pytest.approx(wc0)
        return cc.wc - wc0

    assert run(1.5 * T, 6) == pytest.approx(6 * w_ai)    # n = 1: Algorithm 1 as written
    assert run(4.5 * T, 2) == pytest.approx(2 * 4 * w_ai)    # n = 4 whole T per update
    assert run(9.5 * T, 1) == pytest.approx(9 * w_ai)
    assert run(4.5 * T, 2, rtt=2 * T) == pytest.approx(2 * 2 * w_ai)   # RTTs, not T
    assert run(4.5 * T, 2, rtt=T / 2) == pytest.approx(2 * 4 * w_ai)   # never below T


def test_hpcc_recovers_to_line_rate_without_load():
    cc = _hpcc(t="10us")
    ts, tx = 0.0, 0.0
    cc.on_ack(now=0.0, acked_bytes=1, rtt=T, telemetry=(_hop(0, 0, 0.0),))
    for k in range(1, 200):
        cc.on_packet_sent(now=ts, nbytes=10_000, psn=k, retransmit=False)
        ts += T
        tx += (3.0 if k < 5 else 0.3) * B * T
        cc.on_ack(now=ts, acked_bytes=10_000, rtt=T, telemetry=(_hop(0, tx, ts),))
        if k == 4:
            assert cc.window < W_INIT / 2
    assert cc.window == pytest.approx(W_INIT) and cc.rate == pytest.approx(LINE)


def test_hpcc_path_change_and_missing_telemetry_only_record():
    cc = _hpcc()
    cc.on_ack(now=0.0, acked_bytes=1, rtt=T, telemetry=(_hop(0, 0, 0.0),))
    cc.on_ack(now=T, acked_bytes=1, rtt=T, telemetry=None)
    cc.on_ack(now=T, acked_bytes=1, rtt=T, telemetry=(_hop(0, 0, T), _hop(0, 0, T)))
    assert cc.u == 0.0 and cc.window == pytest.approx(W_INIT)
    cc.on_ack(now=T, acked_bytes=1, rtt=T, telemetry=(_hop(0, 0, T), _hop(0, 0, T)))
    assert cc.u == 0.0                                   # no time passed: nothing learnt


_HOPS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6),
                           st.floats(0, 20e-6)), min_size=1, max_size=40)


@given(_HOPS)
def test_hpcc_window_stays_in_bounds(samples):
    cc = _hpcc()
    ts, tx = 0.0, 0
    for qlen, dtx, dt in samples:
        ts += dt
        tx += dtx
        cc.on_packet_sent(now=ts, nbytes=4096, psn=0, retransmit=False)
        cc.on_ack(now=ts, acked_bytes=4096, rtt=T, telemetry=(_hop(qlen, tx, ts),))
        assert cc.w_min <= cc.window <= W_INIT
        assert cc.rate == pytest.approx(cc.window * 8 / T)


# ------------------------------------------------------------------- docs --

DOC = Path(__file__).resolve().parent.parent / "docs" / "congestion.md"


@pytest.mark.parametrize("name", sorted(set(CONTROLLERS) - {"none"}))
def test_docs_parameter_tables_match_the_code(name):
    assert markdown_table(CONTROLLERS[name].PARAMS) in DOC.read_text()


def test_docs_example_controller_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    source = next(b for b in blocks if "class AIMD" in b)
    namespace: dict = {}
    exec(source, namespace)
    cc = namespace["AIMD"](FLOW, step="1Gbps")
    cc.on_cnp(now=0.0)
    assert cc.rate == LINE / 2
    cc.on_ack(now=1e-6, acked_bytes=4096, rtt=None, telemetry=None)
    assert cc.rate == LINE / 2 + 1e9
    with pytest.raises(ValueError, match="step"):
        namespace["AIMD"](FLOW, step=0)


def test_parse_spec_name_is_case_insensitive_and_none_takes_nothing():
    assert parse_spec("DCQCN:g=0.5") == ("dcqcn", {"g": 0.5})
    with pytest.raises(ValueError, match="it takes none"):
        parse_spec("none:g=0.5")


@given(st.lists(st.floats(0, 1e-3), max_size=50), st.sampled_from([0.0, 10e-6, 50e-6]))
def test_dcqcn_np_spacing_property(gaps, interval):
    cc = create("dcqcn", FLOW, cnp_interval=interval)
    now, last = 0.0, None
    for gap in gaps:
        now += gap
        sent = cc.on_ecn(now=now)
        expect = last is None or now - last >= interval - 1e-12
        assert sent == expect
        if sent:
            last = now


def test_controllers_are_pure():
    """No clocks, randomness, threads or I/O inside congestion/."""
    forbidden = re.compile(r"^\s*(import|from)\s+(time|random|socket|threading|asyncio|os)\b",
                           re.M)
    package = Path(congestion.__file__).parent
    for source in package.glob("*.py"):
        assert not forbidden.search(source.read_text()), source.name


def test_swift_rtt_sample_below_base_rtt_still_paces():
    cc = _swift(init_cwnd=2.0)
    cc.on_ack(now=0.0, acked_bytes=0, rtt=0.0, telemetry=None)
    cc.on_loss(now=0.0, kind="nak")
    cc.on_loss(now=1.0, kind="nak")
    assert cc.cwnd == pytest.approx(0.5)
    assert cc.rate == pytest.approx(0.5 * 4096 * 8 / FLOW.base_rtt)
