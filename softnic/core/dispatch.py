"""Packet dispatch: a datagram in, the handler that owns its opcode called.

``ROUTES`` is the one table dispatch reads, opcode by opcode (as rxe's
``rxe_opcode.c``): the wire's facts from ``wire.roce.OPCODES`` (headers, kind,
place in a message), the side of the QP that takes it (a request goes to the
responder, a response to the completer, a CNP to the congestion controller), and
that side's first branch for the common case (``responder.receive_common``,
``completer.COMMON``'s, ``cnp_common``), which takes the packet from its
bytes when the conditions written there hold.  ``Dispatch`` is one of the classes
``core.device.Device`` is made of.

With ``DeviceConfig(fast_path=False)`` no packet takes a common-case branch or
the kernel: every one is checked, decoded and handled by the general path, the
same rules reached the long way (tests/test_fastpath.py and tests/test_kernel.py
compare the two, byte for byte).
"""

from __future__ import annotations

from enum import Enum
from typing import Callable, NamedTuple

from ..wire.datagram import CE
from ..wire.icrc import check_icrc
from ..wire.mad import GSI_QKEY
from ..wire.roce import BTH_LEN, BTH_STRUCT, CNP_PAD_LEN, DEFAULT_PKEY, ICRC_LEN, Kind, OPCODES, \
    OpInfo, Opcode as O, QPN_MASK, WireError, decode
from . import completer, responder
from .enums import QPState, QPType


class Side(Enum):
    """The side of a QP a packet is for (compared by identity: ``side is Side.REQUEST``)."""
    REQUEST = "responder"         # a request: the responder takes it
    RESPONSE = "completer"        # a response (ACK, NAK, READ response, atomic ACK)
    CNP = "cnp"                   # a congestion notification: the controller


REQUEST, RESPONSE, CNP = Side.REQUEST, Side.RESPONSE, Side.CNP


class Route(NamedTuple):
    info: OpInfo                  # the wire's facts (``wire.roce.OPCODES``)
    side: Side
    common: Callable | None       # ``(dev, data, src, now, ecn, telemetry) -> bool``: the
                                  # side's first branch for the common case, from the bytes


def cnp_common(dev, data, src, now: float, ecn: int = 0, telemetry=None) -> bool:
    """The CNP's first branch: a CNP of the one length ``decode`` takes (a BTH and
    its 16 reserved bytes), taken from its bytes to the same rule
    (``Dispatch._cnp``).  False, nothing changed, for anything else."""
    if len(data) != _CNP_LEN:
        return False
    if dev.config.check_icrc and not check_icrc(data, src[0], dev.ip, src[1], dev.port):
        return False                    # counted and dropped by the general path
    dev.counters["rcvd_pkts"] += 1
    dev._cnp(BTH_STRUCT.unpack_from(data, 0)[3] & QPN_MASK, src, now)
    return True


_CNP_LEN = BTH_LEN + CNP_PAD_LEN + ICRC_LEN


def _route(info: OpInfo) -> Route:
    if info.kind == Kind.CNP:
        return Route(info, CNP, cnp_common)
    if info.is_request:
        common = responder.receive_common if info.opcode in responder.COMMON_OPCODES else None
        return Route(info, REQUEST, common)
    return Route(info, RESPONSE, completer.COMMON.get(info.opcode))


#: opcode -> Route, for every opcode ``wire.roce`` knows
ROUTES: dict[int, Route] = {op: _route(info) for op, info in OPCODES.items()}
#: the opcodes of responses (ACKs, NAKs, READ responses, atomic ACKs): a
#: datagram's first byte says whether it answers this device's own requests
RESPONSES = frozenset(op for op, r in ROUTES.items() if r.side is RESPONSE)
#: opcode -> common-case branch, for the opcodes that have one
_COMMON = {op: r.common for op, r in ROUTES.items() if r.common is not None}
_RECEIVING = (QPState.RTR, QPState.RTS, QPState.SQD)
_READ_MIDDLE = int(O.RC_RDMA_READ_RESPONSE_MIDDLE)
_SEND_FIRST = int(O.RC_SEND_FIRST)
def _send_only(dev, data, src, now: float) -> bool:
    """A SEND ONLY's edge: the device's ``_send_only`` (``responder.receive_edge``,
    compiled on a live NIC)."""
    return dev._send_only(data, src)


def _ack(dev, data, src, now: float) -> bool:
    """An ACKNOWLEDGE: the device's ``_ack`` (``completer.receive_common``, compiled
    on a live NIC)."""
    return dev._ack(data, src, now)


def _answer(dev, data, src, now: float) -> bool:
    """A READ RESPONSE ONLY or an ATOMIC ACKNOWLEDGE: the device's ``_answer``
    (``completer.receive_answer_common``, compiled on a live NIC)."""
    return dev._answer(data, src, now)


#: opcode -> the early exit that takes a datagram alone with the kernel's help: a
#: message's FIRST or LAST packet around its MIDDLEs (a READ's responses, a SEND's
#: requests), a SEND ONLY, a plain ACK, a READ RESPONSE ONLY or an ATOMIC ACKNOWLEDGE
_EDGES = {**{op: completer.receive_edge for op in completer.READ_EDGES},
          **{op: responder.receive_edge for op in responder.SEND_EDGES},
          **{op: _send_only for op in responder.SEND_ONLYS},
          int(O.RC_ACKNOWLEDGE): _ack,
          int(O.RC_RDMA_READ_RESPONSE_ONLY): _answer, int(O.RC_ATOMIC_ACKNOWLEDGE): _answer}
_SENDING = (QPState.RTS, QPState.SQD)
_UD = QPType.UD          # (read per packet: a module global, not the enum class's attribute)


class StreamKind(Enum):
    """What a ``Stream``'s MIDDLEs are (compared by identity)."""
    IN_ORDER = "in order"             # a SEND's or WRITE's, at the ePSN
    BEYOND_HOLE = "beyond a hole"     # a WRITE's, placed beyond a PSN hole (selective repeat)
    RESPONSES = "responses"           # READs' responses, for the requester (``Reads``)


class Stream(NamedTuple):
    """A run of MIDDLEs a driver may take without the engine between its receives
    (``sn_rx_stream``): those of the QP's message in order or beyond a hole
    (``responder.stream_target``); a QP's READ responses are ``Reads``.
    ``took(k, acks, nacks, now)`` accounts for
    ``k`` taken, the AckReqs' indexes from the first ``acks[0:nacks]``."""
    qp: object
    seg: int                      # datagram size of each MIDDLE
    w0: int                       # their BTH word 0
    start: int                    # their ICRC state (``icrc_start``)
    psn: int                      # the first PSN the stream takes
    view: object                  # where their bytes go ...
    off: int                      # ... from this offset on ...
    room: int                     # ... up to this one
    took: Callable
    kind: StreamKind


class Reads(NamedTuple):
    """A QP's READ responses a driver may take without the engine between its
    receives (``sn_rx_reads``), as ``completer.reads_target`` says.
    ``took(k, finished, now)`` accounts for ``k`` taken, the READs ``finished``
    by them (the first ``out[0]`` of ``target.wqes``)."""
    qp: object
    target: object                # completer.ReadsTarget
    took: Callable
    kind: StreamKind = StreamKind.RESPONSES


class Dispatch:
    """Datagrams in (a part of ``Device``)."""

    def stream_target(self) -> Stream | Reads | None:
        """The stream a driver may take now, for ``stream_qp`` (the QP whose
        MIDDLEs the kernel took last): a message's MIDDLEs (``Stream``), or its
        READs' responses (``Reads``); or None."""
        qp = self.stream_qp
        if qp is None:
            return None
        t = responder.stream_target(self)
        if t is not None:
            qp, seg, w0, start, psn, view, off, room, at = t
            if at is None:
                def took(k, acks, nacks, now):
                    responder.took_middles(self, qp, k, acks, 0, nacks)
            else:               # beyond a hole
                def took(k, acks, nacks, now):
                    responder.took_beyond(self, qp, psn, k, at, acks, 0, nacks)
            return Stream(qp, seg, w0, start, psn, view, off, room, took,
                          StreamKind.IN_ORDER if at is None else StreamKind.BEYOND_HOLE)
        if self.qps.get(qp.qpn) is not qp or self.kernel is None or not self.fast \
                or not self.config.check_icrc:
            return None
        r = completer.reads_target(self, qp)
        if r is None:
            return None
        self.stream_qp = qp

        def took(k, finished, now):
            completer.took_responses(self, qp, k, now, finished)
        return Reads(qp, r, took)

    def answer_target(self) -> "responder.AnswerTarget | None":
        """The READs or ATOMICs a driver's kernel may answer now, for
        ``answer_qp`` (the QP that answered one last): ``responder.answer_target``."""
        return responder.answer_target(self) if self.answer_qp is not None else None

    def took_answers(self, qp, kind: int, k: int, origs=None) -> None:
        """Account for ``k`` requests the kernel answered (``responder.took_answers``)."""
        responder.took_answers(self, qp, kind, k, origs)

    def receive_datagram(self, data: bytes, src: tuple[str, int], now: float, ecn: int = 0,
                         telemetry: tuple | None = None) -> None:
        """One UDP payload from ``src``.  ``ecn`` is the IP header's ECN codepoint
        (3 = CE, congestion experienced); ``telemetry`` the INT hop records the
        packet carries (for a response: those its responder echoed)."""
        if self.fast and len(data) >= BTH_LEN + ICRC_LEN:
            common = _COMMON.get(data[0])
            if common is not None and common(self, data, src, now, ecn, telemetry):
                return
        self._dispatch(data, src, now, ecn, telemetry)

    def _dispatch(self, data, src, now: float, ecn: int, telemetry) -> None:
        """The general path: checked, decoded, routed."""
        c = self.counters
        c["rcvd_pkts"] += 1
        n = len(data)
        if self.config.check_icrc and not check_icrc(data, src[0], self.ip, src[1], self.port):
            c["rcvd_icrc_err"] += 1
            return
        try:
            pkt = decode(memoryview(data)[:n - 4])
        except WireError:
            c["rcvd_malformed"] += 1
            return
        side = ROUTES[pkt.info.opcode].side
        if side is CNP:
            self._cnp(pkt.bth.dest_qp, src, now)
            return
        if pkt.bth.dest_qp == 1:
            self._gsi_receive(pkt, src, now)
            return
        qp = self._qp_for(pkt, src)
        if qp is None:
            return
        if side is REQUEST:
            self._request(qp, pkt, src, now, ecn, telemetry)
        else:
            self._response(qp, pkt, now, telemetry)

    def _qp_for(self, pkt, src):
        """The QP a packet is for, if it may reach it (else counted, None)."""
        c = self.counters
        qp = self.qps.get(pkt.bth.dest_qp)
        if qp is None:
            c["rcvd_unknown_qp"] += 1
            return None
        if pkt.info.qp_type != qp.wire:
            c["rcvd_wrong_qp_type"] += 1
            return None
        if pkt.bth.pkey != DEFAULT_PKEY:
            c["rcvd_bad_pkey"] += 1
            return None
        if qp.qp_type != _UD:
            if qp.state in (QPState.RESET, QPState.INIT):   # no peer yet: its AV is unset
                c["rcvd_bad_state"] += 1
                return None
            if tuple(src) != qp.dest:
                c["rcvd_wrong_source"] += 1
                return None
        return qp

    def _request(self, qp, pkt, src, now: float, ecn: int, telemetry) -> None:
        c = self.counters
        if qp.state not in _RECEIVING:
            c["rcvd_bad_state"] += 1
            return
        self.request_signals(qp, now, ecn, telemetry)
        responder.receive(self, qp, pkt, src, now)

    def request_signals(self, qp, now: float, ecn: int, telemetry) -> None:
        """What a request tells the congestion control beside its bytes, before the
        responder takes it: a CE mark is counted and, if the QP's controller asks
        for one (DCQCN's notification point), owes the requester a CNP; INT
        telemetry is kept for the QP's next ACK to echo.  (The general path and
        ``responder.receive_common`` both come here.)"""
        if ecn == CE:
            self.counters["np_ecn_marked_roce_packets"] += 1
            if qp.cc is not None and qp.qp_type != _UD and qp.cc.on_ecn(now=now):
                self._cnps.append(qp)
        if telemetry is not None:
            qp.ccs.int_echo = telemetry

    def _response(self, qp, pkt, now: float, telemetry) -> None:
        if qp.state not in _SENDING:
            self.counters["rcvd_bad_state"] += 1
            return
        if qp.cc is not None:
            qp.ccs.rx_telemetry = telemetry
            completer.receive(self, qp, pkt, now)
            qp.ccs.rx_telemetry = None
            self.arm(qp)
        else:
            completer.receive(self, qp, pkt, now)

    def _cnp(self, dest_qp: int, src, now: float) -> None:
        """A congestion notification for the requester of QP ``dest_qp``."""
        c = self.counters
        c["rcvd_cnp"] += 1
        qp = self.qps.get(dest_qp)
        if qp is not None and qp.cc is not None and tuple(src) == qp.dest:
            c["rp_cnp_handled"] += 1
            qp.cc.on_cnp(now=now)
            self.arm(qp)
            self.cc_changed(qp, now)
        else:
            c["rp_cnp_ignored"] += 1

    def _gsi_receive(self, pkt, src, now: float) -> None:
        """A packet for QP1: a MAD for the GSI agent, if it is a UD SEND with the
        GSI's Q_Key and P_Key."""
        c = self.counters
        if self.gsi is None:
            c["rcvd_unknown_qp"] += 1
        elif pkt.info.opcode != O.UD_SEND_ONLY or pkt.deth.qkey != GSI_QKEY \
                or pkt.bth.pkey != DEFAULT_PKEY:
            c["rcvd_bad_mad"] += 1
        else:
            c["rcvd_mads"] += 1
            self.gsi.receive(pkt.payload, src, now)

    def _send_only(self, data, src) -> bool:
        """``responder.receive_edge`` of a SEND ONLY (the compiled one,
        ``softnic/accel/responder.c``, where ``accel.give_compiled`` made it the
        class's)."""
        return responder.receive_edge(self, data, src)

    def _ack(self, data, src, now: float) -> bool:
        """``completer.receive_common`` of an ACKNOWLEDGE (the compiled one,
        ``softnic/accel/completer.c``, where ``accel.give_compiled`` made it the
        class's)."""
        return completer.receive_common(self, data, src, now)

    def _answer(self, data, src, now: float) -> bool:
        """``completer.receive_answer_common`` of a READ RESPONSE ONLY or an ATOMIC
        ACKNOWLEDGE (the compiled one, ``softnic/accel/completer.c``, where
        ``accel.give_compiled`` made it the class's)."""
        return completer.receive_answer_common(self, data, src, now)

    def _send_run(self, data, o: int, seg: int, src) -> int:
        """``responder.receive_send_run`` of the run from ``data[o:]`` (the compiled one,
        ``softnic/accel/responder.c``, where ``accel.give_compiled`` made it the
        class's)."""
        return responder.receive_send_run(self, data, o, seg, src)

    def receive_run(self, data: bytes, seg: int, src: tuple[str, int], now: float) -> None:
        """Datagrams from ``src`` laid end to end in ``data``, ``seg`` bytes each
        (the last may be shorter; 0: ``data`` is one datagram), as a socket with
        UDP GRO hands them over: ``receive_datagram`` of each in turn.  With a
        kernel, runs of a SEND's or WRITE's MIDDLE packets are taken a run at a time
        (``responder.receive_middles``), runs of READ RESPONSE MIDDLEs
        (``completer.receive_middles``), and the FIRST and LAST around them of a
        READ (``completer.receive_edge``) or a SEND (``responder.receive_edge``);
        a SEND's FIRST, its MIDDLEs and its LAST in one run, in one pass
        (``responder.receive_send_run``).

        ``data`` may be a view of the driver's receive buffer, good for this call
        only: what goes on to ``receive_datagram`` (which may hold a packet) is
        copied, what the kernel places is copied into memory at once."""
        n = len(data)
        fast = self.kernel is not None and self.fast
        if not seg or seg >= n:
            edge = _EDGES.get(data[0]) if fast and data else None
            if edge is None or not edge(self, data, src, now):
                self.receive_datagram(bytes(data), src, now)
            return
        rx = self.receive_datagram
        o = 0
        if not fast:
            while o < n:
                rx(bytes(data[o:o + seg]), src, now)
                o += seg
            return
        middles = responder.receive_middles
        edges = _EDGES
        while o < n:
            op = data[o]
            if op == _SEND_FIRST and o + seg < n:
                k = self._send_run(data, o, seg, src)
                if k:
                    o += k * seg
                    continue
            edge = edges.get(op)
            if o + seg <= n and edge is None:
                if op == _READ_MIDDLE:
                    k = completer.receive_middles(self, data, o, seg, src, now)
                else:
                    k = middles(self, data, o, seg, src)
                if k:
                    o += k * seg
                    continue
            one = data[o:o + seg]
            if edge is None or not edge(self, one, src, now):
                rx(bytes(one), src, now)
            o += seg
