"""TIMELY: a rate set from the RTT gradient.

Mittal et al., "TIMELY: RTT-based Congestion Control for the Datacenter",
SIGCOMM 2015, Algorithm 1.  Rate-based; one completion event is a segment of
``segment`` bytes acknowledged, and its newest RTT sample is the event's RTT:

    new_rtt_diff = rtt - prev_rtt;  prev_rtt = rtt
    rtt_diff = (1 - alpha) rtt_diff + alpha new_rtt_diff
    gradient = rtt_diff / min_rtt
    rtt < t_low:   rate += delta
    rtt > t_high:  rate *= 1 - beta (1 - t_high / rtt)
    gradient <= 0: rate += N delta   (N = hai_n once the gradient has been <= 0
                                      for hai_n events in a row, else 1)
    else:          rate *= 1 - beta gradient

The paper's last formula goes below zero once the gradient passes 1/beta; as
in the ns-3 TIMELY of the HPCC paper (Li et al., SIGCOMM 2019;
alibaba-edu/High-Precision-Congestion-Control, simulation/src/point-to-point/
model/rdma-hw.cc, RdmaHw::UpdateRateTimely: ``c = 1 - m_tmly_beta * gradient;
if (c < 0) c = 0`` then ``max(m_minRate, ...)``) the factor stops at zero and the
rate at ``min_rate``.

The first sample only sets ``prev_rtt``.  The rate stays within
[``min_rate``, line rate].  ACKs without an RTT sample (Karn) are ignored.

The paper evaluates 10 Gbit/s NICs with delta = 10 Mbit/s and sets no rate
floor.  ``delta`` defaults to the same fraction of this flow's line rate (the
TIMELY authors' code snippet, people.eecs.berkeley.edu/~radhika/
timely-code-snippet.cc: "additiveIncrement: 10Mbps for 10Gbps line rate";
HPCC's simulation/run.py: ``ai = 10 * bw / 10`` Mb/s for TIMELY), and
``min_rate`` to HPCC's ns-3 floor (run.py: ``MIN_RATE 1000Mb/s``).

Where HPCC's ns-3 TIMELY departs from the paper this follows the paper: ns-3
updates once per round trip (an ACK past the ``snd_nxt`` of the last update),
enters hyper-active increase after five increases of any kind, and divides the
gradient by a fixed 20 us (``TimelyMinRtt``).
"""

from __future__ import annotations

import math

from .base import Controller, FlowInfo, Hop
from .params import check_below_line_rate, Param, check_flow, resolve

_PAPER = "TIMELY paper (Mittal et al. 2015)"
_HPCC_NS3 = "HPCC's ns-3 TIMELY (alibaba-edu/High-Precision-Congestion-Control)"

#: the paper's delta (10 Mbit/s) over its NICs' line rate (10 Gbit/s)
DELTA_PER_LINE_RATE = 10e6 / 10e9
#: HPCC's ns-3 TIMELY floor (simulation/run.py: MIN_RATE 1000Mb/s)
HPCC_MIN_RATE = 1e9


class Timely(Controller):
    name = "timely"

    PARAMS = {
        "alpha": Param(0.875, "float", "EWMA weight of the newest RTT difference",
                       _HPCC_NS3 + ", TimelyAlpha; a tunable in the paper",
                       lo=0, hi=1, lo_open=True),
        "beta": Param(0.8, "float", "multiplicative decrease factor", _PAPER,
                      lo=0, hi=1, lo_open=True),
        "delta": Param(None, "rate", "additive increment; None: the line rate / 1000",
                       "paper: 10 Mbit/s at 10 Gbit/s; scaled to the line rate as in the "
                       "TIMELY authors' code snippet and " + _HPCC_NS3 + ", run.py",
                       lo=0, lo_open=True, none_ok=True),
        "t_low": Param(50e-6, "time", "below this RTT: always increase", _PAPER,
                       lo=0, lo_open=True),
        "t_high": Param(500e-6, "time", "above this RTT: decrease in proportion", _PAPER,
                        lo=0, lo_open=True),
        "hai_n": Param(5, "int", "negative-gradient events before hyper-active increase "
                       "(and its step multiplier)", _PAPER, lo=1),
        "min_rtt": Param(None, "time", "gradient normaliser; None: the flow's base RTT",
                         "paper: the path's minimum RTT", lo=0, lo_open=True, none_ok=True),
        "min_rate": Param(None, "rate", "rate floor; None: 1 Gbit/s, or the line rate if "
                          "lower", "none in the paper; " + _HPCC_NS3 + ", run.py MIN_RATE",
                          lo=0, lo_open=True, none_ok=True),
        "init_rate": Param(None, "rate", "starting rate; None: line rate",
                           "this implementation; " + _HPCC_NS3 + " starts at line rate too",
                           lo=0, lo_open=True, none_ok=True),
        "segment": Param(16384, "size", "bytes acknowledged per rate update (one "
                         "completion event)", "paper: 16-64 KB segments", lo=0, lo_open=True),
    }

    def __init__(self, flow: FlowInfo, **params) -> None:
        check_flow(self.name, flow)
        p = resolve(self.name, self.PARAMS, params)
        if p["t_low"] >= p["t_high"]:
            raise ValueError(f"{self.name}: parameter t_low ({p['t_low']:g} s) must be "
                             f"below t_high ({p['t_high']:g} s)")
        check_below_line_rate(self.name, p, flow, "min_rate", "init_rate")
        line = float(flow.line_rate_bps)
        min_rate = p["min_rate"] if p["min_rate"] is not None else min(HPCC_MIN_RATE, line)
        if p["init_rate"] is not None and p["init_rate"] < min_rate:
            raise ValueError(f"{self.name}: parameter init_rate is below min_rate")
        super().__init__(flow)
        self.params = p
        self._line = line
        self.min_rate = min_rate
        self.delta = p["delta"] if p["delta"] is not None else line * DELTA_PER_LINE_RATE
        self.min_rtt = p["min_rtt"] if p["min_rtt"] is not None else float(flow.base_rtt)
        self.rate = p["init_rate"] if p["init_rate"] is not None else line
        self.prev_rtt: float | None = None
        self.rtt_diff = 0.0
        self.gradient = 0.0
        self.neg_events = 0        # consecutive events with gradient <= 0
        self._acked = 0            # bytes acknowledged since the last update
        self._last_rtt: float | None = None   # newest RTT sample since then

    def on_ack(self, *, now: float, acked_bytes: int, rtt: float | None,
               telemetry: tuple[Hop, ...] | None) -> None:
        if rtt is not None and not (math.isfinite(rtt) and rtt >= 0):
            raise ValueError(f"{self.name}: RTT sample must be a time >= 0, not {rtt!r}")
        p = self.params
        # TIMELY computes a new rate once per completion event (a segment of
        # 16-64 KB), from that completion's RTT, not on every ACK.
        self._acked += acked_bytes
        if rtt is not None:
            self._last_rtt = rtt
        if self._acked < p["segment"] or self._last_rtt is None:
            return
        self._acked = 0
        rtt, self._last_rtt = self._last_rtt, None
        if self.prev_rtt is None:
            self.prev_rtt = rtt
            return
        new_rtt_diff = rtt - self.prev_rtt
        self.prev_rtt = rtt
        self.rtt_diff = (1 - p["alpha"]) * self.rtt_diff + p["alpha"] * new_rtt_diff
        self.gradient = self.rtt_diff / self.min_rtt
        self.neg_events = self.neg_events + 1 if self.gradient <= 0 else 0
        if rtt < p["t_low"]:
            rate = self.rate + self.delta
        elif rtt > p["t_high"]:
            rate = self.rate * (1 - p["beta"] * (1 - p["t_high"] / rtt))
        elif self.gradient <= 0:
            n = p["hai_n"] if self.neg_events >= p["hai_n"] else 1
            rate = self.rate + n * self.delta
        else:
            # past a gradient of 1/beta the paper's factor is below zero: it stops
            # at zero, and the rate at min_rate (HPCC's ns-3 UpdateRateTimely)
            rate = self.rate * max(0.0, 1 - p["beta"] * self.gradient)
        self.rate = min(self._line, max(self.min_rate, rate))

    def state(self) -> dict:
        return {"rate": self.rate, "window": None, "rtt": self.prev_rtt,
                "rtt_diff": self.rtt_diff, "gradient": self.gradient,
                "hai": self.neg_events >= self.params["hai_n"]}
