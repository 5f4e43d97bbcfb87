"""DCQCN: ECN marks -> CNPs -> rate cuts, then timer/byte-counter recovery.

Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015,
with the NVIDIA/Mellanox ConnectX rate-reduction period ("DCQCN CC Parameters",
NVIDIA DOCA documentation).  One object serves both ends of a QP:

Notification point (responder): ``on_ecn`` answers True (send a CNP) for a
CE-marked packet at most once per ``cnp_interval``.

Reaction point (requester), rate ``Rc`` starting at line rate:

* A CNP: ``Rt = Rc``, ``Rc *= 1 - alpha/2`` (not below ``min_rate``),
  ``alpha = (1-g) alpha + g``; the increase timer, byte counter and their event
  counts restart.  CNPs arriving within ``t_dec`` of the last cut are merged
  into one cut at the end of that window (the NIC's rate_reduce_monitor_period);
  ``t_dec=0`` reacts to every CNP as the paper's RP does.
* Alpha timer: each ``t_alpha`` without a CNP arriving, ``alpha *= 1-g``.
* Increase events: every ``t_inc`` (timer) and every ``byte_counter`` bytes
  sent (byte counter) since the last cut.  With T and BC the two event counts
  (this one included): while ``max(T, BC) <= f`` fast recovery; then while
  ``min(T, BC) <= f`` additive increase ``Rt += rai``; then hyper increase
  ``Rt += i * rhai`` with ``i = min(T, BC) - f``.  Every event then sets
  ``Rc = (Rt + Rc) / 2``.  Neither rate goes above line rate.

Once both rates are back at line rate the increase timer stops and the alpha
timer is no longer offered through ``next_timer``; alpha's decay over that idle
time is applied, exactly, when the next CNP arrives.
"""

from __future__ import annotations

import math

from .base import Controller, FlowInfo
from .params import check_below_line_rate, TIME_EPS, Param, check_flow, resolve

_PAPER = "DCQCN paper (Zhu et al. 2015)"
_NIC = "NVIDIA ConnectX default (DOCA 'DCQCN CC Parameters')"


class DCQCN(Controller):
    name = "dcqcn"

    PARAMS = {
        "g": Param(1 / 256, "float", "alpha gain", _PAPER, lo=0, hi=1, lo_open=True),
        "alpha_init": Param(1.0, "float", "alpha before the first CNP",
                            f"{_PAPER}; NIC initial_alpha_value 1023/1024", lo=0, hi=1),
        "t_alpha": Param(55e-6, "time", "alpha decay period K without CNPs", _PAPER,
                         lo=0, lo_open=True),
        "t_inc": Param(55e-6, "time", "rate increase timer T", _PAPER, lo=0, lo_open=True),
        "byte_counter": Param(10_000_000, "size", "rate increase byte counter B (10 MB)",
                              _PAPER, lo=0, lo_open=True),
        "f": Param(5, "int", "fast recovery events F", _PAPER, lo=1),
        "rai": Param(40e6, "rate", "additive increase step R_AI", _PAPER, lo=0, lo_open=True),
        "rhai": Param(100e6, "rate", "hyper increase step R_HAI", _PAPER, lo=0, lo_open=True),
        "min_rate": Param(1e6, "rate", "floor of the current rate",
                          f"{_NIC}: rpg_min_rate 1 Mbit/s", lo=0, lo_open=True),
        "t_dec": Param(4e-6, "time", "at most one rate cut per this period",
                       f"{_NIC}: rate_reduce_monitor_period 4 us", lo=0),
        "cnp_interval": Param(50e-6, "time", "NP: at most one CNP per QP per this interval",
                              _PAPER, lo=0),
    }

    def __init__(self, flow: FlowInfo, **params) -> None:
        check_flow(self.name, flow)
        p = resolve(self.name, self.PARAMS, params)
        check_below_line_rate(self.name, p, flow, "min_rate")
        super().__init__(flow)
        self.params = p
        self._line = float(flow.line_rate_bps)
        self._g = p["g"]
        self.rate = self._line          # Rc
        self.target_rate = self._line   # Rt
        self.alpha = p["alpha_init"]
        self.t_events = 0               # increase-timer events since the last cut
        self.bc_events = 0              # byte-counter events since the last cut
        self._bytes = 0                 # bytes sent since the last byte-counter event
        self._inc_at: float | None = None     # next increase-timer event
        self._alpha_at: float | None = None   # next alpha decay
        self._dec_at: float | None = None     # a merged cut is due (CNPs came too soon)
        self._next: float | None = None       # next_timer's answer (_timers_moved)
        self._last_cut: float | None = None
        self._np_next = -math.inf             # NP: earliest time the next CNP may go
        self.cnps = 0                   # CNPs received
        self.cuts = 0                   # rate cuts made
        self.cnps_sent = 0              # NP: CNPs asked for

    # -- notification point --------------------------------------------------
    def on_ecn(self, *, now: float) -> bool:
        if now < self._np_next - TIME_EPS:
            return False
        self._np_next = now + self.params["cnp_interval"]
        self.cnps_sent += 1
        return True

    # -- reaction point ------------------------------------------------------
    def on_cnp(self, *, now: float) -> None:
        self._advance(now)
        if self._alpha_at is not None and self._inc_at is None:
            self._decay_alpha_until(now)          # idle: catch up the decay we skipped
        self.cnps += 1
        self._alpha_at = now + self.params["t_alpha"]
        if self._last_cut is None or now >= self._last_cut + self.params["t_dec"] - TIME_EPS:
            self._cut(now)
        elif self._dec_at is None:
            self._dec_at = self._last_cut + self.params["t_dec"]
        self._timers_moved()

    def on_packet_sent(self, *, now: float, nbytes: int, psn: int, retransmit: bool) -> None:
        self._advance(now)
        if self._inc_at is None:
            return                                # not limited: nothing to recover
        self._bytes += nbytes
        b = self.params["byte_counter"]
        while self._bytes >= b and self._inc_at is not None:
            self._bytes -= b
            self.bc_events += 1
            self._increase()

    def on_timer(self, *, now: float) -> None:
        self._advance(now)

    def next_timer(self) -> float | None:
        return self._next           # (the engine asks on every packet: kept, not worked out)

    def _timers_moved(self) -> None:
        """Work out ``next_timer``'s answer again: called wherever the increase
        timer, the alpha timer or a merged cut's time changes."""
        t = self._inc_at
        if t is None:                             # idle: only a pending cut matters
            self._next = self._dec_at
            return
        a, d = self._alpha_at, self._dec_at
        if a is not None and a < t:
            t = a
        if d is not None and d < t:
            t = d
        self._next = t

    def state(self) -> dict:
        return {"rate": self.rate, "window": None, "target_rate": self.target_rate,
                "alpha": self.alpha, "stage": self.stage(), "t_events": self.t_events,
                "bc_events": self.bc_events, "cnps": self.cnps, "cuts": self.cuts}

    def stage(self) -> str:
        """The stage of the latest increase event: "idle" (not limited),
        "fast_recovery" (also before the first event), "additive" or "hyper"."""
        if self._inc_at is None:
            return "idle"
        return self._stage_of(self.t_events, self.bc_events)

    def _stage_of(self, t_events: int, bc_events: int) -> str:
        f = self.params["f"]
        if max(t_events, bc_events) <= f:
            return "fast_recovery"
        if min(t_events, bc_events) <= f:
            return "additive"
        return "hyper"

    # -- internals -------------------------------------------------------------
    def _advance(self, now: float) -> None:
        """Run every timer event due by ``now``, each at its own time, in order."""
        lim = now + TIME_EPS                      # (on every packet: most often none is due)
        n = self._next
        if n is None or n > lim:
            # none due: ``_next`` is the earliest of the three (``_timers_moved``),
            # or, idle, the merged cut's time (the alpha timer then decays lazily,
            # and the loop below would only work ``_next`` out again)
            return
        a, d, i = self._alpha_at, self._dec_at, self._inc_at
        while True:
            # the earliest due event; on a tie the first of alpha, cut, increase
            at = which = None
            if a is not None and a <= lim:
                at, which = a, 0
            if d is not None and d <= lim and (at is None or d < at):
                at, which = d, 1
            if i is not None and i <= lim and (at is None or i < at):
                at, which = i, 2
            if at is None or (i is None and d is None):   # (idle: alpha decays lazily)
                self._timers_moved()
                return
            if which == 0:
                self.alpha *= 1 - self._g
                self._alpha_at = at + self.params["t_alpha"]
            elif which == 1:
                self._cut(at)
            else:
                self._inc_at = at + self.params["t_inc"]
                self.t_events += 1
                self._increase()
            a, d, i = self._alpha_at, self._dec_at, self._inc_at

    def _decay_alpha_until(self, now: float) -> None:
        t_alpha = self.params["t_alpha"]
        now += TIME_EPS
        if self._alpha_at > now:
            return
        n = int((now - self._alpha_at) // t_alpha) + 1
        while self._alpha_at + n * t_alpha <= now:   # guard float rounding either way
            n += 1
        while n > 1 and self._alpha_at + (n - 1) * t_alpha > now:
            n -= 1
        self.alpha *= (1 - self._g) ** n
        self._alpha_at += n * t_alpha

    def _cut(self, at: float) -> None:
        p = self.params
        self.target_rate = self.rate
        self.rate = max(p["min_rate"], self.rate * (1 - self.alpha / 2))
        self.alpha = (1 - self._g) * self.alpha + self._g
        self.t_events = self.bc_events = 0
        self._bytes = 0
        self._inc_at = at + p["t_inc"]
        self._dec_at = None
        self._last_cut = at
        self.cuts += 1
        self._timers_moved()

    def _increase(self) -> None:
        p = self.params
        stage = self._stage_of(self.t_events, self.bc_events)
        if stage == "additive":
            self.target_rate = min(self._line, self.target_rate + p["rai"])
        elif stage == "hyper":
            i = min(self.t_events, self.bc_events) - p["f"]
            self.target_rate = min(self._line, self.target_rate + i * p["rhai"])
        # fast recovery leaves Rt where the cut put it
        self.rate = min(self._line, (self.target_rate + self.rate) / 2)
        if self.target_rate >= self._line and self._line - self.rate < 1.0:
            self.rate = self._line                # back at line rate: stop the limiter
            self._inc_at = None
            self._timers_moved()
            self._bytes = 0
