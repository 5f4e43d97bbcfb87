"""Completion queues.

A CQ has a fixed depth.  Pushing a completion into a full CQ is an error,
as on hardware: the CQ enters the error state, the device raises the
CQ_ERR async event, and ``poll`` reports the overflow instead of
silently losing completions.
"""

from __future__ import annotations

import errno
from collections import deque
from dataclasses import dataclass

from .enums import WCFlags, WCOpcode, WCStatus
from .errors import VerbsError


@dataclass(slots=True)
class WC:
    wr_id: int
    status: WCStatus
    opcode: WCOpcode
    qp_num: int
    byte_len: int = 0
    imm_data: int = 0          # host integer; the API layer presents it in network order
    wc_flags: WCFlags = WCFlags(0)
    src_qp: int = 0
    invalidated_rkey: int = 0
    vendor_err: int = 0
    pkey_index: int = 0
    slid: int = 0
    sl: int = 0
    dlid_path_bits: int = 0
    #: queued by a solicited event (``CQ.push``'s ``solicited``): what a CQ armed for
    #: solicited completions only is armed for, as for an error
    solicited: bool = False


class CQOverflow(VerbsError):
    def __init__(self, cq_handle: int):
        super().__init__(errno.EOVERFLOW, f"CQ {cq_handle} overflowed: completions were lost")


class CQ:
    def __init__(self, handle: int, depth: int, on_overflow=None):
        self.handle = handle
        self.depth = depth
        self.entries: deque[WC] = deque()
        self.overflowed = False
        self.armed = False            # ibv_req_notify_cq
        self.armed_solicited = False
        #: armed and not polled since: what a program about to sleep on its channel
        #: does (arm, poll once for what came meanwhile, sleep); one that keeps
        #: polling an armed CQ without arming it again spins on it (UCX's progress
        #: loop polls the CQs of its wireup's UD transport, armed for its async
        #: thread, which carry nothing once the wireup is over)
        self.arm_unpolled = False
        self.events = 0               # notifications raised (the comp channel reads these)
        self.on_event = None          # called with the CQ when it raises one (a driver's hook)
        self._on_overflow = on_overflow
        self.closed = False
        #: a driver's view of the CQ for a poll that need not take the engine's lock
        #: (the C face's ibv_poll_cq): a two-element integer array kept as
        #: [completions queued, or -1 once overflowed or closed; ``arm_unpolled``],
        #: or None
        self.mirror = None

    def mirrored(self) -> None:
        """Bring ``mirror`` up to date (a change made to ``entries`` from outside
        calls this too)."""
        m = self.mirror
        if m is not None:
            m[0] = -1 if self.overflowed or self.closed else len(self.entries)
            m[1] = 1 if self.arm_unpolled else 0

    def push(self, wc: WC, *, solicited: bool = False) -> bool:
        """Queue a completion.  Returns False (and enters the error state) if the CQ is full."""
        if self.overflowed or len(self.entries) >= self.depth:
            if not self.overflowed:
                self.overflowed = True
                if self.mirror is not None:
                    self.mirrored()
                if self._on_overflow is not None:
                    self._on_overflow(self)
            return False
        if solicited:
            wc.solicited = True
        self.entries.append(wc)
        if self.armed and self._wakes(wc):
            self._event()
        elif self.mirror is not None:
            self.mirror[0] = -1 if self.closed else len(self.entries)
        return True

    def _wakes(self, wc: WC) -> bool:
        """Is ``wc`` a completion the CQ's arm is for: any, or for an arm for
        solicited completions only, a solicited one or an error?"""
        return not self.armed_solicited or wc.solicited or wc.status != WCStatus.SUCCESS

    def _event(self) -> None:
        """Raise the completion event the CQ is armed for (the channel's, a driver's
        ``on_event``); it is disarmed until ``req_notify`` again."""
        self.armed = self.arm_unpolled = False
        self.events += 1
        if self.mirror is not None:
            self.mirrored()
        if self.on_event is not None:
            self.on_event(self)

    def poll(self, n: int = 1) -> list[WC]:
        if self.arm_unpolled:
            self.arm_unpolled = False
            if self.mirror is not None:
                self.mirror[1] = 0
        if self.overflowed:
            raise CQOverflow(self.handle)
        out = []
        e = self.entries
        while e and len(out) < n:
            out.append(e.popleft())
        if out and self.mirror is not None:
            self.mirror[0] = -1 if self.closed else len(e)
        return out

    def req_notify(self, solicited_only: bool = False) -> None:
        """Arm the CQ (ibv_req_notify_cq).  As mlx5 arms a CQ at its consumer index,
        completions already queued and not yet polled raise the event at once (for
        an arm for solicited completions only, one of them solicited or an error):
        a program that arms between its last empty poll and a completion landing
        (UCX's ``ucp_worker_wait``: progress, arm, sleep) is woken, not left asleep
        beside it."""
        self.armed = self.arm_unpolled = True
        self.armed_solicited = solicited_only
        if self.mirror is not None:
            self.mirror[1] = 1
        if not self.overflowed and not self.closed and any(map(self._wakes, self.entries)):
            self._event()
