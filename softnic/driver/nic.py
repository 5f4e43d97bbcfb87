"""Live NICs: the engine driven over a real UDP socket, in real time.

``open_device(name)`` gives this process's NIC of that name (one per name,
reference counted).  Each NIC owns an engine ``Device``, a UDP socket, a lock,
and a progress thread.  Progress happens in two ways, as the design asks:

* the progress thread sleeps in one ``ppoll`` on the device's socket and its
  doorbell (an eventfd) until a datagram arrives, the engine's one timer is
  due, or a verbs call rings the bell (it armed an earlier timer, or the device
  closes); then it feeds the engine and sends what it produced, so one-sided
  operations land while the target program does nothing.  It sleeps without
  the interpreter lock (``softnic.accel``'s ``sn_wait``) and takes it only when
  there is work no other thread will do: never a timed nap.  On the passive side
  (no program polls), after a datagram of a packet or two it first looks without
  sleeping for ``PROGRESS_SPIN`` (``sn_wait_spin``), so a peer's next request
  finds it awake;
* every API call that may be spun on (``poll``, ``wait_until``) drives the same
  step inline, so a program that busy-polls its CQ never waits for the GIL to
  hand the thread a turn.  Such a caller holds a *lease* (a timestamp the
  sleeping thread reads): while it is fresh, a datagram that arrives is left to
  the caller, and the thread does not wake to fight it for the interpreter.

Completion channels wake their waiter from the step that made the completion:
a thread blocked in ``wait_until`` sleeps on the socket itself (``sn_wait``)
and steps what arrives, holding the lease meanwhile; other waiters are notified
by every step and verbs call that did something.

The driver rule holds everywhere: after every input, drain
``datagrams_to_send`` and re-arm from ``get_timer``.
"""

from __future__ import annotations

import array
import atexit
import errno
import heapq
import ipaddress
import json
import os
import random
import select
import socket
import sys
import threading
import time
import zlib
from pathlib import Path

from . import config as _config
from .capture import Capture, TcpCapture
from ..core.device import Device, DeviceConfig
from ..core.enums import MTU, mtu_bytes
from ..core.requester import Gather, Run
from ..core.responder import ANSWER_READ, ANSWER_READ_RUN
from ..core.dispatch import RESPONSES as _RESPONSES, StreamKind
from .. import accel as _accel
from . import env
from .faults import FaultInjector
from . import mcast as _mcast
from . import timeline as _timeline
from .hostfiles import own_start, process_alive, stats_dir  # noqa: F401 (process_alive: for callers)
from .hostfiles import prune as _prune
from ..transport.udp import UdpSocket, bind_free, ip_str as _ip_str, ip_u32 as _ip_u32
from ..wire.roce import AETH_LEN, BTH_LEN, ICRC_LEN, ROCEV2_PORT, Opcode as _Op

#: How long after an inline step (a caller spinning on ``poll``) the caller is
#: trusted to take what arrives; after that the progress thread takes it.  Long
#: enough that a spinner the scheduler preempts for a moment is not fought for
#: the interpreter; a C program that polls its CQ until a completion gives the
#: lease back at once (``end_lease``), so spinning on memory next costs nothing.
SPIN_LEASE = env.number("SOFTNIC_SPIN_LEASE_US", 1000.0, float) * 1e-6
SPIN_LEASE_NS = int(SPIN_LEASE * 1e9)
#: How long output an inline step holds for its caller's next call may wait
#: before the progress thread sends it (the peer waits for it).
HOLD_LEASE = env.number("SOFTNIC_HOLD_US", 100.0, float) * 1e-6
#: How long a C face's thread asleep on the socket in ``ibv_get_cq_event`` holds
#: the lease (``hold_for_waiter``): it renews it each second it sleeps.
WAITER_LEASE = env.number("SOFTNIC_WAITER_LEASE_S", 2.0, float)
STATS_EVERY = 1.0           # seconds between counter publications
#: The interpreter's switch interval while a live NIC is open: how long the
#: progress thread, woken with work, may wait for a thread that computes in
#: Python without calling softnic to hand over the interpreter (CPython's default
#: is 5 ms, a scheduler tick's worth of latency).
SWITCH_INTERVAL = env.number("SOFTNIC_SWITCH_INTERVAL_US", 500.0, float) * 1e-6
#: The progress thread's nice value (Linux: per thread) while the program drives
#: the device, where the process may raise its priority (root, CAP_SYS_NICE,
#: RLIMIT_NICE; elsewhere it stays as it is): woken by a datagram, it must get a
#: CPU from the program's own threads spinning on memory or on a CQ that lost
#: their lease, which the scheduler does not preempt at once for an equal (an
#: equal waits up to a scheduler tick: docs/performance.md, "Priority").  It runs
#: briefly and sleeps, as a NIC's own engine would; 0 leaves it as it is.
PROGRESS_NICE = env.number("SOFTNIC_PROGRESS_NICE", -10)
#: The program drives the device while it polls, streams posts, sleeps on the
#: socket in ``wait_until`` or gives its lease back (``end_lease``) within this
#: many seconds: a poll or ``end_lease`` raises the thread, which looks each
#: time it wakes and lowers itself after this long without either.  A program that does none of
#: these (the passive side of one-sided traffic, asleep elsewhere) has no thread
#: of its own for the progress thread to preempt: raised, the thread would
#: preempt the sender instead (on a loaded machine, at each message's first
#: datagram), taking one message per wake-up and sending each ACK alone
#: (docs/performance.md, "Many QPs").
PROGRESS_NICE_HOLD = 1.0
#: While the thread is raised (``PROGRESS_NICE``), it waits out the lease of a
#: caller that keeps polling under SCHED_IDLE (``sn_wait``'s idle park, lease[5]),
#: so its looks at that lease preempt nobody; ``SOFTNIC_IDLE_PARK=0``: at its own
#: priority, waking each lease (docs/performance.md, "The idle park").
IDLE_PARK = env.flag("SOFTNIC_IDLE_PARK")
#: the lease's slots (the comment in ``NIC.__init__``; wait.c reads them all)
LEASE_LEN = 8
#: How long the progress thread looks at its socket and bell without sleeping
#: after a datagram woke it while the program does not drive the device (as
#: ``PROGRESS_NICE_HOLD`` says; ``sn_wait_spin``), as a driver busy-polls its NIC
#: after traffic: the passive side of a READ, an ATOMIC or one-sided traffic
#: takes the next request without a sleeping thread's wake-up, which the
#: requester pays inside its sendmsg (docs/performance.md, "Busy poll"). It never
#: spins beside a program that polls its own CQ, nor after a step that took more
#: than ``PROGRESS_SPIN_PKTS`` packets (a stream: sleeping lets the next burst
#: gather, to be taken and acknowledged in one step).  A thread that waits for a
#: completion event asleep on the socket (the C face's ``ibv_get_cq_event``,
#: ``wait_until``) looks this long without sleeping at the start of each wait,
#: for the same reason: the peer's answer to what the program just sent.  0: never.
PROGRESS_SPIN = env.number("SOFTNIC_PROGRESS_SPIN_US", 200.0, float) * 1e-6
PROGRESS_SPIN_NS = int(PROGRESS_SPIN * 1e9)
PROGRESS_SPIN_PKTS = 2
#: Send a long message's packets gathered from registered memory (the payload
#: copied once, by the kernel into the socket buffer) rather than built whole
#: first; ``SOFTNIC_TX_GATHER=0`` builds them whole.
GATHER = env.flag("SOFTNIC_TX_GATHER")
#: Take each receive of the socket's (``UdpSocket.recv_runs``) by the kernel's
#: ``sn_rx_one``: the same recvmsg(2), without a poll(2) before it or the
#: interpreter's ancillary data; ``SOFTNIC_RX_ONE=0``: by Python's socket module.
RX_ONE = env.flag("SOFTNIC_RX_ONE")
#: Receive a stream of a SEND's or WRITE's MIDDLEs, or of a READ's RESPONSE
#: MIDDLEs, run after run in the compiled kernel (``_rx_stream``);
#: ``SOFTNIC_RX_STREAM=0``: each run through the engine.
RX_STREAM = env.flag("SOFTNIC_RX_STREAM")
_STREAM_ACKS = 256                       # AckReqs one sn_rx_stream call may take
#: receives a caller's inline step may take of its own READ's RESPONSE MIDDLEs that
#: wait, once it took the READ's FIRST or a run of them: GRO runs of about 60 KiB,
#: so 4 MiB at most (``_step``)
_READ_STREAM_RUNS = 64
#: Answer a peer's READs and ATOMICs in the compiled kernel as they arrive
#: (``_rx_answers``); ``SOFTNIC_RX_ANSWERS=0``: each through the engine.
RX_ANSWERS = env.flag("SOFTNIC_RX_ANSWERS")
#: the longest answer, a READ RESPONSE ONLY (or FIRST, or LAST): BTH, AETH, 4096
#: bytes (the largest path MTU), ICRC; and the most one call answers
_ANSWER_MAX = BTH_LEN + AETH_LEN + mtu_bytes(MTU.MTU_4096) + ICRC_LEN
_ANSWERS_MAX = 256
#: the RESPONSE MIDDLEs of one READ the kernel answers at most (their headers, 16
#: bytes each: 1 MiB at a path MTU of 1024, 4 MiB at 4096); a longer READ is the
#: engine's
_ANSWER_MIDDLES = 1024
#: the longest datagram (an ACK, a small SEND) whose arrival between a peer's
#: requests leaves the kernel its answers (``_rx_answers``)
_ANSWER_BETWEEN = 64
_ANSWER_MISSES = 32
#: a READ's responses before its LAST: more of the same burst follow (``NIC.poll``'s
#: ``reads``; an inline step's stream of them, ``_step``)
_READ_MORE = frozenset({int(_Op.RC_RDMA_READ_RESPONSE_FIRST),
                        int(_Op.RC_RDMA_READ_RESPONSE_MIDDLE)})
_NEVER = float("inf")
_READ_REQUEST = int(_Op.RC_RDMA_READ_REQUEST)
_ANSWER_READS = (ANSWER_READ, ANSWER_READ_RUN)
_WAKES = ("progress_wake_timer", "progress_wake_datagram", "progress_wake_bell",
          "progress_wake_held")          # why the progress thread woke (sn_wait's answers)
_NO_DEADLINE = (1 << 63) - 1


def _flat(buf):
    """A run's buffer laid end to end (a ``Gather`` is only for the socket)."""
    return buf.flatten() if type(buf) is Gather else buf


def unpark_idle(lease) -> None:
    """Raise a progress thread in an idle park (``sn_wait``: SCHED_IDLE while it
    waits out a polling caller's lease; lease[6] its thread id, 0 if it is not)
    back to SCHED_OTHER, its nice value as it was: whoever rings its bell or gives
    the lease back, so the thread's wake-up preempts a program that spins on
    memory next.  The thread raises itself too when its park ends."""
    tid = lease[6]
    if tid:
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass                        # (gone, or raised already)

# Reentrant, and never held while a device is built: the garbage collector may run in any
# thread at any allocation (a new progress thread's start included) and close a device
# whose last owner it collects (pyverbs' Context.__dealloc__ in the C face), which takes
# this lock: held across a thread start, or by the collecting thread itself, it would
# deadlock.
_lock = threading.RLock()
_open: dict[str, "NIC"] = {}
_opening: dict[str, threading.Event] = {}     # devices being built (outside the lock)
_cfg: _config.RuntimeConfig | None = None


def runtime_config() -> _config.RuntimeConfig:
    global _cfg
    if _cfg is None:
        _cfg = _config.load()
    return _cfg


def device_names() -> list[str]:
    return [d.name for d in runtime_config().devices]


def configure(cfg: _config.RuntimeConfig | None = None) -> None:
    """Replace this process's configuration (None: read the environment again).
    Open devices are closed first; a simulated fabric starts afresh."""
    global _cfg, _world
    for nic in open_nics():
        nic.close()
    with _lock:
        _open.clear()
        _cfg = cfg
        _world = None


def open_device(name: str) -> "NIC | SimNIC":
    while True:
        with _lock:
            nic = _open.get(name)
            if nic is not None:
                nic.refs += 1
                return nic
            building = _opening.get(name)
            if building is None:
                cfg = runtime_config()
                spec = next((d for d in cfg.devices if d.name == name), None)
                if spec is None:
                    raise KeyError(f"no softnic device {name!r} (devices: {device_names()})")
                transport = spec.transport or cfg.transport
                if cfg.backend == "sim":
                    # the simulated fabric's devices start no thread: built here, under
                    # the lock, all in the one world
                    if transport == "tcp":
                        raise ValueError(f"device {name}: transport=tcp needs real sockets, "
                                         "not SOFTNIC_BACKEND=sim (the simulated fabric "
                                         "carries datagrams)")
                    nic = sim_world().open(spec)
                    _attach_cm(nic)
                    _open[name] = nic
                    _count_open()
                    nic.refs += 1
                    return nic
                building = _opening[name] = threading.Event()
                break
        building.wait()                 # another thread builds it: take that one
    try:
        nic = TcpNIC(spec, cfg) if transport == "tcp" else NIC(spec, cfg)
        if transport != "tcp":
            _attach_cm(nic)
        with _lock:
            _open[name] = nic
            _count_open()
            nic.refs += 1
        return nic
    finally:
        with _lock:
            del _opening[name]
        building.set()


def node_guid(name: str) -> int:
    """A device's node GUID (host order): a stable EUI-64 made from its name, the
    same in every process and both faces (``ibv_query_device``, pyverbs'
    ``Device.guid``, the CM's local CA GUID)."""
    return 0x02534EFFFE000000 | (zlib.crc32(name.encode()) & 0xFFFFFF)


def _attach_cm(nic) -> None:
    """Every RoCE device answers connection management on QP1, as a NIC does
    (``core.cm``; ``softnic.driver.rdmacm`` takes its events when a program uses rdma_cm)."""
    from ..core.cm import CM
    guid = node_guid(nic.name)
    world = getattr(nic, "world", None)
    rng = world.fabric.derive_rng("cm", nic.name) if world is not None else \
        random.Random(int.from_bytes(os.urandom(8), "little"))   # (simulated: replayable)
    with nic.lock:
        nic.dev.gsi = CM(nic.dev.gid, guid, rng)


def forget_after_fork() -> None:
    """In a child of fork(): the devices open in the parent are the parent's (their
    sockets inherited, their progress threads gone); the child opens its own afresh, as
    a process opens its own context on a kernel device.  (No lock: a thread of the
    parent may have held it at fork.)"""
    global _lock
    _lock = threading.RLock()
    _open.clear()
    _count_open()
    _opening.clear()
    for hook in _fork_hooks:
        hook()


_fork_hooks: list = []


def on_fork(hook) -> None:
    """``hook()`` runs in a forked child after the parent's devices are forgotten (the
    layers above, such as rdma_cm, forget what they kept of them)."""
    _fork_hooks.append(hook)


def open_nics() -> list["NIC"]:
    with _lock:
        return list(_open.values())


def open_count() -> int:
    """How many devices this process has open (without the module's lock: a
    caller spinning on a CQ asks it on every empty poll)."""
    return len(_open)


#: The devices open in this process, in memory a C face reads without the interpreter
#: (``fast_view``): ``[open_count(), lease, socket, lease, socket, ...]``, the addresses
#: of each open device's ``_lease`` and socket fd (``_sock_view``), 0 for a device
#: without them.  It has room for ``FAST_DEVICES``; with more open the count reads
#: -1 (every poll enters Python), so a reader never looks past the pairs written,
#: whatever its own limit.  Made with the first device that has the compiled sleep.
_open_view = None
FAST_DEVICES = 8
#: every lease and socket view ever listed, kept for the process's life: a C reader
#: that raced a change reads memory that still exists (a closed device's fd is -1)
_fast_kept: list = []


def _count_open() -> None:
    """``_open`` changed (caller holds ``_lock``).  The pairs are written before the
    count, so a reader that sees the new count sees the devices it counts."""
    v = _open_view
    if v is None:
        return
    n = len(_open)
    if n > FAST_DEVICES:
        v[0] = -1
        return
    for i, nic in enumerate(_open.values()):
        lease, sock = getattr(nic, "_fast_addr", (0, 0))
        v[1 + 2 * i], v[2 + 2 * i] = lease, sock
    v[0] = n


def port_for_gid(gid: str) -> int:
    """UDP port of the device with this GID, if it is known here; else 4791."""
    ip = ipaddress.ip_address(gid)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    ip = str(ip)                # (IPv6: canonical text, as a device's address is kept)
    for nic in open_nics():
        if nic.ip == ip:
            return nic.port
    for d in runtime_config().devices:
        if d.ip == ip:
            return d.port
    return ROCEV2_PORT


def _loopback_candidates() -> list[str]:
    # not 127.0.0.1: that is the host's own loopback address, which rdma_cm reaches as
    # the host's (a listener bound to it in any process, softnic/driver/rdmacm_host.py)
    return [f"127.0.0.{i}" for i in range(2, 255)] + [f"127.0.1.{i}" for i in range(1, 255)]


class SharedDevice:
    """A device every face of a process shares, counted by reference: ``open_device``
    gives it out (one more reference), ``release`` drops one and the last closes
    it.  The live NIC, the simulated one and the virtual cluster's
    (``collectives.virtual.VNIC``) are such devices; a subclass sets ``name``,
    ``refs`` and ``_closed`` and implements ``close``."""
    name: str
    refs: int
    _closed: bool

    @property
    def closed(self) -> bool:
        """Has the device been closed (its last reference released, or closed)?"""
        return self._closed

    def release(self) -> None:
        """Drop one reference; the last one closes the device."""
        with _lock:
            self.refs -= 1
            if self.refs > 0:
                return
            if _open.get(self.name) is self:     # (not a newer device of the same name)
                del _open[self.name]
                _count_open()
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    def post_recv(self, fn, *args):
        """A post of receives (``fn(*args)``, the engine's ``post_recv`` or
        ``post_srq_recv``, or a chain of them), which sends nothing: a receive
        queue's doorbell.  Run as any call by a device that has nothing to save."""
        return self.call(fn, *args)


class NIC(SharedDevice):
    transport = "udp"

    def __init__(self, spec: _config.DeviceSpec, cfg: _config.RuntimeConfig):
        self._open_wire(spec)
        self.name = spec.name
        self.refs = 0
        try:
            self.dev = self._device_class()(
                spec.name, self.ip, self.port,
                config=DeviceConfig(min_timer=cfg.min_timer, selective_repeat=cfg.selective_repeat,
                                    cc=_config.cc_for(cfg, spec.name),
                                    line_rate_bps=cfg.link_gbps * 1e9))
        except BaseException:
            self._close_wire()
            raise
        # With congestion control on, read the ECN bits of what arrives (a CE mark
        # from a real router reaches the controller) and send ECT if it reacts to ECN.
        # (Over TCP the kernel's own congestion control and ECN apply.)
        self._ecn = self.transport == "udp" and self.dev.config.cc != "none"
        if self._ecn:
            self.sock.enable_ecn(send_ect=self.dev.ect)
        self.gid = self.dev.gid
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        self._waiters = 0           # threads in wait_until (a step wakes them)
        self.injector = None
        if not cfg.faults.is_none():
            seed = zlib.crc32(f"{cfg.seed}/{spec.name}".encode())
            self.injector = FaultInjector(cfg.faults, random.Random(seed))
        self._delayed: list[tuple[float, int, bytes, tuple]] = []   # fault-delayed sends
        self._seq = 0
        self.capture = None
        if cfg.capture:
            p = Path(cfg.capture)
            self.capture = self._capture_class()(
                p.with_name(f"{p.stem}-{spec.name}{p.suffix or '.pcap'}"))
        self._closed = False
        self._stats_at = time.monotonic()
        self._owed = False          # an inline step left its output for the next call
        self._posts_owed = False    # ... and of it, a post's requests (``post``): ``poll`` sends them first
        self._answering = False     # the program spins for a request it will answer (end_lease)
        self._asleep = False        # the program sleeps on a CQ's channel (end_lease_to_sleep)
        # the thread took a datagram between the last such end_lease and the program's
        # next call (end_lease rings the thread for the next one only then)
        self._answer_rx = True
        self._stats_path = stats_dir() / f"{os.getpid()}-{spec.name}.json"
        self._readable = self._readiness()
        self._runs = hasattr(self.sock, "recv_runs")
        # Half a QP's window: a program's inline steps hold their ACKs for fewer
        # packets than that (``_holds_acks``), and a step that keeps receiving
        # sends its coalesced ACKs after every that many packets' worth of data at
        # the active MTU, not only at its end
        cfg_d = self.dev.config
        self._ack_pkts = max(1, cfg_d.window // 2)
        self._ack_bytes = self._ack_pkts * cfg_d.active_mtu
        self._rx_held = 0           # packets inline steps took since output last left
        self._stream = None
        self._answers = None
        self._answers_sent = 0      # requests _rx_answers answered
        self._answer_misses = 0     # its calls in a row that answered none, stopped by a small one
        self._stream_pkts = 0       # packets _rx_stream took
        self._stream_beyond_pkts = 0    # ... of them beyond a hole (selective repeat)
        self._posts_held = 0        # posts whose output waited for the caller's next call
        self._inline_polls = 0      # calls of poll (a C face's empty poll answered in C is none)
        if self._runs:
            self.dev.kernel = _accel.load()
            k = self.dev.kernel
            if k is not None:
                _accel.give_compiled(self.dev)    # (the same rules, compiled beside the kernel)
            if k is not None and RX_ONE and hasattr(self.sock, "use_kernel_rx"):
                self.sock.use_kernel_rx(k)
            if k is not None and hasattr(self.sock, "rx_buffer") \
                    and self.sock.sock.family == socket.AF_INET:
                rx = (k.ffi.from_buffer(self.sock.rx_buffer, require_writable=True),
                      len(self.sock.rx_buffer))
                if RX_STREAM:
                    # the receive of a stream of MIDDLEs (_rx_stream): the progress
                    # thread's, and a caller's inline step's of its own READ's responses
                    self._stream = (k.lib, k.ffi, *rx,
                                    k.ffi.new(f"uint32_t[{_STREAM_ACKS}]"),
                                    k.ffi.new("uint32_t[10]"))
                if RX_ANSWERS and self.injector is None:
                    # the answer to a peer's READs and ATOMICs
                    # (_rx_answers), where no fault model needs to see the responses
                    # (a READ's FIRST and LAST, its MIDDLEs' headers)
                    self._answers = (k.lib, k.ffi, *rx,
                                     k.ffi.new(f"uint8_t[{2 * _ANSWER_MAX}]"),
                                     k.ffi.new(f"uint64_t[{_ANSWERS_MAX}]"),
                                     k.ffi.new(f"uint8_t[{16 * _ANSWER_MIDDLES}]"),
                                     k.ffi.new("uint32_t[10]"))
            # a run's payload goes from registered memory to the socket, gathered
            # (requester.Gather), where no capture or fault model needs its bytes (a
            # model that only drops sends the survivors of a run gathered too)
            self.dev.tx_gather = GATHER and self.capture is None \
                and (self.injector is None or self.injector.drops_only) \
                and hasattr(self.sock, "use_gather") and self.sock.use_gather(self.dev.kernel)
        # The doorbell: verbs calls that need the sleeping thread (an earlier timer,
        # close) add one to it.  ``_sleep_until`` is the thread's planned wake-up while
        # it sleeps (-inf while it is awake, when nobody need ring).
        self._bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._sleep_until = -_NEVER
        self._wakes = [0, 0, 0, 0]
        self._spin_found = 0            # datagrams the thread found while it spun
        self._waiter_spin_found = 0     # ... and a thread waiting for an event (spun_for_waiter)
        # PROGRESS_NICE while the program drives the device (PROGRESS_NICE_HOLD);
        # None: the process may not raise the thread's priority
        self._raised: bool | None = False
        self._base_nice: int | None = None
        self._returned_ns = 0           # monotonic ns of the latest end_lease
        self._nice_changes = 0
        self._waiter = _accel.waiter() if self.transport == "udp" else None
        # A thread blocked in ``wait_until`` sleeps on the socket itself (one wake-up
        # from datagram to its completion, not the progress thread's and then its
        # own); ``_poller`` is its eventfd while it does (-1: none), which a step
        # by another thread that did something writes to.
        self._poller = -1
        self._poller_id = 0
        self._poll_fd = -1
        self._poll_lease = None
        self._sock_view = None
        if self._waiter is not None:
            self._poll_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._poll_lease = self._waiter.ffi.new(f"int64_t[{LEASE_LEN}]")
            # the socket's fd (-1 once closed), for a C face's poll (fast_view)
            self._sock_view = self._waiter.ffi.new("int32_t[1]", [self.sock.fileno()])
            global _open_view
            if _open_view is None:          # (not under _lock: a device is being built)
                view = self._waiter.ffi.new(f"int64_t[{1 + 2 * FAST_DEVICES}]")
                view[0] = len(_open)
                _open_view = view
        if self._waiter is not None:
            # lease[0]: monotonic ns of the latest inline step; lease[1]: a step is
            # under way or holds output (read by sn_wait without the GIL; above 1,
            # ACKs held for the program's answer until that time in ns: NIC.poll,
            # shim.c's sn_cq_idle); lease[2]:
            # the thread is waiting on the lease; lease[3]: the engine's next
            # deadline in ns, which the sleeping thread re-reads; lease[4]: the
            # thread id of the caller that renewed it last (sn_wait keeps the lease
            # only while that thread runs; 0: a lease ahead, not asked about);
            # lease[5]: the thread may idle-park (IDLE_PARK, set while it is raised:
            # _prioritize); lease[6]: its id while it is idle-parked (unpark_idle);
            # lease[7]: the times it lowered itself for one
            self._lease = self._waiter.ffi.new(f"int64_t[{LEASE_LEN}]")
        else:
            self._lease = array.array("q", [0] * LEASE_LEN)
        self._lease[3] = _NO_DEADLINE
        if self._sock_view is not None:
            # (listed in _open_view once open: _count_open)
            ffi = self._waiter.ffi
            _fast_kept.append((self._lease, self._sock_view))
            self._fast_addr = (int(ffi.cast("uintptr_t", self._lease)),
                               int(ffi.cast("uintptr_t", self._sock_view)))
        if sys.getswitchinterval() > SWITCH_INTERVAL > 0:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self._timeline = _timeline.attach(self)     # (SOFTNIC_TIMELINE: None unless set)
        self._thread = threading.Thread(target=self._run, name=f"softnic-{spec.name}",
                                        daemon=True)
        self._thread.start()

    def _open_wire(self, spec: _config.DeviceSpec) -> None:
        if spec.ip is None:
            self.sock = bind_free(_loopback_candidates(), spec.port)
        else:
            self.sock = UdpSocket(spec.ip, spec.port)
        self.ip, self.port = self.sock.address

    def _device_class(self):
        return Device

    def _readiness(self):
        """``f(0)`` is true when a datagram waits on the socket."""
        return self.sock.readable

    def _capture_class(self):
        return Capture

    # ------------------------------------------------------------ API used by verbs_api

    def call(self, fn, *args, **kw):
        """Run an engine call under the lock, then send what it produced (and wake
        whoever waits on its effects: a completion made by the call itself)."""
        with self.lock:
            self._answering = self._asleep = False
            try:
                return fn(*args, **kw)
            finally:
                self._flush(time.monotonic())
                if self._waiters:
                    self._notify()

    def post_recv(self, fn, *args):
        """``call`` without its flush: a receive posted makes no datagram (the
        engine's ``post_recv`` queues it, or completes it flushed on a QP in ERR,
        which wakes the waiters as any completion does), so the flush, which
        would find nothing new, is left out unless output is held for this call
        (an inline step's, ``_owed``), and then only when it may not wait longer
        (``_holds_acks``): UCX and a SEND receiver repost one receive per message,
        and the ACKs of a stream of SENDs coalesce as a WRITE stream's do."""
        with self.lock:
            self._answering = self._asleep = False
            try:
                return fn(*args)
            finally:
                if self._owed and not self._holds_acks():
                    self._flush(time.monotonic())
                if self._waiters:
                    self._notify()

    def _holds_acks(self) -> bool:
        """May held output (``_owed``) wait longer: is it plain ACKs only, of fewer
        than half a window of packets taken by inline steps since output last
        left, on QPs with no work request of their own outstanding, while a
        datagram waits (the receiver of a stream, in the middle of it)?  A
        responder may coalesce ACKs (a later one acknowledges all before it);
        the progress thread's steps send theirs at that mark too
        (``_ack_bytes``).  Either side of a ping-pong over SENDs sends them now:
        with a SEND of its own outstanding (its ACK waits behind the answer just
        taken), or with nothing waiting (the peer spins for this ACK, as
        perftest's ``ib_send_lat`` does for each signaled SEND).  Held, the
        peer would find the ACK behind the next request and pay a poll for it
        (docs/performance.md, "A polling receiver of a stream coalesces its
        ACKs").  A caller that stops calling leaves them to the progress thread
        once its lease runs out (``HOLD_LEASE``)."""
        return not self._at_ack_mark(0) and bool(self._readable(0)) \
            and self.dev.owes_acks_only(True)

    def _at_ack_mark(self, taken: int) -> bool:
        """Have inline steps taken half a window of packets (``_ack_pkts``) since
        output last left, with ``taken`` more by the step under way?  Held ACKs
        leave then (``_holds_acks`` across steps, ``_step`` within one)."""
        return self._rx_held + taken >= self._ack_pkts

    def post(self, qpn: int, fn, *args):
        """A post of work requests to the QP numbered ``qpn`` (``fn(*args)``, the engine's
        post), run as ``call`` runs it, except that a caller who streams leaves what it
        produced for its next call, as a NIC takes WQEs at its next doorbell: a
        program that polls (its lease is fresh) and has sends of this QP outstanding
        will poll for their completions, and that poll sends all that its posts since
        made in one flush (UCX posts a 64 KiB eager message as eight SENDs in a row,
        then polls), where each post's own flush would wake the peer once per work
        request.  Held as an inline step's output is (``HOLD_LEASE``): the progress
        thread sends it if the call does not come.  A first send (nothing
        outstanding: a latency test's) leaves at once."""
        with self.lock:
            self._answering = self._asleep = False
            lease = self._lease
            ns = time.monotonic_ns()
            streams = ns - lease[0] < SPIN_LEASE_NS and self.dev.sends_outstanding(qpn)
            try:
                return fn(*args)
            finally:
                if streams and not self._closed:
                    self._posts_held += 1
                    self._owed = self._posts_owed = True
                    lease[0] = ns
                    lease[4] = threading.get_native_id()
                    lease[1] = 1
                else:
                    self._flush(time.monotonic())
                if self._waiters:
                    self._notify()

    def ring(self) -> None:
        """Wake the progress thread (it re-reads the engine's timer and steps).
        Verbs calls ring it themselves when they need it; a face may too.  A thread
        in an idle park is raised first (``unpark_idle``), so the ring preempts."""
        unpark_idle(self._lease)
        try:
            os.eventfd_write(self._bell, 1)
        except OSError:
            pass                                  # closed

    def end_lease(self, answering: bool = False) -> None:
        """The caller stops polling (its poll found what it spun for): the progress
        thread takes what arrives from now on, at once.  A C program that polls its
        CQ until a completion and then spins on memory calls this, through the
        C face's ``ibv_poll_cq``.  ``answering``: it had nothing more outstanding,
        so what it spins for is a peer's request, which it will answer with a
        post of its own (until its next call, the progress thread holds the ACK
        of a request that lands, for that post to carry).  Output its inline
        steps hold then stays for that post too: the thread is not rung for it,
        and sends it within ``HOLD_LEASE`` if the post does not come.

        A thread waiting out the lease is rung to watch the socket at once, unless
        the program answers and the thread took nothing between the last such
        call and the program's next call: a program that posts next (perftest's
        READ latency test: its request's response is its own poll's to take) has
        no use for the thread meanwhile, and waking it costs the program a
        context switch (16.6 us a round trip, docs/performance.md).  The thread
        then looks again when the lease would have lapsed (``SOFTNIC_SPIN_LEASE_US``),
        and a datagram it takes before the program's next call rings it the next
        time."""
        self._answering = answering
        self._returned_ns = time.monotonic_ns()
        ring = not answering or self._answer_rx
        if answering:
            self._answer_rx = False      # (the thread sets it if it takes one)
        if self._raised is False and PROGRESS_NICE:
            self._prioritize(True)
        lease = self._lease
        lease[0] = 0
        unpark_idle(lease)               # (it looks at the lease when its park ends)
        if answering and self._owed:
            return
        if lease[2] and ring:
            lease[2] = 2                 # (sn_wait takes this ring itself)
            self.ring()

    def end_lease_to_sleep(self) -> None:
        """``end_lease`` for a caller that sleeps next without calling softnic again
        (it armed a CQ whose channel's fd it waits on itself): output an inline
        step or a post held for its next call leaves now, since that call comes
        only after the event it waits for, which may need that output's answer.
        What the progress thread takes while it sleeps may wake it to answer: the
        ACKs of those requests wait for that answer (``_step``)."""
        with self.lock:
            if self._owed and not self._closed:
                self._flush(time.monotonic())
            self._asleep = True
        self.end_lease()

    def poll(self, runs: int = 1, reads: bool = False, seen: bool = False) -> None:
        """One inline progress step: receive, fire timers, send.  Never blocks.
        ``runs``: receives it may take (one datagram or coalesced run each), while
        more wait.  ``reads``: after the first, only while what it took were a
        READ's responses before its LAST and made no completion: the rest of that
        READ's burst follows them (its FIRST, the run of its MIDDLEs and its LAST
        in one call), where anything else (a peer's request the caller may spin on
        memory for, an ACK, a completion) ends the step as one receive did.
        ``seen``: the caller saw a datagram waiting on this device's socket just
        now (the C face's ``ibv_poll_cq``, whose own ``poll(2)`` found it before it
        entered Python, ``sn_cq_idle``): the step does not ask the socket again.

        A program spins on this, so the step with nothing to do is kept cheap: one
        ``poll(2)`` on the socket (a failed non-blocking receive costs four times
        as much), a look at the engine's one timer, and nothing else.  Each call
        renews the caller's lease: the progress thread leaves what arrives to it.
        ACKs held for the caller's answer until a deadline (``lease[1]`` above 1:
        the progress thread took the requests while the caller slept, ``_step``)
        stay held by a step with nothing to receive and no timer due, until then:
        the program that woke to those requests' completions polls before it
        answers.

        Requests the caller's posts left for this call (``post``) leave before the
        step receives: the peer may be waiting for them (an exchange, as an
        allreduce's: each side posts its fragments, then polls for the other's),
        and a step that took ``runs`` of the peer's fragments first would hold
        them back by all of that work (``SOFTNIC_POLL_RUNS``, docs/performance.md,
        "Held posts leave before the poll receives")."""
        with self.lock:
            if not self._closed:
                self._inline_polls += 1
                self._answering = self._asleep = False
                lease = self._lease
                ns = time.monotonic_ns()
                lease[0] = ns
                lease[4] = threading.get_native_id()
                if self._raised is False and PROGRESS_NICE:
                    self._prioritize(True)       # the program drives the device from now
                now = ns * 1e-9
                ready = seen or self._readable(0)
                if not ready:
                    held = lease[1]
                    if (ns < held if held > 1 else not self.dev.has_output) \
                            and self._timers_idle(now):
                        return
                lease[1] = 1
                if self._posts_owed:
                    self._flush(now)
                try:
                    self._step(now, inline=True, ready=bool(ready), runs=runs,
                               reads=reads)
                finally:
                    lease[0] = time.monotonic_ns()
                    lease[1] = 1 if self._owed else 0

    def _timers_idle(self, now: float) -> bool:
        """Is no timer of the engine's due, and no datagram the fault model delays?"""
        t = self.dev.get_timer()
        if t is not None and t <= now:
            return False
        d = self._delayed
        return not (d and d[0][0] <= now)

    def wait_until(self, pred, timeout: float | None = None,
                   recheck: float | None = None) -> bool:
        """Block until ``pred()`` (evaluated under the lock) is true; False on timeout.

        ``pred`` is evaluated again after every progress step and verbs call that
        did something (they notify), so a completion wakes its waiter at once;
        ``recheck`` (seconds) also evaluates it that often, for a predicate that
        time alone can make true."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if not self._closed:
                    self._step(time.monotonic())
                if pred():
                    return True
                if self._closed:
                    return False
                wait = recheck
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    wait = left if wait is None else min(wait, left)
                self._waiters += 1
                try:
                    if self._poller < 0 and self._poll_lease is not None:
                        self._wait_on_socket(wait)
                    else:
                        self._cond.wait(wait)
                finally:
                    self._waiters -= 1

    def fast_view(self):
        """What a C face's ``ibv_poll_cq`` reads without the interpreter to see that a
        poll would find nothing and do nothing (shim.c's ``sn_cq_idle``): this
        device's lease, its socket's fd (-1 once closed) and the devices open in the
        process (``_open_view``: each one's lease and socket, for the other devices
        an empty poll moves along), as cffi arrays; None where there is none (no
        compiled sleep: every poll enters Python)."""
        if self._sock_view is None or _open_view is None:
            return None
        return self._lease, self._sock_view, _open_view

    def hold_for_waiter(self) -> int:
        """A thread of a C face is about to sleep on this device's socket itself
        (``ibv_get_cq_event``: it polls the socket and its channel, and steps what
        arrives with ``poll``).  Send what an inline step held, and give it the lease
        for as long as it may sleep before it comes back (``WAITER_LEASE``; it
        renews it each second), so the progress thread leaves what arrives to it
        and keeps the timers.  Returns the socket's fd, or -1 where it cannot (no
        ``sn_wait``: the progress thread wakes it through the channel)."""
        with self.lock:
            if self._closed or self._poll_lease is None:
                return -1
            if self._owed:
                self._flush(time.monotonic())
            self._lease[0] = time.monotonic_ns() + int(WAITER_LEASE * 1e9)
            self._lease[4] = 0               # (it sleeps on the socket: not asked about)
            return self.sock.fileno()

    def spun_for_waiter(self) -> None:
        """A thread waiting for a completion event found a datagram while it looked
        without sleeping (``PROGRESS_SPIN``): counted as ``waiter_spin_datagram``."""
        self._waiter_spin_found += 1

    def waiter_step(self, pred) -> bool:
        """The thread of ``hold_for_waiter`` woke on the socket: inline steps while
        datagrams wait (a message's next packet may be there already) until
        ``pred()`` (evaluated under the lock) is true.  Returns ``pred()``."""
        while True:
            self.poll()
            with self.lock:
                if pred():
                    return True
                if self._closed or not self._readable(0):
                    return False

    def waiter_done(self) -> None:
        """The thread of ``hold_for_waiter`` returns to its program (with an event,
        or interrupted, or cancelled): a spinner's lease from now, which the
        program's next call (a poll of its CQ) renews or ends.  Not rung: the
        progress thread, parked on the long lease, looks again within a spinner's
        lease (``sn_wait``), so output held for that call leaves even if it never
        comes."""
        with self.lock:
            if not self._closed:
                self._lease[0] = time.monotonic_ns()
                self._lease[4] = threading.get_native_id()

    def _wait_on_socket(self, wait: float | None) -> None:
        """``wait_until``'s sleep for the one thread that sleeps on the socket (and
        its own eventfd) in ``sn_wait``, without the lock or the interpreter: what
        arrives wakes it, and it steps itself.  It first looks at both without
        sleeping for ``PROGRESS_SPIN`` (``sn_wait_spin``), as C's
        ``ibv_get_cq_event`` does: a peer's answer that lands meanwhile costs no
        wake-up of a sleeping thread.  It holds the spinning caller's lease
        meanwhile, so the progress thread leaves what arrives to it (and keeps the
        timers); the lease lapses as a spinner's does, or at once when other
        threads wait too.  Caller holds the lock (once or more: released whole, as
        ``Condition.wait`` does)."""
        fd = self._poll_fd
        self._poller, self._poller_id = fd, threading.get_ident()
        pl = self._poll_lease
        pl[0] = pl[1] = pl[2] = 0          # never fresh: sn_wait returns on a datagram
        pl[3] = self._lease[3]             # (the progress thread keeps the timers)
        lease = self._lease
        # the lease while it sleeps: as long as it may sleep (at most 10 s), so the
        # progress thread sleeps on its doorbell and timers meanwhile
        lease[0] = time.monotonic_ns() + int(min(10.0 if wait is None else wait, 10.0) * 1e9)
        lease[4] = 0                       # (asleep on the socket itself: not asked about)
        sock = self.sock.fileno()
        saved = self.lock._release_save()
        try:
            r = self._waiter.lib.sn_wait_spin(sock, fd, -1 if wait is None else int(wait * 1e9),
                                              pl, 0, 0, PROGRESS_SPIN_NS)
            if r == 4:                   # a datagram, found while it spun
                self._waiter_spin_found += 1
        finally:
            self.lock._acquire_restore(saved)
            self._poller = -1
            if self._waiters > 1:
                self.end_lease()           # the others sleep on the progress thread
            else:
                lease[0] = time.monotonic_ns()   # a spinner's lease from here on
                lease[4] = threading.get_native_id()
        if r == 2 and not self._closed:         # (closed: the fd may be another's now)
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                pass
        elif r < 0 and not self._closed:
            raise OSError(-r, os.strerror(-r))

    @property
    def counters(self) -> dict[str, int]:
        with self.lock:
            c = dict(self.dev.counters)
        c["udp_send_errors"] = self.sock.send_errors if self.sock else 0
        c.update(zip(_WAKES, self._wakes))
        c["udp_recv_truncated"] = self.sock.recv_truncated if self.sock else 0
        c["rx_stream_pkts"] = self._stream_pkts
        c["rx_stream_beyond_pkts"] = self._stream_beyond_pkts
        c["rx_answers"] = self._answers_sent
        c["posts_held"] = self._posts_held
        c["inline_polls"] = self._inline_polls
        c["progress_nice_changes"] = self._nice_changes
        c["progress_idle_parks"] = self._lease[7]
        c["progress_spin_datagram"] = self._spin_found
        c["waiter_spin_datagram"] = self._waiter_spin_found
        c["udp_gather_pkts"] = getattr(self.sock, "gather_pkts", 0) if self.sock else 0
        if self.injector is not None:
            c.update({f"fault_{k}": v for k, v in self.injector.counters.items()})
        return c


    def close(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self._notify()
            self._lease[3] = 1               # a deadline past: sn_wait returns (see end_lease)
            if self._sock_view is not None:
                self._sock_view[0] = -1      # a C face's poll enters Python (fast_view)
        self.ring()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self.publish_counters(final=True)
        if self._timeline is not None:
            self._timeline.write()
            _timeline.flush_calls()
        _prune(self._stats_path.parent)      # what exited programs left there (at times)
        with self.lock:
            self._close_wire()
            if self.capture is not None:
                self.capture.close()
            os.close(self._bell)
            self._bell = -1
            if self._poll_fd >= 0:
                os.close(self._poll_fd)
                self._poll_fd = -1
                self._poll_lease = None

    def _close_wire(self) -> None:
        self.sock.close()

    def publish_counters(self, final: bool = False) -> None:
        """Write the counters where ``softnic counters`` (another process) reads them."""
        try:
            self._stats_path.parent.mkdir(parents=True, exist_ok=True)
            doc = {"pid": os.getpid(), "start": own_start(), "device": self.name,
                   "gid": self.gid, "ip": self.ip, "port": self.port, "time": time.time(),
                   "closed": final,
                   "counters": self.counters}
            tmp = self._stats_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc))
            os.replace(tmp, self._stats_path)
        except OSError:
            pass                                  # statistics are best effort

    # ------------------------------------------------------------ the driver

    def _send(self, data: bytes, addr, now: float, batch: list | None = None) -> None:
        """Send one datagram through the capture and the fault model; with ``batch``,
        what goes out now is appended there for one ``send_batch``."""
        if self.capture is not None:
            self.capture.record(data, (self.ip, self.port), addr, time.time())
        if self.injector is None:
            if batch is None:
                self.sock.send(data, addr)
            else:
                batch.append((data, addr))
            return
        for at, copy in self.injector.apply(data, now):
            if at <= now:
                if batch is None:
                    self.sock.send(copy, addr)
                else:
                    batch.append((copy, addr))
            else:
                self._seq += 1
                heapq.heappush(self._delayed, (at, self._seq, copy, addr))

    def _flush(self, now: float) -> None:
        self._rx_held = 0
        self._posts_owed = False
        if self._owed:
            self._owed = False
            self._lease[1] = 0
        if self._closed:
            return
        out = self.dev.datagram_runs(now)
        t = self.dev.get_timer()
        if t is not None:
            self._deadline(t)
        if not out:
            return
        if any(_mcast.is_group(item[1][0]) for item in out):
            out = self._fan_out(out)
        if self.capture is None and self.injector is None:
            if len(out) == 1 and type(out[0]) is not Run:
                self.sock.send(*out[0])      # one datagram (an ACK, a small message)
            else:
                self.sock.send_runs(out)     # runs of equal datagrams: one sendmsg each
            return
        if self.capture is None and self.injector.drops_only:
            self.sock.send_runs(self._surviving(out, now))
            return
        # The capture and the fault model see every datagram on its own (a run's
        # as read-only views of its buffer); what survives goes in one batch.
        batch: list = []
        send = self._send
        for item in out:
            if type(item) is not Run:
                send(item[0], item[1], now, batch)
            else:
                buf, addr, seg, _ = item
                mv = memoryview(_flat(buf)).toreadonly()
                for o in range(0, len(mv), seg):
                    send(mv[o:o + seg], addr, now, batch)
        self.sock.send_batch(batch)
        d = self._delayed
        if d:
            self._deadline(d[0][0])

    def _surviving(self, out: list, now: float) -> list:
        """``out`` as a fault model that only drops (``drops_only``) leaves it, as
        ``send_runs`` items: a run's datagrams drawn together
        (``FaultInjector.apply_run``, the draws of one ``apply`` each), its
        survivors sent as slices of its buffer, neighbours together."""
        apply_run = self.injector.apply_run
        res = []
        for item in out:
            if type(item) is not Run:
                if apply_run(1, now):
                    res.append(item)
                continue
            buf, addr, seg, _ = item
            total = len(buf)
            n = -(-total // seg)
            keep = apply_run(n, now)
            if len(keep) == n:
                res.append(item)
                continue
            gather = type(buf) is Gather
            mv = None if gather else memoryview(buf).toreadonly()
            i, m = 0, len(keep)
            while i < m:
                j = i
                while j + 1 < m and keep[j + 1] == keep[j] + 1:
                    j += 1
                if gather:              # the survivors still go gathered from memory
                    res.append(Run(buf.part(keep[i], keep[j] + 1), addr, seg, j + 1 - i))
                else:
                    a, b = keep[i] * seg, min((keep[j] + 1) * seg, total)
                    res.append(Run(mv[a:b], addr, seg, j + 1 - i) if j > i else (mv[a:b], addr))
                i = j + 1
        return res

    def _fan_out(self, out: list) -> list:
        """Datagrams to a multicast group become unicast copies, one per member QP
        (``softnic.driver.mcast``); the rest pass as they are."""
        res = []
        me = (self.ip, self.port)
        for item in out:
            addr = item[1]
            if not _mcast.is_group(addr[0]):
                res.append(item)
                continue
            if type(item) is not Run:
                res.extend(_mcast.fan_out(item[0], addr[0], me))
            else:
                mv = memoryview(_flat(item.buf))
                for o in range(0, len(mv), item.seg):
                    res.extend(_mcast.fan_out(mv[o:o + item.seg], addr[0], me))
        return res

    def _step(self, now: float, inline: bool = False, ready: bool = False,
              runs: int = 1, reads: bool = False) -> bool:
        """Receive what waits, fire due timers, send.  Caller holds the lock.
        ``reads`` (an inline step's): a run after the first only while each so far
        was a READ's responses before its LAST and none made a completion
        (``NIC.poll``'s).

        A READ's RESPONSE FIRST, or a run of its MIDDLEs, that leaves more
        MIDDLEs to come (``dev.stream_qp``) is followed, in an inline step too,
        by the rest of them that wait, in the kernel (``_rx_stream``, up to
        ``_READ_STREAM_RUNS`` receives), and by what stops them (the READ's
        LAST, the engine's): the caller waits for that READ, which makes no
        output until it completes, and each run costs it an entry of the engine
        and of its poll otherwise.

        ``inline`` (a spinning caller's step): receive ``runs`` datagrams (or
        coalesced runs) at most, and leave what they produced, typically the ACK
        of a peer's request, for the caller's next call.  The caller looks at its
        memory or CQ between the request landing and the ACK leaving: a program that
        answers at once (a ping-pong, an RPC) sends its answer first, and the
        peer, who is waiting for the answer, finds the ACK behind it.  Output is
        held for one step, or for as long as the steps that follow take only
        responses, or it is plain ACKs of a stream still arriving, fewer than
        half a window of its packets (``_holds_acks``); the progress thread
        sends it if the caller goes away.  ``ready``: the caller saw the socket readable just now."""
        did = False
        answers = True                   # what was received answers this device's requests
        limit = runs if inline else 256
        counters = self.dev.counters
        pkts = counters["rcvd_pkts"]
        if reads and (self._ecn or not self._runs or self.capture is not None):
            limit = 1                    # (a batch is read whole: no stopping inside it)
        if self._ecn:
            batch = self.sock.recv_batch_ecn(limit)
            if batch:
                did = True
                rx = self.dev.receive_datagram
                cap = self.capture
                for data, src, ecn in batch:
                    if cap is not None:
                        cap.record(data, src, (self.ip, self.port), time.time())
                    answers = answers and bool(data) and data[0] in _RESPONSES
                    rx(data, src, now, ecn)
            batch = None
        elif self._runs and self.capture is None:
            # coalesced runs straight to the device (its kernel places a WRITE's
            # MIDDLEs a run at a time)
            # (each a view of the socket's receive buffer, taken before the next)
            dev = self.dev
            rx = dev.receive_run
            got = 0
            stream = self._stream is not None and not inline
            answer = self._answers is not None
            answered = False
            cqes = dev.cqes_posted
            while limit > 0:
                if stream and dev.stream_qp is not None:
                    s_did, s_answers, used, empty = self._rx_stream(now, limit)
                    if s_did:
                        did = True
                        answers = answers and s_answers
                    limit -= used
                    ready = False
                    if empty:
                        break               # nothing waits
                if answer and dev.answer_qp is not None and limit > 0:
                    if answered:
                        # (the responses the engine made for the READs the switch
                        # below took go first, in PSN order: the kernel answers after)
                        answered = False
                        self._flush(now)
                    r_did, used, empty = self._rx_answers(now, limit)
                    if r_did:
                        did = True
                        answers = False     # a peer's requests
                    limit -= used
                    ready = False
                    if empty:
                        break               # nothing waits
                n = 0
                switch = False
                for data, src, seg in self.sock.recv_runs(limit, ready):
                    n += 1
                    did = True
                    op = data[0] if data else -1
                    answers = answers and op in _RESPONSES
                    rx(data, seg, src, now)
                    got += len(data)
                    if (got >= self._ack_bytes if not inline else n < limit and
                            self._at_ack_mark(counters["rcvd_pkts"] - pkts)) \
                            and dev.has_output and (not inline or dev.owes_acks_only()):
                        # the coalesced ACK leaves now, not after the last run waiting:
                        # a sender streaming into a busy socket would run out of window.
                        # So does an inline step's before it takes another receive, at
                        # the mark its held ACKs leave at across steps (``_holds_acks``:
                        # half a window of packets since output last left) when they
                        # are all it owes: eight runs of 64 KiB WRITEs are a whole
                        # window (docs/performance.md, "Held posts leave before the
                        # poll receives")
                        got = 0
                        self._flush(now)
                        pkts = counters["rcvd_pkts"]     # (the flush began the count anew)
                    if stream and dev.stream_qp is not None:
                        switch = True       # a message's MIDDLEs in order: the kernel's
                        break
                    if answer and op == _READ_REQUEST and dev.answer_qp is not None:
                        switch = answered = True    # READs like it: the kernel's
                        break
                    if inline and op in _READ_MORE and dev.stream_qp is not None \
                            and self._stream is not None:
                        # the caller's own READ: the rest of its MIDDLEs, the kernel's
                        _, s_answers, _, _ = self._rx_stream(now, _READ_STREAM_RUNS,
                                                             responses=True)
                        answers = answers and s_answers
                        break
                    if reads and (op not in _READ_MORE
                                  or dev.cqes_posted != cqes):
                        break               # not a READ's burst, or a completion made
                limit -= n
                ready = False
                if not switch:
                    break
            batch = None
        else:
            batch = self.sock.recv_batch(limit)
        if batch:
            did = True
            rx = self.dev.receive_datagram
            cap = self.capture
            for data, src in batch:
                if cap is not None:
                    cap.record(data, src, (self.ip, self.port), time.time())
                answers = answers and bool(data) and data[0] in _RESPONSES
                rx(data, src, now)
        if did and self._answering and not inline:
            self._answer_rx = True       # a datagram: end_lease rings the thread next time
        t = self.dev.get_timer()
        if t is not None and t <= now:
            self.dev.handle_timer(now)
            did = True
        d = self._delayed
        while d and d[0][0] <= now:
            _, _, data, addr = heapq.heappop(d)
            self.sock.send(data, addr)
        if inline:
            self._rx_held += counters["rcvd_pkts"] - pkts
        if inline and did and self.dev.has_output \
                and (not self._owed or answers and self.dev.owes_acks_only()
                     or self._holds_acks()):
            # sent by the next call (or the progress thread); a step that only
            # received responses (the ACK that completes the caller's own request:
            # it answers next) keeps holding them, as does one of a receiver of a
            # stream still arriving, below half a window since output last left
            # (``_holds_acks``: their ACKs coalesce, as the progress thread's do);
            # any other step that receives, or one that receives nothing, sends them
            self._owed = True
        elif did and (self._answering or self._asleep) and not self._owed \
                and self.dev.owes_acks_only():
            # The program spins on memory for a peer's request after its last
            # completion (a latency test, a ping-pong over WRITEs), or sleeps on
            # its CQ's channel for the next (UCX's ucp_worker_wait): the ACK of
            # what just landed waits for its answer, which carries it out behind
            # its own request; the peer, polling for that ACK, then finds the
            # request first and takes it inline, not through its own progress
            # thread, and a peer asleep too wakes once for both, not for the ACK
            # first.  Held for HOLD_LEASE at most, as a caller's output (sn_wait's
            # 3).  A sleeper woken by the completion polls before it answers: the
            # deadline in lease[1] keeps that poll from sending them (``poll``).
            self._owed = True
            lease = self._lease
            lease[0] = ns = time.monotonic_ns()
            lease[1] = ns + int(HOLD_LEASE * 1e9) if self._asleep else 1
        else:
            self._flush(now)
        if did and self._waiters:
            self._notify()
        return did

    def _rx_stream(self, now: float, limit: int,
                   responses: bool = False) -> tuple[bool, bool, int, bool]:
        """The progress thread's receive (or an inline step's: ``responses``) while a
        QP takes a SEND's or WRITE's MIDDLEs, in order or (a WRITE's) beyond a
        hole, or its READ's RESPONSE MIDDLEs
        (``Device.stream_target``): ``sn_rx_stream`` receives and places run
        after run, the engine accounting for them after each call (the stream's
        ``took``), and takes the run that stopped it, if any, as ``_step`` takes
        every run.  ``responses``: a READ's only (an inline step's, for its
        caller's READ).  Returns (did anything arrive, did only responses
        arrive, receives used of ``limit``, did it stop because nothing waits)."""
        lib, ffi, rxptr, cap, acks, out = self._stream
        dev = self.dev
        fd = self.sock.fileno()
        did, answers, used, got = False, True, 0, 0
        state = 2
        while used < limit:
            t = dev.stream_target()
            if t is None:
                break
            qp, kind = t.qp, t.kind
            if responses and kind is not StreamKind.RESPONSES:
                break
            ip, port = qp.dest
            if kind is StreamKind.RESPONSES:
                r = t.target
                views = [ffi.from_buffer(v, require_writable=True) for v in r.views]
                k = lib.sn_rx_reads(fd, rxptr, cap, _ip_u32(ip), port, qp.qpn, r.psn, r.mtu,
                                    r.first_w0, r.first_start, r.mid_w0, r.mid_start,
                                    len(views), ffi.new("uint8_t *[]", views),
                                    ffi.new("uint32_t[]", r.lens),
                                    ffi.new("uint32_t[]", r.last_w0s),
                                    ffi.new("uint32_t[]", r.last_starts), r.p0, limit - used,
                                    out)
            else:
                _, seg, w0, start, psn, view, off, room, _, _ = t
                k = lib.sn_rx_stream(fd, rxptr, cap, _ip_u32(ip), port, w0, qp.qpn, psn,
                                     start, seg, ffi.from_buffer(view, require_writable=True),
                                     off, room, limit - used, self._ack_bytes, acks,
                                     _STREAM_ACKS, out)
            state = out[1]
            used += out[7] + (state in (1, 3))
            got += out[8]
            if k:
                did = True
                answers = answers and kind is StreamKind.RESPONSES
                self._stream_pkts += k
                if kind is StreamKind.BEYOND_HOLE:
                    self._stream_beyond_pkts += k
                if kind is StreamKind.RESPONSES:
                    t.took(k, r.wqes[:out[0]], now)
                else:
                    t.took(k, acks, out[0], now)
            if state == 1:              # a run the kernel did not (wholly) take
                did = True
                n, g, o = out[2], out[3], out[4]
                data = self.sock.rx_view[o:n]
                answers = answers and bool(data) and data[0] in _RESPONSES
                dev.receive_run(data, g, (_ip_str(out[5]), out[6]), now)
                got += n - o
            elif state == 3:
                self.sock.recv_truncated += 1
            elif state == 4:
                raise OSError(out[9], os.strerror(out[9]))
            if got >= self._ack_bytes and dev.has_output:
                got = 0                  # the coalesced ACKs leave now (as in _step)
                self._flush(now)
            if state == 0:
                break
        return did, answers, used, state == 0

    def _rx_answers(self, now: float, limit: int) -> tuple[bool, int, bool]:
        """Answer the READs or ATOMICs that arrive for ``Device.answer_target``'s QP
        in the compiled kernel (``sn_rx_answers``), each response sent as its
        request is taken, up to ``limit`` receives; the engine accounts for them
        after each call (``took_answers``), then takes the datagram that stopped
        it, if any.  Where that datagram began a coalesced run, or came in one
        (UCX's ATS, a SEND of the size of a READ request, between its READs),
        and a request like the last follows it there, the engine takes it alone,
        what it made leaves (responses go out in PSN order), and the kernel is
        offered the rest of the run; else the engine takes all that is left, as
        ``_step`` takes every run (a run of READ responses goes its own fast
        way, not a datagram at a time), and if the call answered none, the
        kernel is offered no more until the engine answers one again, unless
        what stopped it was small and no request (an ACK, UCX's ATS alone:
        ``_ANSWER_BETWEEN``), for ``_ANSWER_MISSES`` such calls in a row.
        Returns (did anything arrive, receives used of ``limit``, did it stop
        because nothing waits)."""
        lib, ffi, rxptr, cap, resp, origs, heads, out = self._answers
        dev = self.dev
        rx_view = self.sock.rx_view
        did, used, state = False, 0, 2
        in_len = in_seg = in_off = 0              # the rest of a run, in the buffer
        while True:
            t = dev.answer_target()
            if t is not None:
                try:
                    mem = ffi.from_buffer(t.mem, require_writable=t.kind not in _ANSWER_READS)
                except (TypeError, BufferError):
                    t = None                     # (memory an ATOMIC may not write: the engine's)
            if t is None:
                if in_len:
                    dev.receive_run(rx_view[in_off:in_len], in_seg, src, now)
                return did, used, False
            qp = t.qp
            ip, port = qp.dest
            k = lib.sn_rx_answers(self.sock.fileno(), rxptr, cap, _ip_u32(ip), port, t.kind,
                                  t.w0, qp.qpn, t.epsn, t.req_start, t.rkey, t.length, t.lo,
                                  t.hi, mem, t.resp_w0, t.dqpn, t.syndrome, t.msn,
                                  t.resp_start, resp, _ANSWERS_MAX, origs, t.mtu, t.mid_w0,
                                  t.mid_start, t.last_w0, t.last_start, heads, _ANSWER_MIDDLES,
                                  in_len, in_seg, in_off, max(limit - used, 0), out)
            state = out[1]
            left_in_run = state == 1 and out[9] == 1     # (no receive used for it)
            used += out[7] + (state in (1, 3) and not left_in_run)
            if k:
                did = True
                self._answers_sent += k
                self._answer_misses = 0
                self.sock.send_errors += out[8]
                dev.took_answers(qp, t.kind, k, origs)
            if state != 1:
                break
            did = True                           # a datagram the kernel did not take
            in_len, in_seg, o = out[2], out[3], out[4]
            src = (_ip_str(out[5]), out[6])
            after = o + in_seg if in_seg else in_len
            if after < in_len and rx_view[after] == t.w0 >> 24:
                # one datagram before a request like the last in a run (UCX's ATS
                # between its rendezvous READs): the engine's, the rest the kernel's
                # (unless what the engine did leaves it none: answer_target)
                dev.receive_run(rx_view[o:after], 0, src, now)
                in_off = after
                if dev.has_output:
                    self._flush(now)             # (what it made leaves before the answers)
                continue
            if not k:
                # not a request like the last: the kernel is offered none until the
                # engine answers one again (a program that did a READ once and now
                # streams WRITEs pays for no attempt per step, nor one whose READs
                # change length, as UCX's rendezvous fragments do); a small packet
                # (an ACK, UCX's ATS) between a peer's READs leaves it the QP, for
                # _ANSWER_MISSES such calls in a row
                self._answer_misses += 1
                if rx_view[o] == t.w0 >> 24 or (in_seg or in_len - o) > _ANSWER_BETWEEN \
                        or self._answer_misses >= _ANSWER_MISSES:
                    self._answer_misses = 0
                    dev.answer_qp = None
            dev.receive_run(rx_view[o:in_len], in_seg, src, now)
            break
        if state == 3:
            self.sock.recv_truncated += 1
        elif state == 4:
            raise OSError(out[9], os.strerror(out[9]))
        return did, used, state == 0

    def _notify(self) -> None:
        """Wake the threads in ``wait_until`` (caller holds the lock)."""
        self._cond.notify_all()
        if self._poller >= 0 and threading.get_ident() != self._poller_id:
            try:
                os.eventfd_write(self._poller, 1)
            except OSError:
                pass

    def _next_deadline(self) -> float | None:
        t = self.dev.get_timer()
        if self._delayed and (t is None or self._delayed[0][0] < t):
            t = self._delayed[0][0]
        return t

    def _deadline(self, t: float) -> None:
        """The engine's earliest deadline (or a fault-delayed send's) is ``t``: the
        sleeping thread re-reads it from lease[3] when it wakes, and is rung only
        if it now sleeps toward a later time.  A cancelled deadline is left
        standing: the thread wakes for nothing, once (a re-armed, later one, as
        each message's retransmission timer is, moves it on without a wake-up)."""
        lease = self._lease
        tn = int(t * 1e9)
        old = lease[3]
        lease[3] = tn
        if tn < old and t < self._sleep_until:
            self.ring()

    def _sleep(self, timeout: float, spin: float = 0.0) -> int:
        """Sleep until there is work for the thread, or ``timeout`` seconds pass;
        ``spin``: look without sleeping for that long first, where no caller holds
        the lease (``sn_wait_spin``; not without the kernel, where a spin would hold
        the interpreter lock).
        1: a datagram waits (4: found while spinning); 2: the bell rang; 3: held
        output waits; 0: time is up."""
        w = self._waiter
        if w is not None:
            r = w.lib.sn_wait_spin(self.sock.fileno(), self._bell, int(timeout * 1e9),
                                   self._lease, int(SPIN_LEASE * 1e9), int(HOLD_LEASE * 1e9),
                                   int(spin * 1e9))
            if r < 0:
                raise OSError(-r, os.strerror(-r))
            return r
        p = select.poll()                    # without the kernel: the same, with the GIL
        p.register(self.sock.fileno(), select.POLLIN)
        p.register(self._bell, select.POLLIN)
        d = self._lease[3] * 1e-9 - time.monotonic()
        got = p.poll(max(0, -int(-min(timeout, d) * 1000)))
        return 2 if any(fd == self._bell for fd, _ in got) else (1 if got else 0)

    def _prioritize(self, raised: bool) -> None:
        """Give the progress thread ``PROGRESS_NICE`` (``raised``) or the nice value
        it started with.  Where the process may not raise it, it stays as it is."""
        with self.lock:
            tid = self._thread.native_id
            if self._raised is None or raised == self._raised or tid is None \
                    or self._closed:
                return
            try:
                if self._base_nice is None:
                    self._base_nice = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid,
                               PROGRESS_NICE if raised else self._base_nice)
            except (OSError, AttributeError):
                self._raised = None          # not permitted here: never again
                return
            self._raised = raised
            self._nice_changes += 1
            # (raised, the thread may leave SCHED_IDLE again: sn_wait's idle park)
            self._lease[5] = 1 if raised and IDLE_PARK else 0

    def _run(self) -> None:
        spin = 0.0
        while True:
            with self.lock:
                if self._closed:
                    return
                now = time.monotonic()
                t = self._next_deadline()
                if t is not None:
                    self._lease[3] = int(t * 1e9)
                elif self._lease[3] * 1e-9 <= now:
                    # (a deadline cancelled but still ahead stays: the next one armed,
                    # later, then moves it on without ringing)
                    self._lease[3] = _NO_DEADLINE
                until = self._stats_at + STATS_EVERY
                self._sleep_until = until
            try:
                r = self._sleep(max(0.0, until - now), spin)
            except (OSError, ValueError):
                return                       # closed under us
            with self.lock:
                self._sleep_until = -_NEVER
                if self._closed:
                    return
                if r == 4:
                    self._spin_found += 1            # a datagram came while it spun
                    r = 1
                self._wakes[r] += 1
                if r == 2:
                    try:
                        os.eventfd_read(self._bell)
                    except BlockingIOError:
                        pass
                now = time.monotonic()
                counters = self.dev.counters
                took = counters["rcvd_pkts"]
                self._step(now, ready=r == 1)        # (1: sn_wait saw a datagram waiting)
                took = counters["rcvd_pkts"] - took
                # lease[0]: the latest poll or streamed post (ahead: a thread asleep
                # on the socket); 0 after end_lease
                driven = now - max(self._lease[0], self._returned_ns) * 1e-9 \
                    < PROGRESS_NICE_HOLD
                spin = PROGRESS_SPIN if r == 1 and 0 < took <= PROGRESS_SPIN_PKTS \
                    and not driven else 0.0
                if PROGRESS_NICE and self._raised is not None and driven != self._raised:
                    self._prioritize(driven)
            if now - self._stats_at >= STATS_EVERY:
                self._stats_at = now
                self.publish_counters()


class TcpNIC(NIC):
    """A live iWARP device: the ``IwarpDevice`` engine over TCP connections, with
    the same progress model (a thread plus inline progress from polling callers).
    No fault model applies: TCP below is reliable, and softnic does not retransmit."""
    transport = "tcp"

    def _open_wire(self, spec: _config.DeviceSpec) -> None:
        from ..transport.tcp import TcpTransport, bind_free_tcp
        if spec.ip is None:
            self.sock = bind_free_tcp(_loopback_candidates(), spec.port)
        elif ":" in spec.ip:
            raise OSError(errno.EAFNOSUPPORT, f"{spec.name}: iWARP (TCP) devices are IPv4 "
                                              f"only; {spec.ip} is IPv6")
        else:
            self.sock = TcpTransport(spec.ip, spec.port)
        self.ip, self.port = self.sock.address

    def _device_class(self):
        from ..core.iwarp import IwarpDevice
        return IwarpDevice

    def _readiness(self):
        return lambda timeout: True          # many sockets: every inline poll steps

    def _capture_class(self):
        return TcpCapture

    def __init__(self, spec: _config.DeviceSpec, cfg: _config.RuntimeConfig):
        super().__init__(spec, cfg)
        self.injector = None          # faults are not applied to a TCP stream

    @property
    def counters(self) -> dict[str, int]:
        with self.lock:
            c = dict(self.dev.counters)
        c["tcp_send_errors"] = self.sock.send_errors if self.sock else 0
        c["tcp_connections"] = len(self.sock.socks) if self.sock else 0
        return c

    def _tx(self, cid, data) -> None:
        local, peer = self.sock.ends[cid]
        self.capture.record(local, peer, data, time.time())

    def _rx(self, cid, data) -> None:
        local, peer = self.sock.ends[cid]
        if peer[0] == self.ip and any(l == peer for l, _ in self.sock.ends.values()):
            return                  # a connection to ourselves: its sending end recorded it
        self.capture.record(peer, local, data, time.time())

    def _flush(self, now: float) -> None:
        self._posts_owed = False
        if self._closed:
            return
        cap = self.capture is not None
        self.sock.flush(self.dev, now, self._tx if cap else None)
        # the sleeping thread watches the connections it saw when it went to sleep:
        # one opened, closed or left with output queued since is rung for
        if self._sleep_until != -_NEVER and threading.get_ident() != self._thread.ident \
                and self.sock.watched() != getattr(self.sock, "watching", None):
            self.ring()

    def _step(self, now: float, inline: bool = False, ready: bool = False,
              runs: int = 1, reads: bool = False) -> bool:
        # (one step takes what the connections hold, whatever ``runs`` says)
        cap = self.capture is not None
        self._flush(now)
        did = self.sock.step(self.dev, now, on_rx=self._rx if cap else None)
        self._flush(now)
        if did:
            if self._answering and not inline:
                self._answer_rx = True   # (as NIC._step: end_lease rings next time)
            self._cond.notify_all()
        return did

    def _next_deadline(self) -> float | None:
        return None

    def _sleep(self, timeout: float, spin: float = 0.0) -> int:
        # its sockets come and go with connections: a select over them and the bell,
        # which a verbs call or inline step that changes them rings (``_flush``); the
        # engine has no timers of its own here
        return self.sock.wait(timeout, self._bell)

    def _close_wire(self) -> None:
        self.sock.close_all()


class SimWorld:
    """The simulated fabric every device of the process joins when the backend is
    ``sim``: one lock, one virtual clock, everything reproducible from the seed."""

    def __init__(self, cfg: _config.RuntimeConfig):
        from ..transport.sim import Fabric
        self.cfg = cfg
        self.lock = threading.RLock()
        self.capture = Capture(cfg.capture) if cfg.capture else None
        self.fabric = Fabric(cfg.seed, default_faults=cfg.faults, default_delay=2e-6,
                             trace=True, capture=self.capture)
        self.next_host = 1

    def open(self, spec: _config.DeviceSpec) -> "SimNIC":
        """The device ``spec`` names, joined to this world."""
        return SimNIC(spec, self)

    def run(self, max_events: int = 2000) -> bool:
        """Advance virtual time by up to ``max_events`` events; False when idle."""
        with self.lock:
            n = self.fabric.events_processed
            self.fabric.run(max_events=max_events)
            trace = self.fabric.trace
            if len(trace) > 20000:              # keep the recent packets, for failure reports
                del trace[:-10000]
            return self.fabric.events_processed != n


_world: SimWorld | None = None


def sim_world() -> SimWorld:
    global _world
    if _world is None:
        _world = SimWorld(runtime_config())
    return _world


def use_sim_world(world) -> None:
    """Make ``world`` the simulated world the devices of ``SOFTNIC_BACKEND=sim`` open
    in (anything with ``open(spec)`` giving a device with ``SimNIC``'s interface;
    ``softnic.collectives.virtual`` runs ranks on a leaf-spine this way)."""
    global _world
    _world = world


class SimNIC(SharedDevice):
    """A device in the simulated fabric, with the live NIC's interface, so the
    pyverbs API runs unchanged in virtual time.  Progress happens whenever the
    program polls or waits: the fabric runs its events, deterministically."""

    def __init__(self, spec: _config.DeviceSpec, world: SimWorld):
        if spec.ip is None:
            ip = f"10.0.0.{world.next_host}"
            world.next_host += 1
        else:
            ip = spec.ip
        self.world = world
        self.name = spec.name
        self.ip, self.port = ip, spec.port or ROCEV2_PORT
        self.refs = 0
        self.dev = Device(spec.name, self.ip, self.port,
                          config=DeviceConfig(min_timer=world.cfg.min_timer,
                                              selective_repeat=world.cfg.selective_repeat,
                                              cc=_config.cc_for(world.cfg, spec.name),
                                              line_rate_bps=world.cfg.link_gbps * 1e9))
        self.gid = self.dev.gid
        self.lock = world.lock
        self._closed = False
        with self.lock:
            world.fabric.attach(self.dev)

    def call(self, fn, *args, **kw):
        with self.lock:
            try:
                return fn(*args, **kw)
            finally:
                self.world.fabric.flush()

    def poll(self, runs: int = 1, reads: bool = False, seen: bool = False) -> None:
        if not self._closed:
            self.world.run()

    def wait_until(self, pred, timeout: float | None = None) -> bool:
        """Run the fabric until ``pred()``; ``timeout`` is in virtual seconds."""
        fabric = self.world.fabric
        with self.lock:
            end = None if timeout is None else fabric.now + timeout
            while True:
                if pred():
                    return True
                if self._closed or (end is not None and fabric.now >= end):
                    return False
                if not self.world.run():
                    return pred()                  # idle: nothing more can happen

    @property
    def counters(self) -> dict[str, int]:
        with self.lock:
            return dict(self.dev.counters)

    def publish_counters(self, final: bool = False) -> None:
        pass


    def close(self) -> None:
        with self.lock:
            if self._closed:
                return
            self._closed = True
            self.world.fabric.detach(self.dev.address)


@atexit.register
def _close_all() -> None:
    for nic in open_nics():
        nic.close()
