"""Queue pair attributes, work requests, and the QP state table.

The state table is data (``TRANSITIONS``): for every legal (current, next)
state pair and QP type, the attribute-mask bits that must be given and those
that may be given, as the IBA spec (and the kernel's ``qp_state_table``)
define them.  ``check_transition`` refuses anything else with EINVAL.
"""

from __future__ import annotations

import functools
import ipaddress
from collections import deque
from dataclasses import dataclass, field, fields

from ..wire.psn import PSN_MASK, psn_add
from ..wire.roce import ROCEV2_PORT
from .enums import Access, QPAttrMask as M, QPState as S, QPType, WROpcode, mtu_bytes
from .errors import VerbsError, einval
from .wr_opcode import RD_ATOMIC

# ---------------------------------------------------------------- attributes


@dataclass(frozen=True)
class AHAttr:
    """Address vector.  ``dgid`` is a GID: an IPv6 address (``::ffff:a.b.c.d`` for
    IPv4, as RoCEv2 has it) or a plain IPv4 address; ``port`` is the peer's UDP port."""
    dgid: str = "::"
    port: int = ROCEV2_PORT
    sl: int = 0
    traffic_class: int = 0
    hop_limit: int = 64
    flow_label: int = 0
    sgid_index: int = 0
    port_num: int = 1

    @property
    def addr(self) -> tuple[str, int]:
        return _gid_address(self.dgid, self.port)


@functools.lru_cache(maxsize=4096)
def _gid_address(dgid: str, port: int) -> tuple[str, int]:
    """(IP, UDP port) of a GID, the IP as a device's address is written (IPv4 for
    an IPv4-mapped GID, else the IPv6 address); the engine asks on every packet."""
    try:
        ip = ipaddress.ip_address(dgid)
    except ValueError:
        raise einval(f"GID {dgid!r} is not an address") from None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip.is_unspecified:
            raise einval(f"GID {dgid} names no port")
        elif ip.is_link_local or ip.scope_id:
            raise einval(f"GID {dgid}: link-local IPv6 GIDs are not supported")
    return (str(ip), port)


@functools.lru_cache(maxsize=4096)
def _dest_of(dgid: str, port: int) -> tuple[str, int] | None:
    """``_gid_address``, or None for a GID that names no port (a QP's address
    vector before RTR: ``::``) or is refused; cached as ``_gid_address`` is."""
    try:
        return _gid_address(dgid, port)
    except VerbsError:
        return None


def gid_of(ip: str) -> str:
    """The RoCEv2 GID of a device's address: ``::ffff:a.b.c.d`` for IPv4, the
    address itself for IPv6."""
    a = ipaddress.ip_address(ip)
    if isinstance(a, ipaddress.IPv4Address):
        return f"::ffff:{a}"
    return str(a)


def same_family(a: str, b: str) -> bool:
    """Are the addresses ``a`` and ``b`` (as ``AHAttr.addr`` gives them) both IPv4 or
    both IPv6?  A device reaches only peers of its own family."""
    return (":" in a) == (":" in b)


@dataclass(frozen=True)
class QPCap:
    max_send_wr: int = 1
    max_recv_wr: int = 10
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = 0


@dataclass(frozen=True)
class QPInitAttr:
    qp_type: QPType = QPType.RC
    send_cq: object = None
    recv_cq: object = None
    srq: object = None
    cap: QPCap = QPCap()
    sq_sig_all: bool = False
    xrc: str | None = None            # XRC: "ini" (XRC_SEND) or "tgt" (XRC_RECV), as RC
    xrcd: object = None               # XRC: the target's domain (an xrc.XRCD)


@dataclass(frozen=True)
class QPAttr:
    qp_state: S = S.RESET
    cur_qp_state: S = S.RESET
    path_mtu: int = 3              # ibv_mtu enum: 1..5 = 256..4096
    qp_access_flags: Access = Access(0)
    pkey_index: int = 0
    port_num: int = 1
    qkey: int = 0
    ah_attr: AHAttr = AHAttr()
    dest_qp_num: int = 0
    rq_psn: int = 0
    sq_psn: int = 0
    max_rd_atomic: int = 1
    max_dest_rd_atomic: int = 1
    min_rnr_timer: int = 12
    timeout: int = 14
    retry_cnt: int = 7
    rnr_retry: int = 7
    en_sqd_async_notify: int = 0
    path_mig_state: int = 0
    cap: QPCap = QPCap()


# ---------------------------------------------------------------- state table

_RC_RTR_REQ = M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN | M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER
_UC_RTR_REQ = M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN
_RC_RTS_REQ = M.SQ_PSN | M.TIMEOUT | M.RETRY_CNT | M.RNR_RETRY | M.MAX_QP_RD_ATOMIC
_RC_RTS_OPT = M.CUR_STATE | M.ALT_PATH | M.ACCESS_FLAGS | M.MIN_RNR_TIMER | M.PATH_MIG_STATE
_UC_RTS_OPT = M.CUR_STATE | M.ALT_PATH | M.ACCESS_FLAGS | M.PATH_MIG_STATE
_UD_RTS_OPT = M.CUR_STATE | M.QKEY
_RC_SQD_OPT = (M.CUR_STATE | M.ALT_PATH | M.AV | M.PKEY_INDEX | M.ACCESS_FLAGS | M.MIN_RNR_TIMER
               | M.MAX_QP_RD_ATOMIC | M.MAX_DEST_RD_ATOMIC | M.PATH_MIG_STATE | M.TIMEOUT
               | M.RETRY_CNT | M.RNR_RETRY)
_NONE = M(0)
RC, UC, UD = QPType.RC, QPType.UC, QPType.UD

#: (current, next) -> {qp type: (required mask, optional mask)}.  STATE is always required.
TRANSITIONS: dict[tuple[S, S], dict[QPType, tuple[M, M]]] = {
    (S.RESET, S.INIT): {RC: (M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS, _NONE),
                        UC: (M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS, _NONE),
                        UD: (M.PKEY_INDEX | M.PORT | M.QKEY, _NONE)},
    (S.INIT, S.INIT): {RC: (_NONE, M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS),
                       UC: (_NONE, M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS),
                       UD: (_NONE, M.PKEY_INDEX | M.PORT | M.QKEY)},
    (S.INIT, S.RTR): {RC: (_RC_RTR_REQ, M.ALT_PATH | M.ACCESS_FLAGS | M.PKEY_INDEX),
                      UC: (_UC_RTR_REQ, M.ALT_PATH | M.ACCESS_FLAGS | M.PKEY_INDEX),
                      UD: (_NONE, M.PKEY_INDEX | M.QKEY)},
    (S.RTR, S.RTS): {RC: (_RC_RTS_REQ, _RC_RTS_OPT),
                     UC: (M.SQ_PSN, _UC_RTS_OPT),
                     UD: (M.SQ_PSN, _UD_RTS_OPT)},
    (S.RTS, S.RTS): {RC: (_NONE, _RC_RTS_OPT), UC: (_NONE, _UC_RTS_OPT), UD: (_NONE, _UD_RTS_OPT)},
    (S.RTS, S.SQD): {t: (_NONE, M.EN_SQD_ASYNC_NOTIFY) for t in (RC, UC, UD)},
    (S.SQD, S.RTS): {RC: (_NONE, _RC_RTS_OPT), UC: (_NONE, _UC_RTS_OPT), UD: (_NONE, _UD_RTS_OPT)},
    (S.SQD, S.SQD): {RC: (_NONE, _RC_SQD_OPT),
                     UC: (_NONE, M.CUR_STATE | M.ALT_PATH | M.AV | M.PKEY_INDEX | M.ACCESS_FLAGS
                          | M.PATH_MIG_STATE),
                     UD: (_NONE, M.PKEY_INDEX | M.QKEY)},
    (S.SQE, S.RTS): {UC: (_NONE, M.CUR_STATE | M.ACCESS_FLAGS), UD: (_NONE, M.CUR_STATE | M.QKEY)},
}
for _s in S:
    TRANSITIONS[(_s, S.RESET)] = {t: (_NONE, _NONE) for t in (RC, UC, UD)}
    if _s != S.RESET:            # as the kernel's table: a QP in RESET cannot go to ERR
        TRANSITIONS[(_s, S.ERR)] = {t: (_NONE, _NONE) for t in (RC, UC, UD)}


#: XRC QPs are RC inside; what the kernel's table (ib_modify_qp_is_ok) lets each role
#: leave out of RC's required attributes: an initiator receives no requests (no responder
#: attributes at RTR), a target sends none (only TIMEOUT and SQ_PSN at RTS).
_XRC_OPTIONAL = {("ini", S.INIT, S.RTR): M.MAX_DEST_RD_ATOMIC | M.MIN_RNR_TIMER,
                 ("tgt", S.RTR, S.RTS): M.RETRY_CNT | M.RNR_RETRY | M.MAX_QP_RD_ATOMIC}


#: ``TRANSITIONS`` as check_transition reads it: (current, next, QP type) ->
#: (required, optional) as plain ints (IntFlag operations cost a call each)
_RULES = {(cur, nxt, t): (int(req), int(opt))
          for (cur, nxt), rules in TRANSITIONS.items() for t, (req, opt) in rules.items()}
_XRC_RELAX = {k: int(v) for k, v in _XRC_OPTIONAL.items()}
_STATES = {int(s): s for s in S}
_M_STATE, _M_CUR_STATE, _M_PATH_MTU, _M_PORT = int(M.STATE), int(M.CUR_STATE), \
    int(M.PATH_MTU), int(M.PORT)
_LIMITS = (("timeout", 31), ("retry_cnt", 7), ("rnr_retry", 7), ("min_rnr_timer", 31))


def check_transition(qp_type: QPType, cur: S, attr: QPAttr, mask: int,
                     xrc: str | None = None) -> S:
    """Validate a modify_qp call; returns the next state.  Raises EINVAL."""
    mask = int(mask)
    if mask & _M_CUR_STATE and attr.cur_qp_state != cur:
        raise einval(f"cur_qp_state {attr.cur_qp_state.name} is not the QP's state {cur.name}")
    if mask & _M_STATE:
        nxt = _STATES.get(attr.qp_state)
        if nxt is None:
            nxt = S(attr.qp_state)          # (raises: not a state)
    else:
        nxt = cur
    rule = _RULES.get((cur, nxt, qp_type))
    if rule is None:
        raise einval(f"{qp_type.name} QP cannot go from {cur.name} to {nxt.name}")
    required, optional = rule
    if xrc is not None:
        relax = _XRC_RELAX.get((xrc, cur, nxt), 0)
        required, optional = required & ~relax, optional | relax
    given = mask & ~_M_STATE
    if missing := required & ~given:
        raise einval(f"{cur.name}->{nxt.name} needs attribute mask bits {M(missing)!r}")
    if extra := given & ~(required | optional):      # CUR_STATE only where the table lists it
        raise einval(f"{cur.name}->{nxt.name} does not accept attribute mask bits {M(extra)!r}")
    if mask & _M_PATH_MTU:
        try:
            mtu_bytes(attr.path_mtu)
        except ValueError as e:
            raise einval(str(e)) from None
    for name, limit in _LIMITS:
        if not 0 <= getattr(attr, name) <= limit:
            raise einval(f"{name} {getattr(attr, name)} out of range 0..{limit}")
    if mask & _M_PORT and attr.port_num != 1:
        raise einval(f"port {attr.port_num} does not exist")
    return nxt


#: the attribute each mask bit selects (the bits as ints: tested once per bit per call)
_PICK = tuple((int(bit), f) for bit, f in {
    M.STATE: "qp_state", M.ACCESS_FLAGS: "qp_access_flags", M.PKEY_INDEX: "pkey_index",
    M.PORT: "port_num", M.QKEY: "qkey", M.AV: "ah_attr", M.PATH_MTU: "path_mtu",
    M.TIMEOUT: "timeout", M.RETRY_CNT: "retry_cnt", M.RNR_RETRY: "rnr_retry",
    M.RQ_PSN: "rq_psn", M.MAX_QP_RD_ATOMIC: "max_rd_atomic", M.MIN_RNR_TIMER: "min_rnr_timer",
    M.SQ_PSN: "sq_psn", M.MAX_DEST_RD_ATOMIC: "max_dest_rd_atomic",
    M.PATH_MIG_STATE: "path_mig_state", M.DEST_QPN: "dest_qp_num",
    M.EN_SQD_ASYNC_NOTIFY: "en_sqd_async_notify",
}.items())


def merge_attr(cur: QPAttr, new: QPAttr, mask: int) -> QPAttr:
    """The QP's attributes after applying the fields selected by ``mask``."""
    mask = int(mask)
    changes = {f: getattr(new, f) for bit, f in _PICK if mask & bit}
    if "sq_psn" in changes:
        changes["sq_psn"] &= PSN_MASK
    if "rq_psn" in changes:
        changes["rq_psn"] &= PSN_MASK
    return attr_with(cur, changes)


def attr_with(cur: QPAttr, changes: dict) -> QPAttr:
    """``dataclasses.replace(cur, **changes)`` for ``QPAttr``, whose fields are all
    plain (no ``__post_init__``, no ``InitVar``: checked at import): a copy of its
    fields with ``changes`` over them, without ``replace``'s per-field walk (a
    modify_qp makes two)."""
    attr = object.__new__(QPAttr)
    d = attr.__dict__
    d.update(cur.__dict__)
    d.update(changes)
    return attr


if hasattr(QPAttr, "__post_init__") or {f.name for f in fields(QPAttr)} != set(QPAttr().__dict__):
    raise TypeError("attr_with copies QPAttr's __dict__: its fields must all be plain")


# ---------------------------------------------------------------- work requests


@dataclass
class SendWR:
    wr_id: int = 0
    opcode: WROpcode = WROpcode.SEND
    sg_list: list[tuple[int, int, int]] = field(default_factory=list)   # (addr, length, lkey)
    send_flags: int = 0
    imm_data: int = 0                 # host integer
    invalidate_rkey: int = 0          # SEND_WITH_INV / LOCAL_INV
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0
    swap: int = 0
    ah: AHAttr | None = None          # UD
    remote_qpn: int = 0               # UD
    remote_qkey: int = 0              # UD
    bind: object = None               # BIND_MW: a memory.MWBind
    xrc_srqn: int = 0                 # XRC initiator: the remote XRC SRQ (the XRCETH)
    atomic_data: bytes | None = None  # ATOMIC_WRITE: the 8 bytes to place
    flush_type: int = 0               # FLUSH: placement type (1 global, 2 persistent)
    flush_level: int = 0              # FLUSH: selectivity level (0 the range, 1 the MR)
    length: int | None = None         # FLUSH: the range's length (no local SGEs)


@dataclass
class RecvWR:
    wr_id: int = 0
    sg_list: list[tuple[int, int, int]] = field(default_factory=list)


#: WR opcodes by value (an enum lookup by value costs a call into enum's machinery)
_WR_OPCODES = {int(w): w for w in WROpcode}


class SendWQE:
    """A posted send work request and its progress through the requester."""
    __slots__ = ("wr_id", "opcode", "flags", "sges", "inline", "length", "imm", "inv_rkey",
                 "remote_addr", "rkey", "compare_add", "swap", "dest", "remote_qpn",
                 "remote_qkey", "signaled", "first_psn", "last_psn", "npkts", "next_pkt",
                 "views", "done", "status", "atomic_orig", "rd_atomic", "got", "asked",
                 "iw_msn", "got_bytes", "sink_stag", "sink_to", "bind",
                 "xrc_srqn", "flush")

    def __init__(self, wr: SendWR, signaled: bool, inline: bytes | None,
                 length: int | None = None):
        self.wr_id = wr.wr_id
        op = _WR_OPCODES.get(wr.opcode)
        self.opcode = op if op is not None else WROpcode(wr.opcode)
        self.flags = int(wr.send_flags)     # a plain int: IntFlag operations are slow
        self.sges = list(wr.sg_list)
        self.inline = inline
        if inline is not None:
            self.length = len(inline)
        else:
            self.length = length if length is not None else sum(s[1] for s in self.sges)
        self.imm = wr.imm_data & 0xFFFFFFFF
        self.inv_rkey = wr.invalidate_rkey
        self.remote_addr = wr.remote_addr
        self.rkey = wr.rkey
        self.compare_add = wr.compare_add & 0xFFFFFFFFFFFFFFFF
        self.swap = wr.swap & 0xFFFFFFFFFFFFFFFF
        self.dest = wr.ah.addr if wr.ah is not None else None
        self.remote_qpn = wr.remote_qpn
        self.remote_qkey = wr.remote_qkey
        self.signaled = signaled
        self.first_psn: int | None = None   # assigned when the requester starts the WQE
        self.last_psn = 0
        self.npkts = 0
        self.next_pkt = 0                    # index of the next packet to (re)send
        self.views: list[memoryview] | None = None
        self.done = False
        self.status = None
        self.atomic_orig = 0
        self.got: set[int] | None = None     # selective repeat: READ responses held beyond a hole
        self.asked: set[int] | None = None   # ... and those already asked for again
        self.iw_msn = 0                      # iWARP: the message's DDP MSN
        self.got_bytes = 0                   # iWARP: Read Response bytes placed
        self.sink_stag = 0                   # iWARP: the READ's data sink STag and TO
        self.sink_to = 0
        self.rd_atomic = self.opcode in RD_ATOMIC
        self.bind = wr.bind
        self.xrc_srqn = wr.xrc_srqn
        self.flush = (wr.flush_level, wr.flush_type) if self.opcode is WROpcode.FLUSH else None


class ReqInfo:
    """The requester's state (rxe's ``struct rxe_req_info``): where it is in the
    send queue and the PSNs it has given out.  ``requester.py`` writes it; the
    completer steps ``send_idx`` back, returns READ/ATOMIC credits
    (``rd_atomic``) and stops the requester (``error``) when a WQE fails."""

    __slots__ = ("send_idx", "psn", "max_sent_psn", "rd_atomic", "pkts_since_ackreq", "error")

    def __init__(self) -> None:
        self.send_idx = 0             # index in sq of the WQE the requester works on
        self.psn = 0                  # next never-used PSN
        self.max_sent_psn = PSN_MASK  # highest PSN sent so far (anything not above it is a resend)
        self.rd_atomic = 0            # READ / ATOMIC requests outstanding (max_rd_atomic caps it)
        self.pkts_since_ackreq = 0    # packets sent since the last that asked for an ACK
        self.error = False            # a WQE failed locally; send nothing more


class CompInfo:
    """The completer's state (rxe's ``struct rxe_comp_info``): how far the send
    queue is acknowledged, the retry and RNR counters, the retransmission, RNR
    and loss-probe deadlines, and selective repeat's record of single PSNs to
    resend.  ``completer.py`` writes it (``Output`` arms ``rto_at`` and
    ``probe_at`` when requests leave; the requester takes PSNs off ``rexmit``
    as it resends them, and a go-back-N rewind empties it)."""

    __slots__ = ("acked_psn", "retry_left", "rnr_left", "rnr_wait", "retry_pending", "rto_at",
                 "rto_shift", "rto_shift_psn", "rnr_at", "sqd_notified", "rexmit", "rexmitted",
                 "sacked_psn", "probe_at", "probe_mark")

    def __init__(self) -> None:
        self.acked_psn = PSN_MASK     # everything up to here is acknowledged (req.psn - 1 at start)
        self.retry_left = 7
        self.rnr_left = 7
        self.rnr_wait = False         # paused by an RNR NAK until the timer fires
        self.retry_pending: int | None = None  # rewind already requested for this PSN
        self.rto_at: float | None = None
        self.rto_shift = 0            # timeouts in a row without ACK progress (the RTO's backoff)
        self.rto_shift_psn = 0        # ... acked_psn when the last of them fired
        self.rnr_at: float | None = None
        self.sqd_notified = False
        self.rexmit: deque[int] = deque()   # selective repeat: single PSNs to resend
        self.rexmitted: dict[int, int] = {}  # ... already resent since the last ACK progress,
        #                                     each with the highest PSN sent before it
        self.sacked_psn: int | None = None  # ... highest PSN the responder said it holds
        self.probe_at: float | None = None  # ... resend the oldest PSN early
        self.probe_mark: int | None = None  # ... unless packets were sent since this PSN


class RespInfo:
    """The responder's state (rxe's ``struct rxe_resp_info``): the expected PSN and
    MSN, the message under way (a SEND's receive WQE and how much of it is placed,
    a WRITE's target and offset), the READ/ATOMIC replay resources, and the
    responses waiting to go out.  ``responder.py`` writes it (iWARP's receive
    path, ``iwarp.py``, uses the message-under-way fields by the same rules);
    ``Output`` takes the responses off ``out``."""

    __slots__ = ("epsn", "msn", "wqe", "off", "kind", "write_view", "write_off", "write_len",
                 "nak_sent", "uc_drop", "resources", "out", "answer_hint")

    def __init__(self) -> None:
        self.epsn = 0                 # the expected PSN
        self.msn = 0                  # messages completed (the MSN in every AETH)
        self.wqe = None               # receive WQE of the SEND in progress
        self.off = 0                  # bytes placed into it so far
        self.kind = None              # kind of the multi-packet message in progress
        self.write_view: memoryview | None = None   # the WRITE in progress: its target,
        self.write_off = 0            # ... the bytes placed so far,
        self.write_len = 0            # ... its length
        self.nak_sent = False         # one PSN sequence NAK per gap (go-back-N)
        self.uc_drop = False          # UC: drop the rest of a message after a PSN gap
        self.resources: deque = deque()   # READ / ATOMIC replay: responder.ReadResource, ...
        self.out: deque = deque()     # responses to send, in PSN order (responder.py's records)
        self.answer_hint = None       # (kind, rkey, length): the last READ or ATOMIC
        #                               answered (responder.answer_target)


class SRInfo:
    """The responder's selective-repeat state (IRN): request packets held beyond a
    PSN hole, the WRITE bytes placed beyond it, and the holes already named in
    NAKs.  ``responder.py`` and ``sr_place.py`` write it.  (The requester's side
    of selective repeat, the single PSNs to resend, is the completer's: ``CompInfo``.)"""

    __slots__ = ("naked", "scan", "stream_psn", "ooo", "writes", "placed")

    def __init__(self) -> None:
        self.naked: set[int] = set()  # PSNs missing beyond the hole, already named in a NAK
        self.scan: int | None = None  # PSNs below it are held or named
        self.stream_psn = 0           # the PSN a stream of MIDDLEs beyond a hole takes next
        self.ooo: dict[int, object] = {}  # PSN -> held: a Packet or a responder.PlacedWrite
        self.writes: list = []        # the current WRITE, then those whose FIRST is held:
        #                               (first psn, view, length, end psn, address)
        self.placed = None            # byte ranges placed beyond a hole, by PSN (sr_place.Placed)


class CongestionState:
    """A QP's congestion-control state, used only when the QP has a controller
    (``qp.cc``).  ``requester.py`` writes the pacer's and the in-flight record;
    ``dispatch.py`` writes the INT telemetry it finds on a packet, which the
    requester hands to the controller with an ACK (``rx_telemetry``) and
    ``output.py`` echoes in the ACKs it sends (``int_echo``)."""

    __slots__ = ("next_tx", "pace_at", "sent", "inflight", "rx_telemetry", "int_echo")

    def __init__(self) -> None:
        self.next_tx = 0.0            # pacing: earliest time of the next packet
        self.pace_at: float | None = None   # pacing timer, when the rate holds a packet back
        self.sent: dict[int, tuple] = {}    # PSN -> (sent at, bytes, resent) until acknowledged
        self.inflight = 0             # bytes sent and not yet acknowledged
        self.rx_telemetry = None      # INT echo of the response being handled
        self.int_echo = None          # INT hops of the latest request, echoed in ACKs


class QP:
    """One queue pair: what is its own (QPN, PD, type, CQs, SRQ, attributes,
    state, the send and receive queues, its congestion controller) and, as rxe's
    ``struct rxe_qp``, a part for each owner of the rest (the logic lives in
    their modules):

    ======  ====================  ===============================================
    req     ``ReqInfo``           requester.py: send queue position, PSNs given out
    comp    ``CompInfo``          completer.py: acknowledged PSN, retries, timers
    resp    ``RespInfo``          responder.py: ePSN, MSN, message under way, replies
    sr      ``SRInfo``            responder.py, sr_place.py: held beyond a hole
    ccs     ``CongestionState``   requester.py, dispatch.py: pacing, bytes in flight
    iw      ``iwarp.IwarpQP``     iwarp.py (None but on an iWARP device)
    ======  ====================  ===============================================

    ``reset()`` gives each part (but ``iw``, which iWARP's device renews) its state
    as new.  A hot path takes a part into a local once (``req = qp.req``)."""

    #: the attributes the engine reads per packet as slots (faster than a dict's);
    #: ``__dict__`` keeps room for any other
    __slots__ = (
        'qpn', 'pd', 'qp_type', 'send_cq', 'recv_cq', 'srq', 'xrc', 'xrcd', 'wire',
        'sq_sig_all', 'cap', 'attr', 'state', 'selective_repeat', 'window', 'closed',
        'timer_at', 'timer_times', 'cc_spec', 'cc', 'req', 'comp', 'resp', 'sr', 'ccs', 'iw', 'sq', 'rq',
        'mtu', 'dest', '_rto', '_rto_of',
        "__dict__", "__weakref__")

    def __init__(self, qpn: int, pd, init: QPInitAttr, cap: QPCap):
        self._rto_of = None
        self.qpn = qpn
        self.pd = pd
        self.qp_type = QPType(init.qp_type)
        self.send_cq = init.send_cq
        self.recv_cq = init.recv_cq
        self.srq = init.srq
        self.xrc: str | None = None           # XRC role ("ini", "tgt"), set by xrc.make_qp
        self.xrcd = None
        self.wire = self.qp_type.name         # the transport its packets' opcodes name
        self.sq_sig_all = bool(init.sq_sig_all)
        self.cap = cap
        self.set_attr(QPAttr(cap=cap))
        self.state = S.RESET
        self.selective_repeat = False
        self.window = 128                     # packets in flight at most
        self.closed = False
        self.timer_at: float | None = None
        self.timer_times: set[float] = set()  # the times of its entries in the device's heap
        self.cc_spec: str | None = None       # per-QP congestion control (None: the device's)
        self.cc = None                        # its controller, made at RTS (None: no control)
        self.iw = None                        # iWARP's part (iwarp.IwarpQP), on an iWARP device
        self.reset()

    def set_attr(self, attr: QPAttr) -> None:
        """Take ``attr`` as the QP's attributes (frozen: a modify replaces them
        whole) and what the engine reads of them on every packet as plain slots:
        ``mtu``, the path MTU in bytes, and ``dest``, the peer's (IP, UDP port)
        (None while the address vector names none: an RC or UC QP has one from
        RTR on, which ``modify_qp`` checked; a UD QP sends to each WQE's)."""
        self.attr = attr
        self.mtu = mtu_bytes(attr.path_mtu)
        ah = attr.ah_attr
        self.dest = _dest_of(ah.dgid, ah.port)

    def clean_cqs(self) -> None:
        """Drop this QP's completions from its CQs, as a move to RESET does on mlx4/mlx5
        (IBA 10.3.1: the CQEs of a reset QP need not be kept), so a QP reused after an
        error does not hand its old flushes to the next poll."""
        for cq in {id(c): c for c in (self.send_cq, self.recv_cq) if c is not None}.values():
            keep = [w for w in cq.entries if w.qp_num != self.qpn]
            if len(keep) != len(cq.entries):
                cq.entries.clear()
                cq.entries.extend(keep)
                cq.mirrored()

    def reset(self) -> None:
        """Empty queues and each part's state as a new QP's (a move to RESET)."""
        self.sq: deque[SendWQE] = deque()
        self.rq: deque = deque()
        self.req = ReqInfo()
        self.comp = CompInfo()
        self.resp = RespInfo()
        self.sr = SRInfo()
        self.ccs = CongestionState()

    def next_send_psn(self) -> int:
        """PSN of the next packet the requester would send on the current WQE."""
        req = self.req
        if req.send_idx < len(self.sq):
            w = self.sq[req.send_idx]
            if w.first_psn is not None:
                return psn_add(w.first_psn, w.next_pkt)
        return req.psn
