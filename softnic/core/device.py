"""One NIC: its object tables, counters and the hooks the protocol rules call.

The device is a sans-I/O state machine in the manner of aioquic:

    receive_datagram(data, src, now)      a UDP payload arrived        (dispatch.py)
    receive_run(data, seg, src, now)      a GRO run of them            (dispatch.py)
    datagrams_to_send(now)                -> [(bytes, (ip, port)), ...] (output.py)
    datagram_runs(now)                    the same, runs kept together as
                                          requester.Run records         (output.py)
    get_timer()                           -> earliest deadline or None  (timers.py)
    handle_timer(now)                     the deadline passed           (timers.py)

plus the verbs calls (alloc_pd, reg_mr, create_cq, create_qp, modify_qp,
post_send, post_recv, poll_cq, ...; verbs.py).  ``Device`` is those four parts
and what they share, here: the tables, the counters, the set of QPs with
something to send, and the hooks the requester, responder and completer call
(``mark_ready``, ``post_cqe``, ``to_error``, ``arm``, ``rto``).  The protocol's
rules are theirs (requester.py, responder.py, completer.py), not the device's.
A driver, after every input, drains ``datagrams_to_send`` and re-arms one timer
at ``get_timer()``.  Nothing here reads a clock, opens a socket or draws global
randomness.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from ..wire.roce import ROCEV2_PORT
from . import completer, responder
from .cq import CQ, WC
from .dispatch import Dispatch
from .enums import EventType, QPState, WCOpcode, WCStatus
from .memory import KeyTable, PD
from .output import Output
from .qp import QP, gid_of
from .srq import SRQ
from .timers import Timers
from .verbs import Verbs
import congestion

#: controllers that react to ECN marks (their packets are sent ECN-capable)
ECN_CONTROLLERS = frozenset({"dcqcn"})


class Counters(dict):
    """A device's counters by name; a name never counted reads 0, as a
    ``collections.Counter``'s does.  Not a Counter: its ``__delitem__`` sends
    every item write (``counters[name] += 1``, per packet) through a method
    lookup, which doubled an increment's cost."""

    __slots__ = ()

    def __missing__(self, name):
        return 0


#: Counter names, as Linux rxe exposes them (plus a few of our own).
RXE_COUNTERS = (
    "sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request", "rcvd_rnr_err",
    "send_rnr_err", "rcvd_seq_err", "ack_deferred", "retry_exceeded_err",
    "retry_rnr_exceeded_err", "completer_retry_err", "send_err", "link_downed",
    "rdma_sends", "rdma_recvs",
)


#: Congestion-control counters, as mlx5 names them (notification / reaction point).
CC_COUNTERS = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored")


#: The port's (active_speed, active_width) for a line rate, as Linux reports an
#: Ethernet port's (``ib_get_eth_speed``, drivers/infiniband/core/verbs.c, for a
#: link that gives no lane count; rxe's ports are such): the least rate each pair
#: covers, in bits/s.  Speeds: 1 SDR, 2 DDR, 8 FDR10, 32 EDR, 64 HDR, 128 NDR
#: (2.5, 5, 10, 25, 50, 100 Gbit/s a lane); widths: 1 1X, 16 2X, 2 4X.
PORT_SPEEDS = ((1e9, 1, 1), (10e9, 8, 1), (20e9, 2, 2), (25e9, 32, 1), (40e9, 8, 2),
               (50e9, 32, 16), (100e9, 32, 2), (200e9, 64, 2))
_NDR_4X = (128, 2)


def port_speed(line_rate_bps: float) -> tuple[int, int]:
    """``(active_speed, active_width)`` of a port whose line rate is ``line_rate_bps``
    (``PORT_SPEEDS``): 100 Gbit/s is 4X EDR, as a 100 GbE ConnectX port reports."""
    for top, speed, width in PORT_SPEEDS:
        if line_rate_bps <= top:
            return speed, width
    return _NDR_4X


@dataclass(frozen=True)
class DeviceConfig:
    """Device-wide settings.  ``min_timer`` is the floor for the retransmission
    and RNR timers (a real-time driver cannot honour microseconds)."""
    max_qp: int = 65536
    max_qp_wr: int = 16384
    max_sge: int = 32
    max_cqe: int = 1 << 20
    max_inline_data: int = 4096
    max_rd_atomic: int = 16
    max_mr_size: int = 1 << 40
    max_msg_size: int = 1 << 31
    active_mtu: int = 4096
    min_timer: float = 1e-3
    selective_repeat: bool = False
    window: int = 128
    #: ask for an ACK every this many packets (None: every window/4)
    ack_every: int | None = None
    check_icrc: bool = True
    #: compute the ICRC of the packets sent one at a time (ACKs, responses, a
    #: paced or window-limited requester's packets).  False: they carry four zero
    #: bytes instead (the same length, so the same timing) - a simulator's
    #: option, for a fabric none of whose links can corrupt and whose receivers
    #: do not check (``check_icrc`` False): nothing that follows can differ
    #: (``softnic.transport.sim.Fabric`` refuses such a sender on a corrupting
    #: link; tests/test_sim_icrc.py).  A requester's bulk runs keep theirs.
    icrc: bool = True
    #: congestion control for every QP unless set per QP: a ``congestion`` spec
    #: such as ``"dcqcn"`` or ``"hpcc:eta=0.9"``; ``"none"`` for no control
    cc: str = "none"
    #: the NIC's line rate (bits/s) and the propagation round trip controllers
    #: start from (seconds); the port reports the line rate as its active speed
    #: and width (``port_speed``), which middleware reads to choose its protocols
    line_rate_bps: float = 100e9
    base_rtt: float = 10e-6
    #: the flows expected to share a bottleneck, where the fabric knows it (an
    #: incast experiment's senders): controllers read it as ``FlowInfo.expected_flows``
    #: (HPCC's N); None: not known
    expected_flows: int | None = None
    #: mark sent packets ECN-capable (ECT(0)); None: when the device's
    #: controller reacts to ECN (DCQCN)
    ecn: bool | None = None
    #: take the common-case branches of the responder and completer (their
    #: ``receive_common``), the requester's packed ONLY / FIRST packets, bulk
    #: runs and paced MIDDLEs, and the kernel (if the driver gives one); False
    #: runs every packet through the general path, one at a time (the same wire
    #: bytes and completions: tests/test_fastpath.py, tests/test_kernel.py)
    fast_path: bool = True


class Device(Verbs, Dispatch, Output, Timers):
    """One RoCEv2 NIC (the iWARP one, ``core.iwarp.IwarpDevice``, builds on it)."""

    #: what the compiled timers and drain (softnic.accel's ``timers.c``,
    #: ``output.c``) read on every call, as slots (read in place there; the rest of
    #: the device is its ``__dict__``), and ``_ctimers``, the timers' state on a
    #: device whose class was given them (``accel.give_compiled``)
    __slots__ = ("_ready", "gsi", "_cnps", "_ctimers")

    def __init__(self, name: str, ip: str, port: int = ROCEV2_PORT, *,
                 config: DeviceConfig | None = None):
        self.name = name
        self.ip = ip
        self.port = port
        self.gid = gid_of(ip)
        self.config = config or DeviceConfig()
        self.keys = KeyTable()
        self.counters = Counters({n: 0 for n in RXE_COUNTERS + CC_COUNTERS})
        self.cqes_posted = 0            # completions posted to any CQ (a driver compares)
        self.qps: dict[int, QP] = {}
        self.cqs: dict[int, CQ] = {}
        self.srqs: dict[int, SRQ] = {}
        self.pds: dict[int, PD] = {}
        self.events: deque[tuple[EventType, object]] = deque()
        self._handles = 0
        self._next_qpn = 0x11
        self._ready: dict[QP, None] = {}     # QPs that may have packets to send (ordered set)
        self._timers: list[tuple[float, int, QP]] = []
        self._tseq = 0
        self._cnps: list[QP] = []            # QPs owing their requester a CNP
        # parse the device's controller spec now: a bad one is an error here
        self._cc_name, self._cc_params = congestion.parse_spec(self.config.cc)
        congestion.create(self._cc_name, self.flow_info(4096), **self._cc_params)
        ecn = self.config.ecn
        #: are this device's packets ECN-capable (ECT(0) in the IP header)?
        self.ect = (self._cc_name in ECN_CONTROLLERS) if ecn is None else bool(ecn)
        #: take the common cases' faster ways through the rules (``config.fast_path``;
        #: tests/test_fastpath.py compares runs with and without them)
        self.fast = self.config.fast_path
        #: the compiled per-packet loops (``softnic.accel.load()``), given by the
        #: driver; None runs the same loops in Python
        self.kernel = None
        #: where the kernel reports the AckReqs of a run of MIDDLEs it took for this
        #: device's responder, (ffi, uint32_t[]), made on first use (``responder.rx_acks``)
        self.rx_acks = None
        #: the ICRC states the kernel's receive loops start each packet's check from,
        #: by (source, datagram size, BTH word 0, QPN): ``responder.rx_icrc_start``'s
        #: memo (a few per QP and direction, asked of each run)
        self.rx_starts: dict[tuple, int] = {}
        #: and those its builders of runs compute packets' ICRCs from, by
        #: (destination, datagram size, opcode, BTH flags, QPN): ``requester.tx_icrc_start``'s
        self.tx_starts: dict[tuple, int] = {}
        #: the QP whose MIDDLEs (a SEND's, a WRITE's, its READ's responses) the kernel
        #: took last, or the FIRST before them (``stream_target``)
        self.stream_qp = None
        #: the QP that answered a READ or an ATOMIC last: a driver's
        #: kernel may answer the next ones like it (``answer_target``)
        self.answer_qp = None
        #: the driver sends a ``requester.Gather`` (a run whose payload stays in
        #: registered memory) as it is; False: every run is built whole
        self.tx_gather = False
        #: the agent behind QP1 (``core.cm.CM``), attached by whoever manages
        #: connections; None: MADs are counted and dropped
        self.gsi = None

    @property
    def address(self) -> tuple[str, int]:
        return (self.ip, self.port)

    def work_outstanding(self, qpn: int) -> bool:
        """May the QP numbered ``qpn`` complete more work without a new post: sends
        not yet completed, or receives posted (on its receive queue or its SRQ)?
        False for a QPN the device does not have."""
        qp = self.qps.get(qpn)
        return qp is not None and bool(qp.sq or qp.rq
                                       or (qp.srq is not None and qp.srq.queue))

    def sends_outstanding(self, qpn: int) -> bool:
        """Has the QP numbered ``qpn`` sends posted and not yet completed?  False for
        a QPN the device does not have."""
        qp = self.qps.get(qpn)
        return qp is not None and bool(qp.sq)

    def _handle(self) -> int:
        self._handles += 1
        return self._handles

    # ------------------------------------------------------------ hooks of the rules

    def mark_ready(self, qp: QP) -> None:
        self._ready[qp] = None

    def post_cqe(self, cq: CQ, wc: WC, qp: QP, solicited: bool = False) -> None:
        self.cqes_posted += 1
        if not cq.push(wc, solicited=solicited) and qp.state != QPState.ERR:
            self.to_error(qp)          # completions were lost: the QP cannot go on

    def async_event(self, name: str, obj) -> None:
        self.events.append((EventType[name], obj))

    def to_error(self, qp: QP, keep_responses: bool = False) -> None:
        """Move a QP to ERR and flush all its outstanding work with WR_FLUSH_ERR."""
        if qp.state == QPState.ERR:
            return
        qp.state = QPState.ERR
        qp.set_attr(replace(qp.attr, qp_state=QPState.ERR))
        qp.comp.rto_at = qp.comp.rnr_at = qp.comp.probe_at = None
        qp.timer_at = None
        qp.req.rd_atomic = 0
        sq, qp.sq = qp.sq, deque()
        qp.req.send_idx = 0
        for w in sq:      # all not yet reported, even those already executed, are flushed
            self.post_cqe(qp.send_cq, WC(w.wr_id, WCStatus.WR_FLUSH_ERR,
                                         completer._WC_OPCODE[w.opcode], qp.qpn), qp)
        rq = list(qp.rq)
        if qp.resp.wqe is not None:
            rq.insert(0, qp.resp.wqe)
            qp.resp.wqe = None
        qp.rq.clear()
        for r in rq:
            self.post_cqe(qp.recv_cq, WC(r.wr_id, WCStatus.WR_FLUSH_ERR, WCOpcode.RECV, qp.qpn),
                          qp)
        qp.sr.ooo.clear()
        qp.sr.writes.clear()
        if not keep_responses:
            responder.keep_answers(qp)
        if qp.resp.out:
            self.mark_ready(qp)
        if qp.srq is not None:
            self.events.append((EventType.QP_LAST_WQE_REACHED, qp))
