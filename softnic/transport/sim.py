"""A deterministic virtual-time fabric for sans-I/O devices.

Any object with this shape is a device (one NIC)::

    device.address                              -> (ip str, udp port)  (IPv4 or IPv6)
    device.receive_datagram(data, src, now)     -> None
    device.datagrams_to_send(now)               -> [(bytes, (ip, port)), ...]
    device.get_timer()                          -> absolute deadline or None
    device.handle_timer(now)                    -> None

The fabric keeps one heap of events ``(time, seq, port, data, src)``:
deliveries carry bytes, timers carry ``data=None``.  ``seq`` grows by one per
heap entry and breaks ties, so events at one time run in the order they were
made and a run depends only on the seed and the workload.  The deliveries
from one switch egress port come in time order: only the first is in the heap,
the rest wait behind it (``_Drain``), which keeps the heap small.

After every input to a device (a delivery, a timer) the fabric applies the
driver rule: drain ``datagrams_to_send(now)`` and re-arm the device's one
timer from ``get_timer()``.  Engines move their timer on almost every packet,
so re-arming is cheap: a later deadline only updates the port, and the heap
entry already there re-checks the armed deadline when it comes up (fire,
push again later, or discard).  An earlier deadline pushes a new entry and
the old one turns stale (its ``seq`` no longer matches).  Neither kind of
leftover entry moves the clock or counts as an event.

The loop runs compiled where ``softnic.accel`` can build it (``fabric.c``: the
same loop over the same objects), else in Python (``Fabric._run_python``, also
what a traced run takes); the two give the same run.

Each link direction has its own ``FaultInjector`` whose rng comes from the
fabric seed and the two addresses (never from ``hash()``, which Python
randomizes per process).  A direction with no faults skips the injector.
``Fabric.set_injector`` puts a test's own injector on one direction.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from dataclasses import dataclass, replace
from heapq import heapify, heappop, heappush
from typing import Any, Callable, NamedTuple, Protocol

from softnic.driver.faults import COUNTER_NAMES, FaultInjector, FaultModel
from softnic.wire.datagram import CE, Datagram
from congestion.base import Hop

__all__ = ["Fabric", "Device", "TraceRecord", "Address", "Switch", "EgressQueue", "RED"]

Address = tuple[str, int]


class Device(Protocol):
    @property
    def address(self) -> Address: ...
    def receive_datagram(self, data: bytes, src: Address, now: float) -> None: ...
    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Address]]: ...
    def get_timer(self) -> float | None: ...
    def handle_timer(self, now: float) -> None: ...


class TraceRecord(NamedTuple):
    time: float
    kind: str        # "send", "drop", "deliver", "corrupt" or "dup"
    src: Address
    dst: Address
    data: bytes


_INF = float("inf")

# Rebuild the heap without stale timer entries once there are this many and
# they make up more than half of it.
_COMPACT_MIN_STALE = 4096


class _Port:
    """A device attached to the fabric, its links out and its one timer."""

    __slots__ = ("device", "address", "links", "armed", "entry_seq", "entry_time", "attached",
                 "ect")

    def __init__(self, device: Any, address: Address) -> None:
        self.device = device
        self.address = address
        self.links: dict[Address, _Link] = {}  # by destination; filled on first use
        self.armed: float | None = None        # the deadline the device asked for
        self.entry_seq = -1                    # seq of this port's live timer entry, -1 if none
        self.entry_time = 0.0                  # and its time
        self.attached = True
        self.ect = bool(getattr(device, "ect", False))   # sends ECN-capable packets


class _Link:
    """One direction of a link: where it goes and what happens on the way."""

    __slots__ = ("dst", "delay", "injector", "counters", "fast", "uplink", "hop", "clos",
                 "clean", "nic")

    def __init__(self, dst: _Port, delay: float, injector: FaultInjector,
                 uplink: "EgressQueue | None" = None, hop: "_SwitchHop | None" = None,
                 clos: Any = None) -> None:
        self.dst = dst
        self.delay = delay
        self.injector = injector
        self.counters = injector.counters
        # Through a switch: the sending NIC's own egress queue, then the switch port.
        self.uplink = uplink
        self.hop = hop
        self.clos = clos            # a LeafSpine both ends are connected to
        # Only a stock injector of a perfect direct link may be skipped; one set
        # by set_injector sees every datagram.
        self.clean = type(injector) is FaultInjector and injector.model.is_none()
        self.fast = self.clean and hop is None and clos is None
        # Through a switch with nothing to draw on the host's side: the NIC's queue,
        # which drops, marks, stamps and samples nothing (``EgressQueue.depart``).
        self.nic = uplink if self.clean and hop is not None and uplink is not None \
            and uplink.plain else None


#: bytes a link carries per datagram beyond the UDP payload (IPv4 + UDP headers)
WIRE_OVERHEAD = 28


@dataclass(frozen=True, slots=True)
class RED:
    """ECN marking as DCQCN's switches do it (RED on the instantaneous queue):
    no mark below ``kmin`` bytes, probability rising linearly to ``pmax`` at
    ``kmax``, every ECN-capable packet marked above ``kmax``."""
    kmin: int = 5_000
    kmax: int = 200_000
    pmax: float = 0.01

    def __post_init__(self) -> None:
        if not 0 <= self.kmin < self.kmax:
            raise ValueError(f"RED needs 0 <= kmin < kmax, got kmin={self.kmin} kmax={self.kmax}")
        if not 0 < self.pmax <= 1:
            raise ValueError(f"RED pmax must be in (0, 1], got {self.pmax}")

    def probability(self, qlen: float) -> float:
        """(Compiled beside it, for this class, in softnic/accel/fabric.c's
        ``queue_arrive``.)"""
        if qlen <= self.kmin:
            return 0.0
        if qlen >= self.kmax:
            return 1.0
        return self.pmax * (qlen - self.kmin) / (self.kmax - self.kmin)


class EgressQueue:
    """A FIFO output port draining at ``rate_bps``: a finite buffer (tail drop),
    optional RED/ECN marking and INT stamping.

    The queue is kept as the time its last queued bit leaves (``busy_until``);
    the bytes queued at time t are ``(busy_until - t) * rate / 8``, exact for a
    FIFO at constant rate.  Datagrams must arrive in time order.

    An INT record's ``qlen`` is the bytes waiting in the buffer ahead of the
    datagram as it is queued; the datagram on the wire, partly sent, is no
    longer in the buffer and is not counted (``Hop``).  The drop, RED and
    sampling figures count it (the bytes still to leave).
    """

    __slots__ = ("name", "rate_bps", "buffer_bytes", "red", "int_telemetry", "rng", "busy_until",
                 "tx_bytes", "counters", "tx_by_src", "samples", "_sample", "_ends", "plain")

    def __init__(self, name: str, rate_bps: float, *, buffer_bytes: float | None = None,
                 red: RED | None = None, int_telemetry: bool = False,
                 rng: random.Random | None = None, sample_every: int = 1) -> None:
        if not rate_bps > 0:
            raise ValueError(f"{name}: rate_bps must be > 0, got {rate_bps!r}")
        if buffer_bytes is not None and not buffer_bytes > 0:
            raise ValueError(f"{name}: buffer_bytes must be > 0, got {buffer_bytes!r}")
        self.name = name
        self.rate_bps = float(rate_bps)
        self.buffer_bytes = buffer_bytes
        self.red = red
        self.int_telemetry = int_telemetry
        self.rng = rng or random.Random(name)
        self.busy_until = 0.0
        self.tx_bytes = 0
        self.counters = {"enqueued": 0, "dropped": 0, "marked": 0, "max_qlen": 0}
        self.tx_by_src: dict = {}
        #: (time, bytes queued) as each datagram arrived (none kept if
        #: ``sample_every`` is 0)
        self.samples: list[tuple[float, int]] = []
        self._sample = sample_every > 0
        #: with INT: when each datagram still queued or on the wire will have left
        self._ends: deque[float] = deque()
        #: drops, marks, stamps and samples nothing: ``depart`` may stand for ``arrive``
        self.plain = buffer_bytes is None and red is None and not int_telemetry \
            and not self._sample

    def qlen(self, now: float) -> float:
        b = self.busy_until - now
        return b * self.rate_bps / 8 if b > 0 else 0.0

    def depart(self, data: bytes, now: float) -> float:
        """``arrive`` of a ``plain`` queue (no buffer limit, no RED, no INT, no
        samples; a NIC's own) for a datagram without ``src``: the same
        bookkeeping, and the departure time (the datagram leaves as it came).
        (Compiled beside it: softnic/accel/fabric.c's ``queue_depart``.)"""
        size = len(data) + WIRE_OVERHEAD
        busy = self.busy_until
        c = self.counters
        if busy > now:
            q = (busy - now) * self.rate_bps / 8
            if q > c["max_qlen"]:
                c["max_qlen"] = int(q)
            start = busy
        else:
            start = now
        self.busy_until = depart = start + size * 8 / self.rate_bps
        self.tx_bytes += size
        c["enqueued"] += 1
        return depart

    def arrive(self, data: bytes, now: float, ect: bool = False, src=None):
        """Queue ``data``; return ``(departure time, datagram)`` or None if dropped.
        (Compiled beside it, but for INT: softnic/accel/fabric.c's ``queue_arrive``.)"""
        size = len(data) + WIRE_OVERHEAD
        busy = self.busy_until
        rate = self.rate_bps
        b = busy - now
        q = b * rate / 8 if b > 0 else 0.0
        if self._sample:
            self.samples.append((now, int(q)))
        c = self.counters
        if q > c["max_qlen"]:
            c["max_qlen"] = int(q)
        buffer = self.buffer_bytes
        if buffer is not None and q + size > buffer:
            c["dropped"] += 1
            return None
        self.busy_until = depart = (busy if busy > now else now) + size * 8 / rate
        self.tx_bytes += size
        c["enqueued"] += 1
        if src is not None:
            by_src = self.tx_by_src
            by_src[src] = by_src.get(src, 0) + size
        red = self.red
        if red is not None and ect and q > red.kmin:
            if q >= red.kmax or self.rng.random() < red.probability(q):
                c["marked"] += 1
                data = data.with_(ecn=CE) if type(data) is Datagram else Datagram(data, ecn=CE)
        if self.int_telemetry:
            ends = self._ends
            while ends and ends[0] <= now:
                ends.popleft()            # gone
            # ends[0]: the datagram on the wire; the bytes after it (whole datagrams,
            # so rounded) wait in the buffer
            waiting = (busy - ends[0]) * rate / 8 if ends else 0.0
            ends.append(depart)
            if type(data) is not Datagram:
                data = Datagram(data, hops=(Hop(round(waiting), self.tx_bytes, depart, rate),))
            elif data.echo is None:
                hop = Hop(round(waiting), self.tx_bytes, depart, rate)
                data = data.with_(hops=(data.hops or ()) + (hop,))
        return depart, data


class _Drain:
    """A heap entry's target: the delivery to ``dst`` of a datagram that left a
    switch egress port.  One port's datagrams leave in order and cross the same
    link, so their deliveries come in time order: only the first is in the heap,
    the rest wait in ``pending`` (a smaller heap: every push and pop is cheaper)."""

    __slots__ = ("dst", "pending", "live")

    def __init__(self, dst: _Port) -> None:
        self.dst = dst
        self.pending: deque[tuple] = deque()
        self.live = False               # an entry of this drain is in the heap


class _SwitchHop:
    """A heap entry's target: a switch egress port, then the link to ``dst``
    (through the port's ``drain``)."""

    __slots__ = ("queue", "dst", "delay", "drain")

    def __init__(self, queue: EgressQueue, dst: _Port, delay: float, drain: _Drain) -> None:
        self.queue = queue
        self.dst = dst
        self.delay = delay
        self.drain = drain


class Switch:
    """An output-queued switch: one ``EgressQueue`` per connected host, each with
    the host's link rate, ``buffer_bytes`` of buffer, ``red`` marking and INT."""

    def __init__(self, name: str, *, buffer_bytes: float | None = 1 << 20,
                 red: RED | None = None, int_telemetry: bool = False) -> None:
        self.name = name
        self.buffer_bytes = buffer_bytes
        self.red = red
        self.int_telemetry = int_telemetry
        self.ports: dict[Address, EgressQueue] = {}     # toward each host
        self.links: dict[Address, tuple[float, float]] = {}   # host -> (rate, delay)

    def port(self, address: Address) -> EgressQueue:
        """The egress queue toward ``address``."""
        return self.ports[tuple(address)]


class Fabric:
    """Devices joined by links, run in virtual time.

    Every direction between two attached devices is a link with propagation
    delay ``default_delay`` (seconds), rate ``default_rate_bps`` (None: no
    limit) and fault model ``default_faults``; ``set_link`` overrides one or
    both directions.  A link's rate becomes the fault model's ``rate_bps``
    unless the model sets its own; the model's ``delay`` adds to the
    propagation delay.

    With ``trace=True`` every send, drop, corruption, duplicate and delivery
    is appended to ``fabric.trace`` (the ``tracing`` attribute switches this
    on and off between runs).  ``capture``, if given, has
    ``capture.record(datagram, src, dst, now)`` called for every delivery.
    """

    #: what the loop writes on every event, as slots (the compiled loop writes them
    #: in place); ``__dict__`` keeps room for the rest
    __slots__ = ("_now", "_received", "_stale", "_dropped_unknown", "__dict__", "__weakref__")

    def __init__(self, seed: int = 0, *, default_faults: FaultModel = FaultModel.none(),
                 default_delay: float = 1e-6, default_rate_bps: float | None = None,
                 trace: bool = False, capture: Any = None) -> None:
        if not default_delay >= 0:
            raise ValueError(f"default_delay must be >= 0 seconds, got {default_delay!r}")
        self.seed = seed
        self.default_faults = default_faults
        self.default_delay = default_delay
        self.default_rate_bps = default_rate_bps
        self.trace: list[TraceRecord] = []
        self.tracing = trace
        self.capture = capture
        #: run the compiled loop where there is one (``compiled_loop``); False: the
        #: Python loop it is checked against (a trace always takes it)
        self.compiled = True
        self.events_processed = 0
        #: datagrams that reached a queue inside the fabric (a switch port):
        #: events of the heap that no device sees
        self.hops_processed = 0
        self._now = 0.0
        self._next_seq = itertools.count(1).__next__
        self._heap: list[tuple] = []
        self._stale = 0
        self._ports: dict[Address, _Port] = {}
        self._overrides: dict[tuple[Address, Address], tuple[FaultModel | None, float | None, float | None]] = {}
        self._injectors: dict[tuple[Address, Address], FaultInjector] = {}
        self._dropped_unknown = 0
        self._received = 0
        self._switch_of: dict[Address, Switch] = {}
        self._uplinks: dict[Address, EgressQueue] = {}
        self._host_faults: dict[Address, FaultModel] = {}
        self._clos_of: dict[Address, Any] = {}
        self._drains: dict[tuple[EgressQueue, _Port], _Drain] = {}

    # -- set-up -------------------------------------------------------------

    @property
    def now(self) -> float:
        """Virtual time in seconds."""
        return self._now

    def attach(self, device: Any) -> None:
        """Add a device, reachable at ``device.address`` from then on.  A fabric
        that runs its compiled loop asks for the device's compiled timers and drain
        too (``softnic.accel.give_compiled``: the same rules, for the device's
        class, where they can be had)."""
        address = tuple(device.address)
        if address in self._ports:
            raise ValueError(f"address {address} is already attached")
        if self.compiled:
            from softnic import accel
            accel.give_compiled(device)
        self._ports[address] = _Port(device, address)
        self._forget_links(address)

    def detach(self, address: Address) -> Any:
        """Remove a device and return it.  Its timer dies and datagrams still
        on the way to it, or sent to its address later, are dropped."""
        address = tuple(address)
        port = self._ports.pop(address)
        port.attached = False
        port.armed = None
        self._forget_links(address)
        return port.device

    def _forget_links(self, address: Address) -> None:
        for port in self._ports.values():
            port.links.pop(address, None)

    def device(self, address: Address) -> Any:
        return self._ports[tuple(address)].device

    @property
    def devices(self) -> list[Any]:
        """Attached devices, in the order they were attached."""
        return [p.device for p in self._ports.values()]

    def set_link(self, a: Address, b: Address, faults: FaultModel | None = None, *,
                 delay: float | None = None, rate_bps: float | None = None,
                 both_directions: bool = True) -> None:
        """Override the link a -> b (and b -> a unless ``both_directions`` is False).

        Arguments left as None take the fabric defaults.  Each direction gets
        a fresh injector seeded from the fabric seed and its two addresses.
        """
        if delay is not None and not delay >= 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        a, b = tuple(a), tuple(b)
        pairs = [(a, b), (b, a)] if both_directions and a != b else [(a, b)]
        for src, dst in pairs:
            self._overrides[(src, dst)] = (faults, delay, rate_bps)
            self._injectors.pop((src, dst), None)
            port = self._ports.get(src)
            if port is not None:
                port.links.pop(dst, None)

    def set_injector(self, src: Address, dst: Address, injector: Any) -> None:
        """Make ``injector`` decide the fate of every datagram on src -> dst.

        ``injector`` replaces the ``FaultInjector`` built from the link's
        fault model.  Any object with ``apply(data, now)`` returning a list of
        ``(delivery time, bytes)`` copies (empty: dropped) and a ``counters``
        dict with the keys of ``softnic.driver.faults.COUNTER_NAMES`` will do, e.g.
        ``softnic.testing.DropList``, which drops chosen datagrams.  The
        link's propagation delay still applies.  A later ``set_link`` on
        this direction goes back to a fault-model injector.
        """
        src, dst = tuple(src), tuple(dst)
        self._injectors[(src, dst)] = injector
        port = self._ports.get(src)
        if port is not None:
            port.links.pop(dst, None)

    def add_switch(self, name: str, *, buffer_bytes: float | None = 1 << 20,
                   red: RED | None = None, int_telemetry: bool = False) -> Switch:
        """A switch; hosts join it with ``connect``."""
        return Switch(name, buffer_bytes=buffer_bytes, red=red, int_telemetry=int_telemetry)

    def connect(self, address: Address, switch: Switch, *, rate_bps: float,
                delay: float = 1e-6, faults: FaultModel | None = None) -> None:
        """Join the host at ``address`` to ``switch`` by a full-duplex link of
        ``rate_bps`` and propagation ``delay``.  Traffic between two hosts of
        one switch then crosses: the sender's NIC queue (its line rate, no
        drops), the link, the switch's egress queue toward the receiver (shared
        by every sender to it), and the receiver's link.  ``faults`` apply to
        what the host sends (its rate limit, if any, is ignored: the link's rate
        is the rate)."""
        if not delay >= 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        address = tuple(address)
        switch.links[address] = (float(rate_bps), float(delay))
        switch.ports[address] = EgressQueue(
            f"{switch.name}->{_fmt(address)}", rate_bps, buffer_bytes=switch.buffer_bytes,
            red=switch.red, int_telemetry=switch.int_telemetry,
            rng=self.derive_rng("switch", switch.name, _fmt(address)))
        self._uplinks[address] = EgressQueue(f"nic {_fmt(address)}", rate_bps, sample_every=0)
        self._switch_of[address] = switch
        faults = faults or FaultModel.none()
        self._host_faults[address] = faults if faults.rate_bps is None \
            else replace(faults, rate_bps=None)
        # the links (and their injectors) made before, between this host and the
        # switch's others, now cross the switch: made again when next used
        ports = self._ports
        injectors = self._injectors
        port = ports.get(address)
        for other in switch.links:
            if injectors:
                injectors.pop((address, other), None)
                injectors.pop((other, address), None)
            if port is not None and port.links:
                port.links.pop(other, None)
            p = ports.get(other)
            if p is not None and p.links:
                p.links.pop(address, None)

    def add_leaf_spine(self, cfg: Any = None, **kw: Any) -> Any:
        """A two-tier Clos (``softnic.transport.clos.LeafSpine``) in this
        fabric, from a ``LeafSpineConfig`` or its fields; hosts attached to the
        fabric join it with ``net.connect(address, leaf)``."""
        from .clos import LeafSpine, LeafSpineConfig
        return LeafSpine(self, cfg if cfg is not None else LeafSpineConfig(**kw))

    def derive_rng(self, *labels: object) -> random.Random:
        """A ``random.Random`` fixed by the fabric seed and ``labels``
        (for seeding devices' own randomness from the same seed)."""
        return random.Random("/".join([str(self.seed), *map(str, labels)]))

    def _zero_icrc_guard(self, src: Address, dst: Address, model: FaultModel) -> None:
        """A device that sends zero ICRCs (``DeviceConfig(icrc=False)``) is allowed
        only where that cannot change what happens: a link that never corrupts,
        to a receiver that does not check ICRCs."""
        sp, dp = self._ports.get(src), self._ports.get(dst)
        cfg = getattr(sp.device, "config", None) if sp is not None else None
        if cfg is None or getattr(cfg, "icrc", True):
            return
        dcfg = getattr(dp.device, "config", None)
        if model.corrupt or getattr(dcfg, "check_icrc", False):
            raise ValueError(
                f"{_fmt(src)} sends zero ICRCs (icrc=False), but the link to {_fmt(dst)} "
                + ("corrupts" if model.corrupt else "ends at a device that checks ICRCs"))

    def _make_link(self, src: Address, dst: Address) -> _Link | None:
        port = self._ports.get(dst)
        if port is None:
            return None
        faults, delay, rate = self._overrides.get((src, dst), (None, None, None))
        net = self._clos_of.get(src)
        if net is not None and self._clos_of.get(dst) is net:
            injector = self._injectors.get((src, dst))
            if injector is None:
                injector = self._injectors[(src, dst)] = FaultInjector(
                    FaultModel.none(), self.derive_rng(_fmt(src), _fmt(dst)))
            self._zero_icrc_guard(src, dst, FaultModel.none())
            return _Link(port, 0.0, injector, clos=net)
        sw = self._switch_of.get(src)
        if sw is not None and self._switch_of.get(dst) is sw:
            model = self._host_faults[src]
            self._zero_icrc_guard(src, dst, model)
            injector = self._injectors.get((src, dst))
            if injector is None:
                injector = self._injectors[(src, dst)] = FaultInjector(
                    model, self.derive_rng(_fmt(src), _fmt(dst)))
            q = sw.ports[dst]
            drain = self._drains.get((q, port))
            if drain is None:
                drain = self._drains[(q, port)] = _Drain(port)
            return _Link(port, sw.links[src][1], injector, uplink=self._uplinks[src],
                         hop=_SwitchHop(q, port, sw.links[dst][1], drain))
        model = self.default_faults if faults is None else faults
        self._zero_icrc_guard(src, dst, model)
        injector = self._injectors.get((src, dst))
        if injector is None:
            if rate is None:
                rate = self.default_rate_bps
            if rate is not None and model.rate_bps is None:
                model = replace(model, rate_bps=float(rate))
            rng = self.derive_rng(_fmt(src), _fmt(dst))
            injector = self._injectors[(src, dst)] = FaultInjector(model, rng)
        return _Link(port, self.default_delay if delay is None else delay, injector)

    def injector(self, src: Address, dst: Address) -> FaultInjector:
        """The injector of direction src -> dst (made now if not used yet;
        whatever ``set_injector`` installed, if it was called)."""
        src, dst = tuple(src), tuple(dst)
        injector = self._injectors.get((src, dst))
        if injector is None:
            link = self._make_link(src, dst)
            if link is None:
                raise KeyError(f"no device attached at {dst}")
            injector = link.injector
        return injector

    def link_counters(self, src: Address, dst: Address) -> dict[str, int]:
        """A copy of the counters of direction src -> dst."""
        return dict(self.injector(src, dst).counters)

    @property
    def counters(self) -> dict[str, int]:
        """Totals over all links (see ``softnic.driver.faults.COUNTER_NAMES``), plus
        ``dropped_unknown`` (nobody at the destination) and ``received``
        (datagrams handed to a device)."""
        total = dict.fromkeys(COUNTER_NAMES, 0)
        for injector in self._injectors.values():
            for name, value in injector.counters.items():
                total[name] = total.get(name, 0) + value
        total["dropped_unknown"] = self._dropped_unknown
        total["received"] = self._received
        return total

    # -- the driver rule ------------------------------------------------------

    def flush(self, addresses: Any = None) -> None:
        """Drain every device's output and re-arm its timer (or only those of the
        devices at ``addresses``).  Call after verbs calls made outside ``run``
        (``run`` itself starts with this, unless told not to)."""
        now = self._now
        if addresses is None:
            ports = list(self._ports.values())
        else:
            ports = [p for p in map(self._ports.get, addresses) if p is not None]
        for port in ports:
            device = port.device
            for data, dst in device.datagrams_to_send(now):
                self._send(port, dst, data, now)
            deadline = device.get_timer()
            if deadline != port.armed:
                self._arm(port, deadline, now)

    def _arm(self, port: _Port, deadline: float | None, now: float) -> None:
        """Set the port's timer to ``deadline`` and its heap entry with it (compiled
        beside it: softnic/accel/fabric.c's ``arm``)."""
        port.armed = deadline
        if deadline is None:
            return  # a live entry left in the heap is discarded when it comes up
        when = deadline if deadline > now else now  # virtual time never goes back
        if port.entry_seq != -1:
            if when >= port.entry_time:
                return  # the earlier entry re-checks when it comes up
            self._stale += 1
        port.entry_seq = seq = self._next_seq()
        port.entry_time = when
        heappush(self._heap, (when, seq, port, None, None))
        if self._stale > _COMPACT_MIN_STALE and self._stale * 2 > len(self._heap):
            self._compact()

    def _compact(self) -> None:
        # In place: run() holds a reference to the list.
        self._heap[:] = [e for e in self._heap if e[3] is not None or e[2].entry_seq == e[1]]
        heapify(self._heap)
        self._stale = 0

    def _send(self, port: _Port, dst: Address, data: bytes, now: float) -> None:
        link = port.links.get(dst)
        if link is None:
            dst = tuple(dst)
            link = self._make_link(port.address, dst)
            if link is None:
                self._dropped_unknown += 1
                if self.tracing:
                    self.trace.append(TraceRecord(now, "send", port.address, dst, data))
                    self.trace.append(TraceRecord(now, "drop", port.address, dst, data))
                return
            port.links[dst] = link
        if link.clos is not None:
            counters = link.counters
            counters["sent"] += 1
            counters["delivered"] += 1
            if self.tracing:
                self.trace.append(TraceRecord(now, "send", port.address, link.dst.address, data))
            link.clos.inject(port, link.dst, data, now)
            return
        if link.fast and not self.tracing:
            counters = link.counters
            counters["sent"] += 1
            counters["delivered"] += 1
            heappush(self._heap, (now + link.delay, self._next_seq(), link.dst, data, port.address))
            return
        src = port.address
        injector = link.injector
        trace = self.trace if self.tracing else None
        if link.nic is not None and trace is None:
            # through a switch with no faults on the host's side: nothing to draw
            counters = link.counters
            counters["sent"] += 1
            counters["delivered"] += 1
            heappush(self._heap, (link.nic.depart(data, now) + link.delay, self._next_seq(),
                                  link.hop, data, src))
            return
        if link.hop is not None and trace is None and link.clean:
            counters = link.counters
            counters["sent"] += 1
            counters["delivered"] += 1
            depart, data = link.uplink.arrive(data, now)
            heappush(self._heap, (depart + link.delay, self._next_seq(), link.hop, data, src))
            return
        if trace is not None:
            trace.append(TraceRecord(now, "send", src, dst, data))
            duplicated = injector.counters["duplicated"]
        copies = injector.apply(data, now)
        if trace is not None:
            if not copies:
                trace.append(TraceRecord(now, "drop", src, dst, data))
            for i, (_, copy) in enumerate(copies):
                if copy is not data:
                    trace.append(TraceRecord(now, "corrupt", src, dst, copy))
                if i and injector.counters["duplicated"] != duplicated:
                    trace.append(TraceRecord(now, "dup", src, dst, copy))
        heap = self._heap
        delay = link.delay
        if link.hop is not None:            # through a switch: the NIC's queue first
            uplink, hop = link.uplink, link.hop
            for at, copy in copies:
                depart, copy = uplink.arrive(copy, at)
                heappush(heap, (depart + delay, self._next_seq(), hop, copy, src))
            return
        dst_port = link.dst
        for at, copy in copies:
            heappush(heap, (at + delay, self._next_seq(), dst_port, copy, src))

    # -- running --------------------------------------------------------------

    def _settle_top(self) -> None:
        """Pop leftover timer entries from the top of the heap until the top
        is a real event (or the heap is empty)."""
        heap = self._heap
        while heap:
            at, seq, port, data, _ = heap[0]
            if data is not None:
                return
            if seq != port.entry_seq:
                heappop(heap)
                self._stale -= 1
                continue
            armed = port.armed
            if armed is not None and armed <= at:
                return
            heappop(heap)
            port.entry_seq = -1
            if armed is not None:  # moved later since this entry was pushed
                port.entry_seq = seq = self._next_seq()
                port.entry_time = armed
                heappush(heap, (armed, seq, port, None, None))

    def next_event_time(self) -> float | None:
        """Time of the next event, or None when the fabric is idle."""
        self._settle_top()
        return self._heap[0][0] if self._heap else None

    def pending(self) -> bool:
        """True while some event is still to come."""
        return self.next_event_time() is not None

    def run(self, until: float | None = None, *, stop: Callable[[], bool] | None = None,
            max_events: int | None = None, flush: bool = True) -> float:
        """Process events in time order; return the virtual time reached.

        Flushes every device first (``flush=False``: the caller has flushed
        the devices it touched, ``flush(addresses)``).  Stops when no events
        are left (idle), before an event later than ``until`` (the clock then
        reads ``until``), once ``stop()`` is true (checked before the first
        event and after each one), or after ``max_events`` events.  An event
        is a delivery (or a drop at a detached device) or a timer firing.
        """
        if flush:
            self.flush()
        if stop is not None and stop():
            return self._now
        limit = -1 if max_events is None else max_events
        end = _INF if until is None else until
        loop = compiled_loop() if self.compiled else None
        if loop is not None and not self.tracing:
            processed, hops, stopped = loop.run_loop(self, self._heap, end, limit, stop,
                                                     self._ports, self._next_seq, self.capture)
        else:
            processed, hops, stopped = self._run_python(end, limit, stop)
        self.events_processed += processed
        self.hops_processed += hops
        if until is not None and not stopped and processed != limit and until > self._now:
            self._now = until
        return self._now

    def _run_python(self, end: float, limit: int, stop: Callable[[], bool] | None
                    ) -> tuple[int, int, bool]:
        """``run``'s loop: events until ``end``, ``limit`` of them (-1: no limit) or
        ``stop()``; returns (events, hops, stopped).  softnic.accel's ``fabric.c``
        runs the same loop compiled (tests/test_sim_reference.py runs both)."""
        heap = self._heap
        trace = self.trace if self.tracing else None
        capture = self.capture
        next_seq = self._next_seq
        send = self._send
        processed = hops = 0
        stopped = False
        ports = self._ports
        # long: one loop on purpose: its body runs once per event, and each step moved
        # into a method would add a call per event (tools/sim_bench.py counts them)
        while processed != limit and heap:
            at, seq, port, data, src = entry = heappop(heap)
            if at > end:
                heappush(heap, entry)         # the same entry back: it keeps its place
                break
            cls = port.__class__
            if cls is not _Port:
                if cls is _Drain:                     # a delivery from a switch port
                    pending = port.pending
                    if pending:
                        heappush(heap, pending.popleft())
                    else:
                        port.live = False
                    port = port.dst
                else:
                    hops += 1
                    if cls is _SwitchHop:             # a datagram reaches a switch port
                        sp = ports.get(src)
                        res = port.queue.arrive(data, at, sp is not None and sp.ect, src)
                        if res is None:
                            if trace is not None:
                                trace.append(TraceRecord(at, "drop", src, port.dst.address,
                                                         data))
                        else:
                            drain = port.drain
                            e = (res[0] + port.delay, next_seq(), drain, res[1], src)
                            if drain.live:
                                drain.pending.append(e)
                            else:
                                drain.live = True
                                heappush(heap, e)
                    else:                             # a leaf-spine's port or switch
                        port.event(at, data, src)
                    continue
            device = port.device
            if data is None:
                if seq != port.entry_seq:
                    self._stale -= 1
                    continue
                port.entry_seq = -1
                armed = port.armed
                if armed is None:
                    continue
                if armed > at:
                    port.entry_seq = seq = next_seq()
                    port.entry_time = armed
                    heappush(heap, (armed, seq, port, None, None))
                    continue
                self._now = at
                port.armed = None
                device.handle_timer(at)
            elif port.attached:
                self._now = at
                self._received += 1
                if trace is not None:
                    trace.append(TraceRecord(at, "deliver", src, port.address, data))
                if capture is not None:
                    capture.record(data, src, port.address, at)
                if data.__class__ is Datagram:
                    device.receive_datagram(data, src, at, data.ecn,
                                            data.echo if data.echo is not None else data.hops)
                else:
                    device.receive_datagram(data, src, at)
            else:
                self._now = at
                self._dropped_unknown += 1
                if trace is not None:
                    trace.append(TraceRecord(at, "drop", src, port.address, data))
                processed += 1
                if stop is not None and stop():
                    stopped = True
                    break
                continue
            # The driver rule, inlined: this is the per-packet path.
            links = port.links
            for out, dst in device.datagrams_to_send(at):
                link = links.get(dst)
                if link is None or trace is not None:
                    send(port, dst, out, at)
                elif link.fast:
                    counters = link.counters
                    counters["sent"] += 1
                    counters["delivered"] += 1
                    heappush(heap, (at + link.delay, next_seq(), link.dst, out, port.address))
                elif link.nic is not None:       # the NIC's queue, then a switch port
                    counters = link.counters
                    counters["sent"] += 1
                    counters["delivered"] += 1
                    heappush(heap, (link.nic.depart(out, at) + link.delay, next_seq(), link.hop,
                                    out, port.address))
                else:
                    send(port, dst, out, at)
            deadline = device.get_timer()
            if deadline != port.armed:
                self._arm(port, deadline, at)
            processed += 1
            if stop is not None and stop():
                stopped = True
                break
        return processed, hops, stopped


#: the compiled loop, once looked for (None: there is none here)
_compiled: Any = False


def compiled_loop() -> Any:
    """``Fabric.run``'s loop compiled (``softnic.accel.fabric_loop()``, set up with this
    module's classes), or None where it cannot be built or ``SOFTNIC_KERNEL=0``."""
    global _compiled
    if _compiled is False:
        from softnic import accel
        m = accel.fabric_loop()
        if m is not None:
            m.setup(_Port, _Drain, _SwitchHop, Datagram, CE, RED, float(WIRE_OVERHEAD),
                    _COMPACT_MIN_STALE)
        _compiled = m
    return _compiled


def _fmt(address: Address) -> str:
    return f"{address[0]}:{address[1]}"
