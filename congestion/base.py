"""The one interface every congestion controller implements.

A controller belongs to one QP (one flow).  It is a pure state machine like
the engine around it: every hook takes ``now`` (seconds, float) from the
caller; it never reads a clock, sleeps or draws global randomness.

The engine calls, on the requester (reaction point) side:

    on_packet_sent(now=, nbytes=, psn=, retransmit=)
    on_ack(now=, acked_bytes=, rtt=, telemetry=)    cumulative ACK moved forward;
                                                   ``rtt`` (s) when the ACK gives a
                                                   sample (Karn: none for resent
                                                   packets); ``telemetry`` the INT hop
                                                   records echoed by the responder
    on_loss(now=, kind=)                            "timeout" or "nak" (PSN sequence error)
    on_cnp(now=)                                    a CNP (BTH opcode 0x81) arrived
    on_timer(now=)                                  ``next_timer()`` has passed

and on the responder (notification point) side:

    on_ecn(now=) -> bool                            a data packet arrived CE-marked;
                                                   True: send a CNP back now

and reads ``rate`` (bits/s the QP may send at, None: unpaced) and ``window``
(bytes it may have unacknowledged, None: no limit) before each packet.

Telemetry records are ``Hop`` tuples, one per switch egress port crossed,
stamped as the packet left it (HPCC's INT fields).

Parameters are keyword arguments validated in the constructor: a bad value
raises ``ValueError`` naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Hop(NamedTuple):
    """One switch egress port's in-band telemetry, as HPCC's INT carries it."""
    qlen: int          # bytes waiting in the port's buffer, the datagram on the wire
                       # not counted: as the packet leaves, those behind it
                       # (transport/clos.py, as HPCC's ns-3 switch), or as it is
                       # queued, those ahead of it (transport/sim.py's one switch)
    tx_bytes: int      # bytes the port has sent since it started (a counter)
    ts: float          # when the packet left (seconds)
    rate_bps: float    # the port's line rate (bits/s)


@dataclass(frozen=True)
class FlowInfo:
    """What a controller knows of its path when it is created."""
    line_rate_bps: float       # the sending NIC's line rate
    mtu: int                   # payload bytes per full packet
    base_rtt: float            # propagation round trip with empty queues (s)
    #: the flows expected to share the flow's bottleneck, where the fabric knows it
    #: (an experiment's incast: its senders); None: not known.  A controller whose
    #: paper sizes a parameter by it reads it (HPCC's N in W_AI = W_init (1 - eta) / N)
    expected_flows: int | None = None


class Controller:
    """Base class: no congestion control (never limits, ignores every signal).

    Subclasses override the hooks they use.  ``rate`` and ``window`` are plain
    attributes so the engine's per-packet check is cheap.
    """

    name = "none"

    #: bits/s this flow may send at; None means unpaced (as fast as the NIC goes)
    rate: float | None = None
    #: bytes this flow may have unacknowledged; None means no window limit
    window: float | None = None
    #: A window below one packet is clocked by ACKs: the packet just acknowledged
    #: held the window alone, and the next leaves (its bytes - window) * 8 / rate
    #: after that ACK rather than (its bytes) * 8 / rate after it was sent (the
    #: engine's ``requester.cc_acked``).  With an empty queue the two are the same
    #: time (rate = window / RTT); a packet delayed in a queue delays the next one
    #: as much, as a window of whole packets is clocked by its ACKs.  False: the
    #: rate alone spaces the packets (Swift's pacing below one packet).
    ack_clocked: bool = False

    def __init__(self, flow: FlowInfo, **params) -> None:
        if params:
            raise ValueError(f"{self.name}: unknown parameter(s) {', '.join(sorted(params))}")
        self.flow = flow
        # the class's defaults made the instance's own: the engine reads both per
        # packet, and CPython 3.11 caches an instance attribute's place at each
        # reading site, while a class attribute read through an instance takes the
        # generic lookup every time
        self.rate = self.rate
        self.window = self.window

    # -- reaction point (sender) --------------------------------------------
    def on_packet_sent(self, *, now: float, nbytes: int, psn: int, retransmit: bool) -> None:
        pass

    def on_ack(self, *, now: float, acked_bytes: int, rtt: float | None,
               telemetry: tuple[Hop, ...] | None) -> None:
        pass

    def on_loss(self, *, now: float, kind: str) -> None:
        pass

    def on_cnp(self, *, now: float) -> None:
        pass

    def on_timer(self, *, now: float) -> None:
        pass

    def next_timer(self) -> float | None:
        """The earliest time ``on_timer`` should be called, or None."""
        return None

    # -- notification point (receiver) -------------------------------------
    def on_ecn(self, *, now: float) -> bool:
        """A CE-marked packet arrived for this QP; return True to send a CNP."""
        return False

    def state(self) -> dict:
        """A snapshot for plots and logs (rate, window, and what drives them)."""
        return {"rate": self.rate, "window": self.window}
