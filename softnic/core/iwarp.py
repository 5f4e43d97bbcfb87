"""iWARP over TCP: the same device, QPs, WQEs, CQs and key tables, framed as
RDMAP/DDP/MPA on one TCP connection per connected QP pair.

``IwarpDevice`` is a ``Device`` whose wire is a set of byte streams instead of
datagrams.  It stays sans-I/O: a driver (``softnic.transport.tcp``) owns the
sockets and, after every input, drains the output.

    connections_to_open()          -> [(cid, (ip, port))]   TCP connects wanted
    connection_made(cid, now)      the connect succeeded
    connection_accepted(peer)      -> cid                   a peer connected to us
    receive_stream(cid, data, now) bytes arrived
    stream_data_to_send(now, budget) -> [(cid, bytes)]
    connection_lost(cid, now)      the peer closed or reset the connection
    connections_to_close()         -> [cid]                 connections we are done with

Connection setup (there is no RDMA CM: verbs programs connect QPs with
modify_qp, giving the peer's GID and QPN).  At INIT->RTR both QPs know the
pair (local address, local QPN) and (peer address, peer QPN); the one whose
(IPv4, port, QPN) sorts lower is the MPA initiator.  It opens a TCP connection
to the peer device's listening port (the device's own port number, on TCP)
and sends an MPA Request whose private data names both QPNs; the responder
finds its QP (in RTR or later, aimed at that peer and QPN; a request that
arrives before the QP reaches RTR waits for it) and answers with an MPA
Reply, or a Reply with the R (reject) bit.  Markers are off, CRC on,
revision 1.  As RFC 5044 asks, the responder sends no FPDU before the
initiator's first one, so the initiator's first FPDU is always a zero-length
RDMA Write (STag 0: nothing is placed), the "ready to receive" of RFC 6581.

Reliability is TCP's: there is no PSN, ACK, retransmission or RNR here.  A
Send or RDMA Write completes once it is handed to TCP, as in SoftiWARP; an
RDMA Read completes when its last Read Response is placed.  A protection
error (bad STag, out of bounds, missing access), a Send with no receive
posted, or a malformed segment makes the receiver send a Terminate (with the
failed segment's headers quoted), move its QP to ERR and raise an async
event; the peer maps the Terminate to the WC status of the WR it names (if
that WR is still outstanding) and goes to ERR too.
"""

from __future__ import annotations

import errno
import ipaddress
from collections import deque
from dataclasses import dataclass, field

from ..wire import iwarp as iw
from ..wire.iwarp import (DdpEtype, DdpTaggedEcode, DdpUntaggedEcode, Layer, LlpEcode, Opcode,
                          QN, RdmapEcode, RdmapEtype, Segment, Terminate)
from . import completer, requester, responder
from .cq import WC
from .device import Device, DeviceConfig
from .enums import Access, EventType, QPState, QPType, SendFlags, WCFlags, WCOpcode, WCStatus, \
    WROpcode as W
from .errors import VerbsError, einval
from .memory import AccessError
from .wr_opcode import SENDS, TAKES_RECV, WRITES

#: Largest DDP segment payload we send.  MPA's length field allows 64 KiB; 16 KiB
#: keeps FPDUs near a loopback TCP segment while costing few per-FPDU steps.
MULPDU = 16384

_NOT_ON_IWARP = {
    W.ATOMIC_CMP_AND_SWP: "iWARP (RFC 5040) has no atomic operations",
    W.ATOMIC_FETCH_AND_ADD: "iWARP (RFC 5040) has no atomic operations",
    W.SEND_WITH_IMM: "iWARP has no Send with Immediate (RFC 7306 has only Immediate Data, "
                     "which RDMA_WRITE_WITH_IMM uses)",
    W.BIND_MW: "memory windows are not supported",
    W.FLUSH: "FLUSH is RoCE's (IBTA Memory Placement Extensions), not iWARP's",
}

#: Terminate (layer, error type) -> WC status of the WR it names, at the requester.
TERMINATE_STATUS = {
    (Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION): WCStatus.REM_ACCESS_ERR,
    (Layer.RDMAP, RdmapEtype.REMOTE_OPERATION): WCStatus.REM_INV_REQ_ERR,
    (Layer.RDMAP, RdmapEtype.CATASTROPHIC): WCStatus.REM_OP_ERR,
    (Layer.DDP, DdpEtype.TAGGED_BUFFER): WCStatus.REM_ACCESS_ERR,
    (Layer.DDP, DdpEtype.UNTAGGED_BUFFER): WCStatus.REM_INV_REQ_ERR,
    (Layer.DDP, DdpEtype.CATASTROPHIC): WCStatus.REM_OP_ERR,
    (Layer.LLP, 0): WCStatus.REM_OP_ERR,
}
#: ... except "no buffer": the responder had no receive posted, the request was fine.
_NO_BUFFER = WCStatus.REM_OP_ERR


class ConnState:
    CONNECTING = "connecting"        # initiator: waiting for TCP to connect
    AWAIT_REPLY = "await-reply"      # initiator: MPA Request sent
    AWAIT_REQUEST = "await-request"  # responder: TCP accepted
    PENDING_QP = "pending-qp"        # responder: Request read, its QP not in RTR yet
    STREAMING = "streaming"          # FPDUs flow
    CLOSED = "closed"


@dataclass(eq=False)
class Conn:
    """One TCP connection and its MPA state."""
    cid: int
    initiator: bool
    peer: tuple[str, int]
    state: str
    qp: object = None
    rx: bytearray = field(default_factory=bytearray)
    tx: list = field(default_factory=list)
    peer_qpn: int = 0
    local_qpn: int = 0
    may_send: bool = False           # responder: the initiator's first FPDU has arrived


class IwarpQP:
    """A QP's iWARP state (``qp.iw`` on an ``IwarpDevice``; None elsewhere): its TCP
    connection, the DDP MSNs of its queues, the READs waiting for responses and
    the Read Responses to send.  ``iwarp.py`` writes it; the QP's queues and the
    requester's, completer's and responder's parts are shared with RoCE's rules."""

    __slots__ = ("conn", "send_msn", "read_msn", "term_msn", "recv_msn", "rreq_msn", "reads",
                 "resp_out", "write_len", "terminated", "last_terminate")

    def __init__(self):
        self.conn: Conn | None = None
        self.send_msn = 1            # next MSN on queue 0 (Send, Immediate Data)
        self.read_msn = 1            # ... on queue 1 (Read Request)
        self.term_msn = 1            # ... on queue 2 (Terminate)
        self.recv_msn = 1            # expected MSN on queue 0
        self.rreq_msn = 1            # expected MSN on queue 1
        self.reads: deque = deque()  # READ WQEs waiting for their responses, in order
        self.resp_out: deque = deque()   # [sink stag, sink to, view, offset]: Read Responses to send
        self.write_len = 0           # bytes of the current inbound RDMA Write message
        self.terminated = False      # a Terminate was sent or received
        self.last_terminate = None   # the Terminate last received (an iw.Terminate)


def _ip_key(addr: tuple[str, int], qpn: int) -> tuple[int, int, int]:
    return int(ipaddress.IPv4Address(addr[0])), addr[1], qpn


class IwarpDevice(Device):
    transport = "tcp"

    def __init__(self, name: str, ip: str, port: int, *, config: DeviceConfig | None = None):
        super().__init__(name, ip, port, config=config)
        self.conns: dict[int, Conn] = {}
        self._next_cid = 0
        self._to_open: list[tuple[int, tuple[str, int]]] = []
        self._to_close: list[int] = []
        self._pending: list[Conn] = []     # responder connections waiting for their QP

    # ------------------------------------------------------------ verbs differences

    def create_qp(self, pd, init):
        if init.qp_type != QPType.RC:
            raise VerbsError(errno.EOPNOTSUPP, f"{QPType(init.qp_type).name} QPs do not exist "
                             "on iWARP (transport=tcp): only RC")
        qp = super().create_qp(pd, init)
        qp.iw = IwarpQP()
        return qp

    def post_send(self, qp, wr) -> None:
        why = _NOT_ON_IWARP.get(W(wr.opcode)) if wr.opcode in W._value2member_map_ else None
        if why is not None:
            raise einval(f"{W(wr.opcode).name}: {why}")
        super().post_send(qp, wr)

    def modify_qp(self, qp, attr, mask) -> None:
        before = qp.state
        super().modify_qp(qp, attr, mask)
        if qp.state == QPState.RTR and before == QPState.INIT:
            self._bind(qp)
        elif qp.state == QPState.RESET and before != QPState.RESET:
            self._unbind(qp)
            qp.iw = IwarpQP()
        elif qp.state == QPState.ERR and before != QPState.ERR:
            self._unbind(qp)             # the peer sees the stream close and fails too

    def destroy_qp(self, qp) -> None:
        self._unbind(qp)
        super().destroy_qp(qp)

    def to_error(self, qp, keep_responses: bool = False) -> None:
        iwq = qp.iw
        if iwq is not None:
            iwq.reads.clear()
            iwq.resp_out.clear()
        super().to_error(qp, keep_responses)

    # ------------------------------------------------------------ connection setup

    def _new_conn(self, initiator: bool, peer, state: str) -> Conn:
        self._next_cid += 1
        c = Conn(self._next_cid, initiator, tuple(peer), state)
        self.conns[c.cid] = c
        return c

    def _bind(self, qp) -> None:
        dest = qp.dest
        dqpn = qp.attr.dest_qp_num
        if _ip_key(self.address, qp.qpn) < _ip_key(dest, dqpn):
            c = self._new_conn(True, dest, ConnState.CONNECTING)
            c.qp, c.local_qpn, c.peer_qpn = qp, qp.qpn, dqpn
            qp.iw.conn = c
            self._to_open.append((c.cid, dest))
            return
        for c in self._pending:
            if c.local_qpn == qp.qpn:
                self._pending.remove(c)
                self._accept_request(c, qp)
                return

    def _unbind(self, qp) -> None:
        iwq = qp.iw
        c = iwq.conn if iwq is not None else None
        if c is not None:
            iwq.conn = None
            self._close(c)

    def _close(self, c: Conn) -> None:
        if c.state != ConnState.CLOSED:
            c.state = ConnState.CLOSED
            self._to_close.append(c.cid)
        c.qp = None

    def connections_to_open(self) -> list[tuple[int, tuple[str, int]]]:
        out, self._to_open = self._to_open, []
        return out

    def connections_to_close(self) -> list[int]:
        out, self._to_close = self._to_close, []
        for cid in out:
            self.conns.pop(cid, None)
        return out

    def connection_made(self, cid: int, now: float) -> None:
        c = self.conns.get(cid)
        if c is None or c.state != ConnState.CONNECTING:
            return
        c.state = ConnState.AWAIT_REPLY
        c.tx.append(iw.encode_mpa(iw.MpaFrame(True, iw.encode_private(c.local_qpn,
                                                                       c.peer_qpn))))
        self.counters["mpa_requests_sent"] += 1

    def connection_accepted(self, peer: tuple[str, int]) -> int:
        return self._new_conn(False, peer, ConnState.AWAIT_REQUEST).cid

    def connection_lost(self, cid: int, now: float) -> None:
        c = self.conns.get(cid)
        if c is None:
            return
        qp = c.qp
        if c in self._pending:
            self._pending.remove(c)
        self._close(c)
        if qp is not None and qp.iw.conn is c:
            qp.iw.conn = None
            self.counters["llp_connections_lost"] += 1
            if qp.state not in (QPState.ERR, QPState.RESET):
                self.to_error(qp)
                self.events.append((EventType.QP_FATAL, qp))

    def _accept_request(self, c: Conn, qp) -> None:
        ok = (qp.qp_type == QPType.RC and qp.iw.conn is None and not qp.closed
              and qp.state in (QPState.RTR, QPState.RTS, QPState.SQD)
              and qp.attr.dest_qp_num == c.peer_qpn and qp.dest[0] == c.peer[0])
        c.tx.append(iw.encode_mpa(iw.MpaFrame(False, iw.encode_private(c.local_qpn, c.peer_qpn),
                                              reject=not ok)))
        if not ok:
            self.counters["mpa_rejects_sent"] += 1
            self._close(c)
            return
        c.qp = qp
        qp.iw.conn = c
        c.state = ConnState.STREAMING
        self.counters["mpa_replies_sent"] += 1

    # ------------------------------------------------------------ input

    def receive_datagram(self, data, src, now) -> None:
        self.counters["rcvd_datagram_on_tcp_device"] += 1

    def receive_stream(self, cid: int, data, now: float) -> None:
        c = self.conns.get(cid)
        if c is None or c.state == ConnState.CLOSED:
            return
        c.rx += data
        try:
            self._process(c)
        except iw.CrcError:
            self.counters["rcvd_crc_err"] += 1
            self._stream_error(c, Terminate(Layer.LLP, 0, LlpEcode.CRC))
        except iw.IwarpError:
            self.counters["rcvd_malformed"] += 1
            self._stream_error(c, Terminate(Layer.LLP, 0, LlpEcode.FPDU_START))

    def _process(self, c: Conn) -> None:
        while c.state not in (ConnState.CLOSED, ConnState.PENDING_QP):
            if c.state == ConnState.AWAIT_REQUEST:
                got = iw.decode_mpa(c.rx, request=True)
                if got is None:
                    return
                frame, n = got
                del c.rx[:n]
                self.counters["mpa_requests_rcvd"] += 1
                c.peer_qpn, c.local_qpn = iw.decode_private(frame.private_data)
                if frame.markers or not frame.crc or frame.revision != iw.MPA_REVISION:
                    raise iw.IwarpError("MPA Request asks for markers, no CRC or revision "
                                        f"{frame.revision}")
                qp = self.qps.get(c.local_qpn)
                if qp is not None and qp.state in (QPState.RESET, QPState.INIT):
                    c.state = ConnState.PENDING_QP          # its modify to RTR is on the way
                    self._pending.append(c)
                    return
                if qp is None:
                    c.tx.append(iw.encode_mpa(iw.MpaFrame(False, frame.private_data,
                                                          reject=True)))
                    self.counters["mpa_rejects_sent"] += 1
                    self._close(c)
                    return
                self._accept_request(c, qp)
            elif c.state == ConnState.AWAIT_REPLY:
                got = iw.decode_mpa(c.rx, request=False)
                if got is None:
                    return
                frame, n = got
                del c.rx[:n]
                qp = c.qp
                if frame.reject or qp is None:
                    self.counters["mpa_rejects_rcvd"] += 1
                    self._close(c)
                    if qp is not None:
                        qp.iw.conn = None
                        self.to_error(qp)
                        self.events.append((EventType.QP_FATAL, qp))
                    return
                self.counters["mpa_replies_rcvd"] += 1
                c.state = ConnState.STREAMING
                c.may_send = True
                # The first FPDU: a zero-length RDMA Write to STag 0, the "ready to receive".
                c.tx.append(iw.encode_fpdu(Segment(Opcode.RDMA_WRITE, True)))
                self.mark_ready(qp)
            else:                                           # STREAMING
                rx = bytes(c.rx)          # segments are views of this while they are handled
                off = 0
                try:
                    while c.state == ConnState.STREAMING:
                        got = iw.decode_fpdu(rx, off)
                        if got is None:
                            break
                        seg, off = got
                        if not c.may_send:
                            c.may_send = True
                            if c.qp is not None:
                                self.mark_ready(c.qp)
                        self._segment(c, seg)
                finally:
                    c.rx = bytearray(rx[off:]) if off else c.rx
                return

    def _stream_error(self, c: Conn, term: Terminate) -> None:
        qp = c.qp
        if qp is not None and c.state == ConnState.STREAMING:
            self._terminate(qp, term)
            self.events.append((EventType.QP_FATAL, qp))
        self._close(c)
        if qp is not None:
            qp.iw.conn = None

    # ------------------------------------------------------------ segments in

    def _segment(self, c: Conn, seg: Segment) -> None:
        qp = c.qp
        self.counters["rcvd_pkts"] += 1
        if qp is None or qp.state not in (QPState.RTR, QPState.RTS, QPState.SQD) \
                or qp.iw.terminated:
            self.counters["rcvd_bad_state"] += 1
            return
        _HANDLERS[seg.opcode](self, qp, seg)

    def _classify(self, qp, stag: int, to: int, n: int, need: Access):
        """The MR view for a tagged access, or the Terminate that refuses it."""
        mr = self.keys.lookup(stag)
        if mr is None or not mr.valid:
            return None, (DdpTaggedEcode.INVALID_STAG, RdmapEcode.INVALID_STAG)
        if mr.pd is not qp.pd:
            return None, (DdpTaggedEcode.STAG_NOT_ASSOCIATED, RdmapEcode.STAG_NOT_ASSOCIATED)
        if not mr.access & need or not qp.attr.qp_access_flags & need:
            return None, (None, RdmapEcode.ACCESS_RIGHTS)
        if to + n > 1 << 64:
            return None, (DdpTaggedEcode.TO_WRAP, RdmapEcode.TO_WRAP)
        try:
            return self.keys.remote(qp.pd, stag, to, n, need), None
        except AccessError:
            return None, (DdpTaggedEcode.BASE_BOUNDS, RdmapEcode.BASE_BOUNDS)

    def _tagged_error(self, qp, seg: Segment, codes) -> None:
        ddp_code, rdmap_code = codes
        if ddp_code is None:         # permissions are RDMAP's to check
            term = Terminate(Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION, rdmap_code)
        else:                        # STag and bounds: DDP's tagged buffer checks
            term = Terminate(Layer.DDP, DdpEtype.TAGGED_BUFFER, ddp_code)
        self._refuse(qp, seg, term, EventType.QP_ACCESS_ERR)

    def _refuse(self, qp, seg: Segment, term: Terminate, event: EventType,
                recv_status: WCStatus | None = None) -> None:
        """Send a Terminate quoting ``seg``, fail the receive in use, go to ERR."""
        hdr = seg.header()
        term = Terminate(term.layer, term.etype, term.ecode, len(hdr) + len(seg.payload), hdr,
                         bytes(seg.payload[:iw.READ_REQUEST_LEN])
                         if seg.opcode == Opcode.RDMA_READ_REQUEST else None)
        if qp.resp.wqe is not None:
            wqe, qp.resp.wqe = qp.resp.wqe, None
            self.post_cqe(qp.recv_cq, WC(wqe.wr_id, recv_status or WCStatus.REM_INV_REQ_ERR,
                                         WCOpcode.RECV, qp.qpn), qp)
        self._terminate(qp, term)
        self.events.append((event, qp))

    def _terminate(self, qp, term: Terminate) -> None:
        c = qp.iw.conn
        if c is not None and c.state == ConnState.STREAMING and not qp.iw.terminated:
            # Requests before the failed one were valid: their Read Responses go first.
            self._responses(qp, c.tx, 1 << 62)
            c.tx.append(iw.encode_fpdu(iw.terminate_segment(term, qp.iw.term_msn)))
            qp.iw.term_msn += 1
            self.counters["terminate_sent"] += 1
        qp.iw.terminated = True
        qp.resp.kind = None
        self.to_error(qp)
        self._unbind(qp)                 # after a Terminate the stream closes, as in SoftiWARP

    def _rx_write(self, qp, seg: Segment) -> None:
        n = len(seg.payload)
        if seg.stag == 0 and n == 0:
            return                                    # the initiator's "ready to receive"
        view, codes = self._classify(qp, seg.stag, seg.to, n, Access.REMOTE_WRITE)
        if view is None:
            self._tagged_error(qp, seg, codes)
            return
        view[:] = seg.payload
        qp.iw.write_len += n
        if seg.last:
            self.counters["rdma_writes_rcvd"] += 1

    def _rx_read_response(self, qp, seg: Segment) -> None:
        reads = qp.iw.reads
        n = len(seg.payload)
        if not reads:
            self._refuse(qp, seg, Terminate(Layer.RDMAP, RdmapEtype.REMOTE_OPERATION,
                                            RdmapEcode.OPCODE), EventType.QP_FATAL)
            return
        wqe = reads[0]
        off = seg.to - wqe.sink_to
        if seg.stag != wqe.sink_stag:
            self._refuse(qp, seg, Terminate(Layer.DDP, DdpEtype.TAGGED_BUFFER,
                                            DdpTaggedEcode.INVALID_STAG), EventType.QP_ACCESS_ERR)
            return
        if off < 0 or off + n > wqe.length:
            self._refuse(qp, seg, Terminate(Layer.DDP, DdpEtype.TAGGED_BUFFER,
                                            DdpTaggedEcode.BASE_BOUNDS), EventType.QP_ACCESS_ERR)
            return
        completer.scatter(wqe, off, seg.payload)
        wqe.got_bytes += n
        if seg.last:
            reads.popleft()
            qp.req.rd_atomic = max(0, qp.req.rd_atomic - 1)
            wqe.done = True
            wqe.status = WCStatus.SUCCESS if wqe.got_bytes == wqe.length else \
                WCStatus.BAD_RESP_ERR
            completer.complete(self, qp)
            self.mark_ready(qp)

    def _rx_send(self, qp, seg: Segment) -> None:
        iwq = qp.iw
        if seg.msn != iwq.recv_msn:
            self._refuse(qp, seg, Terminate(Layer.DDP, DdpEtype.UNTAGGED_BUFFER,
                                            DdpUntaggedEcode.INVALID_MSN_RANGE),
                         EventType.QP_FATAL)
            return
        if seg.mo == 0 and qp.resp.wqe is None:
            try:
                qp.resp.wqe = responder.take_recv(self, qp)
            except responder.Rnr:
                # No receive posted: iWARP has no RNR, this is fatal (RFC 5041 section 7.2).
                self.counters["send_no_buffer"] += 1
                self._refuse(qp, seg, Terminate(Layer.DDP, DdpEtype.UNTAGGED_BUFFER,
                                                DdpUntaggedEcode.INVALID_MSN_NO_BUFFER),
                             EventType.QP_FATAL)
                return
            qp.resp.off = 0
        if qp.resp.wqe is None or seg.mo != qp.resp.off:
            self._refuse(qp, seg, Terminate(Layer.DDP, DdpEtype.UNTAGGED_BUFFER,
                                            DdpUntaggedEcode.INVALID_MO), EventType.QP_FATAL)
            return
        imm = seg.opcode in (Opcode.IMMEDIATE_DATA, Opcode.IMMEDIATE_DATA_SE)
        if imm:
            if len(seg.payload) != 8 or not seg.last:
                self._refuse(qp, seg, Terminate(Layer.RDMAP, RdmapEtype.REMOTE_OPERATION,
                                                RdmapEcode.UNSPECIFIED), EventType.QP_FATAL)
                return
        else:
            try:
                responder.place_recv(self, qp, seg.payload)
            except responder.Nak as e:
                if e.recv_status == WCStatus.LOC_LEN_ERR:
                    term = Terminate(Layer.DDP, DdpEtype.UNTAGGED_BUFFER,
                                     DdpUntaggedEcode.MESSAGE_TOO_LONG)
                else:
                    term = Terminate(Layer.RDMAP, RdmapEtype.CATASTROPHIC,
                                     RdmapEcode.CATASTROPHIC_STREAM)
                self._refuse(qp, seg, term, EventType.QP_FATAL, e.recv_status)
                return
        if not seg.last:
            return
        info = iw.OPCODES[seg.opcode]
        flags = WCFlags(0)
        inv = imm_data = 0
        opcode = WCOpcode.RECV
        byte_len = qp.resp.off
        if info.invalidate:
            if not self.keys.invalidate(qp.pd, seg.inv_stag):
                self._refuse(qp, seg, Terminate(Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION,
                                                RdmapEcode.CANNOT_INVALIDATE),
                             EventType.QP_ACCESS_ERR, WCStatus.LOC_PROT_ERR)
                return
            inv = seg.inv_stag
            flags |= WCFlags.WITH_INV
        if imm:
            # softnic's Immediate Data: the 32-bit verbs immediate, then the length of
            # the RDMA Write it follows (what IBV_WC_RECV_RDMA_WITH_IMM reports).
            imm_data = int.from_bytes(seg.payload[:4], "big")
            byte_len = int.from_bytes(seg.payload[4:8], "big")
            flags |= WCFlags.WITH_IMM
            opcode = WCOpcode.RECV_RDMA_WITH_IMM
        wqe, qp.resp.wqe = qp.resp.wqe, None
        iwq.recv_msn += 1
        self.counters["rdma_recvs"] += 1
        self.post_cqe(qp.recv_cq, WC(wqe.wr_id, WCStatus.SUCCESS, opcode, qp.qpn,
                                     byte_len=byte_len, imm_data=imm_data, wc_flags=flags,
                                     src_qp=qp.attr.dest_qp_num, invalidated_rkey=inv), qp,
                      solicited=info.solicited)

    def _rx_read_request(self, qp, seg: Segment) -> None:
        iwq = qp.iw
        try:
            rr = iw.ReadRequest.decode(seg.payload)
        except iw.IwarpError:
            self._refuse(qp, seg, Terminate(Layer.RDMAP, RdmapEtype.REMOTE_OPERATION,
                                            RdmapEcode.UNSPECIFIED), EventType.QP_FATAL)
            return
        if seg.msn != iwq.rreq_msn or seg.mo != 0 or not seg.last:
            self._refuse(qp, seg, Terminate(Layer.DDP, DdpEtype.UNTAGGED_BUFFER,
                                            DdpUntaggedEcode.INVALID_MSN_RANGE),
                         EventType.QP_FATAL)
            return
        if len(iwq.resp_out) >= max(1, qp.attr.max_dest_rd_atomic):
            self._refuse(qp, seg, Terminate(Layer.RDMAP, RdmapEtype.REMOTE_OPERATION,
                                            RdmapEcode.CATASTROPHIC_STREAM), EventType.QP_FATAL)
            return
        view, codes = self._classify(qp, rr.src_stag, rr.src_to, rr.size, Access.REMOTE_READ)
        if view is None:
            # A Read Request is RDMAP's message: its STag errors are RDMAP's.
            self._refuse(qp, seg, Terminate(Layer.RDMAP, RdmapEtype.REMOTE_PROTECTION,
                                            codes[1]), EventType.QP_ACCESS_ERR)
            return
        iwq.rreq_msn += 1
        iwq.resp_out.append([rr.sink_stag, rr.sink_to, view, 0])
        self.mark_ready(qp)

    def _rx_terminate(self, qp, seg: Segment) -> None:
        self.counters["terminate_rcvd"] += 1
        try:
            term = Terminate.decode(seg.payload)
        except iw.IwarpError:
            term = Terminate(Layer.RDMAP, RdmapEtype.CATASTROPHIC, RdmapEcode.UNSPECIFIED)
        qp.iw.last_terminate = term
        status = TERMINATE_STATUS.get((term.layer, term.etype), WCStatus.REM_OP_ERR)
        if term.layer == Layer.DDP and term.etype == DdpEtype.UNTAGGED_BUFFER \
                and term.ecode == DdpUntaggedEcode.INVALID_MSN_NO_BUFFER:
            status = _NO_BUFFER
        wqe = self._named_wqe(qp, term)
        if wqe is not None and not wqe.done:
            wqe.done = True
            wqe.status = status
        qp.iw.terminated = True
        completer.complete(self, qp)       # the named WR's error, in order; then ERR
        self.to_error(qp)
        self._unbind(qp)
        self.events.append((EventType.QP_FATAL, qp))

    def _named_wqe(self, qp, term: Terminate):
        """The outstanding send WQE whose segment the Terminate quotes."""
        seg = term.quoted_segment()
        if seg is None:
            return None
        for w in qp.sq:
            if w.first_psn is None:
                break
            msn = getattr(w, "iw_msn", None)
            if seg.tagged and seg.opcode == Opcode.RDMA_WRITE and w.opcode in WRITES \
                    and w.rkey == seg.stag and \
                    w.remote_addr <= seg.to <= w.remote_addr + w.length:
                return w
            if not seg.tagged and seg.qn == QN.READ_REQUEST and w.opcode == W.RDMA_READ \
                    and msn == seg.msn:
                return w
            if not seg.tagged and seg.qn == QN.SEND and msn == seg.msn and w.opcode in TAKES_RECV:
                return w
        return None

    # ------------------------------------------------------------ output

    def datagrams_to_send(self, now: float) -> list:
        return []

    def stream_data_to_send(self, now: float, budget: int = 1 << 22) -> list[tuple[int, bytes]]:
        """Bytes for each connection: handshake frames, Terminates, then FPDUs of the
        ready QPs, up to about ``budget`` bytes per QP (the rest waits for the next call)."""
        out = []
        if budget <= 0:                                 # the driver is backlogged: frames only
            ready = {}
        else:
            ready, self._ready = self._ready, {}
        for qp in ready:
            c = qp.iw.conn if hasattr(qp, "iw") else None
            if qp.closed or c is None or c.state != ConnState.STREAMING or not c.may_send:
                continue
            if self._generate(qp, c, budget):
                self._ready[qp] = None                  # more to send next time
        for c in self.conns.values():
            if c.tx:
                out.append((c.cid, b"".join(c.tx)))
                c.tx.clear()
        return out

    def _generate(self, qp, c: Conn, budget: int) -> bool:
        """FPDUs of this QP into ``c.tx``; True if it stopped at the budget."""
        iwq = qp.iw
        tx = c.tx
        # Read Responses first: they answer requests that arrived earlier.
        used = self._responses(qp, tx, budget)
        if iwq.resp_out:
            return True
        if qp.state not in (QPState.RTS, QPState.SQD):
            return False
        sq = qp.sq
        while qp.req.send_idx < len(sq) and not qp.req.error:
            wqe = sq[qp.req.send_idx]
            if wqe.first_psn is None and not wqe.done:
                if qp.state != QPState.RTS:
                    break
                if wqe.flags & SendFlags.FENCE and iwq.reads:
                    break
                if wqe.opcode == W.RDMA_READ and len(iwq.reads) >= max(1, qp.attr.max_rd_atomic):
                    break
                requester.start(self, qp, wqe)          # local checks, LOCAL_INV
                if wqe.done:
                    if wqe.status is not None and wqe.status != WCStatus.SUCCESS:
                        qp.req.error = True
                    qp.req.send_idx += 1
                    continue
                wqe.next_pkt = 0                          # here: bytes sent so far
                wqe.got_bytes = 0
                if wqe.opcode in SENDS:                 # (no SEND_WITH_IMM on iWARP)
                    wqe.iw_msn = iwq.send_msn
                    iwq.send_msn += 1
                elif wqe.opcode == W.RDMA_READ:
                    wqe.iw_msn = iwq.read_msn
                    iwq.read_msn += 1
                elif wqe.opcode == W.RDMA_WRITE_WITH_IMM:
                    wqe.iw_msn = iwq.send_msn
                    iwq.send_msn += 1
            elif wqe.done:
                qp.req.send_idx += 1
                continue
            used += self._emit(qp, wqe, tx, budget - used)
            if wqe.next_pkt < wqe.length or (wqe.length == 0 and wqe.next_pkt == 0):
                return True                               # budget reached inside the message
            qp.req.send_idx += 1
            if wqe.opcode == W.RDMA_READ:
                iwq.reads.append(wqe)
            else:
                wqe.done = True                           # handed to TCP: complete
                wqe.status = WCStatus.SUCCESS
            if used >= budget:
                completer.complete(self, qp)
                return qp.req.send_idx < len(sq)
        completer.complete(self, qp)
        return False

    def _responses(self, qp, tx: list, budget: int) -> int:
        """Read Responses into ``tx`` until done or about ``budget`` bytes; bytes used."""
        resp_out = qp.iw.resp_out
        used = 0
        while resp_out:
            r = resp_out[0]
            stag, to, view, off = r
            total = len(view)
            while True:
                n = min(MULPDU, total - off)
                tx.append(iw.encode_fpdu(Segment(Opcode.RDMA_READ_RESPONSE, off + n == total,
                                                 view[off:off + n], stag=stag, to=to + off)))
                self.counters["sent_pkts"] += 1
                off += n
                used += n + 32
                if off >= total:
                    break
                if used >= budget:
                    r[3] = off
                    return used
            resp_out.popleft()
        return used

    def _emit(self, qp, wqe, tx: list, room: int) -> int:
        """Segments of ``wqe`` from byte ``wqe.next_pkt`` on, until done or ``room`` is used."""
        op = wqe.opcode
        counters = self.counters
        if op == W.RDMA_READ:
            sink_stag = wqe.sges[0][2] if wqe.sges else 0
            wqe.sink_stag = sink_stag
            wqe.sink_to = wqe.sges[0][0] if wqe.sges else 0
            rr = iw.ReadRequest(sink_stag, wqe.sink_to, wqe.length, wqe.rkey, wqe.remote_addr)
            tx.append(iw.encode_fpdu(Segment(Opcode.RDMA_READ_REQUEST, True, rr.encode(),
                                             qn=QN.READ_REQUEST, msn=wqe.iw_msn)))
            counters["sent_pkts"] += 1
            wqe.next_pkt = max(wqe.length, 1)
            return 64
        total = wqe.length
        off = wqe.next_pkt
        used = 0
        if op in SENDS:
            se = bool(wqe.flags & SendFlags.SOLICITED)
            inv = op == W.SEND_WITH_INV
            opcode = {(False, False): Opcode.SEND, (True, False): Opcode.SEND_SE,
                      (False, True): Opcode.SEND_INVALIDATE,
                      (True, True): Opcode.SEND_SE_INVALIDATE}[(se, inv)]
        while True:
            n = min(MULPDU, total - off)
            last = off + n == total
            data = requester.gather(wqe, off, n)
            if op in SENDS:
                seg = Segment(opcode, last, data, qn=QN.SEND, msn=wqe.iw_msn, mo=off,
                              inv_stag=wqe.inv_rkey if inv else 0)
            else:
                seg = Segment(Opcode.RDMA_WRITE, last, data, stag=wqe.rkey,
                              to=wqe.remote_addr + off)
            tx.append(iw.encode_fpdu(seg))
            counters["sent_pkts"] += 1
            off += n
            used += n + 32
            if last:
                break
            if used >= room:
                wqe.next_pkt = off
                return used
        wqe.next_pkt = max(total, 1)
        if op == W.RDMA_WRITE_WITH_IMM:
            imm = wqe.imm.to_bytes(4, "big") + (total & 0xFFFFFFFF).to_bytes(4, "big")
            se = bool(wqe.flags & SendFlags.SOLICITED)
            tx.append(iw.encode_fpdu(Segment(Opcode.IMMEDIATE_DATA_SE if se
                                             else Opcode.IMMEDIATE_DATA, True, imm,
                                             qn=QN.SEND, msn=wqe.iw_msn)))
            counters["sent_pkts"] += 1
        return used

    # no retransmission timers on this transport
    def get_timer(self):
        return None

    def handle_timer(self, now: float) -> None:
        return None


_HANDLERS = {
    Opcode.RDMA_WRITE: IwarpDevice._rx_write,
    Opcode.RDMA_READ_RESPONSE: IwarpDevice._rx_read_response,
    Opcode.RDMA_READ_REQUEST: IwarpDevice._rx_read_request,
    Opcode.SEND: IwarpDevice._rx_send,
    Opcode.SEND_INVALIDATE: IwarpDevice._rx_send,
    Opcode.SEND_SE: IwarpDevice._rx_send,
    Opcode.SEND_SE_INVALIDATE: IwarpDevice._rx_send,
    Opcode.IMMEDIATE_DATA: IwarpDevice._rx_send,
    Opcode.IMMEDIATE_DATA_SE: IwarpDevice._rx_send,
    Opcode.TERMINATE: IwarpDevice._rx_terminate,
}
