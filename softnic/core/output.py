"""A device's output: what its QPs send, pulled by the driver.

``Output`` is one of the classes ``core.device.Device`` is made of.  For each QP
made ready since the last call: its requester's packets (``requester.generate``),
completions that became due, then the responses its responder queued (ACKs and
NAKs, READ responses, ATOMIC ACKs, in PSN order); each packet gets its ICRC here.

The common case of ``datagrams_to_send``, ``_outgoing`` and ``_requests`` (no CM
agent, no CNP owed) also runs compiled (``softnic/accel/output.c``, statement for
statement, over the same objects), as the methods of a device class whose
devices' driver or fabric asks for them (``softnic.accel.give_compiled``);
tests/test_sim_reference.py runs incasts on both and compares every delivery.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ..wire.datagram import Datagram
from ..wire.icrc import append_icrc
from ..wire.psn import PSN_MASK, psn_add
from ..wire.roce import AETH_FMT, AETH_LEN, AETH_SYNDROME_SHIFT, BTH_AETH_STRUCT, BTH_FMT, \
    BTH_LEN, BTH_PAD_SHIFT, DEFAULT_PKEY, ICRC_LEN, MSN_MASK, QPN_MASK, Opcode as O, encode
from . import completer, requester, responder, xrc
from .enums import QPState, QPType
from .qp import QP

_SENDING = (QPState.RTS, QPState.SQD)
_AtomicReply = responder.AtomicReply   # (a module global: read per response)
_Run = requester.Run
_Sealed = requester.Sealed


class EchoAck(NamedTuple):
    """An ACK that echoes the INT telemetry of the request it answers (HPCC), in
    ``Output``'s list of what leaves beside single packets, ``(bytes, dest)``
    tuples, and runs (``requester.Run``)."""
    pkt: bytearray
    dest: tuple
    echo: object
_SQD, _RC = QPState.SQD, QPType.RC      # (enum members as globals: read per packet)
_ACK = int(O.RC_ACKNOWLEDGE)
_ACK_PKT = BTH_AETH_STRUCT


def ack_packet(dqpn: int, psn: int, syndrome: int, msn: int) -> bytearray:
    """An ACK's BTH + AETH (without ICRC), packed straight: the bytes ``encode``
    gives."""
    buf = bytearray(16)
    _ACK_PKT.pack_into(buf, 0, _ACK, 0, DEFAULT_PKEY, dqpn & QPN_MASK, psn & PSN_MASK,
                       ((syndrome & 0xFF) << AETH_SYNDROME_SHIFT) | (msn & MSN_MASK))
    return buf


_READ_ONLY = int(O.RC_RDMA_READ_RESPONSE_ONLY)


def read_response_only(dqpn: int, psn: int, msn: int, payload) -> bytearray:
    """A READ RESPONSE ONLY (BTH, AETH acknowledging with ``msn``, payload, pad;
    without ICRC), packed straight: the bytes ``encode`` gives."""
    return _aeth_packet(_READ_ONLY, dqpn, psn, (responder.ACK_CREDITS, msn), payload)


_ATOMIC_ACK = int(O.RC_ATOMIC_ACKNOWLEDGE)
_ATOMIC_ACK_PKT = struct.Struct("!" + BTH_FMT + AETH_FMT + "Q")   # BTH + AETH + AtomicAckETH


def atomic_ack_packet(dqpn: int, psn: int, msn: int, orig: int) -> bytearray:
    """An ATOMIC ACKNOWLEDGE (BTH, AETH acknowledging with ``msn``, AtomicAckETH
    carrying ``orig``; without ICRC), packed straight: the bytes ``encode`` gives."""
    buf = bytearray(_ATOMIC_ACK_PKT.size)
    _ATOMIC_ACK_PKT.pack_into(buf, 0, _ATOMIC_ACK, 0, DEFAULT_PKEY, dqpn & QPN_MASK,
                              psn & PSN_MASK, (responder.ACK_CREDITS << AETH_SYNDROME_SHIFT)
                              | (msn & MSN_MASK), orig)
    return buf


_CNP = int(O.CNP)


def cnp_packet(dqpn: int) -> bytearray:
    """A CNP's BTH and its 16 reserved bytes (without ICRC), packed straight: the
    bytes ``encode(O.CNP, dest_qp=dqpn, psn=0)`` gives."""
    buf = bytearray(28)
    _ACK_PKT.pack_into(buf, 0, _CNP, 0, DEFAULT_PKEY, dqpn & QPN_MASK, 0, 0)
    return buf


_ZERO_ICRC = b"\0\0\0\0"


def _zero_icrc(pkt: bytearray, *_addresses) -> bytearray:
    """``append_icrc``'s place for a device configured with ``icrc=False``: four
    zero bytes (``DeviceConfig.icrc``)."""
    pkt += _ZERO_ICRC
    return pkt


class Output:
    """Datagrams out (a part of ``Device``)."""

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, tuple[str, int]]]:
        if not self._ready and not self._cnps and self.gsi is None:
            return []                   # (_outgoing's first test: nothing to send)
        out = self._outgoing(now)
        if not out:
            return out
        if len(out) == 1 and not self.config.icrc and type(out[0]) is tuple:
            # _sealed's first case for the one packet a paced sender sends at a time
            pkt, dest = out[0]
            self.counters["sent_pkts"] += 1
            return [(b"".join((pkt, _ZERO_ICRC)), dest)]
        return self._sealed(out, True)

    def datagram_runs(self, now: float) -> list[tuple]:
        """``datagrams_to_send`` for a driver that sends runs at once: items are
        ``(data, dest)`` pairs, one datagram each, and ``requester.Run`` records,
        ``count`` datagrams of ``seg`` bytes one after another in ``buf`` (the
        last may be shorter; a ``requester.Gather`` where the driver gathers),
        all to ``dest``; in the order they are to leave."""
        out = self._outgoing(now)
        return self._sealed(out, False) if out else out

    def _outgoing(self, now: float) -> list:
        """What the device sends now, before sealing (``_sealed``)."""
        gsi = self.gsi
        if not self._ready and not self._cnps and not (gsi is not None and gsi.pending):
            return []
        out: list = []
        if gsi is not None and gsi.pending:
            out.extend(gsi.datagrams())
        if self._cnps:
            cnps, self._cnps = self._cnps, []
            for qp in cnps:
                if not qp.closed:
                    out.append((cnp_packet(qp.attr.dest_qp_num), qp.dest))
            self.counters["np_cnp_sent"] += len(out)
        ready, self._ready = self._ready, {}
        for qp in ready:
            if qp.closed:
                if qp.resp.out:                 # the answers it owed when destroyed
                    self._responses(qp, out)
                continue
            # Requests before responses: a program that posts as soon as a peer's
            # request lands (a ping-pong, an RPC) gets its request out first, and
            # the ACK it owes follows in the same flush.
            if qp.state in _SENDING:
                self._requests(qp, now, out)    # (arms a controlled QP)
            elif qp.cc is not None:
                self.arm(qp)        # (every controlled QP taken is armed: handle_timer)
            if qp.resp.out:
                self._responses(qp, out)
        return out

    @property
    def has_output(self) -> bool:
        """Has a QP marked itself ready to send, or is a CNP owed?  (False: a
        driver's flush would find nothing of a QP's to send; connection
        management's MADs are ``gsi.pending``'s to say.)"""
        return bool(self._ready or self._cnps)

    def drain_idle(self, qp: QP, now: float) -> bool:
        """Would the drain do nothing for ``qp`` now, were it made ready?  So it
        is, with the fast paths, for a QP whose pacer holds its next packet
        (``requester.generate`` stops at HELD: ``held_by_pacer``), with no
        completion due and no response owed.  A controller whose state changed
        (its timer, a CNP) makes its QP ready unless this holds
        (``cc_changed``)."""
        if not self.fast or not requester.held_by_pacer(qp, now):
            return False
        sq = qp.sq
        return not (sq and sq[0].done) and qp.state is not _SQD and not qp.resp.out

    def cc_changed(self, qp: QP, now: float) -> None:
        """The QP's controller changed its rate or window (a CNP): the QP is
        ready, unless the drain would do nothing for it (``drain_idle``)."""
        if not self.drain_idle(qp, now):
            self._ready[qp] = None

    def owes_acks_only(self, responder_only: bool = False) -> bool:
        """Is all the device has to send now plain ACKs of requests it received:
        no request, read or atomic response, NAK, CNP or MAD, and no completion
        that sending would make (``_requests``)?  A driver may hold such output a
        moment, for the program's next post to carry it out behind its own
        request (a responder may coalesce ACKs: a later one acknowledges all
        before it, and the requester's timers allow for the delay).
        ``responder_only``: and no QP that owes them has a work request of its
        own outstanding (a receiver of a stream, not one side of a ping-pong)."""
        gsi = self.gsi
        if not self._ready or self._cnps or (gsi is not None and gsi.pending):
            return False
        plain = responder.ACK_CREDITS
        for qp in self._ready:
            sq = qp.sq
            if qp.closed or qp.cc is not None or qp.req.send_idx < len(sq) or qp.comp.rexmit \
                    or (sq and (responder_only or sq[0].done)) or qp.state is QPState.SQD \
                    or not qp.resp.out:
                return False
            for e in qp.resp.out:
                if type(e) is not tuple or e[1] != plain:       # (psn, syndrome, msn)
                    return False
        return True

    def _requests(self, qp: QP, now: float, out: list) -> None:
        """The requester's packets of a QP that may send, the retransmission timer
        started with the first of them, and completions now due."""
        sq = qp.sq
        if qp.req.send_idx < len(sq) or qp.comp.rexmit:      # something to (re)send
            n0 = len(out)
            requester.generate(self, qp, now, out)
            comp = qp.comp
            if len(out) > n0 and qp.qp_type is _RC and comp.rto_at is None \
                    and qp.attr.timeout:
                comp.rto_at = now + self.rto(qp)
                if qp.selective_repeat:
                    comp.probe_at = now + self.probe_interval(qp)
                if qp.cc is None:
                    self.arm(qp)        # (a controlled QP's is the arming below)
        if qp.cc is not None:
            self.arm(qp)
        if (sq and sq[0].done) or qp.state is _SQD:
            completer.complete(self, qp)

    def _sealed(self, out: list, flat: bool) -> list:
        """``out``'s packets with their ICRCs (a requester's runs and ``Sealed``
        packets have theirs),
        counted in ``sent_pkts``: as ``datagram_runs`` gives them, or (``flat``)
        as ``datagrams_to_send`` does, one ``bytes`` each (runs cut up)."""
        ip, port = self.ip, self.port
        res = []
        npkts = len(out)
        icrc = self.config.icrc
        seal = append_icrc if icrc else _zero_icrc
        zero = flat and not icrc
        for item in out:
            kind = type(item)
            if kind is tuple:           # one packet: (bytes, dest)
                pkt, dest = item
                if zero:                # the same bytes as _zero_icrc, then bytes(): one copy
                    res.append((b"".join((pkt, _ZERO_ICRC)), dest))
                    continue
                pkt = seal(pkt, ip, dest[0], port, dest[1])
                res.append((bytes(pkt) if flat and type(pkt) is bytearray else pkt, dest))
            elif kind is _Sealed:       # one packet, its ICRC included
                pkt, dest = item
                res.append((bytes(pkt) if flat else pkt, dest))
            elif kind is _Run:          # ICRCs included
                pkt, dest, seg, count = item
                npkts += count - 1
                if flat:
                    if type(pkt) is requester.Gather:
                        pkt = pkt.flatten()
                    mv = memoryview(pkt)
                    res.extend((bytes(mv[o:o + seg]), dest) for o in range(0, len(pkt), seg))
                else:
                    res.append(item)
            else:                       # an EchoAck
                pkt, dest, echo = item
                res.append((Datagram(seal(pkt, ip, dest[0], port, dest[1]), echo=echo), dest))
        self.counters["sent_pkts"] += npkts
        return res

    def _responses(self, qp: QP, out: list) -> None:
        if qp.xrc is not None:
            start = len(out)
            self._rc_responses(qp, out)
            xrc.tag_responses(out, start)
        else:
            self._rc_responses(qp, out)

    def _rc_responses(self, qp: QP, out: list) -> None:
        dest = qp.dest
        dqpn = qp.attr.dest_qp_num
        mtu = qp.mtu
        pending = qp.resp.out
        echo = qp.ccs.int_echo
        while pending:
            entry = pending.popleft()
            kind = type(entry)
            if kind is tuple:                   # an ACK or NAK
                psn, syndrome, msn = entry
                ack = ack_packet(dqpn, psn, syndrome, msn)
                if echo is not None:
                    out.append(EchoAck(ack, dest, echo))
                else:
                    out.append((ack, dest))
            elif kind is _AtomicReply:
                psn, orig, msn = entry
                out.append((atomic_ack_packet(dqpn, psn, msn, orig), dest))
            else:                               # a ReadReply
                psn, view, msn = entry
                total = len(view)
                if total <= mtu:                # one response: a READ RESPONSE ONLY
                    out.append((read_response_only(dqpn, psn, msn, view), dest))
                    continue
                npkts = max(1, -(-total // mtu))
                aeth = (responder.ACK_CREDITS, msn)
                if npkts > 2 and self.fast and qp.xrc is None:
                    self._read_run(qp, psn, view, aeth, npkts, out)
                    continue
                for i in range(npkts):
                    if npkts == 1:
                        op, a = O.RC_RDMA_READ_RESPONSE_ONLY, aeth
                    elif i == 0:
                        op, a = O.RC_RDMA_READ_RESPONSE_FIRST, aeth
                    elif i == npkts - 1:
                        op, a = O.RC_RDMA_READ_RESPONSE_LAST, aeth
                    else:
                        op, a = O.RC_RDMA_READ_RESPONSE_MIDDLE, None
                    out.append((encode(op, dest_qp=dqpn, psn=psn_add(psn, i),
                                       payload=view[i * mtu:(i + 1) * mtu], aeth=a), dest))


    def _read_run(self, qp: QP, psn: int, view, aeth, npkts: int, out: list) -> None:
        """A READ's ``npkts`` (> 2) responses from PSN ``psn``: the FIRST and LAST,
        which carry the AETH, packed straight (``_aeth_packet``), and the MIDDLEs between
        them as one run (``requester.middle_run``, the builder of a request's
        MIDDLEs; a response never asks for an ACK).  Responses follow the READ's
        PSN range, not the requester's window: all leave now, as one by one."""
        dest = qp.dest
        dqpn = qp.attr.dest_qp_num
        mtu = qp.mtu
        out.append((_aeth_packet(_READ_FIRST, dqpn, psn, aeth, view[:mtu]), dest))
        nmid = npkts - 2
        buf, _ = requester.middle_run(self, dest, _READ_MIDDLE, dqpn, psn_add(psn, 1),
                                      nmid, mtu, view, mtu, 0, 0xFFFFFFFF)
        out.append(_Run(buf, dest, BTH_LEN + mtu + ICRC_LEN, nmid))
        last = npkts - 1
        out.append((_aeth_packet(_READ_LAST, dqpn, psn_add(psn, last), aeth,
                                 view[last * mtu:]), dest))


def _aeth_packet(opcode: int, dqpn: int, psn: int, aeth, payload) -> bytearray:
    """A response with an AETH (``aeth``: syndrome, MSN) and ``payload`` (a READ
    RESPONSE FIRST or LAST), without ICRC, packed straight: the bytes ``encode``
    gives (its pad zeros, its pad count in the BTH)."""
    n = len(payload)
    pad = -n & 3
    hdr = BTH_LEN + AETH_LEN
    buf = bytearray(hdr + n + pad)
    _ACK_PKT.pack_into(buf, 0, opcode, pad << BTH_PAD_SHIFT, DEFAULT_PKEY, dqpn & QPN_MASK,
                       psn & PSN_MASK, ((aeth[0] & 0xFF) << AETH_SYNDROME_SHIFT)
                       | (aeth[1] & MSN_MASK))
    buf[hdr:hdr + n] = payload
    return buf


_READ_FIRST = int(O.RC_RDMA_READ_RESPONSE_FIRST)
_READ_LAST = int(O.RC_RDMA_READ_RESPONSE_LAST)


_READ_MIDDLE = int(O.RC_RDMA_READ_RESPONSE_MIDDLE)
