"""Swift: a window held at a delay target, with pacing below one packet.

Kumar et al., "Swift: Delay is Simple and Effective for Congestion Control in
the Datacenter", SIGCOMM 2020, Algorithm 1 and section 3.  The window ``cwnd``
is in packets (of ``flow.mtu`` bytes), as in the paper:

* target delay = ``base_target`` + hops x ``hop_scale`` + flow scaling, where
  flow scaling = a/sqrt(cwnd) + b clamped to [0, ``fs_range``], with a and b
  chosen so it is ``fs_range`` at ``fs_min_cwnd`` and 0 at ``fs_max_cwnd``.
  Hops are the length of the ACK's INT telemetry when it has some, else ``hops``.
* ACK with delay (RTT sample) below target: additive increase,
  ``cwnd += ai * acked / cwnd`` (``ai * acked`` when cwnd < 1), acked in packets.
* delay at or above target: ``cwnd *= max(1 - beta (delay - target) / delay,
  1 - max_mdf)``, at most once per RTT.
* loss: a NAK (fast recovery) cuts by ``1 - max_mdf`` at most once per RTT; a
  retransmission timeout does too, and ``retx_reset`` timeouts in a row (no ACK
  in between) drop cwnd to ``min_cwnd``.
* cwnd stays within [``min_cwnd``, ``max_cwnd``].  ``window`` is
  max(cwnd, 1) packets in bytes; below one packet ``rate`` paces one packet per
  RTT/cwnd (bits/s), otherwise ``rate`` is None (window-limited only).
* "RTT" for pacing and for once-per-RTT is the latest sample, never taken as
  less than the flow's base RTT.
"""

from __future__ import annotations

import math

from .base import Controller, FlowInfo, Hop
from .params import TIME_EPS, Param, check_flow, resolve

_OURS = "this implementation"


class Swift(Controller):
    name = "swift"

    PARAMS = {
        "ai": Param(1.0, "float", "additive increase, packets per RTT", _OURS,
                    lo=0, lo_open=True),
        "beta": Param(0.8, "float", "multiplicative decrease gain", _OURS,
                      lo=0, hi=1, lo_open=True),
        "max_mdf": Param(0.5, "float", "largest fraction cut at once", _OURS,
                         lo=0, hi=1, lo_open=True, hi_open=True),
        "base_target": Param(None, "time", "fixed part of the target delay; "
                             "None: the flow's base RTT + 10 us", _OURS,
                             lo=0, lo_open=True, none_ok=True),
        "hop_scale": Param(1e-6, "time", "target added per hop (h in the paper)", _OURS, lo=0),
        "hops": Param(0, "int", "hop count when ACKs carry no telemetry", _OURS, lo=0),
        "fs_range": Param(20e-6, "time", "largest flow-scaling addition to the target; "
                          "0 turns flow scaling off", _OURS, lo=0),
        "fs_min_cwnd": Param(0.1, "float", "cwnd (packets) that gets all of fs_range",
                             _OURS, lo=0, lo_open=True),
        "fs_max_cwnd": Param(100.0, "float", "cwnd (packets) that gets no flow scaling",
                             _OURS, lo=0, lo_open=True),
        "min_cwnd": Param(0.001, "float", "smallest cwnd (packets)", _OURS,
                          lo=0, lo_open=True),
        "max_cwnd": Param(None, "float", "largest cwnd (packets); None: 4 x the "
                          "line-rate BDP of the base RTT", _OURS,
                          lo=0, lo_open=True, none_ok=True),
        "init_cwnd": Param(None, "float", "starting cwnd (packets); None: the line-rate "
                           "BDP of the base RTT", _OURS, lo=0, lo_open=True, none_ok=True),
        "retx_reset": Param(5, "int", "timeouts in a row that reset cwnd to min_cwnd",
                            "value: this implementation (RETX_RESET_THRESHOLD in the paper's "
                            "Algorithm 1)", lo=1),
    }

    def __init__(self, flow: FlowInfo, **params) -> None:
        check_flow(self.name, flow)
        p = resolve(self.name, self.PARAMS, params)
        super().__init__(flow)
        bdp = flow.line_rate_bps * flow.base_rtt / 8 / flow.mtu      # packets
        self.max_cwnd = p["max_cwnd"] if p["max_cwnd"] is not None else max(4 * bdp, 1.0)
        init = p["init_cwnd"] if p["init_cwnd"] is not None else max(bdp, 1.0)
        if p["fs_min_cwnd"] >= p["fs_max_cwnd"]:
            raise ValueError(f"{self.name}: parameter fs_min_cwnd must be below fs_max_cwnd")
        if p["min_cwnd"] > self.max_cwnd:
            raise ValueError(f"{self.name}: parameter min_cwnd must not exceed max_cwnd")
        if not p["min_cwnd"] <= init <= self.max_cwnd:
            raise ValueError(f"{self.name}: parameter init_cwnd must lie within "
                             f"[min_cwnd, max_cwnd] = [{p['min_cwnd']:g}, {self.max_cwnd:g}]")
        self.params = p
        self.base_target = (p["base_target"] if p["base_target"] is not None
                            else flow.base_rtt + 10e-6)
        # flow scaling a/sqrt(cwnd) + b: fs_range at fs_min_cwnd, 0 at fs_max_cwnd
        self._fs_a = p["fs_range"] / (1 / math.sqrt(p["fs_min_cwnd"])
                                      - 1 / math.sqrt(p["fs_max_cwnd"]))
        self._fs_b = -self._fs_a / math.sqrt(p["fs_max_cwnd"])
        self.cwnd = init
        self.last_rtt = float(flow.base_rtt)    # until the first sample
        self.last_delay: float | None = None
        self.last_target: float | None = None
        self.t_last_decrease = -math.inf
        self.retransmit_count = 0
        self.decreases = 0
        self._publish()

    # -- the paper's pieces -------------------------------------------------
    def target_delay(self, hops: int | None = None) -> float:
        """Target for the current cwnd over ``hops`` hops (default: ``hops`` param)."""
        p = self.params
        hops = p["hops"] if hops is None else hops
        fs = min(max(self._fs_a / math.sqrt(self.cwnd) + self._fs_b, 0.0), p["fs_range"])
        return self.base_target + hops * p["hop_scale"] + fs

    def can_decrease(self, now: float) -> bool:
        return now - self.t_last_decrease >= self.last_rtt - TIME_EPS

    # -- hooks -----------------------------------------------------------------
    def on_ack(self, *, now: float, acked_bytes: int, rtt: float | None,
               telemetry: tuple[Hop, ...] | None) -> None:
        self.retransmit_count = 0
        if rtt is None:
            return
        if not (math.isfinite(rtt) and rtt >= 0):
            raise ValueError(f"{self.name}: RTT sample must be a time >= 0, not {rtt!r}")
        p = self.params
        self.last_rtt = max(rtt, self.flow.base_rtt)   # the RTT for pacing and once-per-RTT
        target = self.target_delay(len(telemetry) if telemetry else None)
        self.last_delay, self.last_target = rtt, target
        if rtt < target:
            acked = acked_bytes / self.flow.mtu
            if self.cwnd >= 1:
                self.cwnd += p["ai"] * acked / self.cwnd
            else:
                self.cwnd += p["ai"] * acked
        elif self.can_decrease(now):
            factor = max(1 - p["beta"] * (rtt - target) / rtt, 1 - p["max_mdf"])
            self._decrease(now, factor)
        self._publish()

    def on_loss(self, *, now: float, kind: str) -> None:
        p = self.params
        if kind == "timeout":
            self.retransmit_count += 1
            if self.retransmit_count >= p["retx_reset"]:
                self.cwnd = p["min_cwnd"]
                self.t_last_decrease = now
                self.decreases += 1
            elif self.can_decrease(now):
                self._decrease(now, 1 - p["max_mdf"])
        elif kind == "nak":
            if self.can_decrease(now):
                self._decrease(now, 1 - p["max_mdf"])
        else:
            raise ValueError(f"{self.name}: loss kind must be 'timeout' or 'nak', not {kind!r}")
        self._publish()

    def state(self) -> dict:
        return {"rate": self.rate, "window": self.window, "cwnd": self.cwnd,
                "delay": self.last_delay, "target_delay": self.last_target,
                "decreases": self.decreases}

    # -- internals -------------------------------------------------------------
    def _decrease(self, now: float, factor: float) -> None:
        self.cwnd *= factor
        self.t_last_decrease = now
        self.decreases += 1

    def _publish(self) -> None:
        p = self.params
        self.cwnd = min(self.max_cwnd, max(p["min_cwnd"], self.cwnd))
        mtu = self.flow.mtu
        if self.cwnd < 1:
            self.window = float(mtu)
            self.rate = self.cwnd * mtu * 8 / self.last_rtt
        else:
            self.window = self.cwnd * mtu
            self.rate = None
