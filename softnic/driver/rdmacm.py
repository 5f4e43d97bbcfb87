"""rdma_cm over live softnic devices: what both rdma_cm faces share.

The C face (``softnic/faces/librdmacm``) and the Python face (``verbs_api.cmid``)
keep their own objects and call into this module for everything about
addresses and connections: which device owns an IP address, port spaces and
bound ports, listeners, and the device's connection manager (``core.cm``),
one per device, attached to the device as its QP1 agent.  Events go to an
``EventChannel``: a queue plus an eventfd in semaphore mode that counts what
is queued, so the channel's fd is readable exactly while an event waits (a
program may poll it, or make it non-blocking).

A device is an IPv4 address (its GID ``::ffff:a.b.c.d``) or an IPv6 address (its
GID that address).  A destination that is not one of this process's devices is
reached through the device of its IP version whose address shares the longest
prefix with it (on loopback, any of that version).  ``0.0.0.0`` stands for a
bind to any address, of either version (``::`` binds the same).
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import softnic.driver.nic as _nic
from softnic.driver import rdmacm_host as _host
from softnic.driver import mcast as _mcast
from softnic.core import cm as _cm
from softnic.core import qp as _qp
from softnic.core.cm import EventKind
from softnic.core.errors import VerbsError
from softnic.wire import mad as M

# rdma_cma.h: enum rdma_cm_event_type
ADDR_RESOLVED, ADDR_ERROR, ROUTE_RESOLVED, ROUTE_ERROR, CONNECT_REQUEST, CONNECT_RESPONSE, \
    CONNECT_ERROR, UNREACHABLE, REJECTED, ESTABLISHED, DISCONNECTED, DEVICE_REMOVAL, \
    MULTICAST_JOIN, MULTICAST_ERROR, ADDR_CHANGE, TIMEWAIT_EXIT = range(16)

EVENT_NAMES = ("RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR",
               "RDMA_CM_EVENT_ROUTE_RESOLVED", "RDMA_CM_EVENT_ROUTE_ERROR",
               "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
               "RDMA_CM_EVENT_CONNECT_ERROR", "RDMA_CM_EVENT_UNREACHABLE",
               "RDMA_CM_EVENT_REJECTED", "RDMA_CM_EVENT_ESTABLISHED",
               "RDMA_CM_EVENT_DISCONNECTED", "RDMA_CM_EVENT_DEVICE_REMOVAL",
               "RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR",
               "RDMA_CM_EVENT_ADDR_CHANGE", "RDMA_CM_EVENT_TIMEWAIT_EXIT")

PORT_SPACES = {M.RDMA_PS_TCP: "tcp", M.RDMA_PS_UDP: "udp", M.RDMA_PS_IB: "ib",
               M.RDMA_PS_IPOIB: "ipoib"}
IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD = 2, 3, 4
#: rdma_cm's Q_Key for UD in the UDP port space
RDMA_UDP_QKEY = 0x01234567
#: the private data rdma_cm's IP header leaves a REQ's user
REQ_USER_PRIVATE = 92 - M.CMA_HDR_LEN
SIDR_USER_PRIVATE = 216 - M.CMA_HDR_LEN
EPHEMERAL = (32768, 61000)
#: QP attributes rdma_cm sets (as the kernel's ib_cm picks them)
ACK_TIMEOUT = 14
MIN_RNR_TIMER = 0           # 655.36 ms, as ib_cm's cm_init_qp_rtr_attr sets it

# ibv_qp_attr_mask bits
QP_STATE, QP_ACCESS_FLAGS, QP_PKEY_INDEX, QP_PORT, QP_QKEY, QP_AV, QP_PATH_MTU, QP_TIMEOUT, \
    QP_RETRY_CNT, QP_RNR_RETRY, QP_RQ_PSN, QP_MAX_QP_RD_ATOMIC, QP_MIN_RNR_TIMER, QP_SQ_PSN, \
    QP_MAX_DEST_RD_ATOMIC, QP_DEST_QPN = (1, 1 << 3, 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8,
                                          1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 15,
                                          1 << 16, 1 << 17, 1 << 20)
QPS_INIT, QPS_RTR, QPS_RTS = 1, 2, 3
ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_ATOMIC = 1, 2, 4, 8

_lock = threading.RLock()
_cms: dict[str, _cm.CM] = {}           # device name -> its CM
_nics: dict[str, object] = {}          # devices this module holds open
_bound: dict[tuple[int, int], list] = {}   # (port space, port) -> [CmId]
_ids = itertools.count(1)


def now_of(nic) -> float:
    world = getattr(nic, "world", None)
    return world.fabric.now if world is not None else time.monotonic()


def devices() -> list:
    """Every configured device, opened (this module keeps them open)."""
    with _lock:
        for name in _nic.device_names():
            if name not in _nics or _nics[name].closed:
                _nics[name] = _nic.open_device(name)
        return [_nics[n] for n in _nic.device_names() if n in _nics]


def device_named(name: str):
    for d in devices():
        if d.name == name:
            return d
    raise VerbsError(errno.ENODEV, f"no softnic device {name!r}")


def reset() -> None:
    """Forget every device, CM and bound port (after ``softnic.driver.nic.configure``)."""
    with _lock:
        for nic in _nics.values():
            if not nic.closed:
                nic.release()
        _nics.clear()
        _cms.clear()
        _bound.clear()


def forget_devices() -> None:
    """After fork, in the child: the parent's devices and CMs are not this process's."""
    global _lock
    _lock = threading.RLock()
    _nics.clear()
    _cms.clear()


_nic.on_fork(forget_devices)


def cm_of(nic) -> _cm.CM:
    """The device's connection manager (attached when the device was opened),
    with its events routed here."""
    c = nic.dev.gsi
    if c is None:
        raise VerbsError(errno.EOPNOTSUPP, f"device {nic.name} has no connection manager "
                         "(rdma_cm needs the udp transport)")
    if c.on_event is not _dispatch:
        with nic.lock:
            c.on_event = _dispatch
    _cms[nic.name] = c
    return c


def ip_text(addr) -> str:
    """An address as devices are named: IPv4 for an IPv4-mapped IPv6 address."""
    a = ipaddress.ip_address(addr)
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    return str(a)


def device_for_ip(ip: str):
    """The local device whose address is ``ip`` (None if none)."""
    for d in devices():
        if d.ip == ip:
            return d
    return None


def route(dst: str):
    """The device that reaches ``dst``: itself if local, else the longest prefix match."""
    d = device_for_ip(dst)
    if d is not None:
        return d
    target = ipaddress.ip_address(dst)
    best, best_len = None, -1
    for d in devices():
        a = ipaddress.ip_address(d.ip)
        if a.version != target.version:
            continue
        n = a.max_prefixlen - (int(a) ^ int(target)).bit_length()
        if n > best_len:
            best, best_len = d, n
    if best is None:
        if devices():
            raise VerbsError(errno.EADDRNOTAVAIL, f"{dst}: no softnic device of IP version "
                                                  f"{target.version} reaches it")
        raise VerbsError(errno.ENODEV, "no softnic device")
    return best


def gid_of(ip: str) -> bytes:
    """The 16 bytes of the GID of the device (or group) at ``ip``."""
    return ipaddress.IPv6Address(_qp.gid_of(ip)).packed


# ---------------------------------------------------------------- events

@dataclass
class Event:
    kind: int
    id: "CmId"
    listen_id: "CmId | None" = None
    status: int = 0
    private_data: bytes = b""
    responder_resources: int = 0
    initiator_depth: int = 0
    retry_count: int = 7
    rnr_retry_count: int = 7
    srq: int = 0
    qp_num: int = 0
    qkey: int = 0
    new: bool = False              # the id is new to the consumer (a connection request)
    mgid: bytes = b""              # MULTICAST_JOIN: the group's GID

    @property
    def name(self) -> str:
        return EVENT_NAMES[self.kind]


class EventChannel:
    """Events for the ids that use this channel; ``fd`` is readable while one waits.

    ``fd`` counts the queued events, and both change together under ``lock``:
    ``post`` adds one of each, ``take`` removes one of each (a reader waits for
    ``fd`` to be readable, then takes), ``purge`` removes a destroyed id's events
    with their counts.  Nothing reads ``fd`` without the lock, so a read there
    never blocks on a count another thread took first."""

    def __init__(self, fd: int | None = None):
        #: an eventfd in semaphore mode; given by a face that owns it, or made here
        self.own = fd is None
        self.fd = os.eventfd(0, os.EFD_SEMAPHORE | os.EFD_CLOEXEC) if fd is None else fd
        self.queue: deque[Event] = deque()
        self.closed = False
        self.lock = threading.Lock()

    def post(self, ev: Event) -> None:
        with self.lock:
            if self.closed:
                return
            self.queue.append(ev)
            os.eventfd_write(self.fd, 1)

    def take(self) -> Event | None:
        """Pop the next event and read its count from ``fd``; None if none waits."""
        with self.lock:
            if not self.queue or not self._counted():
                return None
            return self.queue.popleft()

    def _counted(self) -> bool:
        """Read one count from ``fd`` if it has one, without blocking (caller holds
        the lock; ``fd`` may be a blocking descriptor, the C face's)."""
        import select
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        if not p.poll(0):
            return False
        os.eventfd_read(self.fd)
        return True

    def get(self, timeout: float | None = None) -> Event | None:
        """Block (without the caller's other locks) until an event, then take it."""
        import select
        p = select.poll()
        p.register(self.fd, select.POLLIN)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            sims = [d for d in _nics.values() if hasattr(d, "world")]
            if sims:                     # virtual time moves only when driven: up to the event
                world = sims[0].world
                with world.lock:
                    world.fabric.run(until=world.fabric.now + 1.0, stop=lambda: bool(self.queue))
            left = None if end is None else max(0.0, end - time.monotonic())
            if p.poll(None if left is None else int(left * 1000) + 1):
                ev = self.take()
                if ev is None:
                    continue             # another reader took it first
                return ev
            if end is not None and time.monotonic() >= end:
                return None

    def purge(self, cid: "CmId") -> None:
        """Drop the events of a destroyed id (and the connection requests of a
        destroyed listener), with their counts."""
        with self.lock:
            keep = deque(e for e in self.queue if e.id is not cid and e.listen_id is not cid)
            gone = [e for e in self.queue if e.id is cid or e.listen_id is cid]
            self.queue = keep
            for _ in gone:
                if not self._counted():
                    break
        for e in gone:
            if e.new and e.id is not cid:
                e.id.destroy()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.queue.clear()
        if self.own:
            os.close(self.fd)


# ---------------------------------------------------------------- ids

@dataclass(eq=False)
class CmId:
    channel: EventChannel | None
    ps: int = M.RDMA_PS_TCP
    qp_type: int = IBV_QPT_RC
    cookie: object = None                   # the face's own object
    handle: int = field(default_factory=lambda: next(_ids))
    nic: object = None                      # the device it is bound or routed to
    src: tuple[str, int] | None = None      # (ip, port); ip "0.0.0.0" when bound to any
    dst: tuple[str, int] | None = None
    conn: _cm.Conn | None = None
    listeners: list = field(default_factory=list)   # [(CM, Listener)]
    listen_id: "CmId | None" = None
    state: str = "idle"
    qpn: int = 0
    psn: int = 0
    qkey: int = RDMA_UDP_QKEY
    srq: int = 0
    responder_resources: int = 0
    initiator_depth: int = 0
    retry_count: int = 7
    rnr_retry_count: int = 7
    remote_qpn: int = 0
    remote_qkey: int = 0
    destroyed: bool = False
    backlog: int = 0
    #: the host's loopback address this id was bound as (no device's; rdmacm_host)
    host_ip: str | None = None
    #: the device (ip, udp port) through which a loopback destination of the host is
    #: reached (a listener of another process, rdmacm_host); None: dst's own device
    via: tuple[str, int] | None = None
    #: RDMA_OPTION_ID_ACK_TIMEOUT, set before or after the connection exists
    ack_timeout: int | None = None
    #: the multicast groups joined: group IP -> GID
    mcast: dict = field(default_factory=dict)

    def set_ack_timeout(self, timeout: int) -> None:
        """rdma_set_option(ACK_TIMEOUT): the QP's ``timeout`` from now on (as the kernel's
        rdma_set_ack_timeout: rdma_init_qp_attr gives it for RTS)."""
        self.ack_timeout = timeout
        if self.conn is not None:
            self.conn.local_ack_timeout = timeout

    @property
    def dgid(self) -> bytes:
        """The GID of the device at the other end."""
        return gid_of(self.via[0] if self.via else self.dst[0])

    # ---------------------------------------------------------- addresses

    @property
    def bound(self) -> bool:
        return self.src is not None and self.src[1] != 0

    def _claim_port(self, ip: str, port: int) -> int:
        with _lock:
            if port == 0:
                for p in itertools.chain(range(random.randint(*EPHEMERAL), EPHEMERAL[1]),
                                         range(EPHEMERAL[0], EPHEMERAL[1])):
                    if not _bound.get((self.ps, p)):
                        port = p
                        break
                else:
                    raise VerbsError(errno.EADDRNOTAVAIL, "no free port")
            for other in _bound.get((self.ps, port), []):
                oip = other.src[0]
                if oip == ip or oip == "0.0.0.0" or ip == "0.0.0.0":
                    raise VerbsError(errno.EADDRINUSE, f"port {port} is in use")
            _bound.setdefault((self.ps, port), []).append(self)
        return port

    def _release_port(self) -> None:
        if self.src is None:
            return
        with _lock:
            lst = _bound.get((self.ps, self.src[1]), [])
            if self in lst:
                lst.remove(self)

    def bind(self, ip: str, port: int) -> None:
        if self.bound:
            raise VerbsError(errno.EINVAL, "the id is bound already")
        ip = ip_text(ip)
        if ip in ("::", "0.0.0.0"):
            ip, nic = "0.0.0.0", None
        else:
            nic = device_for_ip(ip)
            if nic is None and ipaddress.ip_address(ip).is_loopback and devices():
                # as the kernel's rdma_cm binds a loopback address: to the first device
                # (of the address's IP version, if there is one), whose address the id
                # then reports (what a peer can reach)
                v6 = ":" in ip
                nic = next((d for d in devices() if (":" in d.ip) == v6), devices()[0])
                self.host_ip, ip = ip, nic.ip
            if nic is None:
                raise VerbsError(errno.EADDRNOTAVAIL, f"{ip} is not a softnic device's address")
        port = self._claim_port(ip, port)
        self.src = (ip, port)
        self.nic = nic
        if nic is not None:
            cm_of(nic)
        self.state = "bound"

    def resolve_addr(self, src: str | None, dst: str, dst_port: int) -> None:
        dst = ip_text(dst)
        if src is not None and not self.bound:
            self.bind(src, 0)
        nic = route(dst) if self.nic is None else self.nic
        if not self.bound:
            self.bind(nic.ip, 0)
        elif self.src[0] == "0.0.0.0":
            self.src = (nic.ip, self.src[1])
        self.nic = nic
        cm_of(nic)
        self.dst = (dst, dst_port)
        self.state = "addr_resolved"
        self._post(Event(ADDR_RESOLVED, self))

    def resolve_route(self) -> None:
        if self.state != "addr_resolved":
            raise VerbsError(errno.EINVAL, "resolve the address first")
        self.state = "route_resolved"
        self._post(Event(ROUTE_RESOLVED, self))

    def _post(self, ev: Event) -> None:
        if self.channel is not None and not self.destroyed:
            self.channel.post(ev)

    # ---------------------------------------------------------- passive side

    def listen(self, backlog: int) -> None:
        if not self.bound:
            self.bind("0.0.0.0", 0)
        if self.listeners:
            return
        sid = M.service_id(self.ps, self.src[1])
        nics = [self.nic] if self.nic is not None else devices()
        for nic in nics:
            cm = cm_of(nic)
            with nic.lock:
                if sid in cm.listeners:
                    raise VerbsError(errno.EADDRINUSE, f"port {self.src[1]} has a listener")
                self.listeners.append((nic, cm.listen(sid, self, backlog)))
        if self.host_ip is not None:            # reachable from the host's other processes
            try:
                _host.publish(self.ps, self.src[1], self.host_ip, (self.nic.ip, self.nic.port))
            except VerbsError:
                for nic, lst in self.listeners:
                    with nic.lock:
                        cm_of(nic).unlisten(lst)
                self.listeners.clear()
                raise
        self.state = "listen"
        self.backlog = backlog

    def accept(self, *, qpn: int, responder_resources: int, initiator_depth: int,
               rnr_retry_count: int, srq: int, private_data: bytes, qkey: int = 0) -> None:
        c = self.conn
        if c is None or self.state != "connect_request":
            raise VerbsError(errno.EINVAL, "no connection request to accept")
        now = now_of(self.nic)
        cm = cm_of(self.nic)
        if self.ps == M.RDMA_PS_UDP or self.qp_type == IBV_QPT_UD:
            with self.nic.lock:
                self.nic.call(cm.sidr_reply, c, status=M.SidrStatus.OK, qpn=qpn,
                              qkey=qkey or self.qkey, private_data=private_data, now=now)
            self.state = "connected"
            return
        self.qpn = qpn
        self.srq = srq
        self.psn = self.psn or cm.new_psn()
        self.nic.call(cm.accept, c, local_qpn=qpn, psn=self.psn,
                      responder_resources=responder_resources, initiator_depth=initiator_depth,
                      rnr_retry_count=rnr_retry_count, srq=srq, private_data=private_data,
                      now=now)
        self.responder_resources = c.responder_resources
        self.initiator_depth = c.initiator_depth
        self.state = "accepting"

    def reject(self, private_data: bytes = b"") -> None:
        c = self.conn
        if c is None or self.state not in ("connect_request", "connect_response"):
            raise VerbsError(errno.EINVAL, "nothing to reject")
        cm = cm_of(self.nic)
        now = now_of(self.nic)
        if c.state is _cm.State.SIDR_REQ_RCVD:
            self.nic.call(cm.sidr_reply, c, status=M.SidrStatus.REJECT, qpn=0, qkey=0,
                          private_data=private_data, now=now)
        else:
            self.nic.call(cm.reject, c, private_data=private_data, now=now)
        self.state = "rejected"

    # ---------------------------------------------------------- active side

    def connect(self, *, qpn: int, responder_resources: int, initiator_depth: int,
                retry_count: int, rnr_retry_count: int, srq: int, private_data: bytes,
                mtu: int = 5) -> None:
        if self.state != "route_resolved":
            raise VerbsError(errno.EINVAL, "resolve the route first")
        nic = self.nic
        cm = cm_of(nic)
        now = now_of(nic)
        sid = M.service_id(self.ps, self.dst[1])
        hdr = M.CmaHeader(self.src[0], self.dst[0], self.src[1]).encode()
        if device_for_ip(self.dst[0]) is None and ipaddress.ip_address(self.dst[0]).is_loopback:
            self.via = _host.lookup(self.ps, self.dst[1], self.dst[0])
        peer = self.via or (self.dst[0], _nic.port_for_gid(self.dst[0]))
        if self.ps == M.RDMA_PS_UDP or self.qp_type == IBV_QPT_UD:
            if len(private_data) > SIDR_USER_PRIVATE:
                raise VerbsError(errno.EINVAL, "private data too long")
            self.conn = nic.call(cm.sidr_request, peer, service_id=sid,
                                 private_data=hdr + private_data, owner=self, now=now)
        else:
            if len(private_data) > REQ_USER_PRIVATE:
                raise VerbsError(errno.EINVAL, "private data too long")
            self.qpn, self.srq = qpn, srq
            self.psn = cm.new_psn()
            self.responder_resources, self.initiator_depth = responder_resources, initiator_depth
            self.retry_count, self.rnr_retry_count = retry_count, rnr_retry_count
            self.conn = nic.call(cm.connect, peer, service_id=sid,
                                 remote_gid=self.dgid, local_qpn=qpn, psn=self.psn,
                                 responder_resources=responder_resources,
                                 initiator_depth=initiator_depth, retry_count=retry_count,
                                 rnr_retry_count=rnr_retry_count, path_mtu=mtu,
                                 local_ack_timeout=ACK_TIMEOUT if self.ack_timeout is None
                                 else self.ack_timeout, srq=srq,
                                 qp_type=1 if self.qp_type == IBV_QPT_UC else 0,
                                 private_data=hdr + private_data, owner=self, now=now)
        self.state = "connecting"

    def establish(self) -> None:
        c = self.conn
        if c is None or c.state is not _cm.State.REP_RCVD:
            raise VerbsError(errno.EINVAL, "no connection response to establish")
        self.nic.call(cm_of(self.nic).establish, c, now=now_of(self.nic))
        self.state = "connected"

    def disconnect(self) -> None:
        c = self.conn
        if c is None or self.state not in ("connected", "accepting", "disconnected"):
            raise VerbsError(errno.EINVAL, "not connected")
        if self.state == "disconnected":
            return
        self.nic.call(cm_of(self.nic).disconnect, c, now=now_of(self.nic))

    def destroy(self) -> None:
        if self.destroyed:
            return
        self.destroyed = True
        if self.channel is not None and not self.channel.closed:
            self.channel.purge(self)
        for nic, lst in self.listeners:
            with nic.lock:
                cm_of(nic).unlisten(lst)
        if self.listeners and self.host_ip is not None:
            _host.withdraw(self.ps, self.src[1], self.host_ip)
        self.listeners.clear()
        if self.conn is not None and self.nic is not None:
            c = self.conn
            self.nic.call(cm_of(self.nic).destroy, c, now_of(self.nic))
        self._release_port()

    # ---------------------------------------------------------- multicast

    def join_multicast(self, group: str) -> bytes:
        """rdma_join_multicast: the group's GID; MULTICAST_JOIN follows with the UD
        parameters (DQPN 0xFFFFFF, rdma_cm's Q_Key).  On RoCE the join is local: the
        QP's attachment (``softnic.driver.mcast``) is what puts it in the group."""
        group = ip_text(group)
        if self.nic is None or self.state not in ("bound", "addr_resolved", "route_resolved"):
            raise VerbsError(errno.EINVAL, "bind or resolve the id to a device first")
        if not ipaddress.ip_address(group).is_multicast:
            raise VerbsError(errno.EINVAL, f"{group} is not a multicast address")
        if group in self.mcast:
            raise VerbsError(errno.EADDRINUSE, f"the id has joined {group} already")
        mgid = gid_of(group)
        self.mcast[group] = mgid
        self._post(Event(MULTICAST_JOIN, self, qp_num=_mcast.MULTICAST_QPN, qkey=self.qkey,
                         mgid=mgid))
        return mgid

    def leave_multicast(self, group: str) -> bytes:
        """rdma_leave_multicast: the group's GID (the face detaches the QP);
        EADDRNOTAVAIL for a group the id has not joined (as librdmacm)."""
        group = ip_text(group)
        mgid = self.mcast.pop(group, None)
        if mgid is None:
            raise VerbsError(errno.EADDRNOTAVAIL, f"the id has not joined {group}")
        return mgid

    # ---------------------------------------------------------- QP attributes

    def init_qp_attr(self, state: int) -> tuple[dict, int]:
        """rdma_init_qp_attr: the attributes and mask that move this id's QP to ``state``."""
        ud = self.qp_type == IBV_QPT_UD or self.ps in (M.RDMA_PS_UDP, M.RDMA_PS_IPOIB)
        if state == QPS_INIT:
            if self.nic is None:
                raise VerbsError(errno.EINVAL, "the id has no device yet")
            if ud:
                return ({"qp_state": QPS_INIT, "pkey_index": 0, "port_num": 1,
                         "qkey": self.qkey}, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY)
            acc = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC
            return ({"qp_state": QPS_INIT, "pkey_index": 0, "port_num": 1,
                     "qp_access_flags": acc},
                    QP_STATE | QP_ACCESS_FLAGS | QP_PKEY_INDEX | QP_PORT)
        if ud:
            if state == QPS_RTR:
                return {"qp_state": QPS_RTR}, QP_STATE
            if state == QPS_RTS:
                return {"qp_state": QPS_RTS, "sq_psn": 0}, QP_STATE | QP_SQ_PSN
            raise VerbsError(errno.EINVAL, f"QP state {state}")
        c = self.conn
        if c is None or c.remote_qpn == 0 and c.state not in (_cm.State.REQ_RCVD,
                                                               _cm.State.REP_RCVD):
            raise VerbsError(errno.EINVAL, "no connection to take the attributes from")
        if state == QPS_RTR:
            mtu = min(c.path_mtu or 5, 5)
            return ({"qp_state": QPS_RTR, "path_mtu": mtu, "dest_qp_num": c.remote_qpn,
                     "rq_psn": c.remote_psn, "max_dest_rd_atomic": c.responder_resources,
                     "min_rnr_timer": MIN_RNR_TIMER, "dgid": c.remote_gid or self.dgid,
                     "port_num": 1, "hop_limit": 64},
                    QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN
                    | QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER)
        if state == QPS_RTS:
            return ({"qp_state": QPS_RTS, "sq_psn": self.psn, "timeout": c.local_ack_timeout,
                     "retry_cnt": c.retry_count, "rnr_retry": c.rnr_retry_count,
                     "max_rd_atomic": c.initiator_depth},
                    QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY
                    | QP_MAX_QP_RD_ATOMIC)
        raise VerbsError(errno.EINVAL, f"QP state {state}")


# ---------------------------------------------------------------- the CM's events

def _user_pd(kind_sidr: bool, pd: bytes) -> bytes:
    return pd[M.CMA_HDR_LEN:] if len(pd) >= M.CMA_HDR_LEN else pd


def _dispatch(ev: _cm.CMEvent) -> None:
    """Called by a device's CM (under its lock): turn its event into an rdma_cm event."""
    c = ev.conn
    k = ev.kind
    if k is EventKind.CONNECT_REQUEST:
        lid: CmId = ev.listener.owner
        if lid is None or lid.destroyed:
            return
        nic = next((n for n, lst in lid.listeners if lst is ev.listener), None)
        child = CmId(lid.channel, ps=lid.ps, qp_type=lid.qp_type, nic=nic)
        child.conn = c
        child.listen_id = lid
        c.owner = child
        child.state = "connect_request"
        try:
            h = M.CmaHeader.decode(ev.private_data)
            child.src = (h.dst_ip, lid.src[1])
            child.dst = (h.src_ip, h.src_port)
        except M.MadError:
            child.src = (nic.ip, lid.src[1])
            child.dst = (c.peer[0], 0)
        sidr = c.state is _cm.State.SIDR_REQ_RCVD
        # the PSN the REP will carry, known before the consumer moves its QP to RTS
        child.psn = 0 if sidr else _cms[nic.name].new_psn()
        lid._post(Event(CONNECT_REQUEST, child, listen_id=lid,
                        private_data=_user_pd(sidr, ev.private_data),
                        responder_resources=c.responder_resources,
                        initiator_depth=c.initiator_depth, retry_count=c.retry_count,
                        rnr_retry_count=c.rnr_retry_count, srq=c.req.srq if c.req else 0,
                        qp_num=c.remote_qpn, qkey=c.remote_qkey, new=True))
        return
    cid: CmId = c.owner
    if cid is None or cid.destroyed:
        return
    if k is EventKind.CONNECT_RESPONSE:
        cid.state = "connect_response"
        cid.remote_qpn = c.remote_qpn
        cid._post(Event(CONNECT_RESPONSE, cid, private_data=ev.private_data,
                        responder_resources=c.responder_resources,
                        initiator_depth=c.initiator_depth, rnr_retry_count=c.rnr_retry_count,
                        srq=0, qp_num=c.remote_qpn))
    elif k is EventKind.ESTABLISHED:
        cid.state = "connected"
        cid._post(Event(ESTABLISHED, cid, private_data=ev.private_data,
                        responder_resources=c.responder_resources,
                        initiator_depth=c.initiator_depth, qp_num=c.remote_qpn))
    elif k is EventKind.REJECTED:
        cid.state = "rejected"
        cid._post(Event(REJECTED, cid, status=ev.status, private_data=ev.private_data))
    elif k is EventKind.UNREACHABLE:
        cid.state = "unreachable"
        cid._post(Event(UNREACHABLE, cid, status=-ev.status))
    elif k is EventKind.DISCONNECTED:
        if cid.state != "disconnected":
            cid.state = "disconnected"
            cid._post(Event(DISCONNECTED, cid, private_data=ev.private_data))
    elif k is EventKind.SIDR_REPLY:
        if ev.status == M.SidrStatus.OK:
            cid.state = "connected"
            cid.remote_qpn, cid.remote_qkey = c.remote_qpn, c.remote_qkey
            cid._post(Event(ESTABLISHED, cid, private_data=ev.private_data,
                            qp_num=c.remote_qpn, qkey=c.remote_qkey))
        else:
            cid.state = "unreachable"
            cid._post(Event(UNREACHABLE, cid, status=ev.status, private_data=ev.private_data))
    elif k is EventKind.TIMEWAIT_EXIT:
        pass


def getaddrinfo(node: str | None, service: str | None, *, passive: bool = False,
                ps: int = M.RDMA_PS_TCP, qp_type: int = IBV_QPT_RC,
                src: str | None = None) -> dict:
    """rdma_getaddrinfo: the source and destination (ip, port) and the port space.  A
    name with both IPv4 and IPv6 addresses resolves to its IPv4 one."""
    port = 0
    if service:
        try:
            port = int(service)
        except ValueError:
            import socket
            try:
                port = socket.getservbyname(service)
            except OSError:
                raise VerbsError(errno.EINVAL, f"unknown service {service!r}") from None
    ip = None
    if node:
        import socket
        infos = []
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                infos = socket.getaddrinfo(node, None, family)
                break
            except socket.gaierror:
                continue
        if not infos:
            raise VerbsError(errno.ENODEV, f"cannot resolve {node!r}")
        ip = ip_text(infos[0][4][0])
    if passive:
        return {"src": (ip or "0.0.0.0", port), "dst": None, "ps": ps, "qp_type": qp_type}
    if ip is None:
        raise VerbsError(errno.EINVAL, "a destination is needed")
    return {"src": (src, 0) if src else None, "dst": (ip, port), "ps": ps, "qp_type": qp_type}
