"""HPCC: a window computed from per-hop in-band telemetry.

Li et al., "HPCC: High Precision Congestion Control", SIGCOMM 2019,
Algorithm 1.  Each ACK echoes the INT records (``Hop``) of the data packet it
acknowledges, one per switch egress port.  With ``T`` the base RTT and, per
hop, ``B`` its line rate in bytes/s:

    MeasureInflight: for each hop i, against the previous ACK's record of it,
        txRate = (tx_bytes - prev.tx_bytes) / (ts - prev.ts)
        u_i = min(qlen, prev.qlen) / (B T) + txRate / B
      take the largest u_i and its tau = ts - prev.ts (at most T), then
        U = (1 - tau/T) U + (tau/T) u
    ComputeWind: if U >= eta or incStage >= max_stage:
        W = Wc / (U / eta) + n W_AI   (and, once per RTT, Wc = W, incStage = 0)
      else:
        W = Wc + n W_AI               (and, once per RTT, Wc = W, incStage += 1)

"Once per RTT" is when the ACK covers a byte sent after the last reference
update (the paper's ``ack.seq > lastUpdateSeq``, counted here in bytes).  W_AI
is the paper's additive increase per RTT, W_init (1 - eta) / N with N the
flows expected to share the bottleneck (section 3.3): the spec's
``expected_flows``, else the fabric's count where it has one
(``FlowInfo.expected_flows``: an incast experiment gives its senders, as it
gives every controller T), else 100.  n is the whole RTTs since the
reference window was last set, at least 1 (the RTT: the latest sample, never
less than T).  While a flow keeps data in flight, each update comes one RTT
after the last and n is 1: Algorithm 1 as written.  A flow whose window is
below a packet sends one packet every (packet bytes) / R, several RTTs apart,
and each of its ACKs passes ``lastUpdateSeq``: with n = 1 it would gain W_AI
per packet, an increase per unit time in proportion to its rate, and the
additive increase would no longer pull the flows to equal shares.  A flow
that was idle gains W_AI for each RTT it was idle, up to W_init, where a new
flow starts.  The window starts at, and never exceeds, ``W_init`` = line rate
x T; ``rate`` is W / T.  Below one packet the window is clocked by its ACKs
(``ack_clocked``): the next packet leaves (the acknowledged packet's bytes - W)
x 8 / R after the ACK, which with an empty queue is (bytes) x 8 / R after the
send, and later by as long as the packet waited in a queue.  The first ACK on
a path (or after the hop count changes) only records the hops.  HPCC assumes a
lossless fabric: losses do not change the window.
"""

from __future__ import annotations

from .base import Controller, FlowInfo, Hop
from .params import check_below_line_rate, Param, check_flow, resolve

_PAPER = "HPCC paper (Li et al. 2019)"
#: N of the W_AI rule where neither the spec nor the fabric gives one (about the
#: W_AI of HPCC's ns-3 runs: 10 Mbit/s x T at 25 Gbit/s, docs/results/congestion.md)
DEFAULT_FLOWS = 100
_OURS = "this implementation"


class HPCC(Controller):
    name = "hpcc"
    ack_clocked = True          # R = W / T below one packet, clocked by the ACKs

    PARAMS = {
        "eta": Param(0.95, "float", "target utilisation", _PAPER, lo=0, hi=1, lo_open=True),
        "max_stage": Param(5, "int", "additive steps before a multiplicative update", _PAPER,
                           lo=0),
        "w_ai": Param(None, "size", "additive increase per RTT (bytes); None: "
                      "W_init (1 - eta) / expected_flows", _PAPER + " (section 3.3)",
                      lo=0, lo_open=True, none_ok=True),
        "expected_flows": Param(None, "int", "N in the default W_AI, the flows expected to "
                                "share the bottleneck; None: the flow's expected_flows (the "
                                "fabric's count, where it has one), else 100",
                                _PAPER + " (section 3.3); 100: " + _OURS, lo=1, none_ok=True),
        "t": Param(None, "time", "base RTT T; None: the flow's base RTT", _PAPER,
                   lo=0, lo_open=True, none_ok=True),
        "min_rate": Param(10e6, "rate", "rate floor (window floor = min_rate x T)", _OURS,
                          lo=0, lo_open=True),
    }

    def __init__(self, flow: FlowInfo, **params) -> None:
        check_flow(self.name, flow)
        p = resolve(self.name, self.PARAMS, params)
        check_below_line_rate(self.name, p, flow, "min_rate")
        super().__init__(flow)
        self.params = p
        self.t = p["t"] if p["t"] is not None else float(flow.base_rtt)
        self.w_init = flow.line_rate_bps * self.t / 8
        self.w_min = p["min_rate"] * self.t / 8
        n = p["expected_flows"]
        if n is None:
            n = flow.expected_flows if flow.expected_flows is not None else DEFAULT_FLOWS
        self.n = n                       # N of the W_AI rule, as used
        self.w_ai = (p["w_ai"] if p["w_ai"] is not None
                     else self.w_init * (1 - p["eta"]) / n)
        self.wc = self.w_init            # reference window
        self.u = 0.0                     # normalised inflight, EWMA
        self.inc_stage = 0
        self.snd_nxt = 0                 # bytes sent (new data, not resends)
        self.acked = 0                   # bytes cumulatively acknowledged
        self.last_update_seq = 0
        self.last_update_at: float | None = None    # when Wc was last set
        self.last_rtt = self.t           # the latest RTT sample, never below T
        self.hops: tuple[Hop, ...] | None = None
        self.window = self.w_init
        self.rate = self.window * 8 / self.t

    def on_packet_sent(self, *, now: float, nbytes: int, psn: int, retransmit: bool) -> None:
        if not retransmit:
            self.snd_nxt += nbytes

    def on_ack(self, *, now: float, acked_bytes: int, rtt: float | None,
               telemetry: tuple[Hop, ...] | None) -> None:
        self.acked += acked_bytes
        if rtt is not None:
            self.last_rtt = max(rtt, self.t)
        if not telemetry:
            return
        telemetry = tuple(telemetry)
        prev, self.hops = self.hops, telemetry
        if prev is None or len(prev) != len(telemetry):
            return                       # nothing to difference against yet
        if not self._measure_inflight(prev, telemetry):
            return
        update_wc = self.acked > self.last_update_seq
        self._compute_wind(update_wc, self._rtts_since_update(now))
        if update_wc:
            self.last_update_seq = self.snd_nxt
            self.last_update_at = now

    def state(self) -> dict:
        return {"rate": self.rate, "window": self.window, "wc": self.wc, "u": self.u,
                "inc_stage": self.inc_stage}

    # -- Algorithm 1 -----------------------------------------------------------
    def _measure_inflight(self, prev: tuple[Hop, ...], now_hops: tuple[Hop, ...]) -> bool:
        u, tau = 0.0, None
        for old, new in zip(prev, now_hops):
            dt = new.ts - old.ts
            if dt <= 0 or new.rate_bps <= 0:
                continue                 # no time passed on this hop: no rate to learn
            b = new.rate_bps / 8
            tx_rate = (new.tx_bytes - old.tx_bytes) / dt
            u_i = min(new.qlen, old.qlen) / (b * self.t) + tx_rate / b
            if tau is None or u_i > u:
                u, tau = u_i, dt
        if tau is None:
            return False
        tau = min(tau, self.t)
        self.u = (1 - tau / self.t) * self.u + (tau / self.t) * u
        return True

    def _rtts_since_update(self, now: float) -> int:
        """n: the whole RTTs since Wc was last set, at least 1 (see above)."""
        if self.last_update_at is None:
            return 1
        return max(1, int((now - self.last_update_at) / self.last_rtt))

    def _compute_wind(self, update_wc: bool, rtts: int) -> None:
        eta = self.params["eta"]
        w_ai = self.w_ai * rtts
        if self.u >= eta or self.inc_stage >= self.params["max_stage"]:
            w = self.wc * eta / self.u + w_ai if self.u > 0 else self.w_init
            w = self._clamp(w)
            if update_wc:
                self.inc_stage = 0
                self.wc = w
        else:
            w = self._clamp(self.wc + w_ai)
            if update_wc:
                self.inc_stage += 1
                self.wc = w
        self.window = w
        self.rate = w * 8 / self.t

    def _clamp(self, w: float) -> float:
        return min(self.w_init, max(self.w_min, w))
