"""The communication manager: IBTA CM on QP1, as a pure state machine.

One ``CM`` per device.  It speaks REQ/MRA/REJ/REP/RTU/DREQ/DREP and
SIDR_REQ/SIDR_REP (``wire.mad``) carried as UD SENDs to QP1, keeps each
connection's state (IBTA vol. 1, 12.9), retransmits its last message when the
peer's response timeout passes (at most ``max_cm_retries`` times), answers
duplicates from what it sent before, rejects a REQ nobody listens for, and
holds a closed connection in time-wait so that late duplicates find it.

Sans-I/O like the device: inputs are ``receive(mad, src, now)``,
``handle_timer(now)`` and the consumer's calls (``listen``, ``connect``,
``accept``, ``reject``, ``establish``, ``disconnect``, ``sidr_request``,
``sidr_reply``, ``destroy``); outputs are pulled with ``datagrams()`` (UD
packets without their ICRC, and the address each goes to), ``get_timer()``,
and events handed to ``on_event`` (a list by default).  Randomness (comm IDs,
PSNs) comes from the ``random.Random`` it is given.

The consumer (rdma_cm's faces) owns the QPs: the CM reports what the peer
said (its QPN, PSN, resources) and the face moves its QP through RTR and RTS.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import Enum

from ..wire import mad as M
from ..wire.psn import psn_add
from ..wire.roce import Opcode, encode

#: ETIMEDOUT / ECONNREFUSED as rdma_cm reports them in an event's status
ETIMEDOUT = 110
ECONNRESET = 104


def cm_time(exp: int) -> float:
    """Seconds of an IBTA 5-bit time exponent: 4.096 us * 2**exp."""
    return 4.096e-6 * (1 << (exp & 31))


class State(Enum):
    IDLE = "idle"
    REQ_SENT = "req_sent"
    MRA_REQ_RCVD = "mra_req_rcvd"     # the passive side said it needs more time
    REQ_RCVD = "req_rcvd"
    REP_SENT = "rep_sent"
    REP_RCVD = "rep_rcvd"
    ESTABLISHED = "established"
    DREQ_SENT = "dreq_sent"
    TIMEWAIT = "timewait"
    SIDR_REQ_SENT = "sidr_req_sent"
    SIDR_REQ_RCVD = "sidr_req_rcvd"


class EventKind(Enum):
    """What the CM tells its consumer (rdma_cm's event names where they match)."""
    CONNECT_REQUEST = "connect_request"       # a REQ (or SIDR_REQ) for a listener
    CONNECT_RESPONSE = "connect_response"     # a REP: the active side moves its QP, then establish()
    ESTABLISHED = "established"               # RTU received (passive side)
    REJECTED = "rejected"                     # a REJ; status is its reason
    UNREACHABLE = "unreachable"               # retries exhausted; status ETIMEDOUT
    DISCONNECTED = "disconnected"             # DREQ received, or our DREQ answered / timed out
    TIMEWAIT_EXIT = "timewait_exit"           # the connection is gone
    SIDR_REPLY = "sidr_reply"                 # a SIDR_REP; status is its status


@dataclass
class CMEvent:
    kind: EventKind
    conn: "Conn"
    listener: "Listener | None" = None
    status: int = 0
    private_data: bytes = b""


@dataclass(frozen=True)
class CMConfig:
    #: how long this CM takes to answer (exponent), what it advertises
    response_timeout: int = 16          # 268 ms
    max_cm_retries: int = 15
    #: what an MRA asks the peer to wait (exponent)
    service_timeout: int = 20
    #: time-wait (seconds)
    timewait: float = 1.0
    #: how long a SIDR exchange's answer is kept for duplicates (seconds)
    sidr_keep: float = 2.0


@dataclass(eq=False)
class Listener:
    service_id: int
    owner: object = None
    backlog: int = 0                      # <= 0: unlimited
    pending: int = 0                      # REQs reported and not yet accepted or rejected
    closed: bool = False


@dataclass(eq=False)
class Conn:
    """One connection (or SIDR exchange) as this CM sees it."""
    local_id: int
    peer: tuple                          # (ip, udp port) of the peer's device
    active: bool
    state: State = State.IDLE
    owner: object = None
    listener: Listener | None = None
    remote_id: int = 0
    service_id: int = 0
    qp_type: int = 0                     # transport service type: 0 RC, 1 UC
    local_qpn: int = 0
    local_psn: int = 0
    remote_qpn: int = 0
    remote_psn: int = 0
    remote_qkey: int = 0
    remote_guid: int = 0
    remote_gid: bytes = b""
    responder_resources: int = 0         # as agreed: what this side accepts
    initiator_depth: int = 0             # as agreed: what this side issues
    retry_count: int = 7
    rnr_retry_count: int = 7
    path_mtu: int = 5
    local_ack_timeout: int = 14
    srq: int = 0
    peer_cm_timeout: int = 16            # exponent the peer advertised
    max_retries: int = 15
    req: M.Req | None = None             # the REQ (both sides keep it)
    private_data: bytes = b""            # the last private data received
    last: bytes | None = None            # the last MAD sent (answers duplicates)
    retries: int = 0
    timer_at: float | None = None
    reported: bool = False               # a CONNECT_REQUEST counted against the backlog


class CM:
    def __init__(self, gid: bytes | str, guid: int, rng, *, config: CMConfig | None = None):
        self.gid = M.gid_bytes(gid)
        self.guid = guid
        self.rng = rng
        self.config = config or CMConfig()
        self.listeners: dict[int, Listener] = {}
        self.conns: dict[int, Conn] = {}                 # by local comm ID / SIDR request ID
        self.by_remote: dict[tuple, Conn] = {}           # (peer, remote comm ID)
        self.events: list[CMEvent] = []
        self.on_event = self.events.append
        self.counters = {"cm_sent": 0, "cm_rcvd": 0, "cm_retransmits": 0, "cm_duplicates": 0,
                         "cm_bad": 0, "cm_rej_sent": 0, "cm_stray": 0}
        self._out: list[tuple[bytes, tuple]] = []
        self._timers: list[tuple[float, int, Conn]] = []
        self._tseq = 0
        self._psn = rng.getrandbits(24)

    # ------------------------------------------------------------ consumer calls

    def listen(self, service_id: int, owner=None, backlog: int = 0) -> Listener:
        if service_id in self.listeners:
            raise ValueError(f"service ID {service_id:#x} already has a listener")
        lst = Listener(service_id, owner, backlog)
        self.listeners[service_id] = lst
        return lst

    def unlisten(self, lst: Listener) -> None:
        lst.closed = True
        if self.listeners.get(lst.service_id) is lst:
            del self.listeners[lst.service_id]

    def _new_conn(self, peer, active: bool, owner) -> Conn:
        while True:
            cid = self.rng.getrandbits(32)
            if cid and cid not in self.conns:
                break
        c = Conn(cid, tuple(peer), active, owner=owner)
        self.conns[cid] = c
        return c

    def new_psn(self) -> int:
        return self.rng.getrandbits(24)

    def connect(self, peer, *, service_id: int, remote_gid: bytes | str, local_qpn: int,
                psn: int, responder_resources: int = 0, initiator_depth: int = 0,
                retry_count: int = 7, rnr_retry_count: int = 7, path_mtu: int = 5,
                local_ack_timeout: int = 14, srq: int = 0, qp_type: int = 0,
                private_data: bytes = b"", owner=None, now: float) -> Conn:
        """Send a REQ to the device at ``peer``."""
        c = self._new_conn(peer, True, owner)
        c.service_id = service_id
        c.local_qpn, c.local_psn = local_qpn, psn
        c.responder_resources, c.initiator_depth = responder_resources, initiator_depth
        c.retry_count, c.rnr_retry_count = retry_count & 7, rnr_retry_count & 7
        c.path_mtu, c.local_ack_timeout, c.srq, c.qp_type = path_mtu, local_ack_timeout, srq, qp_type
        c.remote_gid = M.gid_bytes(remote_gid)
        c.max_retries = self.config.max_cm_retries
        c.req = M.Req(local_comm_id=c.local_id, service_id=service_id, local_ca_guid=self.guid,
                      local_qpn=local_qpn, starting_psn=psn,
                      primary_local_port_gid=self.gid, primary_remote_port_gid=c.remote_gid,
                      responder_resources=responder_resources, initiator_depth=initiator_depth,
                      remote_cm_response_timeout=self.config.response_timeout,
                      transport_service_type=qp_type,
                      local_cm_response_timeout=self.config.response_timeout,
                      retry_count=c.retry_count, path_mtu=path_mtu,
                      rnr_retry_count=c.rnr_retry_count, max_cm_retries=c.max_retries,
                      srq=srq, primary_local_ack_timeout=local_ack_timeout,
                      private_data=private_data)
        c.state = State.REQ_SENT
        self._send_first(c, c.req, now)
        return c

    def accept(self, c: Conn, *, local_qpn: int, psn: int, responder_resources: int = 0,
               initiator_depth: int = 0, rnr_retry_count: int = 7, srq: int = 0,
               private_data: bytes = b"", now: float) -> None:
        """Answer a REQ with a REP."""
        if c.state not in (State.REQ_RCVD,):
            raise ValueError(f"accept in state {c.state.value}")
        self._unpend(c)
        req = c.req
        # never more than the peer offered
        c.responder_resources = min(responder_resources, req.initiator_depth)
        c.initiator_depth = min(initiator_depth, req.responder_resources)
        c.local_qpn, c.local_psn, c.srq = local_qpn, psn, srq
        c.rnr_retry_count = rnr_retry_count & 7
        c.state = State.REP_SENT
        rep = M.Rep(local_comm_id=c.local_id, remote_comm_id=c.remote_id, local_qpn=local_qpn,
                    starting_psn=psn, local_ca_guid=self.guid,
                    responder_resources=c.responder_resources,
                    initiator_depth=c.initiator_depth, rnr_retry_count=c.rnr_retry_count,
                    srq=srq, private_data=private_data)
        self._send_first(c, rep, now)

    def reject(self, c: Conn, *, reason: int = M.RejReason.CONSUMER_DEFINED,
               private_data: bytes = b"", now: float) -> None:
        """Refuse a REQ (or a REP, on the active side)."""
        if c.state not in (State.REQ_RCVD, State.REP_RCVD):
            raise ValueError(f"reject in state {c.state.value}")
        self._unpend(c)
        rej = M.Rej(local_comm_id=c.local_id, remote_comm_id=c.remote_id, reason=reason,
                    message_rejected=0 if c.state is State.REQ_RCVD else 1,
                    private_data=private_data)
        self.counters["cm_rej_sent"] += 1
        self._emit(rej, c.peer)
        c.last = self._last
        self._timewait(c, now)

    def establish(self, c: Conn, *, private_data: bytes = b"", now: float) -> None:
        """Active side, after its QP reached RTS: send the RTU."""
        if c.state is not State.REP_RCVD:
            raise ValueError(f"establish in state {c.state.value}")
        c.state = State.ESTABLISHED
        self._emit(M.Rtu(local_comm_id=c.local_id, remote_comm_id=c.remote_id,
                         private_data=private_data), c.peer)
        c.last = self._last
        self._stop(c)

    def disconnect(self, c: Conn, *, private_data: bytes = b"", now: float) -> bool:
        """Send a DREQ; False if there is no connection to end (already ended)."""
        if c.state is State.REP_SENT:
            c.state = State.ESTABLISHED     # the peer may be using it already
        if c.state is not State.ESTABLISHED:
            return False
        c.state = State.DREQ_SENT
        c.max_retries = self.config.max_cm_retries
        self._send_first(c, M.Dreq(local_comm_id=c.local_id, remote_comm_id=c.remote_id,
                                   remote_qpn=c.remote_qpn, private_data=private_data), now)
        return True

    def destroy(self, c: Conn, now: float) -> None:
        """The consumer is gone: end whatever this connection was doing, quietly."""
        c.owner = None
        if c.state in (State.REQ_RCVD, State.REP_RCVD):
            self.reject(c, now=now)
        elif c.state in (State.ESTABLISHED, State.REP_SENT):
            self.disconnect(c, now=now)
        elif c.state in (State.REQ_SENT, State.MRA_REQ_RCVD):
            self._emit(M.Rej(local_comm_id=c.local_id, remote_comm_id=c.remote_id,
                             reason=M.RejReason.TIMEOUT), c.peer)
            self._forget(c)
        elif c.state in (State.SIDR_REQ_SENT, State.IDLE):
            self._forget(c)
        elif c.state is State.SIDR_REQ_RCVD:
            self.sidr_reply(c, status=M.SidrStatus.REJECT, qpn=0, qkey=0, now=now)

    def sidr_request(self, peer, *, service_id: int, private_data: bytes = b"", owner=None,
                     now: float) -> Conn:
        c = self._new_conn(peer, True, owner)
        c.service_id = service_id
        c.state = State.SIDR_REQ_SENT
        c.max_retries = self.config.max_cm_retries
        c.peer_cm_timeout = self.config.response_timeout
        self._send_first(c, M.SidrReq(request_id=c.local_id, service_id=service_id,
                                      private_data=private_data), now)
        return c

    def sidr_reply(self, c: Conn, *, status: int, qpn: int, qkey: int,
                   private_data: bytes = b"", now: float) -> None:
        if c.state is not State.SIDR_REQ_RCVD:
            raise ValueError(f"SIDR reply in state {c.state.value}")
        self._unpend(c)
        self._emit(M.SidrRep(request_id=c.remote_id, status=status, qpn=qpn,
                             service_id=c.service_id, qkey=qkey, private_data=private_data),
                   c.peer)
        c.last = self._last
        c.state = State.TIMEWAIT
        self._arm(c, now + self.config.sidr_keep)

    # ------------------------------------------------------------ sans-I/O surface

    def datagrams(self) -> list[tuple[bytes, tuple]]:
        out, self._out = self._out, []
        return out

    @property
    def pending(self) -> bool:
        return bool(self._out)

    def get_timer(self) -> float | None:
        h = self._timers
        while h:
            t, _, c = h[0]
            if c.timer_at == t:
                return t
            heapq.heappop(h)
        return None

    def handle_timer(self, now: float) -> None:
        h = self._timers
        while h and h[0][0] <= now:
            t, _, c = heapq.heappop(h)
            if c.timer_at != t:
                continue
            c.timer_at = None
            self._timeout(c, now)

    def receive(self, mad: bytes, src: tuple, now: float) -> None:
        """A MAD that arrived on QP1 from the device at ``src``."""
        try:
            hdr, msg = M.decode_cm(bytes(mad))
        except M.MadError:
            self.counters["cm_bad"] += 1
            return
        self.counters["cm_rcvd"] += 1
        src = tuple(src)
        handler = self._HANDLERS[type(msg)]
        handler(self, msg, src, now)

    # ------------------------------------------------------------ internals

    def _event(self, kind: EventKind, c: Conn, **kw) -> None:
        self.on_event(CMEvent(kind, c, **kw))

    def _emit(self, msg, dest) -> None:
        data = M.encode_cm(msg, self._tid(msg))
        self._last = data
        self._send_raw(data, dest)

    def _tid(self, msg) -> int:
        # one transaction per connection: the local comm ID in the low half
        return (self.guid & 0xFFFFFFFF) << 32 | getattr(msg, "local_comm_id",
                                                       getattr(msg, "request_id", 0))

    def _send_raw(self, data: bytes, dest) -> None:
        self._psn = psn_add(self._psn, 1)
        pkt = encode(Opcode.UD_SEND_ONLY, dest_qp=M.GSI_QPN, psn=self._psn, payload=data,
                     deth=(M.GSI_QKEY, M.GSI_QPN))
        self.counters["cm_sent"] += 1
        self._out.append((bytes(pkt), tuple(dest)))

    def _send_first(self, c: Conn, msg, now: float) -> None:
        """Send a message that expects an answer, and time it."""
        self._emit(msg, c.peer)
        c.last = self._last
        c.retries = 0
        self._arm(c, now + self._wait(c))

    def _wait(self, c: Conn) -> float:
        # the peer's response time, plus a round trip's worth of slack
        return cm_time(c.peer_cm_timeout) + 0.01

    def _arm(self, c: Conn, at: float) -> None:
        c.timer_at = at
        self._tseq += 1
        heapq.heappush(self._timers, (at, self._tseq, c))

    def _stop(self, c: Conn) -> None:
        c.timer_at = None

    def _unpend(self, c: Conn) -> None:
        if c.reported and c.listener is not None:
            c.listener.pending -= 1
        c.reported = False

    def _forget(self, c: Conn) -> None:
        c.timer_at = None
        c.state = State.IDLE
        self.conns.pop(c.local_id, None)
        key = (c.peer, c.remote_id)
        if self.by_remote.get(key) is c:
            del self.by_remote[key]

    def _timewait(self, c: Conn, now: float) -> None:
        c.state = State.TIMEWAIT
        self._arm(c, now + self.config.timewait)

    def _timeout(self, c: Conn, now: float) -> None:
        s = c.state
        if s is State.TIMEWAIT:
            self._forget(c)
            if c.owner is not None:
                self._event(EventKind.TIMEWAIT_EXIT, c)
            return
        if s in (State.REQ_SENT, State.MRA_REQ_RCVD, State.REP_SENT, State.DREQ_SENT,
                 State.SIDR_REQ_SENT):
            if c.retries < c.max_retries and c.last is not None:
                c.retries += 1
                self.counters["cm_retransmits"] += 1
                self._send_raw(c.last, c.peer)
                if s is State.MRA_REQ_RCVD:
                    c.state = State.REQ_SENT
                self._arm(c, now + self._wait(c))
                return
            # retries exhausted
            if s is State.DREQ_SENT:
                self._timewait(c, now)
                self._event(EventKind.DISCONNECTED, c)
                return
            if s is State.REP_SENT:
                self._emit(M.Rej(local_comm_id=c.local_id, remote_comm_id=c.remote_id,
                                 reason=M.RejReason.TIMEOUT, message_rejected=1), c.peer)
                self._timewait(c, now)
            else:
                self._forget(c)
            self._event(EventKind.UNREACHABLE, c, status=ETIMEDOUT)

    # ------------------------------------------------------------ handlers

    def _find(self, remote_of_peer: int, src) -> Conn | None:
        """The connection a message addressed to our comm ID ``remote_of_peer`` belongs to."""
        c = self.conns.get(remote_of_peer)
        if c is None or c.peer[0] != src[0]:
            return None
        return c

    def _on_req(self, req: M.Req, src, now: float) -> None:
        dup = self.by_remote.get((src, req.local_comm_id))
        if dup is not None:
            self.counters["cm_duplicates"] += 1
            if dup.state is State.REQ_RCVD:
                self._emit(M.Mra(local_comm_id=dup.local_id, remote_comm_id=dup.remote_id,
                                 message_mraed=0, service_timeout=self.config.service_timeout),
                           src)
            elif dup.state in (State.REP_SENT, State.TIMEWAIT) and dup.last is not None:
                self._send_raw(dup.last, src)             # the REP (or REJ) again
            return
        lst = self.listeners.get(req.service_id)
        c = self._new_conn(src, False, None)
        c.remote_id = req.local_comm_id
        self.by_remote[(src, c.remote_id)] = c
        c.service_id = req.service_id
        if lst is None or (lst.backlog > 0 and lst.pending >= lst.backlog):
            reason = M.RejReason.INVALID_SERVICE_ID if lst is None else M.RejReason.NO_RESOURCES
            self.counters["cm_rej_sent"] += 1
            self._emit(M.Rej(local_comm_id=c.local_id, remote_comm_id=c.remote_id,
                             reason=reason, message_rejected=0), src)
            c.last = self._last
            self._timewait(c, now)
            return
        c.req = req
        c.listener = lst
        c.remote_qpn, c.remote_psn, c.remote_qkey = req.local_qpn, req.starting_psn, req.local_qkey
        c.remote_guid, c.remote_gid = req.local_ca_guid, req.primary_local_port_gid
        c.qp_type = req.transport_service_type
        c.retry_count, c.rnr_retry_count = req.retry_count, req.rnr_retry_count
        c.path_mtu, c.local_ack_timeout = req.path_mtu, req.primary_local_ack_timeout
        c.responder_resources, c.initiator_depth = req.initiator_depth, req.responder_resources
        c.peer_cm_timeout = req.remote_cm_response_timeout
        c.max_retries = req.max_cm_retries
        c.private_data = req.private_data
        c.state = State.REQ_RCVD
        c.reported = True
        lst.pending += 1
        self._event(EventKind.CONNECT_REQUEST, c, listener=lst, private_data=req.private_data)

    def _on_mra(self, mra: M.Mra, src, now: float) -> None:
        c = self._find(mra.remote_comm_id, src)
        if c is None or c.state is not State.REQ_SENT or mra.message_mraed != 0:
            self.counters["cm_stray"] += 1
            return
        c.state = State.MRA_REQ_RCVD
        self._arm(c, now + cm_time(mra.service_timeout) + self._wait(c))

    def _on_rej(self, rej: M.Rej, src, now: float) -> None:
        c = self._find(rej.remote_comm_id, src)
        if c is None or c.state not in (State.REQ_SENT, State.MRA_REQ_RCVD, State.REP_SENT,
                                        State.REP_RCVD):
            self.counters["cm_stray"] += 1
            return
        self._unpend(c)
        c.remote_id = c.remote_id or rej.local_comm_id
        c.private_data = rej.private_data
        self._timewait(c, now)
        self._event(EventKind.REJECTED, c, status=rej.reason, private_data=rej.private_data)

    def _on_rep(self, rep: M.Rep, src, now: float) -> None:
        c = self._find(rep.remote_comm_id, src)
        if c is None:
            self.counters["cm_stray"] += 1
            return
        if c.state in (State.ESTABLISHED, State.REP_RCVD, State.DREQ_SENT, State.TIMEWAIT):
            self.counters["cm_duplicates"] += 1
            if c.state is State.ESTABLISHED and c.last is not None:
                self._send_raw(c.last, src)               # the RTU was lost: again
            return
        if c.state not in (State.REQ_SENT, State.MRA_REQ_RCVD):
            self.counters["cm_stray"] += 1
            return
        self._stop(c)
        c.remote_id = rep.local_comm_id
        self.by_remote[(c.peer, c.remote_id)] = c
        c.remote_qpn, c.remote_psn, c.remote_qkey = rep.local_qpn, rep.starting_psn, rep.local_qkey
        c.remote_guid = rep.local_ca_guid
        # the passive side's answer bounds ours
        c.initiator_depth = min(c.initiator_depth, rep.responder_resources)
        c.responder_resources = min(c.responder_resources, rep.initiator_depth)
        c.rnr_retry_count = rep.rnr_retry_count
        c.private_data = rep.private_data
        c.state = State.REP_RCVD
        self._event(EventKind.CONNECT_RESPONSE, c, private_data=rep.private_data)

    def _on_rtu(self, rtu: M.Rtu, src, now: float) -> None:
        c = self._find(rtu.remote_comm_id, src)
        if c is None or c.state is not State.REP_SENT:
            self.counters["cm_stray" if c is None else "cm_duplicates"] += 1
            return
        self._stop(c)
        c.state = State.ESTABLISHED
        self._event(EventKind.ESTABLISHED, c, private_data=rtu.private_data)

    def _on_dreq(self, dreq: M.Dreq, src, now: float) -> None:
        c = self._find(dreq.remote_comm_id, src)
        drep = M.Drep(local_comm_id=c.local_id if c else dreq.remote_comm_id,
                      remote_comm_id=dreq.local_comm_id)
        if c is None:
            self.counters["cm_stray"] += 1
            self._emit(drep, src)             # nothing to end: say so, and the peer moves on
            return
        if c.state is State.TIMEWAIT:
            self.counters["cm_duplicates"] += 1
            self._emit(drep, src)
            return
        if c.state not in (State.ESTABLISHED, State.REP_SENT, State.DREQ_SENT):
            self.counters["cm_stray"] += 1
            return
        self._emit(drep, src)
        was = c.state
        self._timewait(c, now)
        if was is State.REP_SENT:
            # the RTU was lost but the peer is done: the connection existed
            self._event(EventKind.ESTABLISHED, c)
        self._event(EventKind.DISCONNECTED, c, private_data=dreq.private_data)

    def _on_drep(self, drep: M.Drep, src, now: float) -> None:
        c = self._find(drep.remote_comm_id, src)
        if c is None or c.state is not State.DREQ_SENT:
            self.counters["cm_stray"] += 1
            return
        self._timewait(c, now)
        self._event(EventKind.DISCONNECTED, c, private_data=drep.private_data)

    def _on_sidr_req(self, req: M.SidrReq, src, now: float) -> None:
        dup = self.by_remote.get((src, req.request_id))
        if dup is not None:
            self.counters["cm_duplicates"] += 1
            if dup.state is State.TIMEWAIT and dup.last is not None:
                self._send_raw(dup.last, src)
            return
        c = self._new_conn(src, False, None)
        c.remote_id = req.request_id
        c.service_id = req.service_id
        self.by_remote[(src, c.remote_id)] = c
        lst = self.listeners.get(req.service_id)
        c.state = State.SIDR_REQ_RCVD
        if lst is None:
            self.sidr_reply(c, status=M.SidrStatus.UNSUPPORTED, qpn=0, qkey=0, now=now)
            return
        c.listener = lst
        c.private_data = req.private_data
        c.reported = True
        lst.pending += 1
        self._event(EventKind.CONNECT_REQUEST, c, listener=lst, private_data=req.private_data)

    def _on_sidr_rep(self, rep: M.SidrRep, src, now: float) -> None:
        c = self.conns.get(rep.request_id)
        if c is None or c.state is not State.SIDR_REQ_SENT or c.peer[0] != src[0]:
            self.counters["cm_stray"] += 1
            return
        c.remote_qpn, c.remote_qkey = rep.qpn, rep.qkey
        c.private_data = rep.private_data
        self._forget(c)
        self._event(EventKind.SIDR_REPLY, c, status=rep.status, private_data=rep.private_data)

    _HANDLERS = {M.Req: _on_req, M.Mra: _on_mra, M.Rej: _on_rej, M.Rep: _on_rep, M.Rtu: _on_rtu,
                 M.Dreq: _on_dreq, M.Drep: _on_drep, M.SidrReq: _on_sidr_req,
                 M.SidrRep: _on_sidr_rep}
