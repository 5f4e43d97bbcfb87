"""A device's timers: the retransmission timeout, selective repeat's loss
probe, the RNR wait and a congestion controller's pacing, kept as one heap of
per-QP deadlines behind the one timer a driver arms (``get_timer``).

``Timers`` is one of the classes ``core.device.Device`` is made of.  What a
timeout does (resend, count a retry, fail the WQE) is the completer's rule
(``completer.on_timeout``); here is only when.

The heap holds ``(deadline, seq, qp)`` entries; a QP's live one is the earliest
at ``qp.timer_at``, and entries left at other times are dropped as they reach
the top.  A deadline that moves away and back (the retransmission timeout,
while a paced QP's pacing deadlines come and go before it) is not pushed again
while an entry at that time is still in the heap (``qp.timer_times``): it would
sort after that one, which stands for it, so QPs fire in the order a push per
arming gives (but for a QP armed, as it fires, at the very time it fired: due
again at once either way, it may take another place among QPs due at that
instant), and the heap holds about one entry per distinct deadline, not one per
arming.

A controlled QP that ``handle_timer`` makes ready (its pacing deadline or its
controller's timer came) is armed once, by the drain that takes it
(``Output._outgoing`` arms every controlled QP it takes, after its packets),
or, if the timers are read before that drain, by the read (``_arm_ready``).

The same rules run compiled (``softnic/accel/timers.c``, statement for statement,
over the same objects) as the methods of a device class whose devices' driver or
fabric asks for them (``softnic.accel.give_compiled``); tests/test_timers.py checks
the two against each other step by step.
"""

from __future__ import annotations

from heapq import heappop, heappush

from . import completer
from .qp import QP


class Timers:
    """The one timer (a part of ``Device``)."""

    def rto(self, qp: QP) -> float:
        """The retransmission timeout: ``4.096 us * 2**timeout`` (at least the
        timer floor), doubled for each timeout in a row without ACK progress
        (``completer.on_timeout``), up to ``2**completer.RTO_BACKOFF_MAX`` times.
        Any progress of the cumulative ACK since the last timeout ends the
        backoff (checked here, as the fast path's ACK restarts the timer too)."""
        a = qp.attr
        if qp._rto_of is not a:         # (asked for every paced packet: kept per attributes)
            qp._rto = max(4.096e-6 * (1 << a.timeout), self.config.min_timer)
            qp._rto_of = a
        t = qp._rto
        comp = qp.comp
        if comp.rto_shift:
            if comp.acked_psn == comp.rto_shift_psn:
                return t * (1 << comp.rto_shift)
            comp.rto_shift = 0
        return t

    def probe_interval(self, qp: QP) -> float:
        """Selective repeat's loss probe: with no ACK progress for this long, the
        requester resends its oldest unacknowledged PSN once (a lost resend or a
        lost NAK is then repaired without waiting out the retransmission timer)."""
        return max(self.rto(qp) / 8, self.config.min_timer)

    def arm(self, qp: QP) -> None:
        comp = qp.comp
        t = comp.rto_at
        a = comp.probe_at
        if a is not None and (t is None or a < t):
            t = a
        a = comp.rnr_at
        if a is not None and (t is None or a < t):
            t = a
        cc = qp.cc
        if cc is not None:
            a = qp.ccs.pace_at
            if a is not None and (t is None or a < t):
                t = a
            a = cc.next_timer()
            if a is not None and (t is None or a < t):
                t = a
        if t == qp.timer_at:
            return
        qp.timer_at = t
        if t is not None:
            times = qp.timer_times
            if t not in times:
                times.add(t)
                self._tseq = seq = self._tseq + 1
                heappush(self._timers, (t, seq, qp))

    def _arm_ready(self) -> None:
        """Arm the controlled QPs made ready and not yet drained (``handle_timer``
        leaves their arming to the drain), when the timers are read first."""
        for qp in self._ready:
            if qp.cc is not None and not qp.closed:
                self.arm(qp)

    def get_timer(self) -> float | None:
        if self._ready:
            self._arm_ready()
        h = self._timers
        t = None
        while h:
            t, _, qp = h[0]
            if qp.timer_at == t and not qp.closed:
                break
            heappop(h)
            qp.timer_times.discard(t)
            t = None
        if self.gsi is not None:
            g = self.gsi.get_timer()
            if g is not None and (t is None or g < t):
                return g
        return t

    def handle_timer(self, now: float) -> None:
        if self._ready:
            self._arm_ready()
        if self.gsi is not None:
            g = self.gsi.get_timer()
            if g is not None and g <= now:
                self.gsi.handle_timer(now)
        h = self._timers
        while h and h[0][0] <= now:
            t, _, qp = heappop(h)
            qp.timer_times.discard(t)
            if qp.timer_at != t or qp.closed:
                continue
            qp.timer_at = None
            cc = qp.cc
            ready = False
            if cc is not None:
                ccs = qp.ccs
                if ccs.pace_at is not None and ccs.pace_at <= now:
                    ccs.pace_at = None
                    ready = True
                c = cc.next_timer()
                if c is not None and c <= now:
                    cc.on_timer(now=now)
                    # its rate or window may let the QP send (as ``cc_changed``)
                    if not ready:
                        ready = not self.drain_idle(qp, now)
                if ready:
                    self._ready[qp] = None      # (mark_ready, inline)
            comp = qp.comp
            if comp.rnr_wait or comp.probe_at is not None or \
                    (comp.rto_at is not None and comp.rto_at <= now):
                completer.on_timeout(self, qp, now)     # (it has nothing to do otherwise)
            if not ready:
                self.arm(qp)
            # else the drain arms it after its packets (``Output._outgoing`` arms
            # every controlled QP it takes), or a read of the timers before the
            # drain does (``_arm_ready``): once, not here and there

